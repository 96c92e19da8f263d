"""`worldmodels.GRU` on `cudnn` vs `torch.nn.GRU` on the same weights, fp32 IEEE (TF32 off), the
issue's shape B=256 T=64 H=256: fwd+bwd and fwd, in interleaved rounds (ours first on even
rounds, nn.GRU first on odd ones) so drift in clocks and temperature hits both alike; each round
times 20 calls with CUDA events; prints the medians and the median and IQR of the per-round ratios.

    python -m benchmarks.gru_vs_torch [--rounds 15] [--calls 20]    # CUDA machine
"""

from __future__ import annotations

import argparse
import statistics

import torch

import worldmodels as wm


def time_calls(fn, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gru_vs_torch", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=20)
    args = p.parse_args(argv)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    batch, steps, hidden = 256, 64, 256
    ours = wm.GRU(hidden, hidden, backend="cudnn").cuda()
    ref = torch.nn.GRU(hidden, hidden, batch_first=True).cuda()
    with torch.no_grad():
        for name, p_ref in ref.named_parameters():
            p_ref.copy_(dict(ours.named_parameters())[name])
    x = torch.randn(batch, steps, hidden, device="cuda", requires_grad=True)
    dy = torch.randn(batch, steps, hidden, device="cuda")

    def fwd_bwd(module):
        return lambda: module(x)[0].backward(dy)

    def fwd(module):
        def call():
            with torch.no_grad():
                module(x)
        return call

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, GRU B={batch} T={steps} H={hidden}, fp32 IEEE")
    for label, make in (("fwd+bwd", fwd_bwd), ("fwd", fwd)):
        a, b = make(ours), make(ref)
        for _ in range(5):
            a(), b()
        ours_ms, ref_ms, ratios = [], [], []
        for r in range(args.rounds):
            first, second = (a, b) if r % 2 == 0 else (b, a)
            t_first, t_second = time_calls(first, args.calls), time_calls(second, args.calls)
            t_ours, t_ref = (t_first, t_second) if r % 2 == 0 else (t_second, t_first)
            ours_ms.append(t_ours)
            ref_ms.append(t_ref)
            ratios.append(t_ours / t_ref)
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        print(f"{label}: ours {statistics.median(ours_ms):.3f} ms, nn.GRU {statistics.median(ref_ms):.3f} ms, "
              f"ours / nn.GRU median {statistics.median(ratios):.3f} (IQR {q1:.3f}-{q3:.3f}, {args.rounds} rounds)")


if __name__ == "__main__":
    main()
