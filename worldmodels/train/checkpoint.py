"""Atomic checkpoints in `run_dir/checkpoints/`.

Layout: one directory per checkpoint, `step-<env steps>/` with `state.pt` (model, optimisers,
RNG states, counters) and `replay/` (the replay buffer), and a file `latest` naming the newest
complete one. A save writes `<name>.tmp/` first, renames it into place (`os.replace`), and only
then replaces `latest` (written to a temp file, then renamed). A crash at any point leaves
`latest` naming the previous complete checkpoint; older ones are deleted after the switch.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch


class Checkpoints:
    def __init__(self, directory: str | Path, keep: int = 1):
        self.dir = Path(directory)
        self.keep = max(1, keep)

    def latest(self) -> Path | None:
        """The newest complete checkpoint directory, or None."""
        pointer = self.dir / "latest"
        if not pointer.exists():
            return None
        path = self.dir / pointer.read_text().strip()
        return path if (path / "state.pt").exists() else None

    def save(self, name: str, state: dict, write_extra: Callable[[Path], None] | None = None) -> Path:
        """Write `state` (torch.save) and whatever `write_extra(dir)` writes, atomically."""
        self.dir.mkdir(parents=True, exist_ok=True)
        final, tmp = self.dir / name, self.dir / f"{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        torch.save(state, tmp / "state.pt")
        if write_extra is not None:
            write_extra(tmp)
        if final.exists():  # re-saving the same step: move the old copy aside first
            shutil.rmtree(final)
        os.replace(tmp, final)
        pointer_tmp = self.dir / "latest.tmp"
        pointer_tmp.write_text(name)
        os.replace(pointer_tmp, self.dir / "latest")
        self._prune(keep_name=name)
        return final

    def load(self, path: Path | None = None) -> tuple[dict, Path] | None:
        """(state, directory) of `path` or of the latest checkpoint; None when there is none."""
        path = path or self.latest()
        if path is None:
            return None
        return torch.load(path / "state.pt", map_location="cpu", weights_only=False), path

    def _prune(self, keep_name: str) -> None:
        done = sorted((p for p in self.dir.iterdir() if p.is_dir() and not p.name.endswith(".tmp")),
                      key=lambda p: p.stat().st_mtime)
        for path in done[: -self.keep]:
            if path.name != keep_name:
                shutil.rmtree(path, ignore_errors=True)
        for path in self.dir.glob("*.tmp"):
            if path.is_dir() and path.name != f"{keep_name}.tmp":
                shutil.rmtree(path, ignore_errors=True)
