"""Does the training loop keep pace with its own update? `scripts/train.py`'s loop against the
update alone, on the same config, in one process.

    python -m benchmarks.loop_pace env=cartpole_swingup device=cuda model=size1m backend=triton \
        batch_size=16 seq_len=64 [--seconds 60] [--out pace.json]

Arguments other than the `--` flags are the train script's Hydra overrides. After the prefill, it
runs the loop's body (`Trainer.collect(train=True)` then `Trainer.train_owed`: acting in the env,
and the updates owed at `train_ratio` with their replay sampling, run between each action and the
env step; no eval, logging or checkpoints) for `--seconds`
and counts updates per second. Then it times the update alone on one replay batch (CUDA events,
median, warm) and prints the loop's rate over 1000 / (update ms): 1.0 keeps pace, the target is
>= 0.9. The host time spent in each part of the loop (collect, sample, update calls; within collect:
the policy, which waits for its action, the env's step and the replay writes) says where the rest
goes. The policy is the trainer's acting one (`train/acting.py`: a copy refreshed before each env
step's updates, on its own CUDA stream, unless `act_while_training=false`, where it waits for the
updates in flight).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import tempfile
import time

import torch

from benchmarks._cli import add_out, train_config, write_json


def _clocked(fn, name: str, bucket: dict):
    """`fn`, adding the host time of each call to bucket[name]."""
    def call(*a, **k):
        t0 = time.perf_counter()
        out = fn(*a, **k)
        bucket[name] = bucket.get(name, 0.0) + time.perf_counter() - t0
        return out
    return call


def _timed(owner, name: str, bucket: dict) -> None:
    setattr(owner, name, _clocked(getattr(owner, name), name, bucket))


def _timed_made(owner, name: str, bucket: dict) -> None:
    """Time the calls of what `owner.name(...)` makes (the collector's policy), under `name`."""
    make = getattr(owner, name)
    setattr(owner, name, lambda *a, **k: _clocked(make(*a, **k), name, bucket))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.loop_pace", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="how long the loop runs after the prefill")
    add_out(p)
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="also print the N functions with the most own time in the timed loop (cProfile)")
    p.add_argument("--acting-priority", choices=["high", "normal"], default="high",
                   help="the acting stream's priority: the trainer's (high) or the learner's (normal), an A/B")
    args, overrides = p.parse_known_args(argv)
    from worldmodels.core import recurrent_backend
    from worldmodels.train import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        cfg = train_config(["logger=none", "progress=false", f"run_dir={tmp}/run", *overrides])
        trainer = Trainer(cfg)
        c = trainer.counters
        if args.acting_priority == "normal" and trainer.acting.stream is not None:
            trainer.acting.stream = torch.cuda.Stream(trainer.device)
        try:
            with recurrent_backend(cfg.backend), trainer.precision.recurrent_context():
                def body():  # Trainer.train's loop without its clocks (log, eval, save)
                    trainer.collect(train=True)
                    trainer.train_owed()

                while c["env_steps"] < cfg.prefill or not trainer.replay.ready():
                    trainer.collect()
                for _ in range(20):  # the first updates compile the kernels and capture: not timed
                    body()
                if trainer.device.type == "cuda":
                    torch.cuda.synchronize()
                host: dict[str, float] = {}
                _timed(trainer, "collect", host)
                _timed(trainer.replay, "sample", host)
                _timed(trainer.collector, "add", host)  # inside collect: replay writes
                _timed(trainer.env, "step_and_maybe_reset", host)  # inside collect: the env
                _timed_made(trainer.acting, "policy", host)  # inside collect: acting
                _timed(trainer, "update_on", host)
                profiler = cProfile.Profile() if args.profile else None
                u0, s0, t0 = c["updates"], c["env_steps"], time.perf_counter()
                if profiler:
                    profiler.enable()
                while time.perf_counter() - t0 < args.seconds:
                    body()
                if profiler:
                    profiler.disable()
                    pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
                if trainer.device.type == "cuda":
                    torch.cuda.synchronize()
                wall = time.perf_counter() - t0
                updates, env_steps = c["updates"] - u0, c["env_steps"] - s0
                host = dict(host)  # the parts alone below go through the same wrappers
                update_ms = _update_alone(trainer, repeats=max(20, min(updates, 200)))
                collect_ms = _collect_alone(trainer, repeats=50)
        finally:
            trainer.logger.close()
            trainer.run.release()
    loop_ups = updates / wall
    alone_ups = 1000 / update_ms
    gpu = torch.cuda.get_device_name(trainer.device) if trainer.device.type == "cuda" else None
    row = {"overrides": overrides, "acting_priority": args.acting_priority, "gpu": gpu,
           "seconds": wall, "updates": updates, "env_steps": env_steps,
           "loop_updates_per_s": loop_ups, "env_steps_per_s": env_steps / wall, "update_alone_ms": update_ms,
           "update_alone_per_s": alone_ups, "pace": loop_ups / alone_ups,
           "collect_alone_ms": collect_ms, "collects_per_update": (env_steps / trainer.steps_per_collect) / updates,
           "host_s": {k: v for k, v in host.items()}, "host_share": {k: v / wall for k, v in host.items()}}
    print(json.dumps(row, indent=1))
    print(f"\nloop {loop_ups:.1f} updates/s ({env_steps / wall:.0f} frames/s) vs the update alone "
          f"{update_ms:.2f} ms = {alone_ups:.1f} /s: pace {row['pace']:.2f} (target >= 0.9); one collect alone "
          f"{collect_ms:.2f} ms, {row['collects_per_update']:.2f} per update; host share "
          + ", ".join(f"{k} {v:.0%}" for k, v in row["host_share"].items()))
    write_json(args.out, row)


def _collect_alone(trainer, repeats: int) -> float:
    """Median ms of one `Trainer.collect` (collect_steps agent steps in the env) with the GPU idle."""
    samples = []
    for _ in range(repeats):
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        trainer.collect()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def _update_alone(trainer, repeats: int) -> float:
    """Median ms of the trainer's update (`GraphedUpdate` on CUDA with cuda_graphs=true, at the run's
    precision) on one replay batch (CUDA events on GPU, the host clock on CPU)."""
    batch = trainer.replay.sample().to(trainer.device)
    update = trainer.update_on
    for _ in range(5):
        update(batch)
    if trainer.device.type != "cuda":
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            update(batch)
            samples.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(samples)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    torch.cuda.synchronize()
    for start, end in events:
        start.record()
        update(batch)
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


if __name__ == "__main__":
    main()
