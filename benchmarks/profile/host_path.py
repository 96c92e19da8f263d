"""The host path of a replayed triton RSSM call: what the host does before a CUDA-graph replay starts
(the checks, the Actor's, the capture key), timed on any machine, a CPU one included.

    python -m benchmarks.profile.host_path [V3-1m-imagine-actor,...] [--calls 2000] [--module] [--profile]

A no-grad call on CUDA replays a captured graph (`ops/rssm/fused/entry.py`, `core/cuda_graphs.py`); until
the host has checked the call and found its graph, the GPU waits, so this time adds to every call.
Here the cases are `benchmarks.triton_rssm`'s, on CPU tensors under Triton's interpreter, with the
capture replaced by a stub that returns at once: no copies, no replay, no kernel. What is timed is
everything else, per call, in us (the least of 8 batches' means; `--profile`: also cProfile's top
functions). `--module` times the module's call instead of the op's (`RSSM.observe` /
`RSSM.imagine`: its checks, `op_weights`, the backend choice and the TensorDicts on top).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels' module is first imported

import argparse
import cProfile
import pstats
import time

import torch

from benchmarks.triton_rssm import CASES, make_case


class _StubGraph:
    """Stands in for `cuda_graphs.GraphedUnroll`: no capture, and a call returns no outputs (the unroll
    never runs, so the capture's output names stay unknown; naming a handful costs ~1 us)."""

    def __init__(self, fn, params, inputs, warmup=2, indirect=(), what="unroll"):
        pass

    def __call__(self, *inputs):
        return ()


def module_call(case: str):
    """() -> the case as a call of the module (`RSSM.observe` / `RSSM.imagine`, backend triton)."""
    import worldmodels as wm
    from benchmarks import shapes
    from tensordict import TensorDict

    preset, kind, batch, steps = CASES[case]
    cfg = getattr(shapes, preset)
    torch.manual_seed(0)
    rssm = wm.RSSM(cfg.action, cfg.embed, **cfg.rssm_kwargs()).requires_grad_(False)
    if kind == "observe":
        embed, action = torch.randn(batch, steps, cfg.embed), torch.rand(batch, steps, cfg.action) * 2 - 1
        is_first = torch.zeros(batch, steps, dtype=torch.bool)
        noise = rssm.noise((batch, steps))
        return lambda: rssm.observe(embed, action, is_first, noise=noise, backend="triton")
    start = TensorDict(deter=torch.zeros(batch, cfg.deter), stoch=torch.zeros(batch, cfg.stoch_dim),
                       batch_size=[batch])
    noise = rssm.noise((batch, steps))
    if kind == "open":
        actions = torch.zeros(batch, steps, cfg.action)
        return lambda: rssm.imagine(start, steps, actions=actions, noise=noise, backend="triton")
    actor = wm.Actor(cfg.stoch_dim + cfg.deter, cfg.action, **cfg.actor_kwargs()).requires_grad_(False)
    noise["policy"] = actor.noise((batch, steps))
    return lambda: rssm.imagine(start, steps, policy=actor, noise=noise, backend="triton")


def host_us(case: str, calls: int, profile: bool, module: bool) -> float:
    from worldmodels.core import cuda_graphs
    from worldmodels.ops.rssm import fused

    if module:
        call = module_call(case)
    else:
        op_call, cache = make_case(case, device="cpu"), cuda_graphs.UnrollCache()
        call = lambda: op_call(fused, cache)  # noqa: E731
    with torch.no_grad():
        for _ in range(20):
            call()
        batches = []  # the least of 8 batches' means: noise only adds (timings on a shared VM swing 2x)
        for _ in range(8):
            start = time.perf_counter()
            for _ in range(calls // 8):
                call()
            batches.append(1e6 * (time.perf_counter() - start) / (calls // 8))
        us = min(batches)
        if profile:
            profiler = cProfile.Profile()
            profiler.runcall(lambda: [call() for _ in range(calls // 4)])
            pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    return us


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="?", default="V3-1m-imagine-actor,V3-1m-imagine-open,V3-s512-observe")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profile", action="store_true", help="also print cProfile's top functions")
    parser.add_argument("--module", action="store_true", help="time RSSM.observe / RSSM.imagine, not the op")
    args = parser.parse_args()
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; cases: {', '.join(CASES)}")
    if args.calls < 8:
        parser.error(f"--calls must be >= 8, got {args.calls}")
    from worldmodels.core import cuda_graphs
    cuda_graphs.GraphedUnroll = _StubGraph  # the replay path's composition, without a GPU
    cuda_graphs.captures_graphs = lambda tensor: True
    for case in cases:
        us = host_us(case, args.calls, args.profile, args.module)
        print(f"{case}{' (module)' if args.module else ''}: {us:.1f} us per call on the host before a replay",
              flush=True)


if __name__ == "__main__":
    main()
