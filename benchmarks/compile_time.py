"""Compile time and step time of the RSSM observe unroll under `torch.compile(fullgraph=True)`:
our `loop` backend (Dynamo unrolls the Python loop, so the graph grows with T) vs `scan` (one
traced step body, whatever T).

    python -m benchmarks.compile_time [--steps 32,64,128,256] [--compilers inductor,aot_eager] [--device cuda]
                                      [--threads 1] [--row-timeout 900]

Each row (model, sequence length T, compiler, backend) runs in a fresh process, with inductor's
FX-graph and AOTAutograd caches off; there it compiles one training-style step from cold (so the
compiler's one-time start-up, the same for every row, is in its compile time): forward + backward of a scalar loss
(every output of `observe` times fixed random weights, summed) w.r.t. the inputs and all
parameters. "compile s" is the wall time of the step's first call (tracing, compiling forward and
backward, running them), "step ms" the median of the timed calls after warm-up, "max rel err" the
worst over the gradient tensors of max |g - g_eager| / max |g_eager| against the eager `loop`
backend on the same weights, inputs and noise (above 1e-4 the row is marked WRONG). A row that
runs past `--row-timeout` seconds is killed and reported as timed out, and the same (model,
compiler, backend) is not run at larger T (its compile time only grows with T). Prints a
markdown table (docs/recurrent-core.md keeps the full one); exit status 1 when a row errored or
was wrong (not for timeouts).

On a CPU shared with other busy processes, pass `--threads 1`: with more intra-op (OpenMP)
threads than idle cores every parallel region waits for a descheduled thread, and eager and
compiled steps alike ran 100-400x slower (docs/recurrent-core.md, "Compile time").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import worldmodels as wm
from benchmarks._cli import add_device


@dataclass(frozen=True)
class Model:
    name: str
    rssm: dict       # RSSM keyword arguments
    embed: int = 32
    action: int = 4


MODELS = {
    "v1": Model("V1-like (GRU, deter 64, stoch 8, hidden 64)", dict(deter=64, stoch=8, hidden=64)),
    "v3": Model("V3 block GRU (deter 128, 8x8 cat, hidden 64, 4 blocks, RMSNorm/SiLU)",
                dict(deter=128, stoch=8, classes=8, hidden=64, cell="block_gru", blocks=4, norm="rms", act="silu")),
}
TOLERANCE = 1e-4


def parse_args(argv=None) -> argparse.Namespace:
    ints = lambda text: [int(v) for v in text.split(",") if v]  # noqa: E731
    names = lambda text: [v for v in text.split(",") if v]  # noqa: E731
    p = argparse.ArgumentParser(prog="python -m benchmarks.compile_time", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=ints, default=[32, 64, 128, 256], help="sequence lengths T (default 32,64,128,256)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--models", type=names, default=list(MODELS), help=f"of {list(MODELS)}")
    p.add_argument("--backends", type=names, default=["loop", "scan"])
    p.add_argument("--compilers", type=names, default=["inductor"],
                   help="torch.compile backends, comma-separated: inductor (default), aot_eager")
    add_device(p)
    p.add_argument("--warmup", type=int, default=2, help="calls after the first, before timing")
    p.add_argument("--repeats", type=int, default=5, help="timed calls (median reported)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's); use 1 on a CPU shared with other busy jobs")
    p.add_argument("--row-timeout", type=float, default=900,
                   help="seconds a row may run before it is killed and reported as timed out (default 900)")
    p.add_argument("--row", default=None, help=argparse.SUPPRESS)  # internal: measure one row, print JSON
    args = p.parse_args(argv)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        p.error(f"unknown models {unknown}; expected some of {list(MODELS)}")
    return args


class Problem:
    """One model at one T: the module, inputs, noise and loss weights, and the eager loop's gradients."""

    def __init__(self, model: Model, batch: int, steps: int, device: torch.device):
        torch.manual_seed(0)
        self.rssm = wm.RSSM(model.action, model.embed, **model.rssm).to(device)
        self.embed = torch.randn(batch, steps, model.embed, device=device, requires_grad=True)
        self.action = (torch.rand(batch, steps, model.action, device=device) * 2 - 1).requires_grad_()
        self.is_first = torch.rand(batch, steps, device=device) < 1 / 16  # resets inside the window
        self.is_first[:, 0] = True
        self.noise = self.rssm.noise((batch, steps))
        self.wrt = [self.embed, self.action, *self.rssm.parameters()]
        outputs = self.outputs("loop")
        gen = torch.Generator().manual_seed(1)
        self.weights = {k: torch.randn(v.shape, generator=gen).to(device) for k, v in outputs.items()}
        self.reference = self.gradients(self.loss)("loop")

    def outputs(self, backend: str) -> dict[str, torch.Tensor]:
        post, prior = self.rssm.observe(self.embed, self.action, self.is_first, noise=self.noise, backend=backend)
        return {**{f"post.{k}": v for k, v in post.items()}, **{f"prior.{k}": v for k, v in prior.items()}}

    def loss(self, backend: str) -> torch.Tensor:
        outputs = self.outputs(backend)
        return sum((outputs[k] * w).sum() for k, w in self.weights.items())

    def gradients(self, loss):
        """A step: forward + backward of `loss(backend)`, gradients out (no .grad accumulation)."""
        def step(backend: str) -> list[torch.Tensor]:
            return list(torch.autograd.grad(loss(backend), self.wrt))
        return step

    def max_rel_error(self, grads: list[torch.Tensor]) -> float:
        return max(float((g - r).abs().max() / r.abs().max().clamp_min(1e-12)) for g, r in zip(grads, self.reference))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(problem: Problem, backend: str, compiler: str, args, device: torch.device) -> dict:
    # one row per process, this step the process's first compile: every row starts from the same
    # cold state (compiler start-up included), and no row's compile or threads affect another's
    step = problem.gradients(torch.compile(problem.loss, fullgraph=True, dynamic=False, backend=compiler))
    start = time.perf_counter()
    grads = step(backend)
    synchronize(device)
    compile_s = time.perf_counter() - start
    error = problem.max_rel_error(grads)
    for _ in range(args.warmup):
        step(backend)
    times = []
    for _ in range(args.repeats):
        synchronize(device)
        begin = time.perf_counter()
        step(backend)
        synchronize(device)
        times.append((time.perf_counter() - begin) * 1e3)
    return {"compile_s": compile_s, "step_ms": statistics.median(times), "error": error}


