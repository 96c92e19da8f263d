"""Inputs a no-grad CUDA-graph replay reads through its table (`core/cuda_graphs.InputTable`), not copied.

The table's bookkeeping on plain tensors: which tensors a launch may claim (the capture's buffers,
reshaped views of them included), the addresses a replay writes and the inputs it still copies (a
claimed input that is not 16-byte aligned, an unclaimed one), the NaN a claimed buffer holds after
the capture. Then the triton RSSM ops through it (Triton's interpreter on CPU, where `EagerGraph`
stands in for the capture and the claimed buffers are NaN from the second call on; with
WORLDMODELS_TEST_DEVICE=cuda the real graphs): observe, open loop and the Actor, V1 and V3, two
calls on different inputs and one with noise and initial state that are not 16-byte aligned,
against the reference in float64, and which inputs each mode's launches claim.
"""

from __future__ import annotations

import pytest
import torch

import worldmodels as wm
from benchmarks.triton_rssm import flat
from tests._messages import labelled
from worldmodels.core import cuda_graphs
from worldmodels.core.cuda_graphs import InputTable, UnrollCache
from worldmodels.ops.rssm import reference


def test_a_slot_is_claimed_by_the_buffer_or_a_row_major_view_of_it():
    a, b = torch.zeros(2, 3, 4), torch.zeros(5, dtype=torch.float64)
    table = InputTable([a, b])
    assert table.slot(a).data_ptr() == table.slots.data_ptr() and table.claimed == {0}
    assert table.slot(a.view(2, 12)).data_ptr() == table.slots.data_ptr()  # the same bytes
    for other in (a[:1], a.transpose(1, 2), a.clone(), b.float()):
        assert table.slot(other) is None
    assert table.slot(b).data_ptr() == table.slots.data_ptr() + 8 and table.claimed == {0, 1}


def test_a_replay_points_at_aligned_inputs_and_copies_the_rest():
    statics = [torch.zeros(8), torch.zeros(8), torch.zeros(8)]
    table = InputTable(statics)
    table.slot(statics[0]), table.slot(statics[1])  # the third is not claimed by any launch
    aligned = torch.arange(8.0)
    misaligned = torch.arange(9.0)[1:]  # 4 bytes past an aligned start
    assert aligned.data_ptr() % 16 == 0 and misaligned.data_ptr() % 16 == 4
    copies = table.point([aligned, misaligned, aligned])
    assert table.slots.tolist() == [aligned.data_ptr(), statics[1].data_ptr(), statics[2].data_ptr()]
    assert [(s.data_ptr(), x.data_ptr()) for s, x in copies] == [(statics[1].data_ptr(), misaligned.data_ptr()),
                                                                 (statics[2].data_ptr(), aligned.data_ptr())]
    assert table.point(statics) == [] and table.slots.tolist() == [s.data_ptr() for s in statics]
    table.point([aligned, misaligned, aligned])  # back to the first call's addresses
    assert table.slots.tolist() == [aligned.data_ptr(), statics[1].data_ptr(), statics[2].data_ptr()]


def test_poison_fills_the_claimed_floating_buffers_only():
    floats, ints, unclaimed = torch.ones(3), torch.ones(3, dtype=torch.int64), torch.ones(3)
    table = InputTable([floats, ints, unclaimed])
    table.slot(floats), table.slot(ints)
    table.poison()
    assert floats.isnan().all() and ints.tolist() == [1, 1, 1] and unclaimed.tolist() == [1, 1, 1]


def test_graph_input_is_the_tensor_outside_a_table():
    x = torch.zeros(4)
    assert cuda_graphs.graph_input(x)[0] is x and cuda_graphs.graph_input(x)[1] is False
    table = InputTable([x])
    with cuda_graphs.reading_through(table):
        slot, at = cuda_graphs.graph_input(x)
        assert at and slot.dtype == torch.int64 and slot.data_ptr() == table.slots.data_ptr()
        assert cuda_graphs.graph_input(torch.zeros(4))[1] is False
    assert cuda_graphs.graph_input(x)[1] is False


# ---------------------------------------------------------------------------------------------- through the ops
@pytest.fixture
def ops(monkeypatch, request):
    """The triton RSSM op module with the capture path on: on CPU under the interpreter, `EagerGraph`
    standing in for the capture; on CUDA the real graphs."""
    pytest.importorskip("triton", reason="the triton package is not installed: the triton backend cannot run")
    from tests._triton import DEVICE, import_op
    op = import_op("worldmodels.ops.rssm.fused", "worldmodels.ops.rssm.fused.share",
                   "worldmodels.ops.rssm.fused.forward_kernels", "worldmodels.ops.rssm.fused.launch")
    if DEVICE.type == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        request.getfixturevalue("graphs_on_cpu")
    return op, DEVICE


SPECS = {"v1": dict(cell="gru", norm="none", act="elu"),
         "v3": dict(cell="block_gru", norm="rms", act="silu", classes=3)}
B, T, A = 3, 4, 2


