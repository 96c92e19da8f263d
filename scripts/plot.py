"""Learning curves: `python scripts/plot.py runs/a runs/b ... [--out curves.png]`.

Without `--out`, the image is `curves.png` in the one folder given (`plot.py runs/my-run` writes
`runs/my-run/curves.png`), or in the current directory for several (`DEFAULT_OUT`).

A folder that is not a run directory itself (a sweep's `runs/sweep-<time>/`: scripts/train.py -m)
stands for every run directory under it (`run_dirs`).

Reads each run directory's `metrics.jsonl` (the `--key` values, `eval/return` by default, against
env steps) and `config.yaml`. Runs whose configs are equal once the seed and bookkeeping fields
(IGNORED) are left out are seeds of one experiment: they are drawn as one curve, the mean over
seeds, with a band from the lowest to the highest seed and each seed as a thin line. A step
logged twice in one run (a resumed run repeats the steps after its checkpoint) counts once, the
last value. Curves are labelled by env and algo, plus the config fields that differ between
the curves of the same env and algo (or by `--labels`, one per run). Prints a table of each
curve's points (mean, min, max over seeds) too.

`--bin STEPS` averages each run's values in bins of STEPS env steps (`bin_mean`): one training
episode's return per point is noise; the papers' and the reference's curves are such bin means.

`--reference [JSON]` draws a reference's scores (mean line and min-max band over its seeds) under the
curves of the tasks it holds, one panel per task, and our curves are averaged in its bins. Without a
file, each run gets the JAX DreamerV3 reference of its env.suite and observations (`REFERENCES`, in
docs/results/reference/; docs/reference-scores.md): DMC proprio (18 tasks, the 2023 score file), DMC
from pixels (20 tasks, the 2024 file), Atari 100K (26 games, the 2024 file; the 2023 file's is
dreamerv3_atari100k_2023.json). Those hold training-episode returns in 10K-frame bins; our curves are
then training-episode returns (`episode/return` at the frame the episode ended; a run without them
falls back to `eval/return`). docs/results/reference/dreamer_v1_dmc_pixels.json is Dreamer V1's
(danijar/dreamer) test returns in 100K-frame bins that end at 105K, 205K, ... (its file's `key` and
`offset`); our curves are then greedy evals (`eval/return`), binned alike.
A table compares them with the reference at the file's `at` frames (`--at` picks others), each in the
reference bin at or before it; a run on a task its reference lacks says so.
`--one-episode-per-step` keeps, of a run's training episodes that end on the same frame (several envs
ending together), only the last written, before binning: what reached the 2023 reference's score
files (`one_episode_per_step`).
A run whose `metrics.jsonl` did not survive may keep its training-episode returns as
`binned_returns.json` (`BINNED`: its bin ends and means, as they were read off the run while it
ran) beside its `config.yaml`; such a run is drawn with `--reference` only.
`--make-reference <checkout or git dir>` rebuilds such files from the authors' own score files at the
checkout's HEAD (or `--commit`), recording the commit they were read at: from danijar/dreamerv3, one
file per score file of `DREAMERV3_SCORES` the commit holds, into the folder `--out` (`make_reference`);
from danijar/dreamer, `scores/dreamer.json` into the file `--out` (`make_dreamer_reference`).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
from omegaconf import OmegaConf

# Config fields that say where and how a run is recorded, not what is trained.
IGNORED = ("seed", "run_dir", "resume", "progress", "logger", "log_every", "save_every", "threads", "check_finite")
DEFAULT_OUT = "curves.png"
"""The image's name without --out (see `default_out`)."""
REFERENCE_DIR = Path(__file__).resolve().parents[1] / "docs" / "results" / "reference"
REFERENCE = REFERENCE_DIR / "dreamerv3_dmc_proprio.json"
REFERENCES = {  # (env.suite, env.pixels) -> the reference such a run is compared with; any other: REFERENCE
    ("dmc", False): REFERENCE,
    ("dmc", True): REFERENCE_DIR / "dreamerv3_dmc_vision.json",
    ("atari", True): REFERENCE_DIR / "dreamerv3_atari100k.json",
}
PICK_BY_RUN = "by run"  # --reference without a file: each run's from REFERENCES
DREAMER_SCORES = "scores/dreamer.json"  # in danijar/dreamer: Dreamer V1's test returns, 20 DMC tasks from pixels
TABLE_FRAMES = (20_000, 50_000, 100_000, 200_000, 500_000)  # --at: the rows of the reference table
BINNED = "binned_returns.json"  # {"binsize", "bin_ends", "means", "last_frame", ...}: a run kept as bin means only


BINSIZE = 10_000  # frames: the DreamerV3 references' bins


