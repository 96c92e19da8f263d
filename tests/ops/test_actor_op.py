"""The Actor's pure op (`worldmodels/ops/actor.py`) against the `Actor` module it describes: for every
distribution, norm, activation and depth, `weight_names` are the module's parameter names and
`sample_action` on its parameters is its call (the same numbers, the same gradients); `op_spec`
reads the modules as they are; the RSSM reference's imagination takes the spec as its policy."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.func import functional_call

import worldmodels as wm
from worldmodels.ops import actor as actor_op
from worldmodels.ops.rssm import reference

CASES = list(itertools.product(actor_op.DISTS, ("none", "rms", "layer"), ("elu", "silu"), (0, 1, 3)))


def perturbed_actor(dist, norm, act, layers, feat=7, action=3):
    actor = wm.Actor(feat, action, hidden=5, layers=layers, dist=dist, norm=norm, act=act).double()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return actor


@pytest.mark.parametrize("dist,norm,act,layers", CASES)
def test_pure_op_is_the_module(dist, norm, act, layers):
    actor = perturbed_actor(dist, norm, act, layers)
    spec, weights = actor.op_spec(), dict(actor.named_parameters())
    assert actor_op.weight_names(spec) == list(weights)
    features = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    noise = actor.noise((4,), generator=torch.Generator().manual_seed(1))
    got = actor_op.sample_action(spec, weights, features, noise)
    want = actor(features, noise)
    assert torch.equal(got, want)
    g_got = torch.autograd.grad(got.sum(), [features, *weights.values()])
    g_want = torch.autograd.grad(want.sum(), [features, *weights.values()])
    assert all(torch.equal(a, b) for a, b in zip(g_got, g_want))


def test_op_spec_reads_the_modules_as_they_are():
    actor = wm.Actor(7, 3, hidden=5, layers=2, norm="rms", act="elu")
    spec = actor.op_spec()
    assert (spec.hidden, spec.layers, spec.norm, spec.act, spec.eps) == (5, 2, "rms", "elu", 1e-4)
    actor.net[0][2] = torch.nn.SiLU()  # swapped in place: no parameter changes, the spec does
    assert actor.op_spec().act == "silu" and actor.op_spec() != spec
    assert wm.Actor(7, 3, hidden=5, layers=0).op_spec().layers == 0


def test_reference_imagine_takes_the_spec_as_its_policy():
    rssm = wm.RSSM(3, 13, deter=12, stoch=4, hidden=10).double()
    actor = perturbed_actor("tanh_normal", "layer", "silu", 2, feat=16)
    deter, stoch = torch.randn(2, 12, dtype=torch.float64), torch.zeros(2, 4, dtype=torch.float64)
    noise, policy_noise = rssm.noise((2, 3))["prior"], actor.noise((2, 3))
    args = (rssm.op_spec(), rssm.op_weights(), deter, stoch, noise)
    params = dict(actor.named_parameters())
    got = reference.imagine(*args, policy=actor.op_spec(), policy_params=params, policy_noise=policy_noise)
    want = reference.imagine(*args, policy=actor, policy_params=params, policy_noise=policy_noise)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_functional_call_of_the_module_equals_the_op():
    actor = perturbed_actor("onehot", "rms", "silu", 2)
    weights = {k: v.detach().clone() * 1.5 for k, v in actor.named_parameters()}  # weights other than its own
    features = torch.randn(5, 7, dtype=torch.float64)
    noise = actor.noise((5,))
    assert torch.equal(functional_call(actor, weights, (features, noise)),
                       actor_op.sample_action(actor.op_spec(), weights, features, noise))
