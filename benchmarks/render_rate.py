"""How fast a frameless checkpoint's frames render again, by the number of processes.

    python -m benchmarks.render_rate +experiment=planet_dmc env=cheetah_run [--states 32768] \
        [--workers 8 16] [--repeats 1] [--out FILE]

A resume of a run saved with `replay.save_frames=false` renders every stored frame again from its
physics state (`StateRenderer`, `worldmodels/envs/suites/dmc.py`); at 1M frames that is 250K-500K
frames. Arguments other than the `--` flags are the train script's Hydra overrides; the task, its
keyword arguments, frame size and camera come from their `env` node, as a run's. The states are those
of `--states` steps of random actions on the task loaded bare from dm_control (resets included). Each
row renders all of them once with that many processes at most, their start included, as a resume
does; with `--repeats` the process counts take turns, so that a warming host does not favour one.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks._cli import add_out, train_config, write_json
from benchmarks._dmc import load_bare, random_agent_step


def random_states(env_cfg, n: int):
    """(float64 physics states [n, S] of `n` steps of uniform random actions, with the run's action
    repeat between states and a reset where an episode ends; `domain/task`; the run's env options)."""
    import numpy as np

    bare = load_bare(env_cfg) if env_cfg.pixels else None
    if bare is None:
        raise SystemExit(f"env: {env_cfg.get('task') or env_cfg.get('name')}, pixels={env_cfg.pixels}: expected a "
                         "dm_control task from pixels (only those render their frames again)")
    env, task, opts = bare
    step = random_agent_step(env, opts["action_repeat"])
    states = []
    for _ in range(n):
        step()
        states.append(env.physics.get_state().copy())
    return np.stack(states), task, opts


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.render_rate", description=__doc__.split("\n\n")[0])
    p.add_argument("--states", type=int, default=32768, help="physics states rendered per row")
    p.add_argument("--workers", type=int, nargs="+", default=[8, 16], help="process counts, one row each")
    p.add_argument("--repeats", type=int, default=1, help="renders per process count (median), in turns")
    add_out(p)
    args, overrides = p.parse_known_args(argv)
    for flag, value, least in (("--states", args.states, 1), ("--repeats", args.repeats, 1)):
        if value < least:
            p.error(f"{flag}={value}: expected an int >= {least}")
    if min(args.workers) < 1:
        p.error(f"--workers={args.workers}: expected ints >= 1")
    cfg = train_config(["logger=none", "progress=false", *overrides])
    from worldmodels.envs.suites.dmc import PARALLEL_FROM, StateRenderer

    states, task, opts = random_states(cfg.env, args.states)
    seconds = {w: [] for w in args.workers}
    for _ in range(args.repeats):
        for w in args.workers:
            render = StateRenderer(task, opts["kwargs"] or None, opts["size"], opts["camera"], max_workers=w)
            t0 = time.perf_counter()
            frames = render(states)
            seconds[w].append(time.perf_counter() - t0)
            assert frames.shape == (args.states, opts["size"], opts["size"], 3), frames.shape
    rows = {str(w): {"s": statistics.median(s), "frames_per_s": args.states / statistics.median(s), "runs_s": s}
            for w, s in seconds.items()}
    result = {"overrides": overrides, "task": task, "size": opts["size"], "states": args.states,
              "in_process_below": PARALLEL_FROM, "rows": rows}
    print(f"{task} at {opts['size']}x{opts['size']}: {args.states} states rendered again"
          + (" (in this process: fewer than PARALLEL_FROM)" if args.states < PARALLEL_FROM else ""))
    for w, row in rows.items():
        print(f"  {w:>3} processes at most: {row['s']:7.2f} s, {row['frames_per_s']:7.0f} frames/s")
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
