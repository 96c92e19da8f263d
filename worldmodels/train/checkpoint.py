"""Verified, atomic checkpoints in `run_dir/checkpoints/`.

Layout: one directory per checkpoint, `step-<env steps, 10 digits>/`, holding `state.pt` (model,
optimisers, RNG states, counters), whatever the caller adds (`replay/`) and `manifest.json`: the
size and SHA-256 of every file, written last. A checkpoint is *complete* when its manifest reads
and every file it lists has that size and checksum; nothing else counts, so a crash, a truncated
file or a deleted one makes a checkpoint incomplete, never silently different.

Contract:
- `save` writes `<name>.tmp/`, fsyncs it, writes the manifest, renames the directory into place
  (`os.replace`), then points the file `latest` at it. A crash at any point leaves every earlier
  complete checkpoint loadable.
- `latest()` is the newest complete `step-*` directory. The `latest` file is a hint for people;
  it is never the only way to find a checkpoint (an empty, torn or deleted one changes nothing).
  Incomplete directories are skipped with a warning naming the file at fault.
- Checkpoints are deleted only when a newer one has just been saved and verified: after a save,
  older complete ones beyond `keep`, and older incomplete ones. Newer directories are never deleted.
- `state.pt` is read with `torch.load(weights_only=True)`: tensors, numbers, strings and containers
  only. A file holding anything else (a pickled callable) is refused with `UnsafeCheckpointError`
  and nothing in it runs; callers must not fall back past it silently.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

MANIFEST = "manifest.json"
STATE = "state.pt"
_NAME = re.compile(r"step-(\d+)(\.old)?")  # `.old`: the previous copy while a step is re-saved


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the file."""


class UnsafeCheckpointError(CheckpointError):
    """`state.pt` holds objects `torch.load(weights_only=True)` refuses (it could run code)."""


def step_of(path: Path) -> int | None:
    """The env step in a checkpoint directory's name (`step-0000000048` -> 48, also for the
    `.old` copy a re-save of that step keeps until the new one is in place); None for other names."""
    match = _NAME.fullmatch(path.name)
    return int(match.group(1)) if match else None


def _sha256(path: Path, sync: bool = False) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
        if sync:
            os.fsync(f.fileno())
    return digest.hexdigest()


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(directory: Path) -> None:
    """Record size and SHA-256 of every file under `directory` (fsynced first), then the manifest."""
    files = {}
    for path in _files(directory):
        files[path.relative_to(directory).as_posix()] = {"size": path.stat().st_size,
                                                        "sha256": _sha256(path, sync=True)}
    for sub in sorted({p.parent for p in _files(directory)} | {directory}):
        _fsync_dir(sub)
    tmp = directory / f"{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"format": 1, "files": files}, indent=1))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, directory / MANIFEST)


def verify(directory: Path) -> str | None:
    """None when `directory` is a complete checkpoint, else what is wrong, naming the file."""
    manifest = directory / MANIFEST
    try:
        files = json.loads(manifest.read_text())["files"]
    except FileNotFoundError:  # a save renames its directory into place only after writing the manifest
        return (f"{manifest} is missing: the checkpoint was written by a worldmodels version without manifests, "
                "or altered, and cannot be verified")
    except (ValueError, KeyError, TypeError) as err:
        return f"{manifest} is unreadable ({err.__class__.__name__}: {err})"
    if STATE not in files:
        return f"{manifest} lists no {STATE}"
    for name, expected in files.items():
        path = directory / name
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != expected["size"]:
            return f"{path} has {size} bytes, the manifest says {expected['size']} (truncated or overwritten)"
        if _sha256(path) != expected["sha256"]:
            return f"{path} does not match its checksum in {manifest} (corrupted)"
    return None


