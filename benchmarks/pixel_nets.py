"""The pixel encoder and decoder of a DreamerV3 update on their own: which layout of the channel
norm is fastest on the GPU.

    python -m benchmarks.pixel_nets [--model size1m,size12m] [--images 1024] [--precision tf32|bf16]
                                    [--variants permute,channels_last,fused_norm,nchw,compiled] [--out FILE.json]

One call is what an update does with the nets: encode `images` uint8 frames [N, 3, 64, 64],
decode the same number of feature vectors and take the pixel log-likelihood, then backward
through both. Variants change only how the maps are laid out or normalised:
- `permute`: NCHW maps, the NHWC view normalised by torch's `rms_norm` (the nets before 2026-12-01);
- `channels_last`: the library's nets as they are built (conv weights channels-last, so the maps
  are too, the NHWC view is contiguous and the convs run NHWC; the RMS norm written out);
- `fused_norm`: `channels_last` with the norm through torch's fused `rms_norm` kernel instead;
- `nchw`: the norm as a reduction over dim 1 of the NCHW map, written in elementwise torch ops;
- `compiled`: `channels_last` with the encoder and decoder under `torch.compile` (inductor fuses
  the norm and the activation).
Each row: the median CUDA-event span per call (warm, eager, so host launch gaps included) and
the GPU busy time per call from `torch.profiler` (the sum of kernel intervals), which is what
the call costs inside the update's CUDA graph.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from benchmarks.learner_suite import load_configs
from worldmodels.models import networks


def _fused_forward(m: networks.ChannelNorm):
    return lambda x: m.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class _NchwRmsNorm(torch.nn.Module):
    """RMS norm over dim 1 of [N, C, H, W], with the weight of the row norm it replaces."""

    def __init__(self, norm: torch.nn.RMSNorm):
        super().__init__()
        self.weight, self.eps = norm.weight, norm.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.float().pow(2).mean(1, keepdim=True) + self.eps)
        return (x * scale).to(x.dtype) * self.weight[:, None, None]


def _nets(model: str, variant: str, device: torch.device):
    cfg, _ = load_configs(model)
    feat = cfg.deter + cfg.stoch * (cfg.classes or 1)
    enc = networks.PixelEncoder(depth=cfg.depth, norm=cfg.norm, act=cfg.act).to(device)
    dec = networks.PixelDecoder(feat, depth=cfg.depth, norm=cfg.norm, act=cfg.act).to(device)
    norms = [m for net in (enc, dec) for m in net.modules() if isinstance(m, networks.ChannelNorm)]
    if variant in ("permute", "nchw"):  # NCHW maps, as the nets were before they went channels-last
        enc.to(memory_format=torch.contiguous_format)
        dec.to(memory_format=torch.contiguous_format)
    for m in norms:
        if variant in ("permute", "fused_norm"):
            m.forward = _fused_forward(m)
        elif variant == "nchw" and isinstance(m.norm, torch.nn.RMSNorm):
            m.forward = _NchwRmsNorm(m.norm).forward
    if variant == "compiled":
        enc, dec = torch.compile(enc), torch.compile(dec)
    return enc, dec, feat


def run_variant(model: str, variant: str, args, device: torch.device) -> dict:
    torch.manual_seed(0)
    enc, dec, feat = _nets(model, variant, device)
    pixels = torch.randint(0, 256, (args.images, 3, 64, 64), dtype=torch.uint8, device=device)
    features = torch.randn(args.images, feat, device=device, requires_grad=True)
    params = [*enc.parameters(), *dec.parameters()]
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def call():
        with autocast:
            embed = enc(pixels)
            loss = embed.float().square().mean() - dec.log_prob(features, pixels).float().mean()
        loss.backward()
        for p in params:
            p.grad = None
        features.grad = None
        return loss

    for _ in range(args.warmup):
        call()
    torch.cuda.synchronize()
    spans = []
    for _ in range(args.repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        spans.append((start, end))
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.profile_calls):
            call()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, float] = {}
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.time_range.elapsed_us() / 1e3 / args.profile_calls
    return {"model": model, "variant": variant, "precision": args.precision, "images": args.images,
            "span_ms": statistics.median(s.elapsed_time(e) for s, e in spans),
            "gpu_ms": sum(by_name.values()), "kernels_per_call": len(kernels) / args.profile_calls,
            "top_kernels": sorted(([round(v, 3), k[:80]] for k, v in by_name.items()), reverse=True)[:args.top]}


VARIANTS = ("permute", "channels_last", "fused_norm", "nchw", "compiled")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pixel_nets", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="size1m,size12m")
    p.add_argument("--images", type=int, default=1024, help="frames per call (B16 x T64 = 1024)")
    p.add_argument("--precision", choices=("tf32", "bf16", "ieee"), default="tf32")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--profile-calls", type=int, default=3)
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            p.error(f"--variants: {v!r} is not one of {list(VARIANTS)}")
    if not torch.cuda.is_available():
        p.error("needs a CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.precision != "ieee"
    rows = []
    for model in args.model.split(","):
        for v in variants:
            row = run_variant(model, v, args, torch.device("cuda"))
            rows.append(row)
            print(f"{model:8s} {v:14s} {args.precision}: span {row['span_ms']:7.2f} ms, GPU {row['gpu_ms']:7.2f} ms, "
                  f"{row['kernels_per_call']:.0f} kernels")
            for ms, name in row["top_kernels"]:
                print(f"      {ms:7.3f} ms  {name}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
