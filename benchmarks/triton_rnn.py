"""Time the triton GRU / LSTM op (`worldmodels/ops/rnn/fused/`) against cuDNN (`nn.GRU` /
`nn.LSTM`) and across its launch variants (work splits) and precision modes.

    python benchmarks/triton_rnn.py --out triton_rnn.json          # on a CUDA machine

Every row is first checked against the float64 reference op (outputs and every gradient):
`err` is the largest ||out - ref|| / ||ref|| over y, the final states and all input gradients.
Times are medians of `triton.testing.do_bench` (CUDA events, warm-up first), in ms:
`fwd` is the forward with grad enabled (what training runs), `fwd+bwd` the forward and the
backward of all outputs with random cotangents. The kernels of every variant are compiled
first in parallel worker processes (Triton's on-disk cache), so that compiling stays out of the
timed process and the whole sweep fits in a few minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import sys
import time
from pathlib import Path

import torch

if not __package__:  # run as `python benchmarks/triton_rnn.py`: import from the checkout's root, as `-m` does
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks._cli import add_out, gpu_info, write_json  # noqa: E402

SHAPES = {  # name: (batch, steps, features, hidden)
    "B256-T64-H256": (256, 64, 256, 256),
    "B16-T64-H512": (16, 64, 512, 512),
}
# Work splits: BLOCK_B rows per program, BLOCK_H columns per tile, SPLIT programs share a batch
# tile (each owns H / SPLIT columns; a flag barrier between them every step). SPLIT=1: one program
# per batch tile walks all the column tiles itself (a CTA barrier per step). W_RESIDENT: each
# program loads its W_hh slice once into registers instead of streaming it from L2 every step.
VARIANTS = {
    "B256-T64-H256": {"nosplit": dict(SPLIT=1), "noresident": dict(W_RESIDENT=False, num_warps=4)},
    "B16-T64-H512": {"nosplit": dict(SPLIT=1)},
}
# The per-step cost scan: GRU at B256 H256 for T = 16, 64, 256 (the slope is the cost of one step),
# with and without the cross-program step barrier (without it the results are wrong: timing only).
SCAN_SHAPES = {f"B256-T{t}-H256": (256, t, 256, 256) for t in (16, 64, 256)}
SCAN_VARIANTS = ("default", "nobarrier")
SHAPES_ALL = {**SHAPES, **SCAN_SHAPES}
SWEEP_PRECISION = "tf32"
OTHER_PRECISIONS = ("ieee", "tf32x3", "bf16")


def make_case(cell: str, shape: str, dtype=torch.float32, device="cuda", seed=0):
    batch, steps, features, hidden = SHAPES_ALL[shape]
    torch.manual_seed(seed)
    module = (torch.nn.GRU if cell == "gru" else torch.nn.LSTM)(features, hidden, batch_first=True)
    module = module.to(device=device, dtype=dtype)
    x = torch.randn(batch, steps, features, device=device, dtype=dtype)
    states = tuple(torch.randn(1, batch, hidden, device=device, dtype=dtype) for _ in range(1 if cell == "gru" else 2))
    weights = [p.detach().clone() for p in module._flat_weights]
    return module, x, states, weights


def triton_call(cell, x, states, weights, precision):
    from worldmodels.ops.rnn import fused
    y, finals = fused.rnn(cell, x, states, weights, None, num_layers=1, bias=True, precision=precision)
    return (y, *finals)


def cudnn_call(module, cell, x, states):
    y, finals = module(x, states[0] if cell == "gru" else states)
    return (y, *((finals,) if cell == "gru" else finals))


def leaves_of(x, states, weights):
    return [t.detach().requires_grad_() for t in (x, *states, *weights)]


def forward_backward(call, leaves, cotangents):
    outs = call(leaves)
    return outs, torch.autograd.grad(outs, leaves, cotangents)


def reference_results(cell, shape):
    """float64 reference op: outputs and gradients, for the error column."""
    from worldmodels.ops.rnn.reference import rnn as reference_rnn
    _, x, states, weights = make_case(cell, shape)
    leaves = leaves_of(*(t.double() for t in (x,)), tuple(s.double() for s in states), [w.double() for w in weights])
    n = len(states)

    def call(ls):
        y, finals = reference_rnn(cell, ls[0], tuple(ls[1:1 + n]), ls[1 + n:], None, num_layers=1, bias=True,
                                  precision="ieee")
        return (y, *finals)

    outs = call(leaves)
    cotangents = cotangents_for(outs)
    return forward_backward(call, leaves, [c.double() for c in cotangents])


def cotangents_for(outs):
    gen = torch.Generator(device=outs[0].device).manual_seed(1)
    return [torch.randn(o.shape, generator=gen, device=o.device, dtype=torch.float32) for o in outs]


def relative_error(results, reference) -> float:
    got = [*results[0], *results[1]]
    want = [*reference[0], *reference[1]]
    return max(((a.double() - b).norm() / b.norm()).item() for a, b in zip(got, want))


def row_callable(row):
    """(fn(leaves) -> outs, leaves) for one row."""
    cell, shape, impl, variant, precision = row
    module, x, states, weights = make_case(cell, shape)
    n = len(states)
    if impl == "cudnn":
        module.requires_grad_(True)
        leaves = [x.detach().requires_grad_(), *(s.detach().requires_grad_() for s in states), *module._flat_weights]

        def call(ls):
            with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=False,
                                            allow_tf32=precision == "tf32"):  # flags() defaults to enabled=False
                return cudnn_call(module, cell, ls[0], tuple(ls[1:1 + n]))
        return call, leaves
    leaves = leaves_of(x, states, weights)

    def call(ls):
        return triton_call(cell, ls[0], tuple(ls[1:1 + n]), ls[1 + n:], precision)
    return call, leaves


_launch = contextlib.ExitStack()


def set_variant(variant: str, shape: str):
    """The launch keys of `variant` until the next call."""
    from worldmodels.ops.triton_utils import launch_overrides
    keys = dict(BARRIER=False) if variant == "nobarrier" else VARIANTS.get(shape, {}).get(variant, {})
    _launch.close()
    _launch.enter_context(launch_overrides("rnn", **keys))


def warm(row):
    """Compile a row's kernels (in a worker process: Triton caches them on disk)."""
    try:
        cell, shape, impl, variant, precision = row
        set_variant(variant, shape)
        call, leaves = row_callable(row)
        outs = call(leaves)
        torch.autograd.grad(outs, leaves, cotangents_for(outs))
        torch.cuda.synchronize()
        return None
    except Exception as e:  # reported again by the timed run
        return f"{row}: {type(e).__name__}: {e}"