class ScoreFile(NamedTuple):
    """A danijar/dreamerv3 score file that --make-reference reads, and the reference it writes."""
    out: str  # the reference's file name (REFERENCE_DIR)
    name: str  # what it holds, for legends and tables
    per_episode: bool  # False: the file's x are BINSIZE-frame bins already; True: one x per episode, binned here
    at: tuple[int, ...]  # the table's frames
    runs: str  # whose runs they are, for its "reduction"


DREAMERV3_SCORES = {  # path in danijar/dreamerv3 (the 2023 files at 423291a, the 2024 ones at 2411f7d and later)
    "scores/data/dmcproprio_dreamerv3.json.gz": ScoreFile(
        "dreamerv3_dmc_proprio.json", "DreamerV3 DMC proprio (2023 scores)", False, TABLE_FRAMES,
        "the 2023 code's (dreamerv3/configs.yaml at 423291a, blocks defaults and dmc_proprio; our protocol: "
        "configs/experiment/dmc_proprio_2023.yaml). Of the episodes that several envs ended on the same step, "
        "its logger kept one (docs/reference-scores.md; scripts/plot.py --one-episode-per-step)"),
    "scores/dmc_vision-dreamerv3.json.gz": ScoreFile(
        "dreamerv3_dmc_vision.json", "DreamerV3 DMC vision (2024 scores)", True,
        (100_000, 200_000, 500_000, 1_000_000),
        "the 2024 code's (dreamerv3/configs.yaml at 2411f7d, blocks defaults, size12m and dmc_vision; our "
        "protocol: configs/experiment/dmc_vision.yaml)"),
    "scores/data/atari100k_dreamerv3.json.gz": ScoreFile(
        "dreamerv3_atari100k_2023.json", "DreamerV3 Atari 100K (2023 scores)", False, (100_000, 200_000, 400_000),
        "the 2023 code's (dreamerv3/configs.yaml at 423291a, block atari100k: one env, 4 frames per step, no "
        "sticky actions, up to 30 no-ops, 150K agent steps = 600K frames; the benchmark's budget is 400K)"),
    "scores/atari100k-dreamerv3.json.gz": ScoreFile(
        "dreamerv3_atari100k.json", "DreamerV3 Atari 100K (2024 scores)", True, (100_000, 200_000, 400_000),
        "the 2024 code's (dreamerv3/configs.yaml at 2411f7d, block atari100k: one env, 4 frames per step, "
        "400K frames)"),
}
TASK_NAMES = {"cup_catch": "ball_in_cup_catch"}  # the 2023 files' name of dm_control's ball_in_cup/catch


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


def read_config(run_dir: Path) -> dict[str, object]:
    """The flattened config of a run directory without IGNORED fields."""
    metrics, config_file = run_dir / "metrics.jsonl", run_dir / "config.yaml"
    if not config_file.is_file() or not (metrics.is_file() or (run_dir / BINNED).is_file()):
        missing = metrics if config_file.is_file() else config_file
        raise FileNotFoundError(f"{missing} does not exist: is {str(run_dir)!r} a run directory of scripts/train.py?")
    return {k: v for k, v in flatten(OmegaConf.to_container(OmegaConf.load(config_file))).items()
            if k.split(".")[0] not in IGNORED}


def run_dirs(paths: list[Path]) -> list[Path]:
    """`paths` with each folder that is not a run directory (no metrics.jsonl) replaced by the run
    directories under it, in name order (a sweep: one per run, its checkpoints and files skipped)."""
    found: list[Path] = []
    for path in paths:
        if (path / "metrics.jsonl").is_file() or (path / BINNED).is_file() or not path.is_dir():
            found.append(path)  # a run directory (or a missing path: read_config names it)
            continue
        runs = sorted({p.parent for name in ("metrics.jsonl", BINNED) for p in path.rglob(name)
                       if (p.parent / "config.yaml").is_file()})
        if not runs:
            raise FileNotFoundError(f"{str(path)!r} holds no run directory (metrics.jsonl and config.yaml) "
                                    "at any depth: is it a run or sweep directory of scripts/train.py?")
        found += runs
    return found


def records(run_dir: Path) -> list[dict]:
    if not (run_dir / "metrics.jsonl").is_file():  # read_config let it through: it keeps BINNED only
        raise ValueError(f"{run_dir} keeps only {BINNED} (its training returns' bin means): "
                         "plot it with --reference")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def read_run(run_dir: Path, key: str) -> tuple[dict[str, object], np.ndarray, np.ndarray]:
    """(flattened config without IGNORED fields, steps [n], values [n]) of one run directory."""
    config = read_config(run_dir)
    by_step: dict[int, float] = {}
    seen: set[str] = set()
    for record in records(run_dir):
        seen.update(record)
        if key in record:
            by_step[int(record["step"])] = float(record[key])  # a repeated step: the last value
    if not by_step:
        raise ValueError(f"--key={key!r} is not in {run_dir / 'metrics.jsonl'} (its keys: {sorted(seen - {'step'})})")
    steps = np.array(sorted(by_step))
    return config, steps, np.array([by_step[s] for s in steps])


