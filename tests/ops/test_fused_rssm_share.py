"""The action's share in one launch (`worldmodels/ops/rssm/fused/share.py`) against
`reference.action_in`: V1 (linear, no bias) and V3 (dense: RMSNorm / LayerNorm / none, SiLU / ELU),
float64 to 1e-12 and float32 to 1e-5; actions beyond [-1, 1] (the max(1, |a|) scaling), hidden sizes
that are not powers of two and one past 256 (fewer rows per program), B=1 and an empty batch; where
it stands aside (a gradient needed, autocast, mixed dtypes) and that the op's no-grad unrolls take it.
On CPU under Triton's interpreter (WORLDMODELS_TEST_DEVICE=cuda: compiled).
"""

from __future__ import annotations

import pytest
import torch

import worldmodels as wm
from benchmarks.triton_rssm import flat
from worldmodels.ops.rssm import reference

pytest.importorskip("triton", reason="the triton package is not installed: the triton backend cannot run")

from tests._triton import DEVICE, import_op  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numpy, inside triton's interpreter
entry = import_op("worldmodels.ops.rssm.fused.entry", "worldmodels.ops.rssm.fused.share",
                  "worldmodels.ops.rssm.fused.forward_kernels", "worldmodels.ops.rssm.fused.launch")
from worldmodels.ops.rssm.fused import autograd, launch, share  # noqa: E402  (imported above, under the interpreter)
from worldmodels.ops.triton_utils import launch_overrides  # noqa: E402


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    if DEVICE.type == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")


SPECS = {
    "v1": dict(cell="gru", norm="none", act="elu"),
    "v1-layer": dict(cell="gru", norm="layer", act="silu"),  # V1's share is linear whatever its norm
    "v3-rms-silu": dict(cell="block_gru", norm="rms", act="silu", classes=3),
    "v3-layer-elu": dict(cell="block_gru", norm="layer", act="elu"),
    "v3-plain": dict(cell="block_gru", norm="none", act="elu", classes=3),  # with a bias, no norm
}


def make_rssm(spec: str, hidden: int, dtype, action_dim: int = 3) -> wm.RSSM:
    torch.manual_seed(0)
    rssm = wm.RSSM(action_dim, 13, deter=24, stoch=5, hidden=hidden, blocks=4, **SPECS[spec])
    rssm = rssm.to(device=DEVICE, dtype=dtype)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # nonzero biases and norm parameters
        for p in rssm.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p))
    return rssm.requires_grad_(False)


@pytest.mark.parametrize("spec", list(SPECS))
@pytest.mark.parametrize("hidden,shape", [(20, (2, 3)), (300, (1, 5)), (64, (17,))])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_share_matches_reference(spec, hidden, shape, dtype):
    rssm = make_rssm(spec, hidden, dtype)
    action = 3 * torch.randn(*shape, 3, generator=torch.Generator().manual_seed(2), dtype=dtype).to(DEVICE)
    got = share.action_share(rssm.op_spec(), rssm.op_weights(), action)
    want = reference.action_in(rssm.op_spec(), rssm.op_weights(), action)
    assert got is not None and got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12 if dtype == torch.float64 else 1e-5)


def test_share_of_no_rows():
    rssm = make_rssm("v3-rms-silu", 20, torch.float64)
    got = share.action_share(rssm.op_spec(), rssm.op_weights(), torch.zeros(0, 4, 3, dtype=torch.float64,
                                                                                  device=DEVICE))
    assert got.shape == (0, 4, 20)


def test_share_stands_aside_where_it_cannot_serve():
    """None (the caller runs `reference.action_in`) with a gradient to take, under autocast, or with the
    action and the weights in different dtypes; taken again once the gradient is not needed."""
    rssm = make_rssm("v3-rms-silu", 20, torch.float32)
    spec, action = rssm.op_spec(), torch.rand(2, 3, 3, device=DEVICE)
    action_share = share.action_share
    assert action_share(spec, rssm.op_weights(), action.requires_grad_()) is None
    rssm.requires_grad_(True)
    assert action_share(spec, rssm.op_weights(), action.detach()) is None
    with torch.no_grad():
        assert action_share(spec, rssm.op_weights(), action) is not None
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        assert action_share(spec, rssm.op_weights(), action.detach()) is None
    assert action_share(spec, rssm.requires_grad_(False).op_weights(), action.detach().double()) is None


