"""Benchmark table: our recurrent backends next to the peers, every row in one process and run.

    python scripts/bench.py [--suite gru|unroll|learner|all] [--device cuda] [--out results.json]

Every row: warm-up, then the median of timed repeats (CUDA events on GPU, perf_counter on CPU)
and the peak allocated memory; before timing, its first call is checked against our `loop`
backend (or, for peers with their own weights, against their own eager reference) and its inputs
and outputs are checked to be finite and non-zero. On CPU (the default without CUDA) the shapes
are small, for a smoke run. Exit status 1 when any row errored or failed its parity check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

from worldmodels.bench import gru_suite, learner_suite, shapes, unroll_suite  # noqa: E402
from worldmodels.bench.report import docs_section, environment, read_json, table, update_docs, write_json  # noqa: E402
from worldmodels.bench.runner import run_group  # noqa: E402
from worldmodels.bench.timing import TimingConfig  # noqa: E402
from worldmodels.core import IMPLEMENTED_BACKENDS, set_recurrent_matmul_precision  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", choices=("gru", "unroll", "learner", "all"), default="all")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default="results.json", help="where the JSON goes")
    p.add_argument("--shapes", choices=("full", "small"), default=None,
                   help="full: the issue's matrix (default on CUDA); small: CPU smoke shapes (default on CPU)")
    p.add_argument("--filter", default=None,
                   help="only groups whose shape label contains one of these comma-separated substrings")
    p.add_argument("--backends", default=",".join(IMPLEMENTED_BACKENDS),
                   help=f"our backends to time (loop is always run: it is the reference); default {IMPLEMENTED_BACKENDS}")
    p.add_argument("--peer-compile", action=argparse.BooleanOptionalAction, default=None,
                   help="also time torchrl's compiled rollouts (default: on for CUDA, off for CPU)")
    p.add_argument("--precision", choices=("ieee", "tf32"), default="ieee",
                   help="fp32 matmul precision for every row (set once at start: cuBLAS, cuDNN and our backends)")
    p.add_argument("--rtol", type=float, default=None, help="parity tolerance (default 1e-3 ieee, 2e-2 tf32)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--min-repeats", type=int, default=5)
    p.add_argument("--max-repeats", type=int, default=30)
    p.add_argument("--target-s", type=float, default=None, help="time budget for one row's repeats")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown")
    p.add_argument("--from-json", metavar="RESULTS", default=None,
                   help="do not run: print the table of a saved results JSON (with --update-docs: write it there)")
    p.add_argument("--update-docs", metavar="MD", default=None,
                   help="write the table and its provenance between the bench markers of this file "
                        "(docs/benchmarks.md)")
    return p.parse_args(argv)


def configure_precision(precision: str) -> None:
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    set_recurrent_matmul_precision(precision)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.from_json:
        meta, rows = read_json(args.from_json)
        print(table(rows, markdown=args.markdown))
        if args.update_docs:
            update_docs(args.update_docs, docs_section(meta, rows))
        return 0
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but torch.cuda.is_available() is False")
    full = (args.shapes or ("full" if device.type == "cuda" else "small")) == "full"
    peer_compile = device.type == "cuda" if args.peer_compile is None else args.peer_compile
    rtol = args.rtol or (1e-3 if args.precision == "ieee" else 2e-2)
    backends = tuple(b for b in args.backends.split(",") if b)
    timing = TimingConfig(warmup=args.warmup if args.warmup is not None else (3 if device.type == "cuda" else 1),
                          min_repeats=args.min_repeats, max_repeats=args.max_repeats,
                          target_s=args.target_s if args.target_s is not None else (1.0 if full else 0.2))
    configure_precision(args.precision)

    groups = []
    if args.suite in ("gru", "all"):
        groups += gru_suite.groups(gru_suite.FULL if full else gru_suite.SMALL, device, backends)
    if args.suite in ("unroll", "all"):
        groups += unroll_suite.groups(shapes.FULL if full else shapes.SMALL, device, backends=backends,
                                      peer_compile=peer_compile, rtol=rtol)
    if args.suite in ("learner", "all"):
        groups += learner_suite.groups(learner_suite.FULL if full else learner_suite.SMALL, device,
                                       backends=backends, peer_compile=peer_compile)
    if args.filter:
        wanted = [f for f in args.filter.split(",") if f]
        groups = [g for g in groups if any(f in g.shape for f in wanted)]

    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    rows = [row for group in groups for row in run_group(group, device, timing, rtol, log)]

    meta = environment(device, {
        "shapes": "full" if full else "small", "precision": args.precision, "rtol": rtol,
        "peer_compile": peer_compile, "backends": list(backends), "timing": vars(timing),
    })
    write_json(args.out, meta, rows)
    print(table(rows, markdown=args.markdown))
    if args.update_docs:
        update_docs(args.update_docs, docs_section(meta, rows))
    print(f"\n{meta['date']}  torch {meta['torch']}  triton {meta['triton']}  {meta['device_name']}  -> {args.out}")
    # a failing row of ours, or a row checked against ours, fails the run; a peer that cannot run does not
    bad = [r for r in rows if r.status in ("error", "parity-failed") and (r.kind == "ours" or r.parity.startswith("vs "))]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
