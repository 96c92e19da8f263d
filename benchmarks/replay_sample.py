"""Replay sampling as a training run pays for it: one env step added, then one batch sampled, at
several stored sizes.

    python -m benchmarks.replay_sample [--sizes 50000 200000 800000] [--envs 1] [--batch 50]
                                       [--seq-len 50] [--repeats 50] [--cross-episodes] [--out FILE]

For each size, a `Replay` of that capacity is filled to the brim (`--envs` envs writing interleaved
episodes of `--episode` steps, added in chunks), so the timed adds overwrite the oldest steps as a
long run's do. Then, `--repeats` times: add one step of each env, then sample a batch [B, T]; the
mean ms of the pair is the row's `add+sample`, and of each part alone its `add` and `sample`; `sample
alone` times `--repeats` samples with no add between them. `fill s` is the time to add all the steps
(in chunks of 10,000). The steps are small (a 4-float observation, an action, a reward, the flags and
keys the collector writes), so 800K steps fit in memory; the gather of a batch is then cheap, and what
grows with the size is the sampler's own bookkeeping. Host only (replay lives on the CPU); single thread
unless `--threads`.
"""

from __future__ import annotations

import argparse
import time

import torch
from tensordict import TensorDict

from benchmarks._cli import add_out, write_json
from worldmodels.data import Replay


def env_steps(envs: int, episode: int, start: int, count: int) -> TensorDict:
    """Steps `start` .. `start + count` (each one step of every env, env-major within a step) of
    `envs` envs running episodes of `episode` steps, laid out as the collector writes them."""
    t = torch.arange(start, start + count).repeat_interleave(envs)  # global agent step
    env = torch.arange(envs).repeat(count)
    n = t.numel()
    step = t % episode
    return TensorDict({
        "obs": torch.randn(n, 4), "action": torch.randn(n, 1), "reward": torch.randn(n),
        "is_first": step == 0, "is_last": step == episode - 1, "is_terminal": torch.zeros(n, dtype=torch.bool),
        "episode": (t // episode) * envs + env, "step": step, "stream": env, "stream_step": t,
    }, batch_size=[n])


def row(size: int, args) -> dict:
    replay = Replay(capacity=size, batch_size=args.batch, seq_len=args.seq_len, cross_episodes=args.cross_episodes)
    per_env = -(-size // args.envs)  # agent steps that fill the capacity
    chunk = max(1, 10_000 // args.envs)
    t0 = time.perf_counter()
    for start in range(0, per_env, chunk):
        replay.add(env_steps(args.envs, args.episode, start, min(chunk, per_env - start)))
    fill = time.perf_counter() - t0
    replay.sample()  # warm-up
    adds = [env_steps(args.envs, args.episode, per_env + i, 1) for i in range(args.repeats + 1)]
    replay.add(adds[0])
    replay.sample()
    add_s = sample_s = 0.0
    for step in adds[1:]:
        t0 = time.perf_counter()
        replay.add(step)
        t1 = time.perf_counter()
        replay.sample()
        t2 = time.perf_counter()
        add_s, sample_s = add_s + t1 - t0, sample_s + t2 - t1
    t0 = time.perf_counter()
    for _ in range(args.repeats):
        replay.sample()
    alone = time.perf_counter() - t0
    ms = 1e3 / args.repeats
    return dict(size=len(replay), fill_s=round(fill, 2), add_sample_ms=round((add_s + sample_s) * ms, 3),
                add_ms=round(add_s * ms, 3), sample_ms=round(sample_s * ms, 3), sample_alone_ms=round(alone * ms, 3))


def table(rows: list[dict]) -> str:
    lines = [f"{'stored steps':>12} {'fill s':>8} {'add+sample ms':>14} {'add ms':>8} {'sample ms':>10} "
             f"{'sample alone ms':>16}"]
    for r in rows:
        lines.append(f"{r['size']:>12,} {r['fill_s']:>8.2f} {r['add_sample_ms']:>14.3f} {r['add_ms']:>8.3f} "
                     f"{r['sample_ms']:>10.3f} {r['sample_alone_ms']:>16.3f}")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.replay_sample", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[50_000, 200_000, 800_000], help="stored steps")
    p.add_argument("--envs", type=int, default=1, help="envs writing interleaved (one step each per add)")
    p.add_argument("--episode", type=int, default=1000, help="steps per episode")
    p.add_argument("--batch", type=int, default=50, help="B")
    p.add_argument("--seq-len", type=int, default=50, help="T")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--cross-episodes", action="store_true", help="sequences of env streams (DreamerV3's replay)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    add_out(p)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rows = []
    for size in args.sizes:
        rows.append(row(size, args))
        print(rows[-1], flush=True)
    print(f"\nB={args.batch} T={args.seq_len}, {args.envs} env(s), episodes of {args.episode} steps, "
          f"cross_episodes={args.cross_episodes}, torch {torch.__version__}, {args.threads} thread(s)")
    print(table(rows))
    write_json(args.out, dict(args=vars(args), torch=torch.__version__, rows=rows))
    return rows


if __name__ == "__main__":
    main()
