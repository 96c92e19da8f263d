"""`scan` gradients equal `loop`'s, eager and compiled (aot_eager and inductor), for GRU, LSTM and
both RSSM cells, with resets mid-sequence: the check that lets `auto` pick `scan` under
torch.compile (core/torch_fixes.py holds the upstream workarounds this relies on).

Inductor compiles take 40-90 s each on a 2-core CPU, so CI runs every case with eager and aot_eager
(the graph AOTAutograd hands any backend) and inductor only through tests/core/test_torch_upstream.py's
reproducer of the one inductor scan bug we patch (pytorch#153679, with and without the backport);
`WORLDMODELS_TEST_ALL_INDUCTOR=1` adds inductor on every case here (all pass on torch 2.13 CPU).
"""

from __future__ import annotations

import os

import pytest
import torch

import worldmodels as wm
from worldmodels.core import torch_fixes

pytestmark = pytest.mark.skipif(not torch_fixes.scan_compiles_correctly(),
                                reason=f"torch {torch.__version__}: scan under compile is refused here")
MODES = ("eager", "aot_eager", "inductor")
ALL_INDUCTOR = os.environ.get("WORLDMODELS_TEST_ALL_INDUCTOR") == "1"


def run(mode: str, fn):
    if mode == "eager":
        return fn()
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=mode)()


def assert_grads_match(loss, tensors, names, modes=MODES):
    expected = torch.autograd.grad(loss("loop"), tensors, allow_unused=True)
    for mode in modes:
        got = torch.autograd.grad(run(mode, lambda: loss("scan")), tensors, allow_unused=True)
        for name, g, e in zip(names, got, expected):
            if e is None:
                continue
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5, msg=lambda m: f"{mode} {name}: {m}")


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_rnn_scan_gradients_equal_loop(kind):
    torch.manual_seed(0)
    module = (wm.GRU if kind == "gru" else wm.LSTM)(3, 5, num_layers=2)
    x = torch.randn(2, 6, 3, requires_grad=True)
    is_init = torch.zeros(2, 6, dtype=torch.bool)
    is_init[0, 3] = is_init[1, 0] = True

    def loss(backend):
        y, _ = module(x, is_init=is_init, backend=backend)
        return y.square().sum()

    names = ["x", *[n for n, _ in module.named_parameters()]]
    assert_grads_match(loss, [x, *module.parameters()], names, MODES if ALL_INDUCTOR else MODES[:2])


@pytest.mark.parametrize("cfg", [
    dict(deter=8, stoch=3, hidden=6),
    dict(deter=8, stoch=3, classes=4, hidden=6, cell="block_gru", blocks=2, norm="rms", act="silu"),
], ids=["gru_gaussian", "block_gru_categorical"])
def test_rssm_scan_gradients_equal_loop(cfg):
    torch.manual_seed(0)
    rssm = wm.RSSM(2, 5, **cfg)
    embed = torch.randn(3, 5, 5, requires_grad=True)
    action = torch.randn(3, 5, 2)
    is_first = torch.zeros(3, 5, dtype=torch.bool)
    is_first[:, 0] = is_first[1, 2] = True
    noise = rssm.noise((3, 5))
    head = "logits" if "classes" in cfg else "mean"

    def loss(backend):
        post, prior = rssm.observe(embed, action, is_first, noise=noise, backend=backend)
        return post["stoch"].square().sum() + post[head].square().sum() + prior[head].square().sum()

    names = ["embed", *[n for n, _ in rssm.named_parameters()]]
    assert_grads_match(loss, [embed, *rssm.parameters()], names, MODES if ALL_INDUCTOR else MODES[:2])
