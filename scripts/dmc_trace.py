"""Whether two MuJoCo / dm_control builds step a task alike: trace it under fixed actions, then compare.

    python scripts/dmc_trace.py finger spin --out new.npz     # here (MuJoCo 3.17, dm_control 1.0.50)
    python scripts/dmc_trace.py finger spin --out old.npz     # in a venv with mujoco==2.3.3 dm_control==1.0.11
    python scripts/dmc_trace.py --compare old.npz new.npz

A trace is `--episodes` episodes of `--steps` raw env steps each (no action repeat), episode i started
with the task's random init seeded i and driven by actions uniform in the action box, drawn from numpy's
generator seeded i and each held for `--hold` steps (held actions move the bodies further than white
noise, so contacts happen). It stores every step's observations (flattened, in the spec's key order)
and reward. The script needs numpy and dm_control only, so it runs in an old environment as it is.

`--compare` prints, per episode, the largest observation difference over the first `--early` steps,
the first step that differs by more than `--tol`, and both returns. Chaotic dynamics amplify rounding,
so two builds that agree to 1e-10 early and drift apart late step alike; a build that differs shows
it in the first steps.
"""

from __future__ import annotations

import argparse

import numpy as np


def trace(domain: str, task: str, episodes: int, steps: int, hold: int) -> dict[str, np.ndarray]:
    """{"obs{i}": [steps, O], "reward{i}": [steps]} for episodes i = 0..episodes-1."""
    from dm_control import suite

    out = {}
    for i in range(episodes):
        env = suite.load(domain, task, task_kwargs={"random": i})
        spec = env.action_spec()
        env.reset()
        rng = np.random.default_rng(i)
        draws = rng.uniform(spec.minimum, spec.maximum, size=(-(-steps // hold), *spec.shape))
        obs, reward = [], []
        for action in np.repeat(draws, hold, axis=0)[:steps]:
            step = env.step(action)
            obs.append(np.concatenate([np.ravel(v) for v in step.observation.values()]))
            reward.append(step.reward or 0.0)
        out[f"obs{i}"], out[f"reward{i}"] = np.asarray(obs, np.float64), np.asarray(reward, np.float64)
    return out


def compare(a: dict[str, np.ndarray], b: dict[str, np.ndarray], early: int, tol: float) -> list[dict]:
    """Per episode: the largest observation difference over the first `early` steps, the first step
    whose difference exceeds `tol` (None: none does), and both returns."""
    episodes = sorted(int(k[3:]) for k in a if k.startswith("obs"))
    if episodes != sorted(int(k[3:]) for k in b if k.startswith("obs")):
        raise SystemExit("the traces hold different episodes: trace both with the same --episodes")
    rows = []
    for i in episodes:
        oa, ob = a[f"obs{i}"], b[f"obs{i}"]
        if oa.shape != ob.shape:
            raise SystemExit(f"episode {i}: observations {oa.shape} against {ob.shape}: trace both alike")
        diff = np.abs(oa - ob).max(axis=1)
        over = np.flatnonzero(diff > tol)
        rows.append({"episode": i, "early_max_diff": float(diff[:early].max()),
                     "first_step_over_tol": int(over[0]) if over.size else None,
                     "return_a": float(a[f"reward{i}"].sum()), "return_b": float(b[f"reward{i}"].sum())})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("domain", nargs="?", help="dm_control domain, e.g. finger")
    parser.add_argument("task", nargs="?", help="its task, e.g. spin")
    parser.add_argument("--out", help="the trace to write (.npz)")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--steps", type=int, default=1000, help="raw env steps per episode")
    parser.add_argument("--hold", type=int, default=10, help="steps each random action is held")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two traces to compare")
    parser.add_argument("--early", type=int, default=100, help="steps the early difference is taken over")
    parser.add_argument("--tol", type=float, default=1e-6)
    args = parser.parse_args(argv)
    if args.compare:
        a, b = (dict(np.load(path)) for path in args.compare)
        rows = compare(a, b, args.early, args.tol)
        for r in rows:
            print(f"episode {r['episode']:3d}: max |obs diff| over the first {args.early} steps "
                  f"{r['early_max_diff']:.1e}, first step over {args.tol:g}: {r['first_step_over_tol']}, "
                  f"returns {r['return_a']:g} / {r['return_b']:g}")
        print(f"all: early max {max(r['early_max_diff'] for r in rows):.1e}; returns equal in "
              f"{sum(r['return_a'] == r['return_b'] for r in rows)} of {len(rows)} episodes")
        return
    if not (args.domain and args.task and args.out):
        parser.error("give DOMAIN TASK --out FILE to trace, or --compare A B")
    for name in ("episodes", "steps", "hold"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} must be >= 1")
    np.savez(args.out, **trace(args.domain, args.task, args.episodes, args.steps, args.hold))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