def time_row(row, reference):
    import triton.testing
    cell, shape, impl, variant, precision = row
    if impl == "triton":
        set_variant(variant, shape)
    call, leaves = row_callable(row)
    outs = call(leaves)
    cotangents = cotangents_for(outs)
    error = relative_error(forward_backward(call, leaves, cotangents), reference) if reference else float("nan")

    def fwd():
        call(leaves)

    def fwd_bwd():
        torch.autograd.grad(call(leaves), leaves, cotangents)

    fwd_ms = triton.testing.do_bench(fwd, warmup=25, rep=150, return_mode="median")
    both_ms = triton.testing.do_bench(fwd_bwd, warmup=25, rep=150, return_mode="median")
    return dict(cell=cell, shape=shape, impl=impl, variant=variant, precision=precision, err=error,
                fwd_ms=fwd_ms, fwd_bwd_ms=both_ms)


def main():
    parser = argparse.ArgumentParser()
    add_out(parser, "triton_rnn.json")
    parser.add_argument("--cells", default="gru,lstm")
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--compile-only", action="store_true", help="only fill Triton's cache, in parallel")
    parser.add_argument("--no-compile", action="store_true", help="skip the parallel compile (cache filled)")
    parser.add_argument("--variants", default="",
                        help="comma-separated variant names to sweep (default: all; none: the default launch only)")
    parser.add_argument("--no-scan", action="store_true", help="skip the per-step cost scan")
    args = parser.parse_args()
    chosen = set(args.variants.split(",")) - {"none"} if args.variants else None
    known = {v for shape in SHAPES for v in VARIANTS[shape]}
    if chosen and not chosen <= known:
        parser.error(f"--variants: unknown {sorted(chosen - known)}; expected none or names from {sorted(known)}")
    info = gpu_info()
    cells = args.cells.split(",")
    sweep = [(c, s, "triton", v, SWEEP_PRECISION) for c in cells for s in SHAPES for v in VARIANTS[s]
             if chosen is None or v in chosen]
    sweep += [(c, s, "triton", "default", SWEEP_PRECISION) for c in cells for s in SHAPES]
    baselines = [(c, s, "cudnn", "-", p) for c in cells for s in SHAPES for p in ("tf32", "ieee")]
    scan = [] if args.no_scan else [
        ("gru", s, "triton", v, SWEEP_PRECISION) for s in SCAN_SHAPES for v in SCAN_VARIANTS]
    precisions = [(c, s, "triton", "default", p) for c in cells for s in SHAPES for p in OTHER_PRECISIONS]
    if not args.no_compile:
        start = time.time()
        with mp.get_context("spawn").Pool(args.workers) as pool:
            failures = [f for f in pool.map(warm, sweep + precisions + scan, chunksize=1) if f]
        print(f"compiled {len(sweep + precisions + scan)} rows in {time.time() - start:.0f} s; failures: {failures}",
              flush=True)
    if args.compile_only:
        return
    results = []
    references = {}
    header = f"{'cell':5} {'shape':14} {'impl':6} {'variant':11} {'prec':6} {'err':>8} {'fwd':>8} {'fwd+bwd':>8}"
    print(header, flush=True)
    for row in baselines + sweep + precisions + scan:
        key = row[:2]
        if key not in references and row not in scan:
            references[key] = reference_results(*key)
        try:
            r = time_row(row, references.get(key))
        except Exception as e:
            r = dict(cell=row[0], shape=row[1], impl=row[2], variant=row[3], precision=row[4],
                     error=f"{type(e).__name__}: {e}")
            print(r, flush=True)
        else:
            print(f"{r['cell']:5} {r['shape']:14} {r['impl']:6} {r['variant']:11} {r['precision']:6} {r['err']:8.1e} "
                  f"{r['fwd_ms']:8.3f} {r['fwd_bwd_ms']:8.3f}", flush=True)
        results.append(r)
        write_json(args.out, dict(info=info, rows=results))
    print(header)
    for r in results:
        if "err" in r:
            print(f"{r['cell']:5} {r['shape']:14} {r['impl']:6} {r['variant']:11} {r['precision']:6} {r['err']:8.1e} "
                  f"{r['fwd_ms']:8.3f} {r['fwd_bwd_ms']:8.3f}")


if __name__ == "__main__":
    sys.exit(main())
