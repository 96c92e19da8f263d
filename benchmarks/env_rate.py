"""What one agent step of a run's env costs, part by part, with the GPU idle and with it busy.

    python -m benchmarks.env_rate +experiment=dreamer_v1_dmc env=cartpole_swingup [--steps 300] \
        [--load-ms 30] [--out FILE]

Arguments other than the `--` flags are the train script's Hydra overrides; the env is built from
their `env` node by `make_env`, as a run builds it (one env). Each row is the mean ms per agent step
over `--steps` steps of random actions:

- `env_step`: the run's env, torchrl's `step` through the suite's wrappers and transforms (a reset
  where an episode ends, as the collector's `step_and_maybe_reset`);
- for dm_control tasks, the same task loaded bare: `physics`, its `action_repeat` physics steps, and
  with pixels `render`, one frame at the run's size and camera (dm_control renders through OpenGL:
  EGL on the GPU where there is one). `env_step` less these two is the wrappers' and torchrl's share.

With `--load-ms` (CUDA only) every row is timed again while a side thread keeps the GPU busy with
matmuls of about that many ms each, as a run's updates do while its host steps the env: where the
render waits for the GPU, its row grows there.
"""

from __future__ import annotations

import argparse
import threading
import time

import torch

from benchmarks._cli import add_out, train_config, write_json
from benchmarks._dmc import load_bare, random_agent_step


def per_step_ms(step, steps: int) -> float:
    """Mean ms of `step()` over `steps` calls, after 10 untimed ones."""
    for _ in range(10):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) * 1e3 / steps


def run_env_step(env):
    """One agent step of the run's env with a random action; a reset where the episode ended."""
    state = {"td": env.reset()}

    def step():
        td = state["td"]
        td["action"] = env.action_spec.rand()
        _, state["td"] = env.step_and_maybe_reset(td)
    return step


def bare_dmc(env_cfg):
    """(physics step, render) callables of the task loaded bare from dm_control with the run's
    options, or None for other suites; `render` is None without pixels."""
    bare = load_bare(env_cfg)
    if bare is None:
        return None
    env, _, opts = bare
    physics = random_agent_step(env, opts["action_repeat"])

    def render():
        env.physics.render(height=opts["size"], width=opts["size"], camera_id=opts["camera"])
    return physics, (render if opts["pixels"] else None)


def matmul_side(ms: float, time_at, start: int = 1024, largest: int = 16384, tries: int = 8) -> tuple[int, float]:
    """(n, ms of one n x n matmul) with that time within 20% of `ms` where `largest` allows, found by
    rescaling n by the cube root of the time ratio from each measurement (`time_at(n)` -> ms), up or
    down, in at most `tries` measurements; n stays in [64, largest], a multiple of 64."""
    n, took = start, time_at(start)
    for _ in range(tries - 1):
        if 0.8 * ms <= took <= 1.2 * ms:
            break
        ratio = (ms / max(took, 1e-3)) ** (1 / 3)
        step = min(max(ratio, 0.5), 4.0)  # a noisy first, small measurement does not leap to the limit
        nxt = min(largest, max(64, int(round(n * step / 64)) * 64))
        if nxt == n:
            break
        n, took = nxt, time_at(nxt)
    return n, took


class GpuLoad:
    """A side thread that keeps the GPU busy with one square fp32 matmul after another, each sized to
    take about `ms` (`matmul_side`, measured once at the start), synchronising after each so the queue
    stays short."""

    def __init__(self, ms: float, device: str = "cuda"):
        mats = {}

        def time_at(n: int) -> float:  # ms of one n x n matmul, warm, on `device`
            a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
            mats["a"], mats["b"] = a, b
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a @ b
            start.record()
            a @ b
            end.record()
            end.synchronize()
            return start.elapsed_time(end)

        n, self.matmul_ms = matmul_side(ms, time_at)
        self.a, self.b = mats["a"], mats["b"]  # the last measured: side n
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            while not self.stop.is_set():
                self.a @ self.b
                stream.synchronize()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def rows(env_cfg, steps: int) -> dict:
    """Mean ms per agent step of the env and, for dm_control, its bare physics and render."""
    from worldmodels.envs.factory import make_env

    env = make_env(env_cfg, seed=0, num_envs=1)
    out = {"env_step": per_step_ms(run_env_step(env), steps)}
    env.close()
    bare = bare_dmc(env_cfg)
    if bare:
        physics, render = bare
        out["physics"] = per_step_ms(physics, steps)
        if render:
            out["render"] = per_step_ms(render, steps)
        out["wrappers"] = out["env_step"] - out["physics"] - out.get("render", 0.0)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.env_rate", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="agent steps timed per row (mean)")
    p.add_argument("--load-ms", type=float, default=None,
                   help="also time every row beside a side thread's GPU matmuls of about this many ms (CUDA)")
    add_out(p)
    args, overrides = p.parse_known_args(argv)
    if args.steps < 1:
        p.error(f"--steps={args.steps}: expected an int >= 1")
    if args.load_ms is not None and not (args.load_ms > 0 and torch.cuda.is_available()):
        p.error(f"--load-ms={args.load_ms}: expected a number > 0 of ms, on a machine with CUDA "
                f"(CUDA available: {torch.cuda.is_available()})")
    cfg = train_config(["logger=none", "progress=false", *overrides])
    env_cfg = cfg.env
    result = {"overrides": overrides, "steps": args.steps, "pixels": bool(env_cfg.pixels),
              "action_repeat": env_cfg.action_repeat, "idle_ms": rows(env_cfg, args.steps)}
    if args.load_ms is not None:
        with GpuLoad(args.load_ms) as load:
            result["gpu"] = torch.cuda.get_device_name()
            result["load_matmul_ms"] = load.matmul_ms
            result["busy_ms"] = rows(env_cfg, args.steps)
    print(f"ms per agent step (action repeat {result['action_repeat']}, pixels {result['pixels']}, "
          f"mean of {args.steps}):")
    for part, ms in result["idle_ms"].items():
        busy = result.get("busy_ms", {}).get(part)
        print(f"  {part:>9} {ms:8.3f}" + (f"   beside the GPU load: {busy:8.3f}" if busy is not None else ""))
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