def read_returns(run_dir: Path, binsize: int, key: str | None = None, offset: int = 0,
                 one_per_step: bool = False) -> tuple[dict[str, object], np.ndarray, np.ndarray, str, int]:
    """(config, bin ends [n], mean return in each bin [n], the key read, the last return's frame) of
    one run directory: training-episode returns (`episode/return` at `env_steps`, else `step`; with
    `one_per_step`, only those `one_episode_per_step` keeps), or `eval/return` where the run logged
    none (or where `key` asks for it), averaged in bins of `binsize` frames that end at `offset` +
    multiples of `binsize` (`bin_mean`)."""
    if key not in (None, "episode/return", "eval/return"):
        raise ValueError(f"a reference compares episode/return or eval/return, not {key!r}")
    config = read_config(run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        if key == "eval/return" or offset or one_per_step:
            raise ValueError(f"{run_dir} keeps only {BINNED} (its training returns' bin means), not the "
                             f"{key or 'episode/return'} in bins ending at {offset} + multiples of {binsize}"
                             + (", one episode per step," if one_per_step else "") + " that this comparison needs")
        return (config, *read_binned(run_dir, binsize))
    episodes, evals = [], {}
    for record in records(run_dir):
        if "episode/return" in record:
            episodes.append((record.get("env_steps", record["step"]), record["episode/return"]))
        if "eval/return" in record:
            evals[record["step"]] = record["eval/return"]  # a repeated step: the last value
    if key == "eval/return" or not episodes:
        key, points = "eval/return", sorted(evals.items())
    else:
        key, points = "episode/return", one_episode_per_step(episodes) if one_per_step else episodes
    if not points:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} holds no {key}" if key == "eval/return" and episodes else
                         f"{run_dir / 'metrics.jsonl'} holds neither episode/return nor eval/return")
    frames, returns = np.array(points, dtype=float).T
    return (config, *binned(frames, returns, binsize, offset), key, int(frames.max()))


