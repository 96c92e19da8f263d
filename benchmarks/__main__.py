"""Benchmark table: our recurrent backends next to the peers, every row in one process and run.

    python -m benchmarks [--suite gru|unroll|learner|all] [--device cuda] [--out results.json]

Run it from the repository root (benchmarks/ is not installed with the package). Every row:
warm-up, then the median of timed repeats (CUDA events on GPU, perf_counter on CPU) and the peak
allocated memory; before timing, its first call is checked against our `loop` backend (or, for
peers with their own weights, against their own eager reference) and its inputs and outputs are
checked to be finite and non-zero. Our rows are the backends the registry has for each suite's
op family on the device (`loop` first, the reference), so a newly registered backend gets rows
with no edit here. On CPU (the default without CUDA) the shapes are small, for a smoke run. Exit
status 1 when a row of ours, or a row checked against ours, errored or failed its parity check.
See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys

import torch

from benchmarks import gru_suite, learner_suite, shapes, torchrl_peers, unroll_suite
from benchmarks._cli import add_device, add_out
from benchmarks.report import docs_section, environment, read_json, table, update_docs, write_json
from benchmarks.runner import check_backend_names, run_group
from benchmarks.timing import TimingConfig
from worldmodels.core import registry, set_recurrent_matmul_precision


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", choices=("gru", "unroll", "learner", "all"), default="all")
    add_device(p)
    add_out(p, "results.json")
    p.add_argument("--shapes", choices=("full", "small"), default=None,
                   help="full: the issue's matrix (default on CUDA); small: CPU smoke shapes (default on CPU)")
    p.add_argument("--filter", default=None,
                   help="only groups whose shape label contains one of these comma-separated substrings")
    p.add_argument("--backends", default=None,
                   help=f"our backends to time, comma-separated, of the registered {list(registry.names())} "
                        f"(loop always runs: it is the reference); default: every one the registry has for the "
                        f"suite's op family on the device")
    p.add_argument("--peer-compile", action=argparse.BooleanOptionalAction, default=None,
                   help="also time torchrl's compiled rollouts (default: on for CUDA, off for CPU)")
    p.add_argument("--precision", choices=("ieee", "tf32"), default="ieee",
                   help="fp32 matmul precision for every row (set once at start: cuBLAS, cuDNN and our backends)")
    p.add_argument("--rtol", type=float, default=None, help="parity tolerance (default 1e-3 ieee, 2e-2 tf32)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--min-repeats", type=int, default=None, help="default 5 (full shapes), 1 (small)")
    p.add_argument("--max-repeats", type=int, default=None, help="default 30 (full shapes), 3 (small)")
    p.add_argument("--target-s", type=float, default=None, help="time budget for one row's repeats")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: 1 with small shapes, where thread hand-offs cost more "
                        "than the tiny ops they split; torch's default with full shapes)")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown")
    p.add_argument("--from-json", metavar="RESULTS", default=None,
                   help="do not run: print the tables of saved results JSONs (comma-separated; with "
                        "--update-docs: write them there, one table per run)")
    p.add_argument("--update-docs", metavar="MD", default=None,
                   help="write the table and its provenance between the bench markers of this file "
                        "(docs/benchmarks.md)")
    return p.parse_args(argv)


def configure_precision(precision: str) -> None:
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    set_recurrent_matmul_precision(precision)


def timing_config(args, full: bool) -> TimingConfig:
    """Defaults: full shapes get 3 warm-up calls and 5-30 repeats within ~1 s; small shapes
    (CPU smoke) 1 warm-up and 1-3 repeats."""
    pick = lambda value, full_default, small_default: value if value is not None else (  # noqa: E731
        full_default if full else small_default)
    return TimingConfig(warmup=pick(args.warmup, 3, 1), min_repeats=pick(args.min_repeats, 5, 1),
                        max_repeats=pick(args.max_repeats, 30, 3), target_s=pick(args.target_s, 1.0, 0.1))


def build_groups(args, device: torch.device, full: bool, backends: tuple, peer_compile: bool, rtol: float) -> list:
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
    return groups


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.from_json:
        runs = [read_json(path) for path in args.from_json.split(",")]
        for _, rows in runs:
            print(table(rows, markdown=args.markdown), end="\n\n")
        if args.update_docs:
            update_docs(args.update_docs, docs_section(runs))
        return 0
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but torch.cuda.is_available() is False")
    full = (args.shapes or ("full" if device.type == "cuda" else "small")) == "full"
    peer_compile = device.type == "cuda" if args.peer_compile is None else args.peer_compile
    rtol = args.rtol or (1e-3 if args.precision == "ieee" else 2e-2)
    backends = None  # None: each suite asks the registry (available for its op family on the device)
    if args.backends:
        backends = tuple(b for b in args.backends.split(",") if b)
        try:
            check_backend_names(backends)
        except ValueError as exc:
            raise SystemExit(f"--backends: {exc}") from None
    timing = timing_config(args, full)
    configure_precision(args.precision)
    if peer_compile:
        torchrl_peers.allow_recompiles()
    threads = args.threads if args.threads is not None else (None if full else 1)
    if threads is not None:
        torch.set_num_threads(threads)

    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    groups = build_groups(args, device, full, backends, peer_compile, rtol)
    meta = environment(device, shlex.join(["python", "-m", "benchmarks", *argv]), {
        "shapes": "full" if full else "small", "precision": args.precision, "rtol": rtol,
        "peer_compile": peer_compile, "timing": vars(timing),
        "backends": list(backends) if backends else None, "registered_backends": list(registry.names()),
    })
    rows = []
    write_json(args.out, meta, rows)
    for group in groups:
        rows += run_group(group, device, timing, rtol, log)
        write_json(args.out, meta, rows)  # after every group: a run cut short keeps what it measured
    print(table(rows, markdown=args.markdown))
    print(f"\n{meta['date']}  torch {meta['torch']}  triton {meta['triton']}  {meta['device_name']}  -> {args.out}")
    if args.update_docs:
        update_docs(args.update_docs, docs_section([(meta, rows)]))
    # a failing row of ours, or a row checked against ours, fails the run; a peer that cannot run does not
    bad = [r for r in rows
           if r.status in ("error", "parity-failed") and (r.kind == "ours" or r.parity.startswith("vs "))]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
