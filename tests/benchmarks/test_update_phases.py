"""`python -m benchmarks.update_phases` on CPU: every leaf op of a profiled update lands in one phase and
direction, and the split follows the update's own gradient flow (the imagined rollout has a backward
only where the actor learns by backpropagating through it)."""

from __future__ import annotations

import argparse

import pytest
import torch

from benchmarks import update_phases


def profiled(*extra: str) -> dict:
    parser = argparse.ArgumentParser()
    update_phases.update_options(parser)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--updates", type=int, default=1)
    args = parser.parse_args(["--model", "tiny", "--obs", "state", "--batch", "2", "--steps", "8", "--backend",
                              "loop", *extra])
    update_phases.check_update_options(parser, args)
    return update_phases.profile_phases(args, torch.device("cpu"))


@pytest.mark.parametrize("actor_grad, imagined_backward", [("reinforce", False), ("backprop", True)])
def test_every_op_has_a_phase_and_backward_follows_the_gradient(actor_grad, imagined_backward):
    result = profiled("--set", f"algo.actor_grad={actor_grad}")
    rows = result["phases"]
    for phase in ("encoder", "observe", "decoder and heads", "world-model loss terms", "actor and critic losses"):
        assert rows[f"{phase}/forward"]["kernels"] > 0 and rows[f"{phase}/backward"]["kernels"] > 0, phase
    assert rows["imagination/forward"]["kernels"] > 0 and rows["optimisers/forward"]["kernels"] > 0
    assert ("imagination/backward" in rows) == imagined_backward
    assert "other/forward" not in rows  # the update is labelled end to end
    assert result["total"]["kernels"] == sum(r["kernels"] for r in rows.values())
    table = update_phases.markdown(result, "CPU ms")
    assert table.splitlines()[0].startswith("| phase | forward CPU ms") and "| encoder |" in table


def _event(name: str, start: int, end: int, thread: int = 1, seq: int = -1, parent=None, kernel_us: float = 0.0,
           fwd_thread: int | None = None):
    from torch.autograd.profiler_util import FunctionEvent

    event = FunctionEvent(id=start, name=name, thread=thread, start_us=start, end_us=end, sequence_nr=seq,
                          fwd_thread=fwd_thread)
    if parent is not None:
        event.set_cpu_parent(parent)
        parent.append_cpu_child(event)
    if kernel_us:
        event.append_kernel(f"kernel of {name}", 0, kernel_us)
    return event


def test_a_backward_node_takes_the_phase_of_the_op_that_made_it():
    """An op that makes no autograd node records the number the next node will take: here `aten::view`
    in the world-model loss terms carries 5 before the unroll in `observe` makes node 5. The node's
    backward kernel belongs to `observe` (on a CUDA profile the first op with the number took it)."""
    terms = _event("world-model loss terms", 0, 100)
    view = _event("aten::view", 1, 2, seq=5, parent=terms, kernel_us=1.0)
    observe = _event("observe", 3, 50, parent=terms)
    unroll = _event("_Replay", 4, 40, seq=5, parent=observe, kernel_us=2000.0)
    node = _event("autograd::engine::evaluate_function: _ReplayBackward", 200, 300, thread=2, seq=5, fwd_thread=1)
    chain = _event("_ReplayBackward", 201, 299, thread=2, seq=5, parent=node, kernel_us=3000.0)
    rows = update_phases.phase_table([terms, view, observe, unroll, node, chain], updates=1)
    assert rows["observe/backward"] == {"kernels": 1, "ms": 3.0}
    assert rows["observe/forward"] == {"kernels": 1, "ms": 2.0}
    assert rows["world-model loss terms/forward"] == {"kernels": 1, "ms": 0.001}
    assert "world-model loss terms/backward" not in rows
