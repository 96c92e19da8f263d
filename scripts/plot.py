"""Learning curves: `python scripts/plot.py runs/a runs/b ... --out curves.png`.

Reads each run directory's `metrics.jsonl` (the `--key` values, `eval/return` by default, against
env steps) and `config.yaml`. Runs whose configs are equal once the seed and bookkeeping fields
(IGNORED) are left out are seeds of one experiment: they are drawn as one curve, the mean over
seeds, with a band from the lowest to the highest seed and each seed as a thin line. A step
logged twice in one run (a resumed run repeats the steps after its checkpoint) counts once, the
last value. Curves are labelled by env and algo, plus the config fields that differ between
the curves of the same env and algo. Prints a table of each curve's points (mean, min, max over seeds) too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

# Config fields that say where and how a run is recorded, not what is trained.
IGNORED = ("seed", "run_dir", "resume", "progress", "logger", "log_every", "save_every", "threads", "check_finite")


def flatten(config: dict, prefix: str = "") -> dict[str, object]:
    """{"algo": {"cem": {"top": 10}}} -> {"algo.cem.top": 10}."""
    flat: dict[str, object] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def read_run(run_dir: Path, key: str) -> tuple[dict[str, object], np.ndarray, np.ndarray]:
    """(flattened config without IGNORED fields, steps [n], values [n]) of one run directory."""
    metrics, config_file = run_dir / "metrics.jsonl", run_dir / "config.yaml"
    for path in (metrics, config_file):
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: is {str(run_dir)!r} a run directory of scripts/train.py?")
    config = {k: v for k, v in flatten(OmegaConf.to_container(OmegaConf.load(config_file))).items()
              if k.split(".")[0] not in IGNORED}
    by_step: dict[int, float] = {}
    seen: set[str] = set()
    for line in metrics.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        seen.update(record)
        if key in record:
            by_step[int(record["step"])] = float(record[key])  # a repeated step: the last value
    if not by_step:
        raise ValueError(f"--key={key!r} is not in {metrics} (its keys: {sorted(seen - {'step'})})")
    steps = np.array(sorted(by_step))
    return config, steps, np.array([by_step[s] for s in steps])


def group_runs(run_dirs: list[Path], key: str) -> list[dict]:
    """Runs with equal configs (IGNORED left out) as groups: {"config", "runs": [(dir, steps, values)]}."""
    groups: list[dict] = []
    for run_dir in run_dirs:
        config, steps, values = read_run(run_dir, key)
        for group in groups:
            if group["config"] == config:
                group["runs"].append((run_dir, steps, values))
                break
        else:
            groups.append({"config": config, "runs": [(run_dir, steps, values)]})
    for group in groups:
        group["label"] = label(group["config"], [g["config"] for g in groups])
    return groups


def label(config: dict, configs: list[dict]) -> str:
    """env and algo, then the fields whose values differ between the groups of that env and algo."""
    names = ("env.name", "algo.name")
    peers = [c for c in configs if all(c.get(k) == config.get(k) for k in names)]
    keys = sorted({k for c in peers for k in c} - set(names))
    differ = [k for k in keys if len({json.dumps(c.get(k), sort_keys=True) for c in peers}) > 1]
    return " ".join(str(config.get(k)) for k in names if k in config) + "".join(f" {k}={config.get(k)}" for k in differ)


def seed_stats(runs: list[tuple[Path, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, ...]:
    """(steps, mean, min, max, count) over the seeds that logged each step."""
    steps = np.array(sorted({int(s) for _, run_steps, _ in runs for s in run_steps}))
    table = np.full((len(runs), len(steps)), np.nan)
    for i, (_, run_steps, values) in enumerate(runs):
        table[i, np.searchsorted(steps, run_steps)] = values
    count = (~np.isnan(table)).sum(0)
    return steps, np.nanmean(table, 0), np.nanmin(table, 0), np.nanmax(table, 0), count


def plot(groups: list[dict], key: str, out: Path, title: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for i, group in enumerate(groups):
        color = f"C{i}"
        steps, mean, low, high, _ = seed_stats(group["runs"])
        seeds = len(group["runs"])
        ax.plot(steps, mean, color=color, lw=2, marker="o", ms=3,
                label=f"{group['label']} ({seeds} seed{'s' if seeds > 1 else ''})")
        if seeds > 1:
            ax.fill_between(steps, low, high, color=color, alpha=0.2, lw=0)
            for _, run_steps, values in group["runs"]:
                ax.plot(run_steps, values, color=color, lw=0.7, alpha=0.5)
    ax.set_xlabel("env steps")
    ax.set_ylabel(f"{key} (mean over seeds; band: min to max)")
    ax.set_title(title or key)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (each with metrics.jsonl and config.yaml)")
    parser.add_argument("--out", type=Path, required=True, help="image file to write (.png, .svg, .pdf)")
    parser.add_argument("--key", default="eval/return", help="metric to plot against env steps (default: eval/return)")
    parser.add_argument("--title", default=None, help="plot title (default: the key)")
    args = parser.parse_args(argv)
    try:
        groups = group_runs(args.runs, args.key)
    except (FileNotFoundError, ValueError) as err:
        print(f"plot.py: {err}", file=sys.stderr)
        return 2
    plot(groups, args.key, args.out, args.title)
    for group in groups:
        steps, mean, low, high, count = seed_stats(group["runs"])
        print(f"{group['label']}: {', '.join(str(d) for d, _, _ in group['runs'])}")
        for row in zip(steps, mean, low, high, count):
            print("  step {:>8d}  mean {:>9.1f}  min {:>9.1f}  max {:>9.1f}  seeds {}".format(*row))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