def read_state(path: Path) -> dict:
    """`torch.load(path, weights_only=True)` with errors that name the file and say what to do."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise UnsafeCheckpointError(
            f"{path} holds objects other than tensors, numbers, strings and containers; refusing to "
            f"unpickle it, since that could run code from whoever wrote it ({first}). Load only run "
            f"directories you trust, and only with weights_only=True.") from None
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        raise CheckpointError(f"{path} could not be read ({err.__class__.__name__}: {err}); "
                              f"it is truncated or corrupt") from None


class Checkpoints:
    """The checkpoints of one run.

    Args:
        directory: where the `step-*` directories live (`run_dir/checkpoints`).
        keep: how many complete checkpoints to keep (>= 1); older ones are deleted only after
            a newer one has been saved and verified.
    """

    def __init__(self, directory: str | Path, keep: int = 1):
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep={keep!r} must be an int >= 1")
        self.dir = Path(directory)
        self.keep = keep

    def steps(self) -> list[Path]:
        """Every `step-*` directory, complete or not, newest first."""
        if not self.dir.is_dir():
            return []
        found = [p for p in self.dir.iterdir() if p.is_dir() and step_of(p) is not None]
        return sorted(found, key=lambda p: (step_of(p), not p.name.endswith(".old")), reverse=True)

    def complete(self, warn: bool = True) -> list[Path]:
        """The complete checkpoints, newest first; incomplete ones are skipped (with a warning
        naming the file at fault when `warn`)."""
        good = []
        for path in self.steps():
            problem = verify(path)
            if problem is None:
                good.append(path)
            elif warn:
                warnings.warn(f"skipping incomplete checkpoint {path.name}: {problem}", stacklevel=2)
        return good

    def latest(self) -> Path | None:
        """The newest complete checkpoint directory, or None."""
        complete = self.complete()
        return complete[0] if complete else None

    def save(self, name: str, state: dict, write_extra: Callable[[Path], None] | None = None) -> Path:
        """Write `state` (torch.save) and whatever `write_extra(dir)` writes, verified and atomically."""
        if not re.fullmatch(r"step-\d+", name):
            raise ValueError(f"name={name!r} must look like 'step-<int>'")
        self.dir.mkdir(parents=True, exist_ok=True)
        final, tmp, old = self.dir / name, self.dir / f"{name}.tmp", self.dir / f"{name}.old"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        torch.save(state, tmp / STATE)
        if write_extra is not None:
            write_extra(tmp)
        write_manifest(tmp)
        if final.exists():  # re-saving a step: keep the old copy until the new one is in place
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_dir(self.dir)
        shutil.rmtree(old, ignore_errors=True)
        pointer = self.dir / "latest.tmp"
        pointer.write_text(name)
        os.replace(pointer, self.dir / "latest")
        self._prune(final)
        return final

    def load(self, path: Path | None = None) -> tuple[dict, Path] | None:
        """(state, directory) of `path` or of the newest complete checkpoint; None when there is
        none. A checkpoint whose state.pt cannot be read is skipped for the previous complete one
        (with a warning naming the file); an unsafe one raises `UnsafeCheckpointError`."""
        if path is not None:
            problem = verify(path)
            if problem is not None:
                raise CheckpointError(f"checkpoint {path} is incomplete: {problem}")
            return read_state(path / STATE), path
        for candidate in self.complete():
            try:
                return read_state(candidate / STATE), candidate
            except UnsafeCheckpointError:
                raise
            except CheckpointError as err:
                warnings.warn(f"skipping checkpoint {candidate.name}: {err}", stacklevel=2)
        return None

    def _prune(self, saved: Path) -> None:
        """Delete what `saved` (just written and verified) supersedes: older complete checkpoints
        beyond `keep`, older incomplete ones and leftover temp directories. Newer ones stay."""
        step = step_of(saved)
        older = [p for p in self.steps() if step_of(p) < step]
        kept = 1
        for path in older:
            if kept < self.keep and verify(path) is None:
                kept += 1
                continue
            shutil.rmtree(path, ignore_errors=True)
        for path in self.dir.glob("*.tmp"):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
