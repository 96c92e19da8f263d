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
