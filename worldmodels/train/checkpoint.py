"""Verified, atomic checkpoints in `run_dir/checkpoints/`, in files of at most `PIECE_SIZE` (16 MiB).

Layout: one directory per checkpoint, `step-<env steps, 10 digits>/`, holding `state.pt` (model,
optimisers, RNG states, counters), whatever the caller adds (`replay/`) and `manifest.json`: the
size and SHA-256 of every file, written last. A file larger than `PIECE_SIZE` is stored as pieces
`<name>.000`, `<name>.001`, ... (each at most `PIECE_SIZE`; the manifest lists each piece's size and
SHA-256 under the file's name), so a checkpoint travels as small files; `open_file` reads a file or
its pieces as one stream. A checkpoint is *complete* when its manifest reads and every file (every
piece) it lists has that size and checksum; nothing else counts, so a crash, a truncated file or a
deleted one makes a checkpoint incomplete, never silently different. Checkpoints written before
pieces existed (manifest format 1) verify and load as before.

Moving a run to another machine: copy the whole run directory (pieces and manifest as they are) and
start `scripts/train.py` there with the same `run_dir`; it resumes the newest complete checkpoint.

Contract:
- `save` writes `<name>.tmp/`, splits files larger than `PIECE_SIZE`, fsyncs it, writes the
  manifest, renames the directory into place (`os.replace`), then points the file `latest` at it.
  A crash at any point leaves every earlier complete checkpoint loadable; a write that fails (full
  disk) raises `CheckpointError` saying so, its temp directory removed. `recover()` finishes what a
  save killed midway left (a re-saved step's `.old` copy, temp directories).
- `latest()` is the newest complete `step-*` directory. The `latest` file is a hint for people;
  it is never the only way to find a checkpoint (an empty, torn or deleted one changes nothing).
  Incomplete directories are skipped with a warning naming the file (or piece) at fault.
- Checkpoints are deleted only when a newer one has just been saved and verified: after a save,
  older complete ones beyond `keep`, and older incomplete ones. Newer directories are never deleted.
- `state.pt` is read with `torch.load(weights_only=True)`: tensors, numbers, strings and containers
  only. A well-formed pickle holding anything else (a pickled callable) is refused with
  `UnsafeCheckpointError` and nothing in it runs; callers must not fall back past it silently. A file
  that is no pickle at all (garbage), or a state without the caller's `fields`, is corrupt: `load`
  falls back to the previous complete checkpoint with a warning, as for a truncated file.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import json
import os
import pickle
import pickletools
import re
import shutil
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import torch

MANIFEST = "manifest.json"
STATE = "state.pt"
PIECE_SIZE = 16 * 2**20
"""The largest file a checkpoint holds (bytes); larger ones are split into pieces (tests lower it)."""
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


def piece_path(path: Path, index: int) -> Path:
    """The `index`-th piece of the file `path`: `state.pt` -> `state.pt.000`, `state.pt.001`, ..."""
    return path.with_name(f"{path.name}.{index:03d}")


def _split(path: Path) -> dict:
    """Replace `path` by pieces of at most PIECE_SIZE bytes (fsynced); its manifest entry."""
    whole, pieces = hashlib.sha256(), []
    with open(path, "rb") as source:
        while block := source.read(PIECE_SIZE):
            whole.update(block)
            piece = piece_path(path, len(pieces))
            with open(piece, "wb") as f:
                f.write(block)
                f.flush()
                os.fsync(f.fileno())
            pieces.append({"size": len(block), "sha256": hashlib.sha256(block).hexdigest()})
    size = path.stat().st_size
    path.unlink()
    return {"size": size, "sha256": whole.hexdigest(), "pieces": pieces}


def write_manifest(directory: Path) -> None:
    """Split files larger than PIECE_SIZE into pieces, record size and SHA-256 of every file (and
    piece) under `directory` (fsynced first), then write the manifest."""
    files = {}
    for path in _files(directory):
        name = path.relative_to(directory).as_posix()
        if path.stat().st_size > PIECE_SIZE:
            files[name] = _split(path)
        else:
            files[name] = {"size": path.stat().st_size, "sha256": _sha256(path, sync=True)}
    for sub in sorted({p.parent for p in _files(directory)} | {directory}):
        _fsync_dir(sub)
    tmp = directory / f"{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"format": 2, "piece_size": PIECE_SIZE, "files": files}, indent=1))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, directory / MANIFEST)


def _check(path: Path, expected: dict, manifest: Path, what: str = "") -> str | None:
    if not path.is_file():
        return f"{path} is missing{what}"
    size = path.stat().st_size
    if size != expected["size"]:
        return f"{path} has {size} bytes, the manifest says {expected['size']} (truncated or overwritten){what}"
    if _sha256(path) != expected["sha256"]:
        return f"{path} does not match its checksum in {manifest} (corrupted){what}"
    return None


def verify(directory: Path) -> str | None:
    """None when `directory` is a complete checkpoint, else what is wrong, naming the file or piece."""
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
        pieces = expected.get("pieces")
        checks = [(directory / name, expected, "")] if pieces is None else [
            (piece_path(directory / name, i), piece, f" (piece {i + 1} of {len(pieces)} of {name})")
            for i, piece in enumerate(pieces)]
        for path, entry, what in checks:
            if (problem := _check(path, entry, manifest, what)) is not None:
                return problem
    return None


class _Pieces(io.RawIOBase):
    """The pieces of one file read as one seekable stream."""

    def __init__(self, pieces: list[Path]):
        super().__init__()
        self.pieces = pieces
        self.starts = [0]
        for piece in pieces:
            self.starts.append(self.starts[-1] + piece.stat().st_size)
        self.pos, self.index, self.file = 0, -1, None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.starts[-1]}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buffer) -> int:
        if self.pos >= self.starts[-1]:
            return 0
        index = bisect.bisect_right(self.starts, self.pos) - 1
        if index != self.index:
            if self.file is not None:
                self.file.close()
            self.index, self.file = index, open(self.pieces[index], "rb")
        self.file.seek(self.pos - self.starts[index])
        count = self.file.readinto(memoryview(buffer)[: self.starts[index + 1] - self.pos])
        self.pos += count
        return count

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
        super().close()


def open_file(path: Path) -> BinaryIO:
    """A checkpoint's file for reading (binary): the file itself, or its pieces `<name>.000`, ...
    read as one seekable stream. Check the checkpoint with `verify` first: this checks nothing."""
    path = Path(path)
    if path.is_file():
        return open(path, "rb")
    pieces = []
    while (piece := piece_path(path, len(pieces))).is_file():
        pieces.append(piece)
    if not pieces:
        raise FileNotFoundError(f"{path} is missing (and so is its first piece {piece_path(path, 0).name})")
    return io.BufferedReader(_Pieces(pieces), buffer_size=1 << 20)


def _is_pickle(path: Path) -> bool:
    """Whether `path` (a file or its pieces) is a well-formed `torch.save` archive: a zip whose pickle
    parses from end to end. Parsed by `pickletools`, which runs nothing."""
    try:
        with open_file(path) as f, zipfile.ZipFile(f) as archive:
            name = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
            if name is None:
                return False
            for _ in pickletools.genops(archive.read(name)):
                pass
    except Exception:  # any reason it does not parse: not a pickle someone wrote on purpose
        return False
    return True


def read_state(path: Path) -> dict:
    """`torch.load(path, weights_only=True)` (of the file or its pieces) with errors that name the
    file and say what to do: `UnsafeCheckpointError` for a well-formed pickle that names objects
    `weights_only` refuses (it could run code), `CheckpointError` for anything unreadable (garbage,
    truncated or corrupt)."""
    try:
        with open_file(path) as f:
            return torch.load(f, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if not _is_pickle(path):
            raise CheckpointError(f"{path} is not a torch.save file (garbage where the checkpoint's state should "
                                  "be); it is corrupt") from None
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise UnsafeCheckpointError(
            f"{path} holds objects other than tensors, numbers, strings and containers; refusing to "
            f"unpickle it, since that could run code from whoever wrote it ({first}). Load only run "
            f"directories you trust, and only with weights_only=True.") from None
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        raise CheckpointError(f"{path} could not be read ({err.__class__.__name__}: {err}); "
                              f"it is truncated or corrupt") from None


def missing_field(state: object, fields: dict, prefix: str = "") -> str | None:
    """None when `state` holds every field of `fields` (key -> type, or a nested dict of them), else
    the first one missing or of another type, named (`counters.env_steps`)."""
    if not isinstance(state, dict):
        return f"{prefix.rstrip('.') or 'the state'} is a {type(state).__name__}, not a dict"
    for key, kind in fields.items():
        if key not in state:
            return f"it has no {prefix}{key}"
        if isinstance(kind, dict):
            problem = missing_field(state[key], kind, f"{prefix}{key}.")
            if problem is not None:
                return problem
        elif not isinstance(state[key], kind):
            return f"its {prefix}{key} is a {type(state[key]).__name__}, not a {getattr(kind, '__name__', kind)}"
    return None


class Checkpoints:
    """The checkpoints of one run.

    Args:
        directory: where the `step-*` directories live (`run_dir/checkpoints`).
        keep: how many complete checkpoints to keep (>= 1); older ones are deleted only after
            a newer one has been saved and verified.
        fields: what a loaded `state.pt` must hold (`missing_field`: key -> type, or a nested dict of
            them); a state without them is corrupt: `load` skips it for the previous checkpoint.
    """

    def __init__(self, directory: str | Path, keep: int = 1, fields: dict | None = None):
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep={keep!r} must be an int >= 1")
        self.dir = Path(directory)
        self.keep = keep
        self.fields = fields or {}

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
        """Write `state` (torch.save) and whatever `write_extra(dir)` writes, verified and atomically.
        A write that fails (a full disk, a file-size limit, an I/O error) removes its temp directory and
        raises CheckpointError saying what failed and the newest complete checkpoint, which is kept."""
        if not re.fullmatch(r"step-\d+", name):
            raise ValueError(f"name={name!r} must look like 'step-<int>'")
        self.dir.mkdir(parents=True, exist_ok=True)
        final, tmp, old = self.dir / name, self.dir / f"{name}.tmp", self.dir / f"{name}.old"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            torch.save(state, tmp / STATE)
            if write_extra is not None:
                write_extra(tmp)
            write_manifest(tmp)
        except (OSError, RuntimeError) as err:  # torch.save reports a failed write as a RuntimeError
            shutil.rmtree(tmp, ignore_errors=True)
            raise self._write_error(name, err) from err
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

    def _write_error(self, name: str, err: BaseException) -> CheckpointError:
        free = shutil.disk_usage(self.dir).free
        reason = str(err).strip().splitlines()[0] if str(err).strip() else err.__class__.__name__
        latest = self.latest()
        return CheckpointError(
            f"could not write checkpoint {name} in {self.dir} ({err.__class__.__name__}: {reason}); "
            f"{free / 2**30:.2f} GiB are free there: a full disk, a quota or a file-size limit "
            f"(ulimit -f) stops a save. Free space, or resume on a larger disk with run_dir=<a copy of the "
            f"run directory>; the newest complete checkpoint, "
            f"{latest.name if latest is not None else 'none (none was written yet)'}, is kept")

    def recover(self) -> None:
        """Finish what a save killed midway left (the caller holds the run's lock, so no save is
        running): a re-saved step's `.old` copy goes where its new copy is complete, and takes the
        step's name where the new one never got it; temp directories go."""
        for old in self.dir.glob("step-*.old") if self.dir.is_dir() else ():
            final = old.with_name(old.name.removesuffix(".old"))
            if final.is_dir() and verify(final) is None:
                shutil.rmtree(old, ignore_errors=True)
            elif not final.exists() and verify(old) is None:
                os.replace(old, final)
        for tmp in self.dir.glob("step-*.tmp") if self.dir.is_dir() else ():
            shutil.rmtree(tmp, ignore_errors=True)

    def load(self, path: Path | None = None) -> tuple[dict, Path] | None:
        """(state, directory) of `path` or of the newest complete checkpoint; None when there is
        none. A checkpoint whose state.pt cannot be read, or lacks the `fields` a state holds, is
        skipped for the previous complete one (with a warning naming the file); an unsafe one raises
        `UnsafeCheckpointError`."""
        if path is not None:
            problem = verify(path)
            if problem is not None:
                raise CheckpointError(f"checkpoint {path} is incomplete: {problem}")
            return self._read(path), path
        for candidate in self.complete():
            try:
                return self._read(candidate), candidate
            except UnsafeCheckpointError:
                raise
            except CheckpointError as err:
                warnings.warn(f"skipping checkpoint {candidate.name}: {err}", stacklevel=2)
        return None

    def problem(self, directory: Path) -> str | None:
        """None when `load(directory)` would load it, else why not (naming the file)."""
        try:
            self.load(directory)
        except CheckpointError as err:
            return str(err)
        return None

    def _read(self, directory: Path) -> dict:
        state = read_state(directory / STATE)
        problem = missing_field(state, self.fields)
        if problem is not None:
            raise CheckpointError(f"{directory / STATE} is not a checkpoint's state: {problem}")
        return state

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
