"""`GraphedUpdate`: an agent's whole update (losses, backward, clipping, optimiser steps) replayed
from one CUDA graph, so the host launches one graph instead of the ~1,000-2,000 kernels an eager
update launches one by one. At the small models DreamerV3 trains, an eager update is bound by
the host launching kernels, not by the GPU (`benchmarks/update_profile.py` prints both).

Contract: `GraphedUpdate(agent)(batch)` returns what `agent.update(batch)` returns (the metrics as
0-d tensors, fresh copies) and changes the agent, its optimisers and the CUDA RNG as
`agent.update(batch)` would (the same kernels: equal up to rounding of the fused Adam step).
- Per signature (the batch's keys, shapes and dtypes; grad and autocast mode; the storage of every
  parameter and buffer; each optimiser's `version`, which `load_state_dict` bumps): the first
  `warmup` calls run `agent.update` eagerly on a side stream (library handles, autotuning, Triton
  compiles, the optimisers' state), the next call captures `agent.update` on its batch and replays
  it, and every later call copies its batch into the graph's static inputs and replays. A new
  signature drops the graph (one at a time: its memory pool holds a whole update's activations).
- The RSSM unrolls inside run uncaptured (`core/cuda_graphs.inside_outer_graph`): the outer graph
  holds them, and a capture cannot nest.
- The warm-ups run in the capture's global state (`_as_captured`: autocast's weight cache off too).
  torch.compile guards on that state, so nets compiled for the warm-up (`Agent.compile_nets`) would
  otherwise compile again inside the capture, whose compile makes host-to-device copies.
- Off CUDA, or with `enabled=False`: `agent.update(batch)`.
- The capture starts with every parameter's `.grad` None, so the gradients it makes live in its own
  memory pool (a backward that added into a gradient from the eager warm-up would write, on every
  replay, into memory that a later `zero_grad` freed).
- A capture needs an update without host syncs (a device value read on the host), host-to-device
  copies of pageable memory or data-dependent host branches, and capturable optimisers (set here).
  A capture that fails (the stream and the CUDA generators restored: `core/cuda_graphs.capturing`)
  runs that update eagerly, with one warning that names the error; the next call tries once more
  (the eager update has compiled whatever was missing), and a second failure leaves every update
  eager for good.
- `context` after a call: the agent's `context_out` of that update (replay-context entries to write
  back, or None); from a replay, the graph's own output tensors, overwritten by the next replay, so
  a copy must be queued (on the current stream) before the next call.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
from tensordict import TensorDict

from worldmodels.core import cuda_graphs


class GraphedUpdate:
    """Args:
        agent: an `Agent` (its `update(batch)` and `optimizers()`).
        enabled: capture on CUDA; False always runs `agent.update`.
        warmup: eager updates per signature before the capture (at least 1: the optimisers' state
            must exist before a capture, or each replay would create it afresh).
    """

    def __init__(self, agent, *, enabled: bool = True, warmup: int = 3):
        if warmup < 1:
            raise ValueError(f"warmup={warmup} is not valid; expected >= 1 (the optimisers' state is made eagerly)")
        self.agent, self.enabled, self.warmup = agent, enabled, warmup
        self.failed: str | None = None  # why the last capture failed
        self.failures = 0  # captures that failed; at `cuda_graphs.CAPTURE_ATTEMPTS` every update runs eagerly
        self.captures = 0  # graphs captured so far
        self.stream = None
        self._drop()

    def _drop(self) -> None:
        self.replay = self.static_batch = self.static_metrics = None
        self.names: list[str] = []
        self.signature = None
        self.eager_calls = 0  # warm-up calls of the current signature

    def _signature(self, batch: TensorDict) -> tuple:
        leaves = tuple((k, v.shape, v.dtype) for k, v in batch.items(include_nested=True, leaves_only=True))
        storage = tuple(t.data_ptr() for t in (*self.agent.parameters(), *self.agent.buffers()))
        versions = tuple(opt.version for opt in self.agent.optimizers().values())
        return (leaves, batch.device, torch.is_grad_enabled(), torch.is_autocast_enabled("cuda"),
                torch.get_autocast_dtype("cuda"), storage, versions)

    @property
    def context(self):
        """The latest update's replay-context entries (see the module docstring): the agent's
        `context_out`, which an eager update sets and a capture points at the graph's outputs."""
        return self.agent.context_out

    def __call__(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        if not (self.enabled and self._on_cuda(batch)) or self.failures >= cuda_graphs.CAPTURE_ATTEMPTS:
            return self.agent.update(batch)
        signature = self._signature(batch)
        if signature != self.signature:
            self._drop()
            self.signature = signature
            for opt in self.agent.optimizers().values():
                opt.capturable_()
        if self.replay is None and self.eager_calls < self.warmup:
            self.eager_calls += 1
            with self._as_captured():
                return self._eager(batch)
        if self.replay is None:
            self.static_batch = batch.clone()
            # no gradient from the warm-up reaches the capture: every gradient a captured backward
            # makes is allocated in the graph's own pool, so no replay writes into memory that a
            # `zero_grad` inside the update (or anything after it) may free
            for p in self.agent.parameters():
                p.grad = None
            try:
                with self._as_captured():
                    self.replay = self._record(self._step)
            except RuntimeError as err:  # what was captured never ran: this call's update runs eagerly
                self.failed = f"{type(err).__name__}: {err}"
                self.failures += 1
                signature, self.replay = self.signature, None
                self.static_batch = self.static_metrics = None
                if self.failures == 1 or self.failures >= cuda_graphs.CAPTURE_ATTEMPTS:
                    later = ("every update runs eagerly from now on" if self.failures >= cuda_graphs.CAPTURE_ATTEMPTS
                             else "this update runs eagerly and the next one tries again")
                    warnings.warn(f"GraphedUpdate: the update could not be captured in a CUDA graph ({self.failed}); "
                                  f"{later}", stacklevel=2)
                self.signature = signature
                return self.agent.update(batch)
            self.captures += 1
        else:
            self.static_batch.update_(batch)
        self.replay()
        return dict(zip(self.names, self.static_metrics.clone().unbind()))

    def prime(self, batch: TensorDict) -> None:
        """Warm up and capture on `batch` now, then put the agent, its optimisers (fresh state) and the
        RNG streams back as they were: the next call replays a first update (benchmarks, tests).
        Raises RuntimeError, after rewinding, when the capture failed."""
        state = {k: v.clone() for k, v in self.agent.state_dict().items()}
        devices = [batch.device] if batch.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            while (self.replay is None and self.failures < cuda_graphs.CAPTURE_ATTEMPTS and self.enabled
                   and self._on_cuda(batch)):
                self(batch)
        self.agent.load_state_dict(state)  # copies in place: the graph's storage stays
        for opt in self.agent.optimizers().values():
            opt.reset_state_()
        if self.replay is None and self.failed is not None:
            raise RuntimeError(f"the update could not be captured: {self.failed}")

    def _step(self) -> None:
        """What the graph holds: one update on the static batch, its metrics stacked in one tensor."""
        metrics = self.agent.update(self.static_batch)
        self.names = list(metrics)
        self.static_metrics = torch.stack([v.detach().float().reshape(()) for v in metrics.values()])

    @staticmethod
    @contextlib.contextmanager
    def _as_captured():
        """The global state of the warm-ups and the capture alike: the unrolls left to the outer graph,
        and autocast's cache of cast weights off (a capture must not use it:
        `core/cuda_graphs.no_autocast_cache`)."""
        with cuda_graphs.inside_outer_graph(), cuda_graphs.no_autocast_cache():
            yield

    # The CUDA parts, one method each (tests stand in for them on CPU).
    @staticmethod
    def _on_cuda(batch: TensorDict) -> bool:
        return batch.device.type == "cuda"

    def _stream(self) -> torch.cuda.Stream:
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        return self.stream

    def _eager(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        """A warm-up update on the capture's side stream (torch's recipe for whole-network capture)."""
        stream = self._stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            metrics = self.agent.update(batch)
        torch.cuda.current_stream().wait_stream(stream)
        return metrics

    def _record(self, step):
        """Capture `step` in a CUDA graph; returns its replay."""
        graph = torch.cuda.CUDAGraph()
        stream = self._stream()
        stream.wait_stream(torch.cuda.current_stream())
        with cuda_graphs.capturing(graph, "the update", stream=stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
        return graph.replay
