"""`Replay`: sequences [B, T] sampled from a torchrl replay buffer with a slice sampler.

Each stored item is one step of one env: the observation, the action taken *before* it (zeros
at an episode start), the reward received on arriving there, `is_first`, `is_terminal`, and the
episode id / step index the sampler reads. Several envs write interleaved, so the slice sampler
runs in `fragmented` mode: it rebuilds each episode from (episode, step) and never returns a
slice that crosses from one episode into another. Pixels stay uint8.

With `memmap_dir`, the steps live in memory-mapped files there: scratch space this replay owns
and clears when it builds its storage (a resumed run refills it from the checkpoint's copy).
`save`/`load` write and read a directory (`steps/` memory-mapped tensors, `writer.pt` the write
cursor, read with `weights_only=True`); `load` refuses, naming the file, a directory that does not
hold what `save` wrote (a missing `writer.pt`, fewer steps than the checkpoint recorded).
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import torch
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, SliceSampler, TensorDictReplayBuffer

STEP_KEYS = ("action", "reward", "is_first", "is_terminal", "episode", "step")


class _SlotSampler(SliceSampler):
    """A SliceSampler that only picks storage slots; `Replay.sample` gathers the steps itself.

    torchrl 0.14.1's `_finalize_index` reads every key at the sampled slots to build the
    truncation/init info we never read (`sample` uses only the slots): a second full gather of
    B*T pixel frames per batch, 13-15 ms of a 25-30 ms sample on one CPU thread. We skip it."""

    def _finalize_index(self, *, index, **kwargs):
        return index.to(torch.long).unbind(-1), {}


class ReplayError(RuntimeError):
    """A saved replay that cannot be restored; the message names the file."""


class Replay:
    """Sequences of consecutive steps of single episodes, sampled uniformly.

    Args:
        capacity: steps kept (oldest dropped first), >= seq_len.
        batch_size: sequences per sampled batch (B).
        seq_len: steps per sequence (T).
        memory_gb: caps the capacity by the bytes one step takes (None: no cap).
        memmap_dir: store the steps in memory-mapped files in this directory (cleared when the
            storage is built) instead of RAM.
    """

    def __init__(self, *, capacity: int, batch_size: int, seq_len: int, memory_gb: float | None = None,
                 memmap_dir: str | Path | None = None):
        for name, value in (("capacity", capacity), ("batch_size", batch_size), ("seq_len", seq_len)):
            if value < 1:
                raise ValueError(f"replay.{name}={value!r} must be >= 1")
        if capacity < seq_len:
            raise ValueError(f"replay.capacity={capacity!r} must be >= seq_len={seq_len!r}: it holds no full sequence")
        if memory_gb is not None and memory_gb <= 0:
            raise ValueError(f"replay.memory_gb={memory_gb!r} must be > 0")
        self.capacity, self.batch_size, self.seq_len = capacity, batch_size, seq_len
        self.memory_gb, self.memmap_dir = memory_gb, memmap_dir
        self.buffer: TensorDictReplayBuffer | None = None  # built on the first `add` (needs a step's size)
        self._ready = False

    def _build(self, step: TensorDict) -> None:
        capacity = self.capacity
        if self.memory_gb is not None:
            step_bytes = sum(v.element_size() * v[0].numel() for v in step.values(True, True))
            capacity = min(capacity, int(self.memory_gb * 2**30 // step_bytes))
            if capacity < self.seq_len:
                raise ValueError(f"replay.memory_gb={self.memory_gb} holds {capacity} steps, "
                                 f"fewer than one sequence ({self.seq_len})")
        if self.memmap_dir is not None:
            shutil.rmtree(self.memmap_dir, ignore_errors=True)  # a previous process's scratch files
            storage = LazyMemmapStorage(capacity, scratch_dir=str(self.memmap_dir))
        else:
            storage = LazyTensorStorage(capacity)
        sampler = _SlotSampler(slice_len=self.seq_len, traj_key="episode", step_key="step", fragmented=True,
                               strict_length=True, init_key=None, truncated_key=None)
        self.buffer = TensorDictReplayBuffer(storage=storage, sampler=sampler)  # sampled through `sample` only
        self.storage_capacity = capacity

    def add(self, steps: TensorDict) -> None:
        """steps: TensorDict [n] of single steps (any envs, any order within an episode's step index)."""
        if self.buffer is None:
            self._build(steps)
        self.buffer.extend(steps)

    def __len__(self) -> int:
        return 0 if self.buffer is None else len(self.buffer)

    def ready(self) -> bool:
        """True once some episode holds a full sequence (the sampler can return a batch)."""
        if self.buffer is None:
            return False
        if not self._ready:  # once true it stays true (capacity >= seq_len): scan the steps only until then
            self._ready = bool((self.buffer.storage[: len(self.buffer)]["step"] >= self.seq_len - 1).any())
        return self._ready

    def sample(self) -> TensorDict:
        """A batch [B, T] of consecutive steps from single episodes."""
        (slots,), _ = self.buffer.sampler.sample(self.buffer.storage, self.batch_size * self.seq_len)
        # index_select, not `storage[slots]`: advanced indexing of uint8 frames is ~7x slower on CPU
        steps = self.buffer.storage._storage  # [capacity] TensorDict, slot-indexed
        flat = steps.apply(lambda x: x.index_select(0, slots), batch_size=[slots.numel()])
        return flat.reshape(self.batch_size, self.seq_len)

    def save(self, path: Path) -> None:
        """Write the filled part of the storage (memory-mapped tensors) and the write cursor to
        the directory `path` (only what is stored: an empty tail of the capacity costs nothing)."""
        if self.buffer is None:
            return
        path = Path(path)
        self.buffer.storage[: len(self)].memmap(path / "steps", copy_existing=True)
        torch.save({"cursor": self.buffer._writer._cursor}, path / "writer.pt")

    def load(self, path: Path, example: TensorDict, size: int | None = None) -> None:
        """Restore what `save` wrote; `example` is one step batch (sets up the storage layout);
        `size`: the number of steps the saved replay must hold (what the checkpoint recorded)."""
        path = Path(path)
        if not path.exists() and not size:
            return  # saved before the first step was stored
        for name in ("writer.pt", "steps"):
            if not (path / name).exists():
                raise ReplayError(f"{path / name} is missing: the saved replay is incomplete")
        try:
            cursor = torch.load(path / "writer.pt", weights_only=True)["cursor"]
            saved = TensorDict.load_memmap(path / "steps")
        except (OSError, RuntimeError, ValueError, KeyError, EOFError, pickle.UnpicklingError) as err:
            raise ReplayError(f"the saved replay in {path} could not be read "
                              f"({err.__class__.__name__}: {err})") from None
        if size is not None and saved.shape[0] != size:
            raise ReplayError(f"{path / 'steps'} holds {saved.shape[0]} steps, the checkpoint recorded {size}")
        if self.buffer is None:
            self._build(example)
        self.buffer.empty()
        self._ready = False
        self.buffer.extend(saved.clone())
        self.buffer._writer._cursor = cursor

    def close(self) -> None:
        if self.memmap_dir is not None:
            shutil.rmtree(self.memmap_dir, ignore_errors=True)


__all__ = ["STEP_KEYS", "Replay", "ReplayError"]
