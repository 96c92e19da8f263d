"""Probe: the RSSM observe step (forward + backward, as in `benchmarks.compile_time`) on CPU at
several torch intra-op thread counts, eager `loop` and optionally compiled `scan`.

    python scripts/probe_cpu_threads.py [--threads 1,2] [--models v1,v3] [--steps 8] [--compiled]

On a 2-core CPU shared with other busy processes, 2 threads ran the same step 100-400x slower
than 1 thread, eager and compiled alike (docs/recurrent-core.md, "Compile time"). Each thread
count runs in a fresh process (OpenMP's pool is sized once per process).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(model: str, threads: int, steps: int, compiled: bool) -> str:
    import torch

    sys.path.insert(0, str(ROOT))
    from benchmarks.compile_time import MODELS, Problem

    torch.set_num_threads(threads)
    problem = Problem(MODELS[model], 16, steps, torch.device("cpu"))
    runs = {"eager loop": (problem.gradients(problem.loss), "loop")}
    if compiled:
        runs["compiled scan"] = (problem.gradients(torch.compile(problem.loss, fullgraph=True, dynamic=False)), "scan")
    out = []
    for name, (step, backend) in runs.items():
        step(backend)  # first call (compiles)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            step(backend)
            times.append((time.perf_counter() - start) * 1e3)
        out.append(f"{name} {statistics.median(times):.1f} ms (of {', '.join(f'{t:.0f}' for t in times)})")
    return f"{model} T={steps} threads={threads}: " + "; ".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", default="1,2")
    p.add_argument("--models", default="v1,v3")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--compiled", action="store_true", help="also the compiled scan step (minutes to compile)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        model, threads = args.child.split(",")
        print(child(model, int(threads), args.steps, args.compiled), flush=True)
        return
    for model in args.models.split(","):
        for threads in args.threads.split(","):
            cmd = [sys.executable, __file__, "--steps", str(args.steps), "--child", f"{model},{threads}"]
            subprocess.run(cmd + (["--compiled"] if args.compiled else []), cwd=ROOT, check=True)


if __name__ == "__main__":
    main()
