"""`algos/optim.Optimizer`: Adam with clipping, updates run inside one autocast region, and the
loss scale of float16 compute (`LossScale`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from worldmodels.algos.optim import LossScale, Optimizer


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


def test_a_step_writes_its_own_gradients_only():
    """A loss that runs through another module (an actor's through the dynamics) leaves that module's
    `.grad` as it was, neither made nor accumulated into: a captured update that added into a gradient
    another optimiser then drops would write, on every replay, into memory its graph does not own."""
    torch.manual_seed(0)
    dynamics, actor = nn.Linear(3, 3), nn.Linear(3, 2)
    kept = torch.full_like(dynamics.weight, 7.0)
    dynamics.weight.grad = kept
    opt = Optimizer(actor, lr=0.1)
    opt.step(actor(dynamics(torch.randn(4, 3))).sum())
    assert dynamics.weight.grad is kept and bool((kept == 7.0).all())
    assert dynamics.bias.grad is None
    assert all(p.grad is not None for p in actor.parameters())


def laprop_reference(param, grads, lr, b1, b2, eps, warmup):
    """danijar/dreamerv3 2411f7d's chain, written out: scale_by_rms -> scale_by_momentum -> -lr x warmup."""
    p, mu, nu = param.clone(), torch.zeros_like(param), torch.zeros_like(param)
    for step, g in enumerate(grads):  # step: the updates before this one
        t = step + 1
        nu = b2 * nu + (1 - b2) * g * g
        u = g / ((nu / (1 - b2 ** t)).sqrt() + eps)
        mu = b1 * mu + (1 - b1) * u
        p = p - lr * min(1.0, step / warmup if warmup else 1.0) * mu / (1 - b1 ** t)
    return p


@pytest.mark.parametrize("warmup", [0, 3])
def test_laprop_steps_as_the_reference_chain(warmup):
    torch.manual_seed(0)
    lin = nn.Linear(5, 3).double()
    start = [p.detach().clone() for p in lin.parameters()]
    opt = Optimizer(lin, lr=0.1, eps=1e-20, kind="laprop", warmup=warmup)
    x, grads = torch.randn(6, 7, 5, dtype=torch.float64), [[], []]
    for batch in x:
        before = [p.detach().clone() for p in lin.parameters()]
        opt.step(lin(batch).pow(3).sum())
        for i, p in enumerate(lin.parameters()):
            grads[i].append(p.grad.clone())
        if warmup and len(grads[0]) == 1:  # the reference's warmup scale is 0 on the first update
            assert all(torch.equal(p, b) for p, b in zip(lin.parameters(), before))
    for p, p0, g in zip(lin.parameters(), start, grads):
        torch.testing.assert_close(p.detach(), laprop_reference(p0, g, 0.1, 0.9, 0.999, 1e-20, warmup),
                                   rtol=1e-12, atol=1e-12)
    # the state round-trips, and a reset is a fresh LaProp in the same storage
    state = opt.state_dict()
    assert {k for s in state["state"].values() for k in s} == {"step", "exp_avg", "exp_avg_sq"}
    opt.load_state_dict(state)
    opt.reset_state_()
    assert all(float(s["step"]) == 0 for s in opt.opt.state.values())


def test_optimizer_kinds_are_checked_by_name():
    with pytest.raises(ValueError, match="kind='sgd'"):
        Optimizer(nn.Linear(2, 2), lr=1e-3, kind="sgd")
    with pytest.raises(ValueError, match="warmup=10 is LaProp's"):
        Optimizer(nn.Linear(2, 2), lr=1e-3, warmup=10)


def reference_schedule(scale: float, good: int, finite: bool, low=1e-4, high=1e4, interval=1000):
    """jaxutils.Optimizer._update_scale of DreamerV3's 2023 reference, written out."""
    keep, grow = finite and good < interval, finite and good >= interval
    good = good + 1 if keep else 0
    scale = scale * 2 if grow else scale if finite else scale / 2
    return min(max(scale, low), high), good


def twin_linears():
    torch.manual_seed(0)
    a, b = nn.Linear(4, 3), nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    return a, b


def test_a_scaled_loss_steps_as_the_unscaled_one():
    """In float32 the loss scale changes nothing but rounding: the gradients are divided back before
    the norm, the clip and Adam's step."""
    a, b = twin_linears()
    plain, scaled = Optimizer(a, lr=0.1, clip=0.5), Optimizer(b, lr=0.1, clip=0.5, loss_scale=True)
    x = torch.randn(5, 4)
    for _ in range(3):
        norm_a = plain.step(a(x).square().sum())
        norm_b = scaled.step(b(x).square().sum())
        assert torch.allclose(norm_a, norm_b, rtol=1e-5)
    assert torch.allclose(a.weight, b.weight, atol=1e-6) and torch.allclose(a.bias, b.bias, atol=1e-6)
    assert scaled.loss_scale.scale.item() == 1e4 and scaled.loss_scale.good.item() == 3


def test_a_non_finite_gradient_skips_the_update_and_halves_the_scale():
    _, b = twin_linears()
    opt = Optimizer(b, lr=0.1, loss_scale=True)
    x = torch.randn(5, 4)
    opt.step(b(x).square().sum())
    weights = [p.detach().clone() for p in b.parameters()]
    state = {k: v.clone() for k, v in opt.opt.state[b.weight].items()}
    norm = opt.step((b(x) * float("inf")).sum())
    assert not torch.isfinite(norm)
    assert all(torch.equal(w, p) for w, p in zip(weights, b.parameters()))
    assert all(torch.equal(v, opt.opt.state[b.weight][k]) for k, v in state.items())  # Adam's step count too
    assert (opt.loss_scale.scale.item(), opt.loss_scale.good.item()) == (5e3, 0)
    opt.step(b(x).square().sum())  # the next finite update steps again
    assert not torch.equal(weights[0], b.weight) and opt.opt.state[b.weight]["step"].item() == 2


def test_the_scale_follows_the_references_schedule_within_its_bounds():
    """Doubling after `interval` finite updates in a row, halving on a non-finite one, within
    [1e-4, 1e4] from 1e4: the reference's formula, on a sequence that reaches both bounds."""
    scale = LossScale(interval=3)
    scale._ensure(torch.device("cpu"))
    want, seen = (1e4, 0), set()
    finites = [True] * 5 + [False] * 3 + [True] * 9 + [False] * 30 + [True] * 5
    for finite in finites:
        scale.found_inf.fill_(0.0 if finite else 1.0)
        scale.update_()
        want = reference_schedule(*want, finite, interval=3)
        assert (scale.scale.item(), scale.good.item()) == pytest.approx(want), finite
        seen.add(want[0])
    assert {1e4, 1e-4, 2e-4} <= seen  # capped at the top, floored at the bottom, and doubling from there


def test_the_loss_scale_is_saved_and_restored_with_the_optimiser():
    _, b = twin_linears()
    opt = Optimizer(b, lr=0.1, loss_scale=True)
    x = torch.randn(5, 4)
    opt.step((b(x) * float("inf")).sum())
    opt.step(b(x).square().sum())
    state = opt.state_dict()
    assert state["loss_scale"]["scale"].item() == 5e3 and state["loss_scale"]["good"].item() == 1
    fresh = Optimizer(nn.Linear(4, 3), lr=0.1, loss_scale=True)
    fresh.load_state_dict(state)
    assert fresh.loss_scale.scale.item() == 5e3 and fresh.loss_scale.good.item() == 1
    unscaled = Optimizer(nn.Linear(4, 3), lr=0.1)
    unscaled.load_state_dict(state)  # a run resumed without fp16 drops the scale
    older = Optimizer(nn.Linear(4, 3), lr=0.1, loss_scale=True)
    older.load_state_dict(unscaled.state_dict())  # a checkpoint from before fp16: the scale starts afresh
    assert older.loss_scale.state_dict() == {}


def test_a_loss_scale_needs_adam_and_a_backward_of_its_own():
    with pytest.raises(ValueError, match="loss scale needs kind='adam'.*'laprop'"):
        Optimizer(nn.Linear(4, 3), lr=0.1, kind="laprop", loss_scale=True)
    lin = nn.Linear(4, 3)
    opt = Optimizer(lin, lr=0.1, loss_scale=True)
    lin(torch.randn(2, 4)).sum().backward()  # a shared backward of unscaled losses
    with pytest.raises(RuntimeError, match="scales its loss.*apply\\(\\) after a shared backward"):
        opt.apply()


def test_global_norm_clipping_equals_torchs_clip_grad_norm():
    """`apply` clips with the norm it already computed; the gradients equal clip_grad_norm_'s, below
    and above the clip."""
    for scale in (0.01, 100.0):
        torch.manual_seed(0)
        ours, theirs = nn.Linear(5, 3), nn.Linear(5, 3)
        theirs.load_state_dict(ours.state_dict())
        x = torch.randn(8, 5)
        for net in (ours, theirs):
            (scale * net(x).square().sum()).backward()
        opt = Optimizer(ours, lr=0.0, clip=1.0)  # lr 0: the step leaves the weights, the clipped gradients stay
        norm = opt.apply()
        expected = torch.nn.utils.clip_grad_norm_(list(theirs.parameters()), 1.0)
        assert torch.equal(norm, expected)
        for a, b in zip(ours.parameters(), theirs.parameters()):
            assert torch.equal(a.grad, b.grad)
