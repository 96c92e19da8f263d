"""`algos/optim.Optimizer`: Adam with clipping, and updates run inside one autocast region."""

from __future__ import annotations

import torch
from torch import nn

from worldmodels.algos.optim import Optimizer


def test_torch_autocast_reuses_a_cast_after_the_weight_changed_in_its_region():
    """Plain torch: inside one autocast region a leaf weight is cast once and the cast reused, also
    after an in-place change (torch documents the cache per region). This is why `Optimizer.step`
    clears the cache; the day this fails, torch re-casts changed weights and the clear can go."""
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = lin(x)
        with torch.no_grad():
            lin.weight.add_(1.0)
        stale = lin(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fresh = lin(x)
    assert torch.equal(before, stale) and not torch.equal(stale, fresh)


def test_forwards_after_a_step_in_the_same_autocast_region_see_the_new_weights():
    """An agent's update runs several losses and steps; run inside one autocast region (the learner
    bench does), a forward after a step must read the stepped weights, as it does without autocast."""
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    opt = Optimizer(lin, lr=0.1)
    x = torch.randn(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        opt.step(lin(x).square().sum())
        after = lin(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = lin(x)
    assert torch.equal(after, want)


def test_reset_state_is_a_fresh_adam_in_the_same_storage():
    torch.manual_seed(0)
    lin = nn.Linear(3, 2)
    opt = Optimizer(lin, lr=0.1)
    opt.step(lin(torch.randn(4, 3)).sum())
    storage = {k: v.data_ptr() for k, v in opt.opt.state[lin.weight].items()}
    opt.reset_state_()
    state = opt.opt.state[lin.weight]
    assert {k: v.data_ptr() for k, v in state.items()} == storage
    assert all(not v.any() for v in state.values())
    version = opt.version
    opt.load_state_dict(opt.state_dict())
    assert opt.version == version + 1
