"""`ActingCopy`: the agent the collector acts with, a few updates behind the learner, so that on
CUDA acting never waits for an update in flight.

Why: the update and the policy share the GPU. Acting with the live weights puts every action
behind the updates queued before it in stream order, so the host waits for them at each action
and the GPU idles while the host steps the envs, samples and launches the next updates. Acting
with the weights from before the latest batch of updates, on a stream of its own, lets the GPU
train while the host acts and steps the envs.

Contract:
- `agent`: a copy of the learner's agent (own parameters and buffers, no optimisers, empty CUDA
  graph caches), or with `enabled=False` the learner itself.
- `refresh()`, queued on the learner's stream: copies the learner's parameters and buffers into
  the copy after the acting work queued so far has read them. The trainer calls it before the
  updates owed at each env step, so every action uses the weights from before the most recent
  batch of updates, on every device alike; after a `refresh()` with no update after it (the
  trainer's resume) the weights equal.
- `policy(...)`: the copy's `Agent.policy`, each call run on the acting stream (CUDA) with the
  action moved to the host there, so the call returns when its own kernels are done. The acting
  stream has the device's highest priority: when an SM frees, the GPU's block scheduler gives it to
  a pending acting kernel before the updates' (at equal priority a planner's many small kernels can
  queue behind update kernels launched before them, while the host waits for the action).
- `to_device(batch)`: a host batch moved to the device on the learner's stream without the host
  waiting: from page-locked memory (`Replay.sample(pin_memory=True)`) the copy is only queued
  (pageable memory, or tensordict's own `.to`, would wait for the update in flight).
Off CUDA there are no streams: the same copies, in program order.
"""

from __future__ import annotations

import contextlib
import copy

import torch
from tensordict import TensorDictBase

from worldmodels.algos import Agent


class ActingCopy:
    """Args:
        agent: the learner's agent (trained by its `update`).
        enabled: act with a copy that trails the learner (see `refresh`); False acts with `agent` itself.
    """

    def __init__(self, agent: Agent, *, enabled: bool = True):
        self.learner, self.enabled = agent, enabled
        self.agent = _copy_without_optimizers(agent) if enabled else agent
        self._targets = [*self.agent.parameters(), *self.agent.buffers()]
        self._sources = [*agent.parameters(), *agent.buffers()]
        device = agent.updates.device
        # a priority under the device's range is clamped to its highest (a CUDA graph replayed on the
        # stream runs at the stream's priority)
        self.stream = torch.cuda.Stream(device, priority=-100) if enabled and device.type == "cuda" else None

    @torch.no_grad()
    def refresh(self) -> None:
        """Before an update: the copy takes the learner's weights (see the module docstring)."""
        if not self.enabled:
            return
        learner = torch.cuda.current_stream() if self.stream is not None else None
        if learner is not None:
            learner.wait_stream(self.stream)  # acting reads of the old copy come first
        torch._foreach_copy_(self._targets, self._sources)
        if learner is not None:
            self.stream.wait_stream(learner)  # later acting sees the new copy (not the update after it)

    def policy(self, mode: str, *, graphed: bool = False, device: torch.device | str = "cpu"):
        """The copy's `Agent.policy(mode, graphed=)`; actions come back on `device` (the envs')."""
        inner = self.agent.policy(mode, graphed=graphed)

        def policy(obs, is_first, carry):
            with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
                action, carry = inner(obs, is_first, carry)
                return action.to(device), carry  # on the acting stream: waits for that stream only
        return policy

    def context(self, carry, n: int, device: torch.device | str = "cpu"):
        """The replay-context entries [n] of a policy carry (`Agent.context_entries`; None: zeros) on
        `device` (the envs'), computed and copied on the acting stream: waits for acting only (leaf by
        leaf: tensordict's own `.to` would wait for the whole device). Zeros are made on `device`."""
        if carry is None:
            return self.agent.context_entries(None, n, device=device)
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            return self.agent.context_entries(carry[0]).apply(lambda x: x.to(device), device=device)

    def to_device(self, batch: TensorDictBase, device: torch.device) -> TensorDictBase:
        """`batch` on `device`, queued on the current (learner's) stream; pinned leaves are copied
        without the host waiting (see the module docstring)."""
        if device.type != "cuda":
            return batch.to(device)
        return batch.apply(lambda x: x.to(device, non_blocking=x.is_pinned()), device=device)


def _copy_without_optimizers(agent: Agent) -> Agent:
    """A deep copy of `agent` that shares no storage with it and holds no optimisers (its graph
    caches start empty: `UnrollCache.__deepcopy__`)."""
    memo = {id(opt): None for opt in agent.optimizers().values()}
    clone = copy.deepcopy(agent, memo)
    for p in clone.parameters():
        p.requires_grad_(False)
    return clone
