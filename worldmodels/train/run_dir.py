"""The run directory: what a training run checks there before it writes anything.

Layout of `run_dir/`: `config.yaml` (the resolved config of the latest start), `changes.jsonl`
(one line per resume that changed an allowed field), `metrics.jsonl` and the logger's files
(`csv/scalars/<key>.csv`, `tensorboard/`, `wandb/`), `checkpoints/` (checkpoint.py), `replay_memmap/`
(scratch storage of `replay.memmap=true`), `media/`, and `cut/` (metric lines logged after the
checkpoint a run resumed from, moved aside so the curve holds each step once).

A run touches only what it wrote: `run_dir` must be a new or empty directory, or a run directory
(`is_run_dir`: its `config.yaml` is a run's config, or it holds checkpoints). Any other existing
folder, a file, or a place this process cannot write to (read-only filesystem, permissions) is
refused before anything is built or written, naming `run_dir`; so is an empty `run_dir`.

Contract of `open_run(cfg, checkpoints)`; it reads only, except for making the directory (removed
again if the run is refused), taking the run lock and finishing a save a kill cut short
(`Checkpoints.recover`):
- one trainer per run directory at a time (an advisory `flock` on the directory);
- `resume=false` on a directory that holds checkpoints is refused (it would overwrite them);
- with `resume=true`, the newest complete checkpoint is found (checkpoint.py), incomplete ones
  skipped with a warning naming the file; checkpoint directories of which none is complete are
  refused rather than restarted from step 0 over them;
- the new config is compared with the checkpoint's: a field outside `MUTABLE` that differs
  (env, model, algo, replay, seed, batch shape, ...) is refused, naming every such field;
- a checkpoint written by a data-parallel run of another world size (torchrun ranks; one process
  is world size 1) is refused, naming both sizes: each rank resumes its own replay shard;
- a run whose checkpoint already reached `steps` is `finished`: the caller changes nothing.
Then `Run.start()` writes: `config.yaml`, the allowed changes to `changes.jsonl`, and cuts the
run's own metric files (`METRIC_FILES`) back to the checkpoint's step (`truncate_metrics`).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from worldmodels.train.checkpoint import Checkpoints, step_of
from worldmodels.train.config import upgrade

MUTABLE = ("steps", "run_dir", "resume", "progress", "threads", "check_finite", "device", "backend", "cuda_graphs",
           "act_while_training", "precision", "logger", "eval_every", "eval_episodes", "log_every", "save_every",
           "env.parallel", "replay.memmap", "replay.on_device", "replay.save_frames", "runs_per_gpu", "compile_nets")
"""Fields (and groups, by prefix) a resumed run may change: they do not change what is learned."""

METRIC_FILES = ("metrics.jsonl", "csv/scalars/**/*.csv")
"""The step-indexed metric files a run writes (globs under `run_dir`): `truncate_metrics` cuts these only."""
SCRATCH = "replay_memmap"
"""What a run writes before its `config.yaml` (the memmap replay's files, rewritten at every start)."""


class RunDirError(RuntimeError):
    """A run directory this run must not use as asked; the message says why and what to do."""


def _flatten(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def _mutable(name: str) -> bool:
    return any(name == m or name.startswith(f"{m}.") for m in MUTABLE)


def config_changes(stored: DictConfig, new: DictConfig) -> tuple[dict, dict]:
    """(refused, allowed): dotted field -> (stored value, new value) for every field that differs
    (a field only one side has counts as a change); refused are those outside `MUTABLE`."""
    old = _flatten(OmegaConf.to_container(upgrade(stored.copy(), warn=False), resolve=True))
    cur = _flatten(OmegaConf.to_container(new, resolve=True))
    missing = "<missing>"
    changed = {k: (old.get(k, missing), cur.get(k, missing)) for k in sorted(old.keys() | cur.keys())
               if old.get(k, missing) != cur.get(k, missing)}
    refused = {k: v for k, v in changed.items() if not _mutable(k)}
    allowed = {k: v for k, v in changed.items() if _mutable(k)}
    return refused, allowed


@dataclass
class Run:
    """What `open_run` found; made by `open_run`.

    Args:
        run_dir: the run directory.
        checkpoint: the checkpoint directory to resume (None: a fresh start).
        state: its `state.pt` contents, read with weights_only=True (None: a fresh start).
        finished: the checkpoint already reached `steps`: nothing is to be trained or written.
        allowed: config fields that changed and may change, field -> (stored value, new value).
        lock: the run directory's lock, held until `release` (or the process ends).
    """

    run_dir: Path
    checkpoint: Path | None = None
    state: dict | None = None
    finished: bool = False
    allowed: dict = field(default_factory=dict)
    lock: _Lock | None = None

    @property
    def step(self) -> int:
        """The env step training continues from (0 for a fresh start)."""
        return 0 if self.state is None else int(self.state["counters"]["env_steps"])

    def start(self, cfg: DictConfig) -> dict[str, int]:
        """Write `config.yaml`, record allowed changes, cut metrics back to `step`; returns the
        lines cut per metric file."""
        _atomic_write(self.run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        if self.allowed:
            record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "step": self.step,
                      "changes": {k: list(v) for k, v in self.allowed.items()}}
            with open(self.run_dir / "changes.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
        return truncate_metrics(self.run_dir, self.step)

    def release(self) -> None:
        """Release the run lock (also released when the process ends, however it ends)."""
        if self.lock is not None:
            self.lock.close()
            self.lock = None


class _Lock:
    """An exclusive advisory `flock` on the run directory, held while this object lives."""

    def __init__(self, run_dir: Path):
        self.fd: int | None = os.open(run_dir, os.O_RDONLY)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.close()
            raise RunDirError(f"run_dir={str(run_dir)!r} is in use by another training process; "
                              "wait for it to end or pick another run_dir") from None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self):
        self.close()


def is_run_dir(path: Path) -> bool:
    """Whether the directory `path` is a run directory: its `config.yaml` holds a run's config
    (`env`, `algo`, `model` and `run_dir` fields), it holds checkpoints, or only the scratch files a
    run writes before its config."""
    config = path / "config.yaml"
    if config.is_file():
        try:
            stored = OmegaConf.load(config)
        except Exception:  # not YAML, or not ours
            return False
        return isinstance(stored, DictConfig) and {"env", "algo", "model", "run_dir"} <= set(stored.keys())
    if any(step_of(p) is not None for p in (path / "checkpoints").glob("step-*")):
        return True
    return [p.name for p in path.iterdir()] == [SCRATCH]


def check_run_dir(path: str) -> None:
    """Refuse (RunDirError) a `run_dir` this run may not use (see the module docstring): nothing is written."""
    name = f"run_dir={path!r}"
    if not path.strip():  # Path('') would be the current directory
        raise RunDirError(f"{name} names no directory; give the run its own, e.g. run_dir=runs/my-run")
    run_dir = Path(path)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"{name} is a file, not a directory; pick a directory for the run (a new one, or a run "
                          "directory to resume)")
    if run_dir.is_dir() and any(run_dir.iterdir()) and not is_run_dir(run_dir):
        entries = sorted(p.name for p in run_dir.iterdir())
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise RunDirError(f"{name} already holds files that are not a worldmodels run's ({shown}); a run writes into "
                          "a new or empty directory, or resumes its own run directory, and never touches files it "
                          "did not write. Pick a new run_dir")
    base = next(p for p in (run_dir.absolute(), *run_dir.absolute().parents) if p.exists())
    if os.statvfs(base).f_flag & os.ST_RDONLY:
        raise RunDirError(f"{name} is on a read-only filesystem ({base}); pick a run_dir on a writable disk")
    if not os.access(base, os.W_OK | os.X_OK):
        raise RunDirError(f"{name}: this user may not write to {base}; pick a run_dir you can write to")


def _make_dirs(path: Path) -> list[Path]:
    """mkdir -p `path`; the directories it made, outermost first."""
    made = [p for p in (*reversed(path.absolute().parents), path.absolute()) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    return made


def open_run(cfg: DictConfig, checkpoints: Checkpoints, world_size: int = 1) -> Run:
    """Check `cfg.run_dir` for this run of `world_size` ranks (see the module docstring); raises RunDirError,
    `CheckpointError` (an unsafe or unreadable checkpoint) naming the field or file."""
    check_run_dir(str(cfg.run_dir))
    run_dir = Path(cfg.run_dir)
    made = _make_dirs(run_dir)
    try:
        run = Run(run_dir, lock=_Lock(run_dir))
    except BaseException:
        _remove_empty(made)
        raise
    try:
        checkpoints.recover()
        found = checkpoints.steps()
        if found and not cfg.resume:
            raise RunDirError(f"resume=false, but run_dir={str(run_dir)!r} holds checkpoints "
                              f"(newest: {found[0].name}); "
                              "refusing to start over them (the first save would delete them). Use a new run_dir, "
                              "or resume=true to continue this run")
        if not found or not cfg.resume:
            return run
        loaded = checkpoints.load()
        if loaded is None:
            problems = "; ".join(f"{p.name}: {checkpoints.problem(p)}" for p in found)
            raise RunDirError(f"run_dir={str(run_dir)!r} has checkpoint directories but none is complete ({problems}); "
                              "refusing to restart from step 0 over them. Move them away to start afresh")
        run.state, run.checkpoint = loaded
        saved_world = int(run.state.get("world_size", 1))
        if saved_world != world_size:
            raise RunDirError(
                f"run_dir={str(run_dir)!r}: its checkpoint {run.checkpoint.name} was written by a run of world size "
                f"{saved_world} ({'one process' if saved_world == 1 else f'{saved_world} torchrun ranks'}), this run "
                f"has world size {world_size}; each rank resumes its own replay shard, so the world size may not "
                f"change on resume. Resume with {saved_world} ranks ("
                + ("python scripts/train.py ..." if saved_world == 1 else
                   f"torchrun --nproc-per-node {saved_world} scripts/train.py ..., or nodes x processes = "
                   f"{saved_world}")
                + "), or start a new run_dir")
        stored = _stored_config(run_dir, run.state)
        if stored is not None:
            refused, run.allowed = config_changes(stored, cfg)
            if refused:
                fields = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
                raise RunDirError(f"run_dir={str(run_dir)!r} holds a run with a different config; resuming would "
                                  f"train something else. Fields that may not change on resume: {fields}. "
                                  "Use a new run_dir, or the stored values "
                                  f"(fields that may change: {', '.join(MUTABLE)})")
        run.finished = run.step >= cfg.steps
        return run
    except BaseException:
        run.release()
        _remove_empty(made)
        raise


def _remove_empty(made: list[Path]) -> None:
    """Remove the directories `_make_dirs` made, innermost first, where still empty: a refused run leaves none."""
    for path in reversed(made):
        try:
            path.rmdir()
        except OSError:
            return


def _stored_config(run_dir: Path, state: dict) -> DictConfig | None:
    """The config the checkpoint was trained with (saved in it), else `config.yaml`."""
    if state.get("config") is not None:
        return OmegaConf.create(state["config"])
    path = run_dir / "config.yaml"
    return OmegaConf.load(path) if path.exists() else None


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------- metrics

def _split_jsonl(lines: list[str], step: int) -> tuple[list[str], list[str]]:
    keep, cut = [], []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            cut.append(line)  # a torn or corrupt record
            continue
        late = isinstance(record, dict) and isinstance(record.get("step"), (int, float)) and record["step"] > step
        (cut if late else keep).append(line)
    return keep, cut


def _first_cell_step(line: str) -> float | None:
    cell = line.split(",", 1)[0].strip().strip('"')
    try:
        return float(cell)
    except ValueError:
        return None


def _split_csv(lines: list[str], step: int) -> tuple[list[str], list[str]] | None:
    """None when the file is not step-indexed (first column neither headed 'step' nor numeric)."""
    header = lines[0] if lines and _first_cell_step(lines[0]) is None else None
    rows = lines[1:] if header is not None else lines
    named_step = header is not None and header.split(",", 1)[0].strip().strip('"').lower() == "step"
    if not named_step and (header is not None or any(_first_cell_step(r) is None for r in rows)):
        return None
    keep = [header] if header is not None else []
    cut = []
    for row in rows:
        value = _first_cell_step(row)
        (cut if value is None or value > step else keep).append(row)
    return keep, cut


def truncate_metrics(run_dir: str | Path, step: int) -> dict[str, int]:
    """Cut the run's metric files (`METRIC_FILES`: `metrics.jsonl`, and the csv logger's step-indexed
    `csv/scalars/<key>.csv`, first column the step, with or without a `step` header) back to records
    at steps <= `step`; no other file is read or written. Cut lines, and a torn last line (no newline:
    a write the process did not finish), are appended to `run_dir/cut/<same relative path>`, unless
    that file already ends with them (a cut a kill interrupted before the metric file was rewritten);
    files are rewritten atomically. Returns relative path -> number of lines cut, for the files that
    lost lines."""
    run_dir = Path(run_dir)
    files = sorted({p for pattern in METRIC_FILES for p in run_dir.glob(pattern) if p.is_file()})
    report = {}
    for path in files:
        text = path.read_text()
        lines = text.splitlines(keepends=True)
        torn = [lines.pop()] if lines and not lines[-1].endswith("\n") else []
        split = _split_jsonl(lines, step) if path.suffix == ".jsonl" else _split_csv(lines, step)
        if split is None:
            continue
        keep, cut = split
        cut += torn
        if not cut:
            continue
        rel = path.relative_to(run_dir)
        side = run_dir / "cut" / rel
        side.parent.mkdir(parents=True, exist_ok=True)
        block = "".join(line if line.endswith("\n") else line + "\n" for line in cut)
        if not (side.is_file() and side.read_text().endswith(block)):
            with open(side, "a") as f:
                f.write(block)
        _atomic_write(path, "".join(keep))
        report[rel.as_posix()] = len(cut)
    return report
