"""Run in a fresh process with empty TRITON_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR (CUDA only; see
tests/core/test_capture_failures.py): every RSSM unroll kind on backend="triton" (observe, open-loop and
Actor-in-the-loop imagination with no grad, observe and imagination with gradients), V1 and V3 specs,
each captured in CUDA graphs from kernels compiled in this process, compared with `loop` on the same
noise. Prints one JSON line: the capture-failure warnings seen, and whether each case was close."""

import json
import warnings

import torch

import worldmodels as wm

torch.manual_seed(0)
dev = torch.device("cuda")
wm.set_recurrent_matmul_precision("tf32x3")  # near fp32: compared with the loop at fp32 tolerances
SPECS = {"v1": dict(cell="gru", norm="none", act="elu"),
         "v3": dict(cell="block_gru", norm="rms", act="silu", classes=4, blocks=2)}
B, T, A, E, H = 5, 6, 3, 7, 4
close: dict[str, bool] = {}


def compare(name, got, want, atol=2e-4):
    close[name] = all(torch.allclose(got[k].float(), want[k].float(), rtol=1e-3, atol=atol) for k in want.keys())


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for spec, kw in SPECS.items():
        rssm = wm.RSSM(A, E, deter=32, stoch=6, hidden=24, **kw).to(dev)
        actor = wm.Actor(rssm.stoch_dim + rssm.deter_dim, A, hidden=16, layers=2).to(dev)
        embed, action = torch.randn(B, T, E, device=dev), torch.randn(B, T, A, device=dev).tanh()
        is_first = torch.zeros(B, T, dtype=torch.bool, device=dev)
        is_first[:, 0] = True
        is_first[2, 3] = True
        for call in range(3):  # the first call captures, the later ones replay
            noise = rssm.noise((B, T))
            with torch.no_grad():
                post, _ = rssm.observe(embed, action, is_first, noise=noise, backend="triton")
                want, _ = rssm.observe(embed, action, is_first, noise=noise, backend="loop")
                compare(f"{spec}-observe-{call}", post, want)
                start = post[:, -1]
                img = rssm.noise((B, H))
                got = rssm.imagine(start, H, actions=action[:, :H], noise=img, backend="triton")
                compare(f"{spec}-open-{call}", got, rssm.imagine(start, H, actions=action[:, :H], noise=img,
                                                                  backend="loop"))
                img["policy"] = actor.noise((B, H))
                got = rssm.imagine(start, H, policy=actor, noise=img, backend="triton")
                compare(f"{spec}-actor-{call}", got, rssm.imagine(start, H, policy=actor, noise=img, backend="loop"))
            grads = []
            for backend in ("triton", "loop"):
                rssm.zero_grad()
                post, _ = rssm.observe(embed, action, is_first, noise=noise, backend=backend)
                post["deter"].square().mean().backward()
                grads.append({n: p.grad.clone() for n, p in rssm.named_parameters() if p.grad is not None})
            compare(f"{spec}-observe-grad-{call}", *grads, atol=1e-3)
    torch.cuda.synchronize()
    torch.rand(4, device=dev)  # the generator still draws

capture_warnings = [str(w.message) for w in caught if "capture" in str(w.message).lower()]
print(json.dumps({"capture_warnings": capture_warnings, "close": close}))
