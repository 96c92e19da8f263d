"""`Replay`: sequences [B, T] of consecutive steps, sampled uniformly from a torchrl replay buffer.

Each stored item is one step of one env: the observation, the action taken *before* it (zeros
at an episode start), the reward received on arriving there, `is_first`, `is_terminal`, `is_last`,
the episode id / step index and the env's stream id / position (collector.py). torchrl's buffer
stores the steps (a ring: the oldest are overwritten first); a `SequenceIndex`
(sequence_index.py) links each written step to its trajectory's previous step, so several envs can
write interleaved, and samples a batch uniformly over the stored sequences of T consecutive steps
of one trajectory (each such sequence as likely as any other, whatever its trajectory's length),
at a cost that does not grow with the number of steps stored. An add that does not wrap the ring
writes its steps straight into the storage's tensors, leaving what torchrl's `extend` would (the
writer's cursor and count, the "index" column, the length): one env writes every agent step, and the
generic path's host time was most of the write. By default a trajectory is an
episode, and no sequence crosses from one episode into another; with `cross_episodes` it is an
env's stream, as in DreamerV3's replay: a sequence may run on past an episode's last step into the
next episode (`is_first` marks where the model resets), so that every step is covered by as many
sequences as any other. Within episodes only, the k-th step of an episode lies in min(k + 1, T)
sequences: its first steps (where, say, a walker stands up) are sampled up to T times less than
its middle. Pixels stay uint8.

With `memmap_dir`, the steps live in memory-mapped files there: scratch space this replay owns
and clears when it builds its storage (a resumed run refills it from the checkpoint's copy). With a
CUDA `device`, they live in that GPU's memory: a batch is gathered there (no host gather, no copy
to the GPU), and an add copies its steps over. The trajectory / position columns that the index
walks when sampling are also kept on the host, whatever the device. The whole storage is allocated
at the first add (or `load`); on a GPU that is refused, naming the settings to change, where it would
leave less than `GPU_HEADROOM` of the GPU's memory free (other processes' use counted: runs sharing
a GPU under MPS start one by one), instead of failing later in a bare CUDA or cuBLAS allocation.

`save`/`load` write and read a directory: `writer.pt` (the write cursor, read with
`weights_only=True`), `steps.json` (each stored key's dtype, shape and chunk sizes) and
`steps/<key>.zlib`, one per key: the filled part of the storage in chunks of about `CHUNK_BYTES`
raw bytes, each compressed on its own (zlib level `LEVEL`, bytes of multi-byte numbers grouped by
significance first; chunks compressed and decompressed on several threads). A 64x64x3 pixel
replay shrinks about 3.5x, a state replay about 1.4x. `load` reads its files through `open_file`, so a
checkpoint can hand it files stored as pieces; it refuses, naming the file, a directory that does
not hold what `save` wrote (a missing file, a damaged chunk, fewer steps than the checkpoint
recorded). Directories of the earlier format (`steps/` memory-mapped tensors) still load.

Frames rendered again (`save(frames=key, render=...)`): where every stored step holds the simulator
state its frame was rendered from (`RENDER_STATE`, envs/render_state.py), a save can leave the
frames out and keep, per step, the state (int64 [S]) and the frame's CRC-32 (`FRAME_CRC`): a saved
step of cheetah_run or walker_walk at 64x64 (18 float64 of state) takes ~170 bytes in all, against
2.0 and 3.8 KB with its frame (random actions). It first renders a sample of the stored states and
keeps the frames after all (with a warning) when any differs from its stored frame (a task whose
frames depend on more than the state) or when some stored steps have no state (loaded from a save
without them). `load(render=...)` renders the frames again and warns with the count of frames whose
CRC differs (another renderer: GL library, driver, GPU); `RENDER_STATE` is never part of a sampled
batch.

Replay context (`Agent.context_entries`, under "context"): a sampled batch holds the entries of each
sequence's first step (the state it is filtered from) and zeros at its other steps;
`sample(with_slots=True)` also returns where each sampled step is stored, `held(slots)` the (episode,
step) they hold then (on the host, read without waiting on a GPU), and `write` puts an update's fresh
entries back there (skipping slots that were reused since). These entries are not
saved: they are a cache of the model's own posteriors (2-4 KB a step, poorly compressible), so a
resumed replay holds zeros there until the updates rewrite the steps they sample, which covers the
replay within a few hundred updates.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import time
import warnings
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, RandomSampler, TensorDictReplayBuffer

from worldmodels.data.sequence_index import SequenceIndex
from worldmodels.envs.render_state import RENDER_STATE, frame_checksums

TRAJECTORY_KEYS = {False: ("episode", "step"), True: ("stream", "stream_step")}  # by `cross_episodes`
UNSAVED = ("context",)  # top-level keys `save` leaves out (see the module docstring)
UNSAMPLED = ("context", RENDER_STATE)  # top-level keys a batch leaves out (context: filled in at step 0 only)
FRAME_CRC = "frame_crc32"  # a frameless save's per-step checksums of the frames it left out
CHECKED_FRAMES = 64  # stored frames a frameless save renders again first, spread over the replay
STEP_KEYS = ("action", "reward", "is_first", "is_terminal", "episode", "step")
LAYOUT = "steps.json"
LEVEL = 4  # zlib level; dm_control 64x64 frames, one thread: 3.4x at ~45 MB/s (1: 2.7x, ~50 MB/s; 6: 3.5x, ~25)
CHUNK_BYTES = 4 * 2**20  # raw bytes per compressed chunk: the unit of work of one thread


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
        cross_episodes: slices may run on from an episode into the next one of the same env (see the
            module docstring); False: each slice lies within one episode.
        device: where the steps are stored and batches gathered (None: host memory); not with
            `memmap_dir`.
    """

    def __init__(self, *, capacity: int, batch_size: int, seq_len: int, memory_gb: float | None = None,
                 memmap_dir: str | Path | None = None, cross_episodes: bool = False,
                 device: str | torch.device | None = None):
        for name, value in (("capacity", capacity), ("batch_size", batch_size), ("seq_len", seq_len)):
            if value < 1:
                raise ValueError(f"replay.{name}={value!r} must be >= 1")
        if capacity < seq_len:
            raise ValueError(f"replay.capacity={capacity!r} must be >= seq_len={seq_len!r}: it holds no full sequence")
        if memory_gb is not None and memory_gb <= 0:
            raise ValueError(f"replay.memory_gb={memory_gb!r} must be > 0")
        device = torch.device("cpu" if device is None else device)
        if memmap_dir is not None and device.type != "cpu":
            raise ValueError(f"replay.memmap stores steps in host files; it cannot hold them on {device}")
        self.capacity, self.batch_size, self.seq_len = capacity, batch_size, seq_len
        self.memory_gb, self.memmap_dir, self.device = memory_gb, memmap_dir, device
        self.traj_key, self.step_key = TRAJECTORY_KEYS[bool(cross_episodes)]
        self.buffer: TensorDictReplayBuffer | None = None  # built on the first `add` (needs a step's size)
        self.index: SequenceIndex | None = None
        self.stateless_steps = False  # some stored steps were loaded without their RENDER_STATE
        self.rendered_on_load: tuple[int, float] | None = None  # (frames, seconds) the last `load` rendered again

    def _build(self, step: TensorDict) -> None:
        capacity = self.capacity
        step_bytes = sum(v.element_size() * v[0].numel() for v in step.values(True, True))
        if self.memory_gb is not None:
            capacity = min(capacity, int(self.memory_gb * 2**30 // step_bytes))
            if capacity < self.seq_len:
                raise ValueError(f"replay.memory_gb={self.memory_gb} holds {capacity} steps, "
                                 f"fewer than one sequence ({self.seq_len})")
        if self.device.type == "cuda":
            check_gpu_room(capacity * step_bytes, self.device)
        if self.memmap_dir is not None:
            shutil.rmtree(self.memmap_dir, ignore_errors=True)  # a previous process's scratch files
            storage = LazyMemmapStorage(capacity, scratch_dir=str(self.memmap_dir))
        else:
            storage = LazyTensorStorage(capacity, device=self.device)
        # storage and ring writer; `sample` draws from `self.index` (the plain sampler costs nothing on extend)
        self.buffer = TensorDictReplayBuffer(storage=storage, sampler=RandomSampler())
        self.index = SequenceIndex(capacity, self.seq_len)
        self.storage_capacity = capacity
        # host copies of the columns the index walks when sampling and `write` checks (a storage on a GPU
        # holds its own there; 16-32 bytes a step, a few hundredths of a pixel step's)
        self._host_columns = {key: torch.zeros(capacity, dtype=torch.long)
                              for key in dict.fromkeys((self.traj_key, self.step_key, "episode", "step"))}
        self._leaves = None  # (storage TensorDict, [(key, its column)]): `_write_in_place`'s targets

    def add(self, steps: TensorDict) -> None:
        """steps: TensorDict [n] of single steps (any envs; any order within the call, but each episode's
        and stream's steps in position order from call to call, as the collector writes them)."""
        if self.buffer is None:
            self._build(steps)
        slots = self._write_in_place(steps)
        if slots is None:
            slots = self.buffer.extend(steps).cpu()
        self._link(slots, steps)

    def _link(self, slots: torch.Tensor, steps: TensorDict) -> None:
        """The host columns' copies of `steps` just stored at `slots` (host), and the index's links."""
        for key, column in self._host_columns.items():
            values = steps.get(key, None)  # episode / step: what `write` checks, where the steps hold them
            if values is not None:
                column[slots] = values.cpu()
        self.index.link(slots, steps.get(self.traj_key), steps.get(self.step_key))

    def _write_in_place(self, steps: TensorDict) -> torch.Tensor | None:
        """What torchrl's `extend` does for a write that does not wrap the ring, done straight into its
        storage's tensors: a copy per key, the "index" column, the writer's cursor and count, the storage's
        length (`extend`'s writer, storage `set` and TensorDict indexing are Python run on every agent
        step). Returns the slots written, or None where `extend` must write: the storage is not allocated
        yet, the write wraps, or `steps` holds other keys than the storage."""
        storage, writer = self.buffer.storage, self.buffer._writer
        n, cursor = steps.shape[0], writer._cursor
        if not storage.initialized or cursor + n > self.storage_capacity or n == 0:
            return None
        stored = storage._storage
        if self._leaves is None or self._leaves[0] is not stored:
            self._leaves = (stored, [(key, stored.get(key)) for key in stored.keys(True, True) if key != "index"])
        keys = steps.keys(True, True)
        if len(keys) != len(self._leaves[1]):
            return None
        try:
            for key, column in self._leaves[1]:
                column[cursor: cursor + n].copy_(_staged(steps.get(key), column.device), non_blocking=True)
        except KeyError:
            return None  # nothing was written past the key that is missing: `extend` rewrites these slots
        slots = torch.arange(cursor, cursor + n)
        index = stored.get("index")
        index[cursor: cursor + n].copy_(_staged(slots, index.device), non_blocking=True)
        writer._cursor = (cursor + n) % self.storage_capacity
        writer._write_count += n
        storage._len = min(storage._len + n, self.storage_capacity)
        return slots

    def __len__(self) -> int:
        return 0 if self.buffer is None else len(self.buffer)

    def ready(self) -> bool:
        """True once some episode (stream, with `cross_episodes`) holds a full sequence of T steps (the
        sampler can return a batch); O(1)."""
        return self.index is not None and self.index.ready()

    def sample(self, pin_memory: bool = False, with_slots: bool = False):
        """A batch [B, T] of consecutive steps from single episodes (streams, with `cross_episodes`),
        drawn uniformly over the stored sequences; raises a RuntimeError if none is stored. `pin_memory`:
        gathered straight into page-locked host memory, so that a `non_blocking` copy to the GPU is
        queued, not waited for (a replay on a GPU gathers there: nothing to pin).
        `with_slots`: returns (batch, slots [B, T]), the storage slots of the steps (for `write`)."""
        steps = self.buffer.storage._storage  # [capacity] TensorDict, slot-indexed
        columns = self._host_columns
        slots = self.index.sample(self.batch_size, len(self.buffer), columns[self.traj_key],
                                  columns[self.step_key])  # [B, T], each sequence in time order
        at = _staged(slots.reshape(-1), self.device).to(self.device, non_blocking=True)
        pin_memory = pin_memory and self.device.type == "cpu"

        def gather(x: torch.Tensor) -> torch.Tensor:
            # index_select, not `storage[slots]`: advanced indexing of uint8 frames is much slower on CPU (docs/pace.md)
            if not pin_memory:
                return x.index_select(0, at)
            out = torch.empty((at.numel(), *x.shape[1:]), dtype=x.dtype, pin_memory=True)
            return torch.index_select(x, 0, at, out=out)

        B, T = self.batch_size, self.seq_len
        batch = steps.exclude(*UNSAMPLED).apply(gather, batch_size=[at.numel()]).reshape(B, T)
        if "context" in steps.keys():  # read at step 0 only (the state the sequence starts from): zeros after
            context = steps["context"].apply(lambda x: _zeros_but_first(x, at.reshape(B, T)[:, 0], T, pin_memory),
                                              batch_size=[B, T])
            batch.set("context", context)
        return (batch, slots) if with_slots else batch

    def write(self, slots: torch.Tensor, episode: torch.Tensor, step: torch.Tensor, values: TensorDict) -> int:
        """Overwrite stored steps: `values` [...] (keys as stored, e.g. {"context": ...}) at `slots` [...],
        where the slot still holds that (`episode`, `step`); a slot reused by a newer step since it was
        sampled is skipped. Returns the number of steps written."""
        stored, device, columns = self.buffer.storage._storage, self.device, self._host_columns
        slots, episode, step = (x.reshape(-1).cpu() for x in (slots, episode, step))
        keep = torch.nonzero((columns["episode"][slots] == episode) & (columns["step"][slots] == step)).squeeze(1)
        written, at = keep.numel(), slots[keep]  # checked on the host: a GPU's storage is not waited for
        keep, at = (_staged(x, device).to(device, non_blocking=True) for x in (keep, at))
        for key in values.keys(True, True):
            value = values.get(key)
            value = value.reshape(-1, *value.shape[values.batch_dims:])
            value = _staged(value, device).to(device, non_blocking=True)
            stored.get(key).index_copy_(0, at, value.index_select(0, keep))
        return written

    def held(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(episode, step) [...] that `slots` [...] hold now, on the host (what `write` checks later)."""
        slots = slots.cpu()
        return self._host_columns["episode"][slots], self._host_columns["step"][slots]

    def save(self, path: Path, frames: str | tuple | None = None,
             render: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """Write the filled part of the storage, compressed, and the write cursor to the directory
        `path` (only what is stored: an empty tail of the capacity costs nothing). `frames`: the key of
        stored frames to leave out, to be rendered again on load from the steps' `RENDER_STATE` by
        `render` (int64 states [n, S] -> uint8 frames [n, ...]); kept after all where that cannot
        reproduce them (module docstring)."""
        if self.buffer is None:
            return
        path = Path(path)
        (path / "steps").mkdir(parents=True, exist_ok=True)
        steps = self.buffer.storage[: len(self)].exclude(*UNSAVED)
        rendered = frames is not None and self._renders_again(steps, frames, render)
        if rendered:
            steps = steps.exclude(frames).set(FRAME_CRC, _checksums(steps.get(frames)))
        fields = [_write_field(path, key, steps.get(key)) for key in steps.keys(True, True)]
        layout = {"format": 2, "codec": "zlib", "level": LEVEL, "steps": len(self), "fields": fields}
        if rendered:
            layout["rendered"] = [frames] if isinstance(frames, str) else list(frames)
        (path / LAYOUT).write_text(json.dumps(layout, indent=1))
        torch.save({"cursor": self.buffer._writer._cursor}, path / "writer.pt")

    def _renders_again(self, steps: TensorDict, frames: str | tuple, render: Callable | None) -> bool:
        """Whether `render` gives back the stored `frames` from the steps' `RENDER_STATE` (checked on
        `CHECKED_FRAMES` steps spread over the replay); warns, naming the reason, where it does not."""
        if RENDER_STATE not in steps.keys() or render is None or self.stateless_steps:
            why = ("some stored steps were loaded without the state they were rendered from" if self.stateless_steps
                   else "no renderer was given" if RENDER_STATE in steps.keys()
                   else "the env gives no state to render them from")
            warnings.warn(f"the replay is saved with its frames: {why}", stacklevel=3)
            return False
        at = torch.linspace(0, len(steps) - 1, min(CHECKED_FRAMES, len(steps))).long().unique()
        stored = steps.get(frames)[at.to(self.device)].cpu()
        again = render(steps.get(RENDER_STATE)[at.to(self.device)].cpu())
        differ = int((again != stored).flatten(1).any(1).sum())
        if differ:
            warnings.warn(f"the replay is saved with its frames: {differ} of {len(at)} frames rendered again from "
                          "their states differ from those stored (the frames depend on more than the state)",
                          stacklevel=3)
        return not differ

    def load(self, path: Path, example: TensorDict, size: int | None = None,
             open_file: Callable[[Path], BinaryIO] | None = None,
             render: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """Restore what `save` wrote; `example` is one step batch (sets up the storage layout);
        `size`: the number of steps the saved replay must hold (what the checkpoint recorded);
        `open_file(path)`: opens a saved file for reading (a checkpoint's `open_file` reads pieces);
        `render`: int64 states [n, S] -> uint8 frames [n, ...], for a replay saved without its frames."""
        path = Path(path)
        if not path.exists() and not size:
            return  # saved before the first step was stored
        saved, cursor, layout = _read_saved(path, open_file)
        if size is not None and saved.shape[0] != size:
            raise ReplayError(f"{path / 'steps'} holds {saved.shape[0]} steps, the checkpoint recorded {size}")
        if self.buffer is None:  # before a render of the frames: a storage that cannot fit is refused first
            self._build(example)
        rendered, self.rendered_on_load = layout.get("rendered"), None
        if rendered is not None:
            start = time.perf_counter()
            _render_frames(path, saved, tuple(rendered), render)
            self.rendered_on_load = (saved.shape[0], time.perf_counter() - start)
        self.stateless_steps = RENDER_STATE in example.keys() and RENDER_STATE not in saved.keys()
        for key in example.keys(True, True):  # what `save` leaves out (UNSAVED): zeros
            if key in _BEFORE_STREAMS and key not in saved.keys():  # saved before streams: one per episode
                saved.set(key, saved.get(_BEFORE_STREAMS[key]).clone())
            elif key not in saved.keys(True, True):
                value = example.get(key)
                saved.set(key, torch.zeros((saved.shape[0], *value.shape[1:]), dtype=value.dtype))
        self.buffer.empty()
        self.index.clear()
        slots = self.buffer.extend(saved).cpu()
        self._link(slots, saved)  # vectorised: one sort
        self.buffer._writer._cursor = cursor

    def close(self) -> None:
        if self.memmap_dir is not None:
            shutil.rmtree(self.memmap_dir, ignore_errors=True)


_BEFORE_STREAMS = {"stream": "episode", "stream_step": "step"}


GPU_HEADROOM = 0.1  # of the GPU's memory, left free for the model, its update's activations, CUDA graphs and cuBLAS


def check_gpu_room(need: int, device: torch.device) -> None:
    """Refuse a replay storage of `need` bytes on the CUDA `device` where it would leave less than
    `GPU_HEADROOM` of the GPU's memory free. Free memory counts what other processes hold (CUDA's own
    count) and this process's cached but unused blocks (which its allocator hands out again)."""
    free, total = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if need > free - GPU_HEADROOM * total:
        gib = 2**30
        raise RuntimeError(
            f"replay.on_device=true: the replay's storage takes {need / gib:.1f} GiB of {device}, which has "
            f"{free / gib:.1f} of its {total / gib:.1f} GiB free (the rest held by this and other processes); "
            f"it would leave less than {GPU_HEADROOM:.0%} for the model and its update: "
            "lower replay.memory_gb (or replay.capacity), set replay.on_device=false (host memory), "
            "or run fewer runs on this GPU")


def _staged(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`values`, ready for a `non_blocking` copy to `device`: a host tensor bound for a GPU in page-locked
    memory, so that the copy is queued on the current stream, in order with the batches gathered there,
    without the host waiting (a copy from pageable memory waits for the work queued before it, such as
    the updates in flight). Anything else as it is."""
    if device.type == "cuda" and not values.is_cuda and not values.is_pinned():
        return values.pin_memory()
    return values


def _zeros_but_first(x: torch.Tensor, first: torch.Tensor, steps: int, pin_memory: bool) -> torch.Tensor:
    """[B, steps, ...]: `x` at the slots `first` [B] at step 0, zeros after (a gather of every step's
    entries would cost host time on every batch, growing with deter: docs/pace.md)."""
    out = torch.zeros((first.numel(), steps, *x.shape[1:]), dtype=x.dtype, device=x.device, pin_memory=pin_memory)
    out[:, 0] = x.index_select(0, first)
    return out


def read_saved(path: Path, open_file: Callable[[Path], BinaryIO] | None = None) -> tuple[TensorDict, int]:
    """(steps [n], write cursor) of a directory `Replay.save` wrote, in either format."""
    steps, cursor, _ = _read_saved(path, open_file)
    return steps, cursor


def _read_saved(path: Path, open_file: Callable[[Path], BinaryIO] | None) -> tuple[TensorDict, int, dict]:
    """`read_saved`, and the saved `LAYOUT` (empty for the memory-mapped format, which has none)."""
    path, open_file = Path(path), open_file or _open
    try:
        with open_file(path / "writer.pt") as f:
            cursor = torch.load(f, weights_only=True)["cursor"]
        if (path / "steps" / "meta.json").is_file():  # memory-mapped tensors: the format before compression
            return TensorDict.load_memmap(path / "steps").clone(), cursor, {}
        with open_file(path / LAYOUT) as f:
            layout = json.loads(f.read())
        steps = TensorDict({}, batch_size=[layout["steps"]])
        for field in layout["fields"]:
            steps.set(tuple(field["key"]), _read_field(path, field, layout["steps"], open_file))
        return steps, cursor, layout
    except FileNotFoundError as err:
        raise ReplayError(f"{err}: the saved replay is incomplete") from None
    except (OSError, RuntimeError, ValueError, KeyError, TypeError, EOFError, zlib.error,
            pickle.UnpicklingError) as err:
        raise ReplayError(f"the saved replay in {path} could not be read "
                          f"({err.__class__.__name__}: {err})") from None


def _checksums(frames: torch.Tensor) -> torch.Tensor:
    """`frame_checksums` of frames [n, ...], a chunk at a time (a GPU's frames come over in pieces)."""
    rows = max(1, CHUNK_BYTES // max(1, frames[0].numel()))
    return torch.cat([frame_checksums(frames[i: i + rows]) for i in range(0, frames.shape[0], rows)])


def _render_frames(path: Path, saved: TensorDict, key: tuple, render: Callable | None) -> None:
    """Put the frames a frameless save left out back into `saved` under `key`, rendered from the steps'
    `RENDER_STATE`; warns with the count of frames whose CRC differs from the stored one."""
    key = key[0] if len(key) == 1 else key
    if render is None:
        raise ReplayError(f"{path} was saved without its frames (replay.save_frames=false); loading it needs the env "
                          "that renders them again from their states, and none was given")
    try:
        frames = render(saved.get(RENDER_STATE))
    except Exception as err:  # the renderer's own message says what failed (envs/gl.py: GLUnavailable)
        raise ReplayError(f"{path} was saved without its frames (replay.save_frames=false), and rendering them "
                          f"again failed: {err}") from None
    if frames.shape[0] != saved.shape[0]:
        raise ReplayError(f"rendering {path}'s frames again gave {frames.shape[0]} frames for {saved.shape[0]} steps")
    differ = int((_checksums(frames) != saved.pop(FRAME_CRC)).sum())
    if differ:
        warnings.warn(f"{differ} of {frames.shape[0]} frames rendered again from {path}'s states differ from the "
                      "frames the run saw (CRC-32): this renderer (GL library, driver or GPU) is not the one that ran; "
                      "training goes on with the new frames", stacklevel=3)
    saved.set(key, frames)


def _open(path: Path) -> BinaryIO:
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing") from None


def _threads() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(8, cores)


def _in_order(fn: Callable, items: Iterable) -> Iterator:
    """fn(item) for each item, computed on `_threads()` threads, yielded in order; only a few
    items are in flight at a time, so memory stays bounded."""
    threads = _threads()
    with ThreadPoolExecutor(threads) as pool:
        pending = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _planes(rows: torch.Tensor) -> torch.Tensor:
    """[n, ...] -> uint8 [bytes per number, n, numbers per row]: byte k of every number together."""
    item = rows.element_size()
    return rows.contiguous().view(torch.uint8).reshape(rows.shape[0], -1, item).permute(2, 0, 1)


def _encode(rows: torch.Tensor) -> bytes:
    return zlib.compress(_planes(rows.cpu()).contiguous().numpy(), LEVEL)  # zlib releases the GIL


def _decode(job: tuple[bytes, torch.Tensor]) -> None:
    blob, out = job
    data = zlib.decompress(blob)
    planes = _planes(out)  # a view of `out`
    if len(data) != planes.numel():
        raise ValueError(f"a chunk holds {len(data)} bytes, expected {planes.numel()}")
    np.copyto(planes.numpy(), np.frombuffer(data, np.uint8).reshape(planes.shape))


def _write_field(path: Path, key: str | tuple, values: torch.Tensor) -> dict:
    """Compress `values` [n, ...] into `path/steps/<key>.zlib`; its entry in steps.json."""
    key = (key,) if isinstance(key, str) else tuple(key)
    file = Path("steps", *key[:-1], f"{key[-1]}.zlib")
    (path / file).parent.mkdir(parents=True, exist_ok=True)
    rows = max(1, CHUNK_BYTES // max(1, math.prod(values.shape[1:]) * values.element_size()))
    chunks = []
    with open(path / file, "wb") as f:
        for blob in _in_order(_encode, (values[i: i + rows] for i in range(0, values.shape[0], rows))):
            f.write(blob)
            chunks.append(len(blob))
    return {"key": list(key), "dtype": str(values.dtype).removeprefix("torch."), "shape": list(values.shape[1:]),
            "file": file.as_posix(), "rows": rows, "chunks": chunks}


def _read_field(path: Path, field: dict, steps: int, open_file: Callable[[Path], BinaryIO]) -> torch.Tensor:
    dtype = getattr(torch, field["dtype"])
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{field['dtype']!r} is not a torch dtype")
    out = torch.empty((steps, *field["shape"]), dtype=dtype)
    starts = range(0, steps, field["rows"])
    if len(starts) != len(field["chunks"]):
        raise ValueError(f"{field['file']} lists {len(field['chunks'])} chunks, {steps} steps need {len(starts)}")
    with open_file(path / field["file"]) as f:
        jobs = ((f.read(size), out[start: start + field["rows"]]) for start, size in zip(starts, field["chunks"]))
        for _ in _in_order(_decode, jobs):
            pass
    return out


__all__ = ["FRAME_CRC", "STEP_KEYS", "Replay", "ReplayError", "read_saved"]
