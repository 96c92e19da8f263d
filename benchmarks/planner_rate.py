"""PlaNet's planner at the paper's settings: actions per second of `PlaNet.plan`, per backend.

    python -m benchmarks.planner_rate [--envs 1 16] [--backends auto cudnn triton loop] [--precision ieee tf32]
                                      [--out FILE]

The agent is the one `scripts/train.py +experiment=planet_dmc env=cheetah_run` builds (64x64 pixels,
6 actions, CEM horizon 12, 1000 candidates, top 100, 10 iterations: each action is 10 batched
open-loop `imagine` calls over N x 1000 rollouts plus the reward head). Two timings per row:
`ms_per_plan`, the planner called eagerly, and `ms_per_action_graphed`, the step a training run
acts with (`Agent.policy(graphed=True)`: encoder, filter step and planner replayed from one CUDA
graph; on CPU the same step, uncaptured). Timed with CUDA events after warm-up, median of
`--repeats`; on CPU with the wall clock and the test-sized planner of `--small` (the paper's
planner takes seconds per action there). `--precision` (the run's `precision=` names, each in turn, as a
run sets them: torch's float32 matmuls and the recurrent core's mode, `train/config.py` RunPrecision):
the preset's is tf32, where `auto` takes the fused open-loop kernel up to 2,048 rollouts
(`ops/rssm/fused/entry.py` OPEN_LOOP_MAX_ROWS) and cudnn above; in ieee it plans on cudnn.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from benchmarks._cli import add_device, add_out, train_config, write_json
from worldmodels.train.config import PRECISIONS, RunPrecision


def build_planet(device: str, backend: str, small: bool, precision: str = "tf32"):
    from worldmodels.train.trainer import build_agent

    overrides = ["+experiment=planet_dmc", "env=cheetah_run", f"device={device}", f"backend={backend}",
                 f"precision={precision}", "logger=none", "progress=false",
                 f"run_dir={tempfile.gettempdir()}/planner_rate"]
    if small:
        overrides += ["algo.cem.candidates=64", "algo.cem.top=8", "algo.cem.iterations=3"]
    cfg = train_config(overrides)
    info = {"obs_shape": (3, 64, 64), "action_dim": 6, "discrete": False}  # cheetah_run from pixels
    return build_agent(cfg, info).eval(), cfg


def _median_seconds(call, repeats: int, device: str) -> float:
    """Median seconds of `call()` after 3 warm-up calls: CUDA events on the GPU, the wall clock on CPU."""
    for _ in range(3):
        call()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_plan(agent, envs: int, repeats: int, device: str) -> float:
    """Median seconds of one `plan` call for `envs` filter states."""
    state = agent.rssm.initial(envs).to(device)
    state = state.apply(lambda v: torch.randn_like(v) if v.is_floating_point() else v)
    return _median_seconds(lambda: agent.plan(state), repeats, device)


def time_policy(agent, envs: int, repeats: int, device: str) -> float:
    """Median seconds of one acting step as a training run takes it (`policy("explore", graphed=True)`),
    the carry handed on from call to call."""
    policy = agent.policy("explore", graphed=True)
    obs = torch.randint(0, 256, (envs, 3, 64, 64), dtype=torch.uint8, device=device)
    is_first = torch.zeros(envs, dtype=torch.bool, device=device)
    carry = [None]

    def act():
        _, carry[0] = policy(obs, is_first, carry[0])

    return _median_seconds(act, repeats, device)


def _row(agent, cfg, precision: str, backend: str, envs: int, args) -> dict:
    seconds = time_plan(agent, envs, args.repeats, args.device)
    graphed = time_policy(agent, envs, args.repeats, args.device)
    return dict(precision=precision, backend=backend, envs=envs, ms_per_plan=round(seconds * 1e3, 3),
                actions_per_s=round(envs / seconds, 1), ms_per_action_graphed=round(graphed * 1e3, 3),
                actions_per_s_graphed=round(envs / graphed, 1), **{k: int(v) for k, v in cfg.algo.cem.items()})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 16], help="filter states planned at once")
    parser.add_argument("--backends", nargs="+", default=["auto", "cudnn", "triton", "loop"])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="64 candidates, top 8, 3 iterations (CPU smoke)")
    parser.add_argument("--precision", nargs="+", default=["tf32"], choices=PRECISIONS,
                        help="the run's precision names to time in turn (the preset's: tf32)")
    add_device(parser)
    add_out(parser)
    args = parser.parse_args(argv)
    rows = []
    torch_matmul = torch.get_float32_matmul_precision()
    try:
        for name in args.precision:
            precision = RunPrecision.of(name)
            precision.apply()  # process-wide, as a run sets it; the recurrent core's mode for the block below
            with precision.recurrent_context():
                for backend in args.backends:
                    agent, cfg = build_planet(args.device, backend, args.small, name)
                    for envs in args.envs:
                        rows.append(_row(agent, cfg, name, backend, envs, args))
                        print(rows[-1], flush=True)
    finally:
        torch.set_float32_matmul_precision(torch_matmul)
    write_json(args.out, dict(device=args.device, gpu=torch.cuda.get_device_name() if args.device == "cuda" else None,
                              torch=torch.__version__, rows=rows))


if __name__ == "__main__":
    main()