def _claimed(cache: UnrollCache) -> set[int]:
    """The positions (among the call's present inputs) the capture reads through its table."""
    (graphed, _), = cache.values()
    if hasattr(graphed, "claimed"):  # EagerGraph
        return {graphed.indirect[slot] for slot in graphed.claimed}
    capture = graphed.captures[0]
    return set(capture.through) if capture.table is not None else set()


def _inputs(rssm, actor, seed, device, misaligned=False):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device)

    torch.manual_seed(seed)
    noise = {k: v.to(device=device, dtype=torch.float64) for k, v in rssm.noise((B, T)).items()}
    is_first = torch.zeros(B, T, dtype=torch.bool, device=device)
    is_first[:, 0] = True
    is_first[1, T - 1] = True
    x = dict(deter=rand(B, rssm.deter_dim), stoch=rand(B, rssm.stoch_dim), action=2 * rand(B, T, A),
             embed=rand(B, T, 7), is_first=is_first, noise=noise, policy_noise=actor.noise((B, T)).to(device))
    if misaligned:  # the same values 8 bytes past an aligned start: the replay copies them into its buffers
        for group, k in ((noise, "prior"), (noise, "posterior"), (x, "deter"), (x, "stoch")):
            room = torch.empty(group[k].numel() + 1, dtype=torch.float64, device=device)
            group[k] = room[1:].view(group[k].shape).copy_(group[k])
            assert group[k].data_ptr() % 16 == 8
    return x


def _run(op, mode, rssm, actor, x, cache=None):
    spec, w = rssm.op_spec(), rssm.op_weights()
    if mode == "observe":
        return flat(op.observe(spec, w, x["deter"], x["stoch"], x["action"], x["embed"], x["is_first"],
                               x["noise"]["posterior"], x["noise"]["prior"], cache=cache))
    if mode == "open":
        return op.imagine(spec, w, x["deter"], x["stoch"], x["noise"]["prior"], actions=x["action"], cache=cache)
    return op.imagine(spec, w, x["deter"], x["stoch"], x["noise"]["prior"], policy=actor,
                      policy_params=dict(actor.named_parameters()), policy_noise=x["policy_noise"], cache=cache)


# the inputs each mode's launches read through the table, by position among the call's present inputs:
# observe (deter, stoch, action, embed, is_first, post_noise, prior_noise) the initial state and the
# posterior's noise; open loop (deter, stoch, prior_noise, actions) and the Actor (deter, stoch,
# prior_noise, policy_noise) every one
CLAIMED = {"observe": {0, 1, 5}, "open": {0, 1, 2, 3}, "actor": {0, 1, 2, 3}}


@pytest.mark.parametrize("mode", ["observe", "open", "actor"])
@pytest.mark.parametrize("spec", list(SPECS))
def test_replays_read_the_callers_tensors(ops, spec, mode):
    op, device = ops
    torch.manual_seed(0)
    rssm = wm.RSSM(A, 7, deter=12, stoch=4, hidden=10, blocks=2, **SPECS[spec]).to(device, torch.float64)
    actor = wm.Actor(rssm.stoch_dim + rssm.deter_dim, A, hidden=8, layers=2).to(device, torch.float64)
    rssm.requires_grad_(False), actor.requires_grad_(False)
    cache = UnrollCache()
    for seed, misaligned in ((1, False), (2, False), (3, True)):
        x = _inputs(rssm, actor, seed, device, misaligned)
        got = _run(op, mode, rssm, actor, x, cache)
        want = _run(reference, mode, rssm, actor, x)
        assert got.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-10,
                                       msg=labelled(f"{mode} {spec} seed {seed}: {k}"))
        if mode == "open":
            assert got["action"] is x["action"]  # the caller's, as the reference returns it
    assert len(cache) == 1 and _claimed(cache) == CLAIMED[mode]


def test_a_weight_in_another_dtype_is_refused_before_a_capture(ops):
    """The weights' dtypes and devices are checked once per capture (a replay's key holds their
    addresses): a float32 weight in a float64 RSSM raises, and nothing is captured."""
    op, device = ops
    rssm = wm.RSSM(A, 7, deter=12, stoch=4, hidden=10, blocks=2, **SPECS["v3"]).to(device, torch.float64)
    actor = wm.Actor(rssm.stoch_dim + rssm.deter_dim, A, hidden=8, layers=2).to(device, torch.float64)
    rssm.requires_grad_(False)
    x, cache = _inputs(rssm, actor, 1, device), UnrollCache()
    w = rssm.op_weights()
    w["in_stoch.w"] = w["in_stoch.w"].float()
    for call in (lambda: op.imagine(rssm.op_spec(), w, x["deter"], x["stoch"], x["noise"]["prior"],
                                    actions=x["action"], cache=cache),
                 lambda: op.observe(rssm.op_spec(), w, x["deter"], x["stoch"], x["action"], x["embed"],
                                    x["is_first"], x["noise"]["posterior"], x["noise"]["prior"], cache=cache)):
        with pytest.raises(TypeError, match="every tensor must be torch.float64"):
            call()
    assert len(cache) == 0
