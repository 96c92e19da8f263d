"""`ContextWriteBack`: each update's replay-context entries written back into replay, without the
host waiting for the update.

An update leaves, on the device, the posteriors of the steps it trained (`GraphedUpdate.context`:
entries [B, T-1] for steps 1..T-1 of its batch, `Agent.keep_context`); replay keeps them at the
slots the batch was sampled from (`Replay.write`), so the next sequence that starts there is
filtered from the state the newest model inferred, as the reference's `replay.update` does.

On CUDA, `push` queues a copy of the entries into page-locked host memory on the current (learner's)
stream, behind the update, and records an event; `flush` writes the copies whose event has passed,
oldest first (so a slot two updates wrote keeps the newer entry), and never waits. At most `depth`
copies are in flight: a push beyond that waits for the oldest and writes it. Off CUDA every push is
written at once.
"""

from __future__ import annotations

from collections import deque

import torch
from tensordict import TensorDict

from worldmodels.data import Replay


class ContextWriteBack:
    """Args:
        replay: the replay the sampled batches came from.
        depth: copies in flight at most (each one batch of entries: ~4 MB at B16 x T64, deter 2048).
    """

    def __init__(self, replay: Replay, depth: int = 32):
        if depth < 1:
            raise ValueError(f"depth={depth} must be >= 1")
        self.replay, self.depth = replay, depth
        self.pending: deque = deque()  # (event, host entries, slots, episode, step), oldest first
        self.written = 0  # steps written so far

    def push(self, entries: TensorDict, slots: torch.Tensor, episode: torch.Tensor, step: torch.Tensor) -> None:
        """`entries` [B, T-1] (on the update's device) for steps 1..T-1 of a batch sampled at `slots`
        [B, T] whose steps held (`episode`, `step`) [B, T] (host tensors)."""
        where = (slots[:, 1:], episode[:, 1:], step[:, 1:])
        if entries.device is None or entries.device.type != "cuda":
            self._write(None, entries.cpu(), *where)
            return
        host = entries.apply(lambda x: torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
                             .copy_(x, non_blocking=True), device="cpu")
        event = torch.cuda.Event()
        event.record()
        self.pending.append((event, host, *where))
        if len(self.pending) > self.depth:
            self._write(*self.pending.popleft())

    def flush(self) -> None:
        """Write every copy that has arrived (oldest first); waits for none."""
        while self.pending and self.pending[0][0].query():
            self._write(*self.pending.popleft())

    def _write(self, event, host: TensorDict, slots, episode, step) -> None:
        if event is not None:
            event.synchronize()
        values = TensorDict({"context": host}, batch_size=host.batch_size)
        self.written += self.replay.write(slots, episode, step, values)