class TimedOut(str):
    """A row's result when it ran past the row timeout (the text says by how much)."""


def row(model: str, steps: int, compiler: str, backend: str, result: dict | str) -> str:
    if isinstance(result, TimedOut):
        return f"| {model} | {steps} | {compiler} | `{backend}` | {result} | - | - |"
    if isinstance(result, str):
        return f"| {model} | {steps} | {compiler} | `{backend}` | - | - | ERROR: {result} |"
    verdict = "" if result["error"] <= TOLERANCE else " WRONG"
    return (f"| {model} | {steps} | {compiler} | `{backend}` | {result['compile_s']:.1f} | {result['step_ms']:.1f} "
            f"| {result['error']:.1e}{verdict} |")


def measure_row(args) -> dict:
    """The `--row model,T,compiler,backend` child: one cold compile and its timing, in this process."""
    key, steps, compiler, backend = args.row.split(",")
    device = torch.device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    # inductor's on-disk FX-graph cache and AOTAutograd's cache would turn a rerun's compile into a load
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    problem = Problem(MODELS[key], args.batch, int(steps), device)
    return measure(problem, backend, compiler, args, device)


def run_row(args, argv: list[str], key: str, steps: int, compiler: str, backend: str) -> dict | str:
    """One row in a fresh `python -m benchmarks.compile_time --row ...` process."""
    cmd = [sys.executable, "-m", "benchmarks.compile_time", *argv, "--row", f"{key},{steps},{compiler},{backend}"]
    # its own process group, so that a timeout also ends inductor's compile-worker subprocesses
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1], start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=args.row_timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return TimedOut(f"> {args.row_timeout:g} s (timed out)")
    if proc.returncode != 0:
        lines = [line for line in stderr.splitlines() if line.strip()] or [f"exit status {proc.returncode}"]
        return lines[-1][:200]
    return json.loads(stdout.splitlines()[-1])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.row:
        print(json.dumps(measure_row(args)))
        return 0
    device = torch.device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {device} ({where}), B={args.batch}, fp32, observe fwd+bwd, "
          f"{args.warmup} warm-up + median of {args.repeats}\n", flush=True)
    print("| model | T | compiler | backend | compile s | step ms | max rel err vs eager loop |")
    print("|---|---:|---|---|---:|---:|---:|", flush=True)
    failed = False
    timed_out: dict[tuple[str, str, str], int] = {}  # (model, compiler, backend) -> the T that timed out
    for key in args.models:
        for steps in args.steps:
            for compiler in args.compilers:
                for backend in args.backends:
                    if (key, compiler, backend) in timed_out:
                        result = TimedOut(f"not run (T={timed_out[key, compiler, backend]} timed out)")
                    else:
                        result = run_row(args, argv, key, steps, compiler, backend)
                    if isinstance(result, TimedOut):
                        timed_out.setdefault((key, compiler, backend), steps)
                    else:
                        failed |= isinstance(result, str) or result["error"] > TOLERANCE
                    print(row(key, steps, compiler, backend, result), flush=True)
    print("\nmodels: " + "; ".join(f"{k} = {MODELS[k].name}" for k in args.models))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