def one_episode_per_step(episodes: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The (frame, return) pairs the 2023 reference would have logged of these, in file order: one per
    frame, the last written. At 423291a, dreamerv3/embodied/run/train.py:30-39 adds every episode that
    ends on a step to the logger at that step, in env order (core/driver.py:67-71), and the JSONL
    output (core/logger.py:146-155) writes one line per step, each name's last value. Our
    metrics.jsonl has every episode, in env order too (worldmodels/data/collector.py)."""
    return list(dict(episodes).items())


def read_binned(run_dir: Path, binsize: int) -> tuple[np.ndarray, np.ndarray, str, int]:
    """(bin ends [n], means [n], "episode/return", the last frame) of a run's BINNED file, whose bins
    must be `binsize` wide and end at multiples of it (bin means cannot be rebinned)."""
    kept = json.loads((run_dir / BINNED).read_text())
    ends, means = np.array(kept["bin_ends"], dtype=int), np.array(kept["means"], dtype=float)
    if kept["binsize"] != binsize or len(ends) != len(means) or np.any(ends % binsize):
        raise ValueError(f"{run_dir / BINNED}: bins of {kept['binsize']} frames ending at {ends.tolist()}, "
                         f"{len(means)} means; expected one mean per bin of {binsize} frames, ending at its multiples")
    return ends, means, "episode/return", int(kept["last_frame"])


def bin_mean(frames: np.ndarray, values: np.ndarray, binsize: int,
             offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(bin ends [k], mean of the values in each bin [k], NaN where empty): the bins (x - binsize, x]
    for x = binsize, 2 binsize, ... up to the last value, as danijar/dreamerv3's plot.py bins its
    scores (there [x - binsize, x); here a point on a bin end, an eval at 10K, counts for that end).
    With an `offset` (0 < offset < binsize) the bins end at x = offset, offset + binsize, ..., the first
    (-inf, offset], as danijar/dreamer's plotting.py bins from its first test at 5K frames."""
    if not 0 <= offset < binsize:
        raise ValueError(f"bins of {binsize} frames with offset {offset}: expected 0 <= offset < binsize")
    first = 0 if offset else 1  # without an offset, frame 0 counts for the bin ending at binsize
    index = np.maximum(np.ceil((frames - offset) / binsize).astype(int), first)
    sums = np.bincount(index, weights=values)[first:]
    counts = np.bincount(index)[first:]
    means = np.divide(sums, counts, out=np.full(len(counts), np.nan), where=counts > 0)
    return offset + binsize * np.arange(first, first + len(counts)), means


def binned(steps: np.ndarray, values: np.ndarray, binsize: int, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`bin_mean` without the empty bins: (ends [k'], means [k'])."""
    ends, means = bin_mean(steps, values, binsize, offset)
    keep = ~np.isnan(means)
    return ends[keep], means[keep]


def group_runs(run_dirs: list[Path], key: str, labels: list[str] | None = None,
               references: list[dict] | None = None, one_per_step: bool = False) -> list[dict]:
    """Runs with equal configs (IGNORED left out) as groups: {"config", "runs": [(dir, steps, values)],
    "last": [the step of each run's last value]}.
    With `references` (one reference file's contents per run: `run_references`): each run's returns in
    its reference's bins (`read_returns`, with `one_per_step`) instead of `key`; runs compared with
    different references are never one group; each group's "reference" is its runs', "task" the
    reference task its config trains (`reference_task`, else its env.task or env.name), "keys" which key was read.
    With `labels` (one per run): runs of equal label and env form a group, named by the label, whatever
    else their configs hold (a label given to runs of several tasks names one curve in each task's panel)."""
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"--labels gives {len(labels)} labels for {len(run_dirs)} run directories: give one per run")
    groups: list[dict] = []
    for i, run_dir in enumerate(run_dirs):
        reference = None if references is None else references[i]
        if reference is None:
            (config, steps, values), used = read_run(run_dir, key), key
            last = int(steps[-1])
        else:
            config, steps, values, used, last = read_returns(run_dir, reference["binsize"], reference.get("key"),
                                                             reference.get("offset", 0), one_per_step)
        if labels is not None:
            config = {**config, "label": labels[i]}
        for group in groups:
            if group["reference"] is reference and (group["config"] == config if labels is None else
                                                    all(group["config"].get(k) == config.get(k)
                                                        for k in ("label", *ENV_KEYS))):
                group["runs"].append((run_dir, steps, values))
                group["keys"].add(used)
                group["last"].append(last)
                break
        else:
            task = None if reference is None else (reference_task(config, reference["tasks"])
                                                   or config.get("env.task") or config.get("env.name"))
            groups.append({"config": config, "runs": [(run_dir, steps, values)], "keys": {used}, "last": [last],
                           "reference": reference, "task": task})
    for group in groups:
        group["label"] = group["config"]["label"] if labels is not None else label(
            group["config"], [g["config"] for g in groups])
    return groups


ENV_KEYS = ("env.name", "env.task")
"""What tells one env's runs from another's (runs of equal `--labels` group only within an env)."""


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


def reference_task(config: dict, tasks) -> str | None:
    """The reference task a run's config trains: its `env.task` (walker/walk, ball_in_cup/catch, pong,
    MsPacman, ALE/UpNDown-v5) or `env.name` (walker_walk) spelt as a task of `tasks` (walker_walk,
    ball_in_cup_catch, ms_pacman, up_n_down) but for case, separators and ALE's affixes."""
    def spelling(name: str) -> str:
        return re.sub(r"[^a-z0-9]", "", name.removeprefix("ALE/").removesuffix("-v5").lower())

    by_spelling = {spelling(task): task for task in tasks}
    for name in (config.get("env.task"), config.get("env.name")):
        if isinstance(name, str) and spelling(name) in by_spelling:
            return by_spelling[spelling(name)]
    return None


def reference_file(config: dict) -> Path:
    """The reference a run is compared with unless --reference names one: its env.suite's and
    env.pixels' (`REFERENCES`; the DMC proprio one for any other, whose table then says it lacks the task)."""
    return REFERENCES.get((config.get("env.suite"), bool(config.get("env.pixels"))), REFERENCE)


def run_references(run_dirs: list[Path], chosen: Path | None = None) -> list[dict]:
    """The contents of the reference each run is compared with: `chosen`, else its `reference_file`
    (each file read once, so that runs of one file share one dict)."""
    paths = [chosen or reference_file(read_config(run_dir)) for run_dir in run_dirs]
    read = {path: json.loads(path.read_text()) for path in set(paths)}
    return [read[path] for path in paths]


def parse_mark(text: str) -> tuple[float, float, str]:
    """`--mark STEP:VALUE:LABEL` (e.g. 500000:475:PlaNet paper) -> (step, value, label)."""
    parts = text.split(":", 2)
    try:
        step, value = float(parts[0]), float(parts[1])
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"--mark {text!r}: expected STEP:VALUE:LABEL, e.g. 500000:475:PlaNet paper")
    return step, value, parts[2] if len(parts) > 2 and parts[2] else f"{value:g} at {step:g}"


def plot(groups: list[dict], key: str, out: Path, title: str | None = None,
         marks: list[tuple[float, float, str]] = (), binsize: int | None = None) -> None:
    """One panel, or with the groups' references (`group_runs`) one per task and reference, the
    reference's band under each."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    compared = groups[0]["reference"] is not None
    panels = list(dict.fromkeys((g["task"], g["reference"]["name"]) for g in groups)) if compared else [None]
    several = len({name for _, name in panels}) > 1 if compared else False
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 4.5 * rows), dpi=120, squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    labels = list(dict.fromkeys(g["label"] for g in groups))  # one color per label, in every panel
    for ax, panel in zip(axes.flat, panels):
        members = [g for g in groups if not compared or (g["task"], g["reference"]["name"]) == panel]
        reference = members[0]["reference"]
        task = members[0]["task"]
        if compared and task in reference["tasks"]:
            ref = reference["tasks"][task]
            ax.fill_between(ref["x"], ref["min"], ref["max"], color="0.5", alpha=0.25, lw=0)
            ax.plot(ref["x"], ref["mean"], color="0.3", lw=1.5, ls="--",
                    label=f"{reference['name']} ({ref['seeds']} seeds)")
        for group in members:
            color = f"C{labels.index(group['label'])}"
            steps, mean, low, high, _ = seed_stats(group["runs"])
            seeds = len(group["runs"])
            ax.plot(steps, mean, color=color, lw=2, marker="o", ms=3,
                    label=f"{group['label']} ({seeds} seed{'s' if seeds > 1 else ''})")
            if seeds > 1:
                ax.fill_between(steps, low, high, color=color, alpha=0.2, lw=0)
                for _, run_steps, values in group["runs"]:
                    ax.plot(run_steps, values, color=color, lw=0.7, alpha=0.5)
        if not compared:
            ax.set_xlabel("env steps" + (f" (the values' mean in {binsize:,}-step bins)" if binsize else ""))
            seeded = any(len(g["runs"]) > 1 for g in groups)
            ax.set_ylabel(key + (" (mean over seeds; band: min-max)" if seeded else ""))
            ax.set_title(title or key)
        else:
            keys = sorted({k for g in members for k in g["keys"]})
            offset = reference.get("offset", 0)
            ends = f", ending at {offset // 1000}K, {(offset + reference['binsize']) // 1000}K, ..." if offset else ""
            ax.set_xlabel(f"frames (mean return in {reference['binsize'] // 1000}K-frame bins{ends})")
            ax.set_ylabel(f"{' / '.join(keys)} (band: min to max over seeds)")
            name = f"{task}, {reference['name']}" if several else str(task)
            ax.set_title(name if title is None or len(panels) > 1 else title)
        for j, (step, value, text) in enumerate(marks):  # published scores, drawn in every panel
            ax.plot([step], [value], marker="*", ms=12, ls="none", color=f"C{len(labels) + j}", label=text)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    if title is not None and len(panels) > 1:
        fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def reference_table(groups: list[dict], frames: tuple[int, ...] | None = None) -> list[str]:
    """Lines comparing each group with its reference (`group_runs`) at `frames` (default: the
    reference's "at", else TABLE_FRAMES; the reference bin at or before each): "no reference" for a
    task the reference lacks, "not reached" past the group's last bin, "no return in this bin" for an
    empty one before it, a mean outside the reference's min-max says so ("below the band" / "above the
    band"), and a bin that a run stopped inside says where ("partial: a run ends at 46K")."""
    lines = []
    for group in groups:
        reference = group["reference"]
        if group["task"] not in reference["tasks"]:
            lines.append(f"{group['label']}: no reference for task {group['task']!r} in {reference['name']} "
                         f"(it has {', '.join(reference['tasks'])}; --reference FILE picks another)")
            continue
        ref = reference["tasks"][group["task"]]
        steps, mean, low, high, count = seed_stats(group["runs"])
        lines.append(f"{group['label']} ({'/'.join(sorted(group['keys']))}) vs {reference['name']} "
                     f"({ref['seeds']} seeds), {group['task']}:")
        lines.append(f"  {'frames':>8}  {'ours (min-max)':>26}  {'reference (min-max)':>26}")
        shown = set()
        for target in frames or reference.get("at", TABLE_FRAMES):
            at = [i for i, x in enumerate(ref["x"]) if x <= target]
            if not at or at[-1] in shown:  # before the first bin, or past the last one already shown
                continue
            r, x = at[-1], ref["x"][at[-1]]
            shown.add(r)
            ours = np.flatnonzero(steps == x)
            if not len(ours):
                lines.append(f"  {x // 1000:>7}K  {'not reached' if x > steps[-1] else 'no return in this bin':>26}")
                continue
            j = ours[0]
            inside = [last for last in group.get("last", []) if x - reference["binsize"] < last < x]
            band = ("below the band" if mean[j] < ref["min"][r] else
                    "above the band" if mean[j] > ref["max"][r] else "")
            lines.append(f"  {x // 1000:>7}K  {spread(mean[j], low[j], high[j]):>26}  "
                         f"{spread(ref['mean'][r], ref['min'][r], ref['max'][r]):>26}"
                         + (f"  {band}" if band else "")
                         + (f"  partial: a run ends at {min(inside) / 1000:.0f}K" if inside else ""))
    return lines


def spread(mean: float, low: float, high: float) -> str:
    return f"{mean:.1f} ({low:.1f}-{high:.1f})"


def git_file(checkout: Path, path: str, commit: str = "HEAD") -> tuple[bytes, dict[str, str]]:
    """(the bytes of `path` at `commit` of `checkout`, a git checkout or git dir; its "source" record:
    the commit that last changed it, the commit it was read at, its sha256)."""
    def git(*args: str) -> bytes:
        return subprocess.run(["git", "-C", str(checkout), *args], check=True, capture_output=True).stdout

    blob = git("show", f"{commit}:{path}")
    return blob, {"file": path, "commit": git("log", "-1", "--format=%H", commit, "--", path).decode().strip(),
                  "read_at": git("rev-parse", commit).decode().strip(), "sha256": hashlib.sha256(blob).hexdigest()}


def holds_file(checkout: Path, path: str, commit: str = "HEAD") -> bool:
    """Whether `path` is in `commit` of `checkout`."""
    return subprocess.run(["git", "-C", str(checkout), "cat-file", "-e", f"{commit}:{path}"],
                          capture_output=True).returncode == 0


def seed_reduction(seeds: list[dict]) -> dict:
    """{"seeds", "x", "mean", "min", "max"} over the runs of one task (score-file records with "xs", "ys"):
    the x grid all seeds share (a seed logged further keeps only that prefix), rounded to 0.1."""
    xs = min((r["xs"] for r in seeds), key=len)
    if any(r["xs"][:len(xs)] != xs for r in seeds):
        raise ValueError(f"{seeds[0]['task']}: its {len(seeds)} seeds' x grids differ, not only in length")
    ys = np.array([r["ys"][:len(xs)] for r in seeds], dtype=float)
    return {"seeds": len(seeds), "x": [int(x) for x in xs], **{
        name: [round(float(v), 1) for v in fn(ys, axis=0)]
        for name, fn in (("mean", np.nanmean), ("min", np.nanmin), ("max", np.nanmax))}}


def write_reference(result: dict, out: Path) -> dict:
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=1)
    out.write_text(re.sub(r"\[\s+([^][]*?)\s+\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text) + "\n")
    return result


def carried_bins(seeds: list[dict], binsize: int) -> list[dict]:
    """Score-file records of one task's bin means ("ys": one per bin of `binsize` frames from 0, NaN
    where the seed had no return) on one grid up to the task's last bin, filled as danijar/dreamerv3's
    scores/plot.py fills its bins (`binning(..., fill='last')`): a bin without a return, or past the
    seed's last one, carries the previous bin's mean. The grid starts at the first bin by which every
    seed has a return."""
    means = np.full((len(seeds), max(len(r["ys"]) for r in seeds)), np.nan)
    for i, r in enumerate(seeds):
        means[i, :len(r["ys"])] = r["ys"]
        for j in range(1, means.shape[1]):
            if np.isnan(means[i, j]):
                means[i, j] = means[i, j - 1]
    first = int(np.argmax(~np.isnan(means), axis=1).max())
    return [{**r, "xs": list(range(binsize * (first + 1), binsize * means.shape[1] + 1, binsize)),
             "ys": row[first:].tolist()} for r, row in zip(seeds, means)]


def make_reference(dreamerv3: Path, path: str, out: Path, commit: str = "HEAD") -> dict:
    """Write `out`: per task, mean/min/max over seeds of the training-episode scores in 10K-frame bins
    (`BINSIZE`) of the score file `path` (one of DREAMERV3_SCORES) in `dreamerv3` (a danijar/dreamerv3
    checkout or git dir) at `commit`: the file's own bins, or `bin_mean`'s of its episodes; `carried_bins`
    fills them."""
    score = DREAMERV3_SCORES[path]
    blob, source = git_file(dreamerv3, path, commit)
    runs = json.loads(gzip.decompress(blob))
    held = ("each training episode's score at the frame it ended, binned here into bins (x - 10K, x]"
            if score.per_episode else "the mean score of its training episodes in each 10K-frame bin (its end: x)")
    result = {
        "name": score.name,
        "source": {"repo": "danijar/dreamerv3", **source},
        "reduction": (f"The file holds, per task and seed, {held}; x counts frames (env steps x action repeat). "
                      "Kept: per bin up to the task's last one, the mean, min and max over the seeds (rounded to "
                      "0.1), a seed's bin without a return carrying its previous bin's mean as danijar/dreamerv3's "
                      "scores/plot.py does (fill='last'), from the first bin by which every seed has a return. "
                      f"Made by scripts/plot.py --make-reference. The runs are {score.runs}."),
        "binsize": BINSIZE, "at": list(score.at), "tasks": {}}
    for task in sorted({r["task"] for r in runs}):
        seeds = sorted((r for r in runs if r["task"] == task), key=lambda r: r["seed"])
        if score.per_episode:
            seeds = [{**r, "ys": bin_mean(np.array(r["xs"], dtype=float), np.array(r["ys"], dtype=float),
                                          BINSIZE)[1].tolist()} for r in seeds]
        elif any(r["xs"] != list(range(BINSIZE, BINSIZE * (len(r["xs"]) + 1), BINSIZE)) for r in seeds):
            raise ValueError(f"{task}: x is not a grid of {BINSIZE}-frame bins from 0 ({seeds[0]['xs'][:3]} ...)")
        name = task.split("_", 1)[1]
        result["tasks"][TASK_NAMES.get(name, name)] = seed_reduction(carried_bins(seeds, BINSIZE))
    return write_reference(result, out)


def make_dreamer_reference(dreamer: Path, out: Path, commit: str = "HEAD") -> dict:
    """Write `out`: per DMC task, mean/min/max over seeds of Dreamer V1's test returns, from
    `DREAMER_SCORES` in `dreamer` (a danijar/dreamer checkout or git dir) at `commit`. Its x grid is
    5K, 105K, 205K, ... frames: plotting.py's bins of 100K frames from the first test (offset 5K)."""
    blob, source = git_file(dreamer, DREAMER_SCORES, commit)
    runs = [r for r in json.loads(blob) if r["method"] == "dreamer" and r["task"].startswith("dmc_")]
    if not runs:
        raise ValueError(f"{DREAMER_SCORES}: no runs of method 'dreamer' on dmc_ tasks")
    result = {
        "name": "Dreamer V1 (danijar/dreamer) test returns",
        "source": {"repo": "danijar/dreamer", **source},
        "reduction": ("The file holds, per DMC task and seed (method dreamer, 5 seeds, 64x64 pixels, action repeat 2), "
                      "the mean test-episode return (the policy's mode, one episode every 10K frames) in bins of 100K "
                      "frames; x is the bin's end in frames, from the first test at 5K (danijar/dreamer plotting.py "
                      "binning: bins (x - 100K, x], the first (-inf, 5K]). Kept: per x that every seed of a task "
                      "reached, the mean, min and max over the seeds (rounded to 0.1). Made by scripts/plot.py "
                      "--make-reference. Our runs are compared by their greedy evals (eval/return) in the same bins; "
                      "their protocol is configs/experiment/dreamer_v1_dmc.yaml."),
        "key": "eval/return", "binsize": 0, "offset": 0, "at": [105_000, 205_000, 505_000, 1_005_000], "tasks": {}}
    for task in sorted({r["task"] for r in runs}):
        seeds = sorted((r for r in runs if r["task"] == task), key=lambda r: r["seed"])
        reduced = seed_reduction(seeds)
        xs = reduced["x"]
        if len(xs) < 2:
            raise ValueError(f"{task}: {len(xs)} bins that every seed reached; expected at least 2")
        offset, binsize = xs[0], xs[1] - xs[0]
        if xs != list(range(offset, offset + binsize * len(xs), binsize)) or not 0 < offset < binsize:
            raise ValueError(f"{task}: x is not a grid of equal bins from an offset below one bin ({xs[:3]} ...)")
        if result["binsize"] and (binsize, offset) != (result["binsize"], result["offset"]):
            raise ValueError(f"{task}: bins of {binsize} from {offset}, the other tasks' of {result['binsize']} "
                             f"from {result['offset']}")
        result["binsize"], result["offset"] = binsize, offset
        result["tasks"][task.removeprefix("dmc_")] = reduced
    return write_reference(result, out)


def default_out(folders: list[Path]) -> Path:
    """Where the image goes without --out: `DEFAULT_OUT` in the one folder given, else in the current directory."""
    return folders[0] / DEFAULT_OUT if len(folders) == 1 else Path(DEFAULT_OUT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", type=Path,
                        help="run directories (each with metrics.jsonl and config.yaml), or folders of them (a sweep)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"image file to write (.png, .svg, .pdf; default: {DEFAULT_OUT} in the one run or sweep "
                             "folder given, else in the current directory); with --make-reference (required "
                             "there), the JSON file (danijar/dreamer) or the folder of JSON files (danijar/dreamerv3)")
    parser.add_argument("--key", default="eval/return", help="metric to plot against env steps (default: eval/return)")
    parser.add_argument("--title", default=None, help="plot title (default: the key, or the task)")
    parser.add_argument("--reference", nargs="?", const=PICK_BY_RUN, default=None, metavar="JSON",
                        help="draw a reference's scores under ours, binned as its (without a file: each run's "
                             "DreamerV3 reference by its env.suite and env.pixels, from docs/results/reference/: "
                             "dreamerv3_dmc_proprio.json, dreamerv3_dmc_vision.json, dreamerv3_atari100k.json; "
                             "other files there: dreamerv3_atari100k_2023.json, Dreamer V1's "
                             "dreamer_v1_dmc_pixels.json)")
    parser.add_argument("--one-episode-per-step", action="store_true",
                        help="with --reference: of the training episodes that end on the same frame, keep only the "
                             "last written, as the 2023 DreamerV3 logger did (docs/reference-scores.md)")
    parser.add_argument("--at", type=int, nargs="+", default=None, metavar="FRAMES",
                        help="with --reference: the frames of the table's rows (default: the file's 'at', else "
                             f"{' '.join(str(f) for f in TABLE_FRAMES)})")
    parser.add_argument("--labels", nargs="+", default=None, metavar="LABEL",
                        help="one label per run directory: runs of equal label are seeds of one curve, named by it "
                             "(default: grouped by config, labelled by the fields that differ)")
    parser.add_argument("--mark", action="append", type=parse_mark, default=[], metavar="STEP:VALUE:LABEL",
                        help="a published score to mark (a star at STEP, VALUE, named LABEL); repeatable, "
                             "e.g. --mark '500000:475:PlaNet (CURL table)'")
    parser.add_argument("--bin", type=int, default=None, metavar="STEPS",
                        help="average each run's --key values in bins of STEPS env steps (a curve of one value "
                             "per episode, episode/return, reads better binned); --reference bins by itself")
    parser.add_argument("--make-reference", type=Path, default=None, metavar="CHECKOUT",
                        help="write --out from a danijar/dreamerv3 or danijar/dreamer checkout's score files "
                             "instead of plotting")
    parser.add_argument("--commit", default="HEAD", metavar="REV",
                        help="with --make-reference: the commit to read the score files at (default: HEAD; "
                             "danijar/dreamerv3's 2023 files are at 423291a)")
    args = parser.parse_args(argv)
    if args.bin is not None and (args.bin < 1 or args.reference is not None):
        parser.error(f"--bin={args.bin} must be an int >= 1, without --reference (it bins by the reference's bins)")
    if args.one_episode_per_step and args.reference is None:
        parser.error("--one-episode-per-step re-bins training returns for --reference: give --reference too")
    if args.make_reference is not None:
        if args.out is None:
            parser.error("--make-reference needs --out: the reference file or folder to write")
        return make_references(parser, args.make_reference, args.out, args.commit)
    if not args.runs:
        parser.error("give at least one run directory")
    if args.out is None:
        args.out = default_out(args.runs)
    try:
        args.runs = run_dirs(args.runs)
        references = None if args.reference is None else run_references(
            args.runs, None if args.reference == PICK_BY_RUN else Path(args.reference))
        groups = group_runs(args.runs, args.key, args.labels, references, args.one_episode_per_step)
    except (FileNotFoundError, ValueError) as err:
        print(f"plot.py: {err}", file=sys.stderr)
        return 2
    if args.bin is not None:
        for group in groups:
            group["runs"] = [(run, *binned(steps, values, args.bin)) for run, steps, values in group["runs"]]
    plot(groups, args.key, args.out, args.title, args.mark, args.bin)
    for group in groups:
        steps, mean, low, high, count = seed_stats(group["runs"])
        print(f"{group['label']}: {', '.join(str(d) for d, _, _ in group['runs'])}")
        for row in zip(steps, mean, low, high, count):
            print("  step {:>8d}  mean {:>9.1f}  min {:>9.1f}  max {:>9.1f}  seeds {}".format(*row))
    if references is not None:
        print("\n".join(reference_table(groups, args.at)))
    print(f"wrote {args.out}")
    return 0


def make_references(parser: argparse.ArgumentParser, checkout: Path, out: Path, commit: str) -> int:
    """--make-reference: Dreamer V1's reference into the file `out`, or one DreamerV3 reference per
    score file of DREAMERV3_SCORES that `commit` of `checkout` holds, each under its name in the folder `out`."""
    if holds_file(checkout, DREAMER_SCORES, commit):
        made = [(out, make_dreamer_reference(checkout, out, commit))]
    elif held := [path for path in DREAMERV3_SCORES if holds_file(checkout, path, commit)]:
        if out.suffix == ".json":
            parser.error(f"--out={out}: for danijar/dreamerv3 give a folder (it writes one file per score file)")
        made = [(out / DREAMERV3_SCORES[path].out, make_reference(checkout, path, out / DREAMERV3_SCORES[path].out,
                                                                  commit)) for path in held]
    else:
        parser.error(f"--make-reference={checkout}: expected a git checkout of danijar/dreamerv3 "
                     f"({', '.join(DREAMERV3_SCORES)}) or danijar/dreamer ({DREAMER_SCORES}) at {commit}")
    for path, result in made:
        print(f"wrote {path} ({len(result['tasks'])} tasks) from {result['source']['repo']} {result['source']['file']} "
              f"at {result['source']['read_at']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
