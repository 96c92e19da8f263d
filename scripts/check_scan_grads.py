"""Does torch's scan give the loop's gradients for the RSSM observe unroll on this machine?

    python scripts/check_scan_grads.py [--device cuda]

Prints, per RSSM cell and per way of running `scan` (eager, compiled with aot_eager, compiled with
inductor; cudnn as a control), which gradients differ from the `loop` backend's, with this
package's workarounds for torch's scan bugs applied (worldmodels/core/torch_fixes.py). Where
torch is known to be wrong under compile, `scan` refuses and the row says so. Rerun it when
upgrading torch (docs/recurrent-core.md).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

import worldmodels as wm  # noqa: E402

CELLS = {
    "gru (V1)": dict(deter=8, stoch=3, hidden=6),
    "block_gru (V3)": dict(deter=8, stoch=3, classes=4, hidden=6, cell="block_gru", blocks=2, norm="rms", act="silu"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    device = parser.parse_args().device
    print(f"torch {torch.__version__} on {device}")
    for label, cfg in CELLS.items():
        torch.manual_seed(0)
        rssm = wm.RSSM(2, 5, **cfg).to(device)
        embed = torch.randn(3, 5, 5, device=device, requires_grad=True)
        action = torch.randn(3, 5, 2, device=device)
        is_first = torch.rand(3, 5, device=device) < 0.3
        noise = rssm.noise((3, 5))
        head = "logits" if "classes" in cfg else "mean"

        def loss(backend: str) -> torch.Tensor:
            post, prior = rssm.observe(embed, action, is_first, noise=noise, backend=backend)
            return post["stoch"].square().sum() + post[head].square().sum() + prior[head].square().sum()

        names = ["embed"] + [n for n, _ in rssm.named_parameters()]
        tensors = [embed, *rssm.parameters()]
        reference = torch.autograd.grad(loss("loop"), tensors, allow_unused=True)
        runs = {
            "scan eager": lambda: loss("scan"),
            "scan compiled (aot_eager)": lambda: torch.compile(loss, fullgraph=True, backend="aot_eager")("scan"),
            "scan compiled (inductor)": lambda: torch.compile(loss, fullgraph=True)("scan"),
            "cudnn (control)": lambda: loss("cudnn"),
        }
        for run_name, run in runs.items():
            try:
                grads = torch.autograd.grad(run(), tensors, allow_unused=True)
            except Exception as exc:  # report and go on: this is a diagnosis, not a test
                lines = str(exc).splitlines() or [""]
                ours = [line for line in lines if "backend=" in line]  # our refusal, inside torch's wrapper
                print(f"{label:15s} {run_name:26s} ERROR {type(exc).__name__}: {(ours or lines)[0][:200]}")
                if "-v" in sys.argv:
                    traceback.print_exc()
                continue
            bad = [f"{n} ({((g - r).abs().max() / r.abs().max().clamp_min(1e-12)).item():.2g})"
                   for n, g, r in zip(names, grads, reference)
                   if r is not None and g is not None and (g - r).abs().max() > 1e-4 * (r.abs().max() + 1e-6)]
            print(f"{label:15s} {run_name:26s} " + ("gradients match loop" if not bad else "WRONG: " + ", ".join(bad)))


if __name__ == "__main__":
    main()