@pytest.mark.parametrize("call", ["observe", "open"])
@pytest.mark.parametrize("spec", ["v3-rms-silu", "v1"])
def test_no_grad_unrolls_take_it(monkeypatch, call, spec):
    """The op's observe and open-loop imagine compute the share in the fused launch when nothing needs a
    gradient (their values against the reference are `tests/ops/test_fused_rssm.py`'s: its no-grad V3
    cases run the pre-multiplied share, its gradient cases the share as it was), V3 multiplied on by
    dyn_x's columns (the launch's a_pre); through torch when the share's weights need a gradient."""
    calls, pre = [], []
    action_share, forward = share.action_share, launch.forward
    monkeypatch.setattr(share, "action_share", lambda *a: calls.append(action_share(*a)) or calls[-1])
    monkeypatch.setattr(launch, "forward", lambda *a, **k: pre.append(k["a_pre"]) or forward(*a, **k))
    monkeypatch.setattr(share, "dyn_x_share_pays", lambda spec: True)  # hidden 20: below where it pays
    rssm = make_rssm(spec, 20, torch.float64)
    unroll(rssm, call, entry)
    assert len(calls) == 1 and calls[0] is not None and pre == [spec != "v1"]
    rssm.requires_grad_(True)
    unroll(rssm, call, entry)
    assert len(calls) == 2 and calls[1] is None and pre[1:] == [False]


def unroll(rssm, call, op, batch=2, steps=3, seed=3):
    """`op`'s (triton or reference) observe or open-loop imagine of `rssm` on fixed float64 inputs: a
    nonzero start, actions beyond [-1, 1], resets at t=0 and mid-sequence (observe)."""
    gen = torch.Generator().manual_seed(seed)
    w, spec = rssm.op_weights(), rssm.op_spec()
    deter = torch.randn(batch, rssm.deter_dim, generator=gen, dtype=torch.float64).to(DEVICE)
    stoch = torch.zeros(batch, rssm.stoch_dim, dtype=torch.float64, device=DEVICE)
    action = (3 * torch.rand(batch, steps, 3, generator=gen, dtype=torch.float64) - 1.5).to(DEVICE)
    torch.manual_seed(seed)
    noise = {k: v.to(torch.float64) for k, v in rssm.noise((batch, steps)).items()}
    if call == "open":
        return op.imagine(spec, w, deter, stoch, noise["prior"], actions=action)
    embed = torch.randn(batch, steps, 13, generator=gen, dtype=torch.float64).to(DEVICE)
    is_first = torch.zeros(batch, steps, dtype=torch.bool, device=DEVICE)
    is_first[:, 0] = True
    is_first[0, steps - 1] = True
    return op.observe(spec, w, deter, stoch, action, embed, is_first, noise["posterior"], noise["prior"])


# The pre-multiplied share (A_PRE, `share.dyn_x_share_pays` forced: the tests' hidden is 20) against
# the reference: the dyn dot without its action part, in the column split (1 and 3 ranks) and in dyn_x's
# K split between two halves of 4 ranks (`_dyn_x_split`), categorical and Gaussian V3, B=1 and B=17.
@pytest.mark.parametrize("call", ["observe", "open"])
@pytest.mark.parametrize("spec", ["v3-rms-silu", "v3-layer-elu"])
@pytest.mark.parametrize("keys,batch", [(dict(SPLIT=1), 17), (dict(SPLIT=3), 1),
                                        (dict(SPLIT=4, BLOCK_N=16), 2)])
def test_pre_multiplied_share_matches_reference(monkeypatch, call, spec, keys, batch):
    monkeypatch.setattr(share, "dyn_x_share_pays", lambda spec: True)
    pre, run = [], launch.forward
    monkeypatch.setattr(launch, "forward", lambda *a, **k: pre.append(k["a_pre"]) or run(*a, **k))
    rssm = make_rssm(spec, 20, torch.float64)
    with launch_overrides("rssm", **keys):
        got = flat(unroll(rssm, call, entry, batch))
    want = flat(unroll(rssm, call, reference, batch))
    assert pre == [True] and got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-10, msg=k)


def test_pre_multiplied_share_only_without_gradients():
    """`autograd.unroll(a_share_pre=True)` refuses an unroll that needs a gradient (its backward reads
    a_share as the cell input's share), and the launch refuses V1, the Actor and a saving forward."""
    rssm = make_rssm("v3-rms-silu", 20, torch.float64).requires_grad_(True)
    noise = rssm.noise((2, 3))["prior"].to(torch.float64)
    deter, stoch = torch.zeros(2, 24, dtype=torch.float64), torch.zeros(2, 15, dtype=torch.float64)
    with pytest.raises(ValueError, match="a_share_pre"):
        autograd.unroll("open_loop", rssm.op_spec(), rssm.op_weights(), deter, stoch, noise,
                         a_share=torch.zeros(2, 3, 20, dtype=torch.float64), a_share_pre=True)
    v1 = make_rssm("v1", 20, torch.float64)
    with pytest.raises(ValueError, match="a_pre"):
        launch.forward(v1.op_spec(), {}, deter, torch.zeros(2, 5, dtype=torch.float64), noise, "ieee",
                              observe=False, a_share=torch.zeros(2, 3, 20, dtype=torch.float64), a_pre=True)
