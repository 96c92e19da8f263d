"""The triton RSSM ops (`worldmodels/ops/rssm/fused/`) against the reference ops, with fixed noise:
observe (V1 Gaussian / GRU, V3 categorical / block GRU, the block GRU with Gaussian latents),
open-loop imagine, imagine with the Actor in the loop (one-hot, tanh-normal, normal), the matmul
precision modes, the backward (every gradient), torch.compile through the custom ops, the
fallback for other policies, and the column split (SPLIT ranks per batch tile: emulated by one
program on the CPU, SPLIT programs with the flag barrier on the GPU; the GPU's default launch
splits the columns too).

Specs come from `worldmodels.RSSM` modules of odd sizes (deter 24 in 4 blocks, stoch 5, classes 3,
hidden 20, embed 13) with every parameter perturbed (norm weights and biases included); resets at
t=0 and mid-sequence; B=1 and B=17 (two batch tiles of 16, the second almost empty).

On a CPU machine the kernels run under Triton's interpreter (TRITON_INTERPRET=1 is set for the
import and for each test, as tests/ops/test_fused_rnn.py does); WORLDMODELS_TEST_DEVICE=cuda runs
the same tests on the compiled kernels.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
import warnings


import pytest
import torch

import worldmodels as wm
from worldmodels.ops.rssm import reference

pytest.importorskip("triton", reason="the triton package is not installed: the triton backend cannot run")

from tests._triton import DEVICE, import_op  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numpy, inside triton's interpreter
entry = import_op("worldmodels.ops.rssm.fused.entry", "worldmodels.ops.rssm.fused.forward_kernels",
                  "worldmodels.ops.rssm.fused.backward_kernels", "worldmodels.ops.rssm.fused.launch",
                  "worldmodels.ops.rssm.fused.share")
from worldmodels.ops import triton_utils  # noqa: E402  (imported above, under the interpreter)
from worldmodels.ops.rssm.fused import autograd, backward_kernels, launch, share  # noqa: E402
from worldmodels.ops.triton_utils import launch_overrides  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    if DEVICE.type == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")


_launch = contextlib.ExitStack()


def launch_keys(keys=None) -> None:
    """These RSSM launch keys overridden until the test ends (replacing the ones given before)."""
    _launch.close()
    _launch.enter_context(launch_overrides("rssm", **(keys or {})))


@pytest.fixture(autouse=True)
def _launch_reset():
    yield
    _launch.close()


A, E = 3, 13
CONFIGS = {  # odd sizes: non-powers of two, hidden 20 spans two 16-wide tiles, 4 blocks of deter 6 / hidden 5
    "v1": dict(deter=24, stoch=5, hidden=20, cell="gru", norm="none", act="elu"),
    "v1-layer": dict(deter=24, stoch=5, hidden=20, cell="gru", norm="layer", act="silu"),
    "v3": dict(deter=24, stoch=5, hidden=20, classes=3, cell="block_gru", blocks=4, norm="rms", act="silu"),
    "v3-gauss": dict(deter=24, stoch=5, hidden=20, cell="block_gru", blocks=4, norm="layer", act="elu"),
    "v3-plain": dict(deter=24, stoch=5, hidden=20, classes=3, cell="block_gru", blocks=4, norm="none", act="elu",
                     unimix=0.0),
    "v1-silu": dict(deter=24, stoch=5, hidden=20, cell="gru", norm="none", act="silu"),  # no fused reverse chain
    "v1-relu": dict(deter=24, stoch=5, hidden=20, cell="gru", norm="none", act="relu"),  # PlaNet's; no fused chain
    "v3-relu": dict(deter=24, stoch=5, hidden=20, classes=3, cell="block_gru", blocks=4, norm="rms", act="relu"),
    # deter 72 over 2 ranks: 64-column deter tiles (launch._deter_tile) spanning blocks of 18, the
    # second rank's mostly past the end; 5 latents dealt 4 + 1
    "v3-wide": dict(deter=72, stoch=5, hidden=20, classes=3, cell="block_gru", blocks=4, norm="rms", act="silu"),
    # hidden 52: the logits dot four 16-deep K tiles deep, the last one 4 (LOGITS_KSPLIT)
    "v3-k": dict(deter=24, stoch=5, hidden=52, classes=3, cell="block_gru", blocks=4, norm="rms", act="silu"),
    # blocks of deter 32 that whole deter tiles fit in (4 ranks: 32-column tiles): the gates' one-group tiles
    "v3-even": dict(deter=64, stoch=5, hidden=20, classes=3, cell="block_gru", blocks=2, norm="rms", act="silu"),
    # the 2023 DreamerV3's dense GRU (one norm over the 72 gates) from its learned initial state, and from zeros
    "ng": dict(deter=24, stoch=5, hidden=20, classes=3, cell="norm_gru", norm="layer", act="silu", initial="learned"),
    "ng-rms": dict(deter=24, stoch=5, hidden=20, cell="norm_gru", norm="rms", act="elu", initial="learned"),
    "ng-plain": dict(deter=24, stoch=5, hidden=20, classes=3, cell="norm_gru", norm="none", act="elu"),
}
TOL = {torch.float64: 1e-10, torch.float32: 1e-5 if DEVICE.type == "cpu" else 1e-4}


def make_rssm(cfg: str, dtype, seed=0) -> wm.RSSM:
    torch.manual_seed(seed)
    rssm = wm.RSSM(A, E, **CONFIGS[cfg]).to(device=DEVICE, dtype=dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # nonzero biases and norm parameters everywhere
        for p in rssm.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p))
    return rssm.requires_grad_(False)


def observe_inputs(rssm, batch, steps, dtype, seed=1):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device=DEVICE, dtype=dtype)

    is_first = torch.zeros(batch, steps, dtype=torch.bool)
    is_first[0, 0] = True  # reset at t=0
    is_first[batch - 1, steps // 2] = True  # and mid-sequence
    gen_noise = torch.Generator(device=DEVICE).manual_seed(seed)
    noise = rssm.noise((batch, steps), generator=gen_noise)
    deter, stoch = randn(batch, rssm.deter_dim), randn(batch, rssm.stoch_dim)  # reset must discard them
    return (deter, stoch, 2 * randn(batch, steps, A), randn(batch, steps, E), is_first.to(DEVICE),
            noise["posterior"], noise["prior"])


def assert_outputs_close(got: dict, want: dict, tol: float) -> None:
    assert list(got) == list(want)
    for key in want:
        assert got[key].shape == want[key].shape and got[key].dtype == want[key].dtype, key
        torch.testing.assert_close(got[key], want[key], atol=tol, rtol=tol, msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize("cfg,batch,steps,dtype", [
    ("v1", 1, 4, torch.float64),
    ("v1-layer", 17, 3, torch.float64),
    ("v3", 17, 4, torch.float64),
    ("v3-plain", 1, 3, torch.float64),
    ("v3-gauss", 2, 3, torch.float64),
    ("v1-relu", 3, 4, torch.float64),
    ("v1", 3, 4, torch.float32),
    ("v3", 3, 4, torch.float32),
    ("ng", 17, 4, torch.float64),
    ("ng-rms", 1, 3, torch.float64),
    ("ng-plain", 2, 3, torch.float64),
    ("ng", 3, 4, torch.float32),
], ids=lambda v: str(v).replace("torch.", ""))
def test_observe_matches_reference(cfg, batch, steps, dtype):
    rssm = make_rssm(cfg, dtype)
    args = (rssm.op_spec(), rssm.op_weights(), *observe_inputs(rssm, batch, steps, dtype))
    post, prior = entry.observe(*args)
    ref_post, ref_prior = reference.observe(*args)
    assert_outputs_close(post, ref_post, TOL[dtype])
    assert_outputs_close(prior, ref_prior, TOL[dtype])
    # the kernel writes the sequences as the op's fake says they are (contiguous), beside its padded ones
    assert all(post[k].is_contiguous() for k in ("deter", "stoch"))


@pytest.mark.parametrize("steps", [1, 3])
def test_a_learned_initial_state_at_every_step_matches_reference(monkeypatch, steps):
    """Every step a reset (and one step alone): each filters from the learned initial state, which the
    kernel reads through the host-made shares and its blend alone; values and every gradient (the
    initial state's parameter's too), the reverse chain in the fused kernel."""
    calls = reverse_chain_calls(monkeypatch)
    name, args, kwargs, leaves = kind_call("observe", "ng", batch=2, steps=steps, train=True)
    is_first = torch.ones_like(args[6])
    args = (*args[:6], is_first, *args[7:])
    check_grads_match_reference(name, args, kwargs, leaves)
    assert len(calls) == 1


@pytest.mark.parametrize("cfg,batch,steps", [("v3", 1, 3), ("v1", 3, 1), ("ng", 2, 1)],
                         ids=["v3-B1T3", "v1-B3T1", "ng-B2T1"])
def test_observe_without_resets_matches_reference(cfg, batch, steps):
    """No reset anywhere: the start state reaches every step (B=1 over three steps, and one step
    alone); values and every gradient, the start state's (nonzero) included."""
    name, args, kwargs, leaves = kind_call("observe", cfg, batch=batch, steps=steps, train=True)
    args = (*args[:6], torch.zeros_like(args[6]), *args[7:])
    check_grads_match_reference(name, args, kwargs, leaves)
    _, (deter_grad, stoch_grad, *_) = grads_of(reference.observe, args, kwargs, leaves)
    assert deter_grad.abs().min() > 0 and stoch_grad.abs().sum() > 0


class _CudaStandIn:
    """What `_check_runs` reads of deter, as a CUDA tensor would have it (no GPU here)."""
    dtype, device, is_cuda = torch.float32, torch.device("cuda", 0), True

    def get_device(self) -> int:
        return 0


def test_check_runs_cuda_fast_path_still_names_a_stray_tensor():
    """On CUDA `_check_runs` passes a tensor on two reads (dtype identity, `get_device`); anything
    else takes the full check, which names the tensor's dtype and device."""
    spec = make_rssm("v3", torch.float32).op_spec()
    deter = _CudaStandIn()
    entry._check_runs(spec, deter, [deter, None, torch.zeros(2, dtype=torch.int8)])  # ints pass
    with pytest.raises(TypeError, match="torch.float32 on cuda:0 like deter, got torch.float32 on cpu"):
        entry._check_runs(spec, deter, [deter, torch.zeros(2)])
    with pytest.raises(TypeError, match="got torch.float64 on cpu"):
        entry._check_runs(spec, deter, [torch.zeros(2, dtype=torch.float64)])


@pytest.mark.parametrize("cfg,dtype", [("v1", torch.float64), ("v3", torch.float64), ("v3", torch.float32),
                                       ("v1-relu", torch.float64),  # PlaNet's planning
                                       ("ng", torch.float64)],
                         ids=lambda v: str(v).replace("torch.", ""))
def test_imagine_open_loop_matches_reference(cfg, dtype):
    rssm = make_rssm(cfg, dtype)
    deter, stoch, action, *_ = observe_inputs(rssm, 17, 3, dtype)
    noise = rssm.noise((17, 3), generator=torch.Generator(device=DEVICE).manual_seed(3))
    args = (rssm.op_spec(), rssm.op_weights(), deter, stoch, noise["prior"])
    out = entry.imagine(*args, actions=action)
    assert_outputs_close(out, reference.imagine(*args, actions=action), TOL[dtype])


@pytest.mark.parametrize("cfg,dist,norm,layers,batch", [
    ("v1", "tanh_normal", "none", 2, 17),
    ("v1", "normal", "layer", 1, 1),
    ("v3", "onehot", "rms", 3, 17),
    ("ng", "normal", "layer", 2, 2),
])
def test_imagine_with_actor_matches_reference(cfg, dist, norm, layers, batch):
    dtype = torch.float64
    rssm = make_rssm(cfg, dtype)
    act = "silu" if norm == "rms" else "elu"
    actor = wm.Actor(rssm.stoch_dim + rssm.deter_dim, A, hidden=18, layers=layers, dist=dist, norm=norm, act=act)
    actor = actor.to(device=DEVICE, dtype=dtype).requires_grad_(False)
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(0.2 * torch.randn_like(p))
    deter, stoch, *_ = observe_inputs(rssm, batch, 3, dtype)
    noise = rssm.noise((batch, 3), generator=torch.Generator(device=DEVICE).manual_seed(4))
    kwargs = dict(policy=actor, policy_params=dict(actor.named_parameters()),
                  policy_noise=actor.noise((batch, 3), generator=torch.Generator(device=DEVICE).manual_seed(5)))
    args = (rssm.op_spec(), rssm.op_weights(), deter, stoch, noise["prior"])
    out = entry.imagine(*args, **kwargs)
    assert_outputs_close(out, reference.imagine(*args, **kwargs), TOL[dtype])


# SPLIT column ranks per batch tile: on the GPU SPLIT programs with the flag barrier, under the
# interpreter one program running the ranks in turn (the split bookkeeping: tile ownership, norm
# partials, group / latent ownership). SPLIT 3 with 16-column tiles: ranks own 0, 1 or 2 tiles of a
# 20-wide layer, a rank with none still writes its (zero) partials; 7 ranks: most own nothing.
@pytest.mark.parametrize("kind,cfg,split", [
    ("observe", "v3", 3), ("observe", "v1-layer", 3), ("observe", "v3-gauss", 7), ("open", "v3-plain", 3),
    ("actor-onehot", "v3", 3), ("actor-tanh", "v1-layer", 2), ("observe", "v3-even", 4),
    ("observe", "ng", 3), ("observe", "ng-plain", 5), ("actor-tanh", "ng", 2),
])
def test_column_split_matches_reference(monkeypatch, kind, cfg, split):
    launch_keys(dict(SPLIT=split, BLOCK_N=16))
    check_kind_matches_reference(kind, cfg)


# Launch variants of benchmarks/entry.py: wider / deeper tiles (64 > every size here: one partial
# tile per layer), PRELOAD_H and BLOCKS_KMAJOR forced where the interpreter's plans leave them off.
@pytest.mark.parametrize("kind,cfg,override", [
    ("observe", "v1-layer", dict(BLOCK_K=64)),  # _mm3
    ("actor-onehot", "v3", dict(BLOCK_N=64, BLOCK_K=64)),
    ("observe", "v3", dict(PRELOAD_H=True, SPLIT=3, BLOCK_N=16)),  # the gates' biases and deter tile loaded first
    ("actor-onehot", "v3-even", dict(PRELOAD_H=True, BLOCKS_KMAJOR=True, SPLIT=2, BLOCK_N=16)),
    ("open", "v3-gauss", dict(PRELOAD_H=True, BLOCK_B=64, num_warps=8, SPLIT=2, BLOCK_N=16)),
], ids=["v1-k64", "actor-n64-k64", "v3-preh-s3", "actor-preh-km", "open-preh-b64"])
def test_launch_variants_match_reference(monkeypatch, kind, cfg, override):
    launch_keys(override)
    check_kind_matches_reference(kind, cfg)


# The wider batch tiles of open-loop imagination (`_open_loop_rows`): 32 and 64 rows with 8 warps
# and the ranks it gives, over a batch of 17 (one partial tile, most rows masked).
@pytest.mark.parametrize("cfg,override", [
    ("v3", dict(BLOCK_B=32, num_warps=8, SPLIT=4, BLOCK_N=16)),
    ("v1-layer", dict(BLOCK_B=64, num_warps=8, SPLIT=3, BLOCK_N=16)),
], ids=["v3-b32-s4", "v1-b64-s3"])
def test_open_loop_wide_batch_tiles_match_reference(monkeypatch, cfg, override):
    launch_keys(override)
    check_kind_matches_reference("open", cfg)


@pytest.mark.parametrize("kind", ["observe", "open"])
def test_preload_gradients_match_reference(monkeypatch, kind):
    """PRELOAD_H where the forward saves the gates for the backward's reverse chain: every gradient."""
    launch_keys(dict(PRELOAD_H=True, SPLIT=2, BLOCK_N=16))
    plans = recorded_plans(monkeypatch)
    name, args, kwargs, leaves = kind_call(kind, "v3", 3, steps=3, train=True)
    check_grads_match_reference(name, args, kwargs, leaves)
    assert plans and all(p.preload_h for p in plans)


# FOLD_NORMS: the forward without norm phases, each row norm (RMSNorm / LayerNorm, SiLU / ELU; the
# Actor's too) applied by its consumer's load from the layer's raw output and partials; LayerNorm
# and a Gaussian head, V1's posterior head, the Actor's layers into its one-hot, tanh-normal and
# normal heads, V3's action layer into the cell; with the split (3 ranks) and without.
@pytest.mark.parametrize("kind,cfg", [
    ("observe", "v3"), ("observe", "v3-gauss"), ("observe", "v1-layer"), ("open", "v3"), ("actor-onehot", "v3"),
    ("actor-tanh", "v3-gauss"), ("actor-normal-rms", "v1-layer"),
])
@pytest.mark.parametrize("split", [1, 3])
def test_folded_norms_match_reference(monkeypatch, kind, cfg, split):
    launch_keys(dict(FOLD_NORMS=True, SPLIT=split, BLOCK_N=16))
    check_kind_matches_reference(kind, cfg)


def test_folded_norms_stay_out_of_calls_that_save_for_the_backward(monkeypatch):
    """A call that needs gradients saves every layer's output for the reverse chain: FOLD_NORMS is off
    there (the same gradients as the reference)."""
    launch_keys(dict(FOLD_NORMS=True, SPLIT=2))
    name, args, kwargs, leaves = kind_call("actor-onehot", "v3", 2, train=True)
    check_grads_match_reference(name, args, kwargs, leaves)


# DYN_KSPLIT: V3's dyn_x dot split over K between two halves of the ranks (where they are at least twice
# its column tiles: hidden 20 is two 16-wide tiles, so 4 ranks and up; an odd count leaves one idle), the
# norm phase adding the two partial sums; values, and gradients through the fused reverse chain (which
# reads the summed raw output the forward saved). RMSNorm / LayerNorm, observe / open loop / the Actor.
@pytest.mark.parametrize("kind,cfg,split", [  # 5 ranks: one idle
    ("observe", "v3", 5), ("observe", "v3-gauss", 4), ("open", "v3", 4), ("actor-onehot", "v3", 5),
])
def test_dyn_k_split_matches_reference(monkeypatch, kind, cfg, split):
    launch_keys(dict(SPLIT=split, BLOCK_N=16))
    plans = recorded_plans(monkeypatch)
    name, args, kwargs, leaves = kind_call(kind, cfg, 3, steps=3, train=True)
    check_grads_match_reference(name, args, kwargs, leaves)
    assert plans and all(p.dyn_k_parts == 2 for p in plans)
    if (kind, cfg, split) == ("observe", "v3", 5):  # the prior's logits split too (test_logits_k_split's case)
        assert {p.logits_k_parts for p in plans} == {2}
    check_kind_matches_reference(kind, cfg)  # no grad too


def test_backward_plans_as_its_forward_did_on_another_thread(monkeypatch):
    """The backward re-plans the launch its forward's call saw, wherever it runs. Autograd runs a CUDA
    backward on its device thread, which does not see the caller's `launch_overrides` (Python context
    variables stay with their thread): the plan there was the rules' default, its scratch not the
    forward's ("saved scratch [3, 3, 544] is not this launch's [3, 3, 512]") or, same width, its
    gradients wrong. Here the backward runs on a fresh thread, as CUDA's does."""
    launch_keys(dict(SPLIT=5, BLOCK_N=16))
    plans = recorded_plans(monkeypatch)
    name, args, kwargs, leaves = kind_call("observe", "v3", 3, steps=3, train=True)
    out = flat_outputs(getattr(entry, name)(*args, **kwargs))
    result = {}

    def backward():
        try:
            result["grads"] = torch.autograd.grad(weighted_sum(out), leaves, allow_unused=True)
        except Exception as exc:  # noqa: BLE001 - reported on the test's thread
            result["error"] = exc

    worker = threading.Thread(target=backward)
    worker.start()
    worker.join()
    assert "error" not in result, result.get("error")
    _, want = grads_of(getattr(reference, name), args, kwargs, leaves)
    assert_grads_equal(result["grads"], want)
    assert len(plans) >= 2 and all(p.dyn_k_parts == 2 and p.slot_width == plans[0].slot_width for p in plans)


def test_dyn_k_split_only_where_there_are_idle_ranks():
    """Not with fewer ranks than twice dyn_x's column tiles, without a norm phase to add the partials
    (V3 without norms), or with folded inputs."""
    def dyn_ks(cfg_name="v3", **override):
        launch_keys({"BLOCK_N": 16, "FOLD_NORMS": False, **override})
        r = make_rssm(cfg_name, torch.float64)
        return launch.make_plan(r.op_spec(), 3, 2, r.op_weights(), None, DEVICE, torch.float64).dyn_k_parts

    got = dyn_ks(SPLIT=3), dyn_ks(SPLIT=4), dyn_ks("v3-plain", SPLIT=4), dyn_ks(SPLIT=4, FOLD_NORMS=True)
    assert got == (1, 2, 1, 1)


# The logits' K split (`launch._k_parts`): the forward's categorical logits dot split over K between
# groups of ranks, the sample phase adding the parts and storing their sum (what the reverse chain
# reads). Hidden 52 is four 16-deep K tiles (the last 4 deep): at 8 ranks 4 parts; "v3"'s 20 at 5
# ranks 2 parts, with idle ranks (run by test_dyn_k_split_matches_reference[observe-v3-5], which checks
# its parts too). Values, and every gradient through the chain.
@pytest.mark.parametrize("kind,cfg,split,parts", [
    ("observe", "v3-k", 8, 4), ("actor-onehot", "v3-k", 8, 4),  # observe holds the prior's
])
def test_logits_k_split_matches_reference(monkeypatch, kind, cfg, split, parts):
    launch_keys(dict(SPLIT=split, BLOCK_N=16))
    plans = recorded_plans(monkeypatch)
    name, args, kwargs, leaves = kind_call(kind, cfg, 3, steps=3, train=True)
    check_grads_match_reference(name, args, kwargs, leaves)
    assert plans and {p.logits_k_parts for p in plans} == {parts}
    check_kind_matches_reference(kind, cfg)  # no grad too


def test_logits_k_split_only_where_there_are_idle_ranks():
    """`_k_parts`: as many parts (up to 4) as groups of ranks that each hold every column tile, each at
    least one K tile; none where the head's norm is folded into the logits' load."""
    def parts(k, n, split):
        return launch._k_parts(16, 32, k, n, split)

    # V3-s512 observe at B16: 32 tiles of 512 logits, K 512; 64 ranks -> 2, 63 -> 1, 128 / 256 -> 4
    assert [parts(512, 512, r) for r in (64, 63, 128, 256)] == [2, 1, 4, 4]
    assert parts(64, 256, 64) == 2  # two K tiles: two parts
    launch_keys({"BLOCK_N": 16, "SPLIT": 8})
    r = make_rssm("v3-k", torch.float64)

    def logits_ks(**kw):
        plan = launch.make_plan(r.op_spec(), 3, 2, r.op_weights(), None, DEVICE, torch.float64, **kw)
        return plan.logits_k_parts

    assert logits_ks() == logits_ks(save=True) == 4
    launch_keys({"BLOCK_N": 16, "SPLIT": 8, "FOLD_NORMS": True})
    assert logits_ks() == 1 and logits_ks(save=True) == 4  # the folded head norm is applied on the logits' load


@pytest.mark.parametrize("kind,cfg", [("observe", "v3"), ("observe", "v1"), ("actor-onehot", "v3")])
def test_count_barrier_matches_reference(monkeypatch, kind, cfg):
    """COUNT_BARRIER: the barrier on one counter per batch tile (uint32 flags; uint64 when profiled).
    Values and every gradient through the fused chain at 4 ranks. Under the interpreter the ranks run
    in turn in one program (no cross-program wait), so this checks the launch and the kernels'
    dispatch on the flags' dtype; with WORLDMODELS_TEST_DEVICE=cuda the counter runs for real."""
    launch_keys(dict(COUNT_BARRIER=True, SPLIT=4, BLOCK_N=16))
    dtypes = []
    flags = launch._flags
    monkeypatch.setattr(launch, "_flags", lambda *a: dtypes.append(flags(*a).dtype) or flags(*a))
    name, args, kwargs, leaves = kind_call(kind, cfg, 3, steps=3, train=True)
    check_grads_match_reference(name, args, kwargs, leaves)
    assert dtypes and set(dtypes) == {torch.uint32}
    r = make_rssm("v3", torch.float64)
    plan = launch.make_plan(r.op_spec(), 3, 2, r.op_weights(), None, DEVICE, torch.float64)
    profiled = dataclasses.replace(plan, profile=[])
    assert flags(profiled, torch.device("cpu"), 3, "rssm_kernel").dtype == torch.uint64
    plain = dataclasses.replace(plan, count_barrier=False)
    assert flags(plain, torch.device("cpu"), 3, "rssm_kernel").dtype == torch.int32


# KSPLIT_ROWS (`launch._k_rows`): the normed long-K layers (V3's in_deter, the head, the Actor's
# first layer) split over K (part p of [src | src2] on rank p, every column), their norm phase over rows
# (each rank a quarter / half of the 16-row tile, whole rows: the parts' sum, the row statistics, the
# norm). K 24 (deter) in 16-deep tiles over 4 ranks: parts [0, 16), [16, 24) and two empty ones; the
# Actor's K 15 + 24 = 39 splits [0, 16) across stoch | deter. RMSNorm / LayerNorm, the posterior head's
# embedding share (observe), Gaussian and categorical heads, one-hot / tanh-normal / normal Actors;
# B=17: the second batch tile has one row. At 2 ranks the K parts' column tiles are 16 wide and the norm
# phase holds a whole row in one tile; at 4, tiles of 32 and the norm in two passes over 16-column tiles
# (`_k_rows_tiles` patched: the default tiles hold these layers whole). FOLD_NORMS off: CUDA folds these
# 16-row plans of up to 4 ranks by default (`_fold_pays`).
@pytest.mark.parametrize("kind,cfg,split", [  # each norm and head at both rank counts
    ("observe", "v3", 4), ("observe", "v1-layer", 2), ("open", "v3-gauss", 4), ("actor-onehot", "v3", 2),
    ("actor-tanh", "v3-gauss", 2), ("actor-normal-rms", "v1-layer", 4),
])
def test_k_split_rows_matches_reference(monkeypatch, kind, cfg, split):
    launch_keys(dict(KSPLIT_ROWS=True, SPLIT=split, BLOCK_N=16, FOLD_NORMS=False))
    monkeypatch.setattr(launch, "_k_rows_tiles", lambda width: (8 * split, 64 // split))
    plans = recorded_plans(monkeypatch)
    check_kind_matches_reference(kind, cfg)
    assert plans and all(p.k_split_rows for p in plans)


def test_k_split_rows_only_where_allowed(monkeypatch):
    """`_k_rows`: whole rows per rank (BLOCK_B a multiple of SPLIT), more than one rank, nothing saved
    for a backward (the reverse chain reads the raw outputs and partials it does not write), nothing
    folded. Gradients where the forward splits:
    where the fused chain does not run (imagination above deter 1024: V3-12m's) the forward saves
    nothing, and the torch chain recomputes the steps from the carries the split forward wrote."""
    r = make_rssm("v3", torch.float64)

    def ksr(save=False, **override):
        launch_keys({"BLOCK_N": 16, **override})
        plan = launch.make_plan(r.op_spec(), 3, 2, r.op_weights(), None, DEVICE, torch.float64, save)
        return plan.k_split_rows

    on = dict(KSPLIT_ROWS=True, FOLD_NORMS=False)
    assert [ksr(SPLIT=s, **on) for s in (1, 2, 3, 4, 16)] == [False, True, False, True, True]
    assert not ksr(True, SPLIT=4, **on) and not ksr(SPLIT=4, KSPLIT_ROWS=True, FOLD_NORMS=True)
    assert not launch._k_rows(True, 64, 3, False, False)  # 64 rows over 3 ranks: not whole rows
    launch_keys(dict(KSPLIT_ROWS=True, SPLIT=4, BLOCK_N=16, FOLD_NORMS=False))
    monkeypatch.setattr(autograd, "fused_chain", lambda *a: False)
    plans = recorded_plans(monkeypatch)
    name, args, kwargs, leaves = kind_call("actor-onehot", "v3", 3, steps=3, train=True)
    check_grads_match_reference(name, args, kwargs, leaves)
    assert plans and all(p.k_split_rows for p in plans)


# BLOCKS_KMAJOR (`launch._wide_tiles_pay`): the forward reads V3's gates.w and dyn_h transposed per
# block (copies made per call), through strides; the reverse chain reads the native weights. Tiles across
# blocks (deter 24 in blocks of 6, 16-column tiles) and in one block ("v3-even": 32-column tiles in blocks
# of 32 at 4 ranks); dyn_x's K split (its block-diagonal half) at 4 ranks; values, and every gradient.
@pytest.mark.parametrize("kind,cfg,split", [
    ("observe", "v3", 1), ("observe", "v3", 4), ("open", "v3-gauss", 3), ("actor-onehot", "v3", 2),
    ("observe", "v3-even", 4), ("open", "v3-even", 1),
])
def test_blocks_k_major_matches_reference(monkeypatch, kind, cfg, split):
    launch_keys(dict(BLOCKS_KMAJOR=True, SPLIT=split, BLOCK_N=16))
    plans = recorded_plans(monkeypatch)
    check_kind_matches_reference(kind, cfg)
    assert plans and all(p.blocks_k_major for p in plans)
    if kind == "observe":
        name, args, kwargs, leaves = kind_call(kind, cfg, 3, steps=3, train=True)
        check_grads_match_reference(name, args, kwargs, leaves)


def test_gates_tiles_in_one_block():
    """`v3-even` at 4 ranks plans 32-column deter tiles in blocks of 32 (the gates' ONE_GROUP path);
    the other V3 configs' tiles cross blocks."""
    def deter_tile(cfg, split):
        r = make_rssm(cfg, torch.float64)
        tile = launch._deter_tile(r.deter_dim, split, 16, r.stoch_dim)
        return tile, r.deter_dim // r.op_spec().blocks

    assert deter_tile("v3-even", 4) == (32, 32) and deter_tile("v3", 4) == (16, 6)


def kind_call(kind, cfg, batch=17, steps=3, train=False):
    """(op name, args, kwargs, leaves) of one unroll kind on float64 inputs: "observe", "open" (open
    loop) or "actor-<kind>" (the Actor in the loop: onehot, tanh, normal, bounded, ...). With `train`
    the weights, the actor's parameters and every float input (not the noise) require grad: the
    leaves to differentiate."""
    dtype = torch.float64
    rssm = make_rssm(cfg, dtype)
    deter, stoch, action, embed, is_first, post_noise, prior_noise = observe_inputs(rssm, batch, steps, dtype)
    spec, w = rssm.op_spec(), rssm.op_weights()
    if kind == "observe":
        args, kwargs, name = (spec, w, deter, stoch, action, embed, is_first, post_noise, prior_noise), {}, "observe"
        leaves = [deter, stoch, action, embed, *w.values()]
    else:
        args, name = (spec, w, deter, stoch, prior_noise), "imagine"
        if kind == "open":
            kwargs, leaves = dict(actions=action), [deter, stoch, action, *w.values()]
        else:
            dist, norm, act = {
                "actor-onehot": ("onehot", "rms", "silu"), "actor-tanh": ("tanh_normal", "layer", "silu"),
                "actor-normal": ("normal", "none", "silu"), "actor-normal-rms": ("normal", "rms", "silu"),
                "actor-relu": ("onehot", "rms", "relu"), "actor-bounded": ("bounded_normal", "layer", "silu")}[kind]
            actor = wm.Actor(rssm.stoch_dim + rssm.deter_dim, A, hidden=18, layers=2, dist=dist, norm=norm, act=act)
            actor = actor.to(device=DEVICE, dtype=dtype).requires_grad_(False)
            with torch.no_grad():
                for p in actor.parameters():
                    p.add_(0.2 * torch.randn_like(p))
            params = dict(actor.named_parameters())
            kwargs = dict(policy=actor, policy_params=params, policy_noise=actor.noise(
                (batch, steps), generator=torch.Generator(device=DEVICE).manual_seed(5)))
            leaves = [deter, stoch, *w.values(), *params.values()]
    if train:
        for leaf in leaves:
            leaf.requires_grad_(True)
    return name, args, kwargs, leaves


def flat_outputs(out) -> dict:
    if isinstance(out, tuple):  # observe: (post, prior)
        return {**{f"post.{k}": v for k, v in out[0].items()}, **{f"prior.{k}": v for k, v in out[1].items()}}
    return dict(out)


def check_kind_matches_reference(kind, cfg):
    name, args, kwargs, _ = kind_call(kind, cfg)
    got = flat_outputs(getattr(entry, name)(*args, **kwargs))
    assert_outputs_close(got, flat_outputs(getattr(reference, name)(*args, **kwargs)), TOL[torch.float64])


def weighted_sum(outputs: dict) -> torch.Tensor:
    """A loss reading every output (fixed random weights), so every cotangent is nonzero."""
    gen = torch.Generator().manual_seed(11)
    return sum((v * torch.randn(v.shape, generator=gen, dtype=torch.float64).to(v)).sum()  # same for fp32 / fp64
               for v in outputs.values() if v.is_floating_point())


def check_grads_match_reference(name, args, kwargs, leaves) -> None:
    """The triton op's outputs and every leaf's gradient against the reference's (`kind_call`'s
    float64 inputs)."""
    got_out, got = grads_of(getattr(entry, name), args, kwargs, leaves)
    want_out, want = grads_of(getattr(reference, name), args, kwargs, leaves)
    assert_outputs_close(got_out, want_out, TOL[torch.float64])
    assert_grads_equal(got, want)


def recorded_plans(monkeypatch) -> list:
    """The plans `launch.make_plan` makes from here on (filled as the calls run)."""
    plans = []
    plan = launch.make_plan
    monkeypatch.setattr(launch, "make_plan", lambda *a, **k: plans.append(plan(*a, **k)) or plans[-1])
    return plans


def grads_of(fn, args, kwargs, leaves) -> tuple[dict, list]:
    """The outputs and every leaf's gradient (None where no output depends on it)."""
    out = flat_outputs(fn(*args, **kwargs))
    return out, torch.autograd.grad(weighted_sum(out), leaves, allow_unused=True)


def assert_grads_equal(got, want, tol=1e-10):
    """Same gradients, leaf by leaf; None (no path: e.g. the posterior's weights in imagine) where
    the reference has None, not a tensor of zeros."""
    for i, (g, r) in enumerate(zip(got, want)):
        assert (g is None) == (r is None), f"leaf {i}: gradient {g is not None} vs reference {r is not None}"
        if r is not None:
            torch.testing.assert_close(g, r, atol=tol, rtol=tol, msg=lambda m: f"leaf {i}: {m}")


# The backward (core/chain_backward.py behind the custom op) against the reference's autograd in
# float64: every input's and weight's gradient, resets at t=0 and mid-sequence, B = 1 / 2 / 17.
@pytest.mark.parametrize("kind,cfg,batch", [
    ("observe", "v1", 17), ("observe", "v1-layer", 1), ("observe", "v3", 3), ("observe", "v3-gauss", 2),
    ("open", "v3", 2), ("actor-onehot", "v3", 2), ("actor-tanh", "v1-layer", 1),
    ("observe", "ng", 17), ("observe", "ng-plain", 2), ("actor-tanh", "ng", 2),
])
def test_gradients_match_reference(kind, cfg, batch):
    name, args, kwargs, leaves = kind_call(kind, cfg, batch, steps=3, train=True)
    check_grads_match_reference(name, args, kwargs, leaves)


# The backward's reverse chain runs in one fused kernel (`fused/backward_kernels.py`) from the
# forward's saved scratch: observe, open loop and the Actor in the loop (its MLP, distribution and
# the action layer reversed too); a spec or Actor it does not take (a layer without a norm that is
# not ELU) keeps the torch chain. SPLIT ranks emulated on the CPU, the real split on the GPU.
@pytest.mark.parametrize("kind,cfg,batch,split,fused", [
    ("observe", "v1", 17, 3, True), ("observe", "v1-layer", 2, 2, True), ("observe", "v3", 17, 5, True),
    ("observe", "v3-gauss", 1, 3, True), ("observe", "v3-plain", 3, 2, True), ("observe", "v1-silu", 2, 1, False),
    ("open", "v3", 2, 3, True), ("open", "v1-layer", 3, 2, True), ("actor-onehot", "v3-plain", 2, 2, True),
    ("actor-tanh", "v1", 17, 3, True), ("actor-tanh", "v3-gauss", 3, 3, True), ("actor-normal-rms", "v3", 2, 2, True),
    ("actor-normal", "v3", 2, 1, False), ("observe", "v3-wide", 3, 2, True), ("actor-onehot", "v3-wide", 2, 2, True),
    # ReLU: its derivative from the pre-activation where a norm precedes it (the kernel's activation_grad);
    # without a norm (PlaNet's cell input) the torch chain
    ("observe", "v3-relu", 3, 2, True), ("actor-relu", "v3-relu", 2, 2, True), ("observe", "v1-relu", 3, 2, False),
    # the 2023 dense GRU: one LayerNorm / RMSNorm over the 3 D gates (partials across the ranks), from its
    # learned initial state ("ng", "ng-rms") and from zeros without norms ("ng-plain"); 5 ranks: idle ones
    ("observe", "ng", 3, 2, True), ("observe", "ng", 17, 5, True), ("observe", "ng-rms", 1, 3, True),
    ("observe", "ng-plain", 17, 1, True), ("open", "ng", 3, 3, True), ("open", "ng-plain", 1, 2, True),
    ("actor-tanh", "ng", 2, 2, True), ("actor-onehot", "ng-rms", 3, 3, True), ("actor-normal-rms", "ng", 1, 1, True),
    ("actor-normal", "ng-rms", 2, 2, False),
    # the bounded normal Actor (its distribution's backward from the forward's saved derivatives)
    ("actor-bounded", "v3-gauss", 3, 3, True), ("actor-bounded", "ng", 1, 2, True),
])
def test_backward_runs_the_fused_chain(monkeypatch, kind, cfg, batch, split, fused):
    if DEVICE.type == "cpu":
        launch_keys(dict(SPLIT=split))
    calls = reverse_chain_calls(monkeypatch)
    name, args, kwargs, leaves = kind_call(kind, cfg, batch, steps=4 if kind == "observe" else 3, train=True)
    check_grads_match_reference(name, args, kwargs, leaves)
    assert len(calls) == int(fused)


def reverse_chain_calls(monkeypatch) -> list:
    """One entry per `launch.reverse_chain` (the fused reverse chain) from here on."""
    calls = []
    chain = launch.reverse_chain
    monkeypatch.setattr(launch, "reverse_chain", lambda *a, **k: calls.append(1) or chain(*a, **k))
    return calls


def float32_call(args, kwargs, leaves) -> tuple[tuple, dict, list]:
    """`kind_call`'s call in float32: every float64 tensor (the weights and the Actor's parameters too)
    as a float32 copy, requiring grad where the float64 one does (the new leaves, in `leaves`' order)."""
    new = {}

    def f32(t):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return t
        if id(t) not in new:
            new[id(t)] = t.detach().float().requires_grad_(t.requires_grad)
        return new[id(t)]

    args = tuple({k: f32(v) for k, v in a.items()} if isinstance(a, dict) else f32(a) for a in args)
    kwargs = dict(kwargs)
    if "policy" in kwargs:
        policy = copy.deepcopy(kwargs["policy"]).float()
        params = dict(policy.named_parameters())
        for name, p in kwargs["policy_params"].items():
            p.requires_grad_(True)
            new[id(p)] = params[name].requires_grad_(True)
        kwargs.update(policy=policy, policy_params=params)
    kwargs = {k: f32(v) for k, v in kwargs.items()}
    return args, kwargs, [new[id(leaf)] for leaf in leaves]


# The 2023 dense GRU's fused reverse chain in float32 (the float64 cases above): every gradient against the
# reference's float32 autograd; observe from its learned initial state (3 ranks), the Actor in the loop.
@pytest.mark.parametrize("kind,cfg,batch,split", [("observe", "ng", 5, 3), ("actor-onehot", "ng-rms", 2, 1)])
def test_norm_gru_fused_chain_in_float32(monkeypatch, kind, cfg, batch, split):
    launch_keys(dict(SPLIT=split) if DEVICE.type == "cpu" else {})
    calls = reverse_chain_calls(monkeypatch)
    args, kwargs, leaves = float32_call(*kind_call(kind, cfg, batch, steps=3, train=True)[1:])
    name = "observe" if kind == "observe" else "imagine"
    got_out, got = grads_of(getattr(entry, name), args, kwargs, leaves)
    want_out, want = grads_of(getattr(reference, name), args, kwargs, leaves)
    assert_outputs_close(got_out, want_out, TOL[torch.float32])
    assert_grads_equal(got, want, tol=1e-4)
    assert len(calls) == 1


def test_fused_chain_where_measured_faster():
    """The fused reverse chain for every observe and for imagination up to deter 1024, every cell; the torch
    chain for imagination at deter 2048 (measured faster there) and for specs the kernel does not take."""
    rssm = make_rssm("v3", torch.float64)
    spec = rssm.op_spec()
    wide = dataclasses.replace(spec, deter=2048)
    assert all(autograd.fused_chain(mode, spec) for mode in ("observe", "open_loop", "actor"))
    assert autograd.fused_chain("observe", wide) and not autograd.fused_chain("actor", wide)
    assert not autograd.fused_chain("observe", dataclasses.replace(spec, norm="none", act="silu"))
    silu_actor = wm.Actor(rssm.stoch_dim + rssm.deter_dim, A, hidden=8, layers=1, norm="none", act="silu")
    assert not autograd.fused_chain("actor", spec, silu_actor.op_spec())
    # the 2023 dense GRU, from its learned initial state or from zeros, normed or ELU without norms
    ng = make_rssm("ng", torch.float64).op_spec()
    for spec in (ng, make_rssm("ng-rms", torch.float64).op_spec(), make_rssm("ng-plain", torch.float64).op_spec()):
        assert all(autograd.fused_chain(mode, spec) for mode in ("observe", "open_loop", "actor"))
    assert not autograd.fused_chain("observe", dataclasses.replace(ng, norm="none", act="silu"))
    # every Actor distribution; an Actor on stop-gradient features whatever its layers (nothing reaches the carry)
    bounded = wm.Actor(rssm.stoch_dim + rssm.deter_dim, A, hidden=8, layers=1, dist="bounded_normal", norm="layer")
    assert autograd.fused_chain("actor", spec, bounded.op_spec())
    stopped = dataclasses.replace(silu_actor.op_spec(), stop_features=True)
    assert autograd.fused_chain("actor", spec, stopped)


_after = backward_kernels._after  # a global of the test kernel below (the interpreter resolves names there)


@triton.jit
def _first_of_second(out, N: tl.constexpr, TILE: tl.constexpr, SPLIT: tl.constexpr):
    for q in tl.static_range(SPLIT):
        tl.store(out + q, _after(q, N, TILE, SPLIT))


def _dealt(first: list, n1: int, n2: int, split: int) -> list:
    """Per rank, the tiles it takes: list 1's j = rank, rank + split, ...; list 2's from first[rank]."""
    return [[("a", j) for j in range(q, n1, split)] + [("b", e) for e in range(first[q], n2, split)]
            for q in range(split)]


@pytest.mark.parametrize("n,tile,split,n2", [
    (512, 16, 64, 32),  # V3-s512 observe: in_deter's 32 tiles then in_stoch's 32, deter's then stoch's
    (200, 32, 13, 2),   # V1 observe: 7 deter tiles of 32, 2 stoch tiles
    (200, 16, 13, 2),   # 13 + 2 on 13 ranks
    (512, 64, 2, 4),    # V3-1m imagination: more tiles than ranks
    (20, 16, 3, 2), (72, 64, 2, 1), (24, 16, 5, 3),
])
def test_reverse_chain_deals_the_second_list_on_after_the_first(n, tile, split, n2):
    """`backward_kernels._after`: a second list of tiles continues the first's turn over the ranks,
    so every tile of both is taken once and no rank takes more than its fair share (at V3-s512
    observe the two lists both started at rank 0: half the 64 ranks did two K-512 dots, half none)."""
    out = torch.zeros(split, dtype=torch.int32, device=DEVICE)
    _first_of_second[(1,)](out, n, tile, split)
    n1 = -(-n // tile)
    dealt = _dealt(out.tolist(), n1, n2, split)
    taken = sorted(t for rank in dealt for t in rank)
    assert taken == sorted([("a", j) for j in range(n1)] + [("b", e) for e in range(n2)])
    assert max(map(len, dealt)) == -(-(n1 + n2) // split)


def test_deter_tiles_are_a_ranks_share_up_to_64_columns():
    """The tiles of the phases over deter's columns: a rank's share, wider (up to 64) while the carry's deter
    and stoch tiles outnumber the ranks: the DreamerV3 updates' observe at B16, size1m (32 ranks) and
    size12m (64 ranks), beside the benchmark cases of `test_default_launch`."""
    plans = [(512, 32, 16, 128), (2048, 64, 32, 512)]  # (deter, SPLIT, BLOCK_N, stoch)
    assert [launch._deter_tile(d, split, n, s) for d, split, n, s in plans] == [32, 64]


# The launch each benchmark case gets on the H200 (132 SMs), planned on the CPU: (case, grad) -> BLOCK_B,
# BLOCK_N, warps, SPLIT, and what the rules decide (PLAN_FIELDS; docs/kernels.md, "Launch defaults"), then
# whether the op pre-multiplies the action share by dyn_x's columns (a_share_pre; `share.dyn_x_share_pays`):
# V3 given actions (observe, open-loop imagine) without gradients, at hidden >= 256 (V3-s512's 512 and
# V3-12m's 256, not V3-1m's 64).
DEFAULT_LAUNCH = {
    ("V1-observe", False): (16, 16, 4, 13, False, 1, 1, False, True, False, False, 32, False),
    ("V1-observe", True): (16, 16, 4, 13, False, 1, 1, False, True, False, False, 32, False),
    ("V3-s512-observe", False): (16, 16, 4, 64, False, 2, 2, False, True, False, False, 16, True),
    ("V3-s512-observe", True): (16, 16, 4, 64, False, 2, 2, False, True, False, False, 16, False),
    ("V1-imagine-open", False): (64, 32, 8, 7, False, 1, 1, False, False, False, False, 64, False),
    ("V1-imagine-open", True): (16, 32, 4, 2, False, 1, 1, False, False, False, False, 64, False),
    ("V1-imagine-actor", False): (64, 32, 8, 3, False, 1, 1, False, False, False, False, 64, False),
    ("V1-imagine-actor", True): (64, 32, 8, 3, False, 1, 1, False, False, False, False, 64, False),
    ("V3-1m-imagine-open", False): (32, 32, 8, 4, False, 2, 1, False, False, False, False, 64, False),
    ("V3-1m-imagine-open", True): (16, 32, 4, 2, False, 1, 1, False, False, False, False, 64, False),
    ("V3-1m-imagine-actor", False): (16, 32, 4, 2, True, 1, 1, False, False, False, False, 64, False),
    ("V3-1m-imagine-actor", True): (16, 32, 4, 2, False, 1, 1, False, False, False, False, 64, False),
    ("V3-12m-imagine-open", False): (64, 32, 8, 8, False, 1, 1, True, False, True, True, 64, True),
    ("V3-12m-imagine-open", True): (64, 32, 8, 8, False, 1, 1, True, False, True, True, 64, False),
    ("V3-12m-imagine-actor", False): (64, 32, 8, 8, False, 1, 1, True, False, True, True, 64, False),
    ("V3-12m-imagine-actor", True): (64, 32, 8, 8, False, 1, 1, True, False, True, True, 64, False),
}
PLAN_FIELDS = ("block_b", "block_n", "num_warps", "split", "fold", "dyn_k_parts", "logits_k_parts", "k_split_rows",
               "count_barrier", "blocks_k_major", "preload_h", "deter_tile")


@pytest.mark.parametrize("case,grad", list(DEFAULT_LAUNCH))
def test_default_launch(monkeypatch, case, grad):
    """The default launch of every benchmark case, with and without gradients, as planned for the H200."""
    from benchmarks import shapes
    from benchmarks.triton_rssm import CASES

    monkeypatch.setattr(launch, "_gpu_sms", lambda device: 132)
    preset, kind, batch, steps = CASES[case]
    cfg = getattr(shapes, preset)
    rssm = wm.RSSM(cfg.action, cfg.embed, **cfg.rssm_kwargs())
    spec, w = rssm.op_spec(), rssm.op_weights()
    packed = launch.rssm_args(spec, w, "post" if kind == "observe" else "prior", torch.float32, torch.float32)
    actor = None
    if kind == "actor":
        policy = wm.Actor(cfg.stoch_dim + cfg.deter, cfg.action, **cfg.actor_kwargs())
        actor = launch.actor_args(policy.op_spec(), dict(policy.named_parameters()), spec, w, torch.float32,
                                  torch.float32)
    save = grad and autograd.fused_chain("observe" if kind == "observe" else "actor", spec)
    plan = launch.make_plan(spec, batch, steps, packed, actor, torch.device("cuda"), torch.float32, save,
                               open_loop=kind == "open")
    pre = kind != "actor" and pre_multiplied_share(monkeypatch, spec, w, cfg.action, grad)
    assert (*(getattr(plan, f) for f in PLAN_FIELDS), pre) == DEFAULT_LAUNCH[case, grad]


def pre_multiplied_share(monkeypatch, spec, w, action_dim: int, grad: bool) -> bool:
    """Whether the op's unroll with given actions (observe, open-loop imagine; the Actor's imagination has
    none) hands the launch the action share pre-multiplied by dyn_x's columns (a_share_pre), as
    `entry._action_share` decides it on the CPU: the one-launch share stood in for by the reference's (its
    numbers are test_fused_rssm_share.py's), so no kernel runs at the benchmark's sizes."""
    monkeypatch.setattr(share, "action_share", lambda spec, w, action: reference.action_in(spec, w, action))
    deter, stoch = torch.zeros(1, spec.deter), torch.zeros(1, spec.stoch * (spec.classes or 1))
    with torch.set_grad_enabled(grad):
        got = entry._action_share(spec, w, torch.zeros(1, 2, action_dim), deter, stoch)
    return got.get("a_share_pre", False)


def test_no_grad_observe_saves_nothing_for_the_backward():
    """The forward keeps its scratch (the gates, the Gaussian head's sigmoid) only when a gradient
    will be asked for."""
    name, args, kwargs, leaves = kind_call("observe", "v1", 2, steps=2, train=False)
    spec, w, deter, stoch, action, embed, is_first, post_noise, _ = args
    a_share, e_share = reference.action_in(spec, w, action), reference.embed_in(w, embed)
    for grad in (False, True):
        deter = deter.detach().requires_grad_(grad)
        config = autograd._describe("observe", spec, list(w), save=grad)
        out = autograd._unroll_op(config, deter, stoch, post_noise, a_share, e_share, is_first, None,
                                   list(w.values()), [])
        assert (out[-1].numel() > 0) == grad


@pytest.mark.parametrize("kind,cfg", [("observe", "v3"), ("actor-tanh", "v1-layer"), ("observe", "ng")])
def test_compiled_chain_matches_reference(kind, cfg, monkeypatch):
    """The backward's per-step VJP under torch.compile (inductor; the default on CUDA): the same
    gradients, and no fall back to the eager VJP."""
    from worldmodels.core import chain_backward
    monkeypatch.setattr(autograd, "compile_chain", lambda tensor: True)
    name, args, kwargs, leaves = kind_call(kind, cfg, 2, steps=3, train=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = grads_of(getattr(entry, name), args, kwargs, leaves)[1]
    fallbacks = [str(w.message) for w in caught if "chain_backward" in str(w.message)]
    assert not fallbacks and not chain_backward._failed, fallbacks  # a compile failure warns, then runs eagerly
    assert_grads_equal(got, grads_of(getattr(reference, name), args, kwargs, leaves)[1])


def test_only_requested_gradients_are_computed():
    """Dreamer V1's actor loss: the world model frozen, gradients reach only the actor and the start
    deter; the frozen weights and the start stoch get none."""
    name, args, kwargs, _ = kind_call("actor-tanh", "v1", 2)
    deter, stoch = args[2].requires_grad_(), args[3]
    params = list(kwargs["policy_params"].values())
    for p in params:
        p.requires_grad_(True)
    out = entry.imagine(*args, **kwargs)
    assert all(not w.requires_grad for w in args[1].values()) and not stoch.requires_grad
    got = torch.autograd.grad(weighted_sum(out), [deter, *params])
    want = torch.autograd.grad(weighted_sum(reference.imagine(*args, **kwargs)), [deter, *params])
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("cfg", ["v1-layer", "ng-rms"])
def test_gradcheck_through_the_custom_op(cfg):
    """torch.autograd.gradcheck (finite differences) of the op's start state and action share (and the
    2023 dense GRU's learned initial state, which resets read): a check of the backward that does not
    go through the reference's autograd."""
    rssm = make_rssm(cfg, torch.float64)
    deter, stoch, action, embed, is_first, post_noise, _ = observe_inputs(rssm, 2, 3, torch.float64)
    spec, w = rssm.op_spec(), rssm.op_weights()
    e_share = reference.embed_in(w, embed)
    learned = spec.initial == "learned"

    def run(deter, stoch, a_share, *initial):
        weights = reference.with_initial(spec, {**w, "initial": initial[0]}) if learned else w
        out = autograd.unroll("observe", spec, weights, deter, stoch, post_noise, a_share=a_share, e_share=e_share,
                               resets=is_first)
        return out["deter"], out["stoch"], out["mean"], out["std"]

    a_share = torch.randn(2, 3, spec.hidden, dtype=torch.float64, device=DEVICE)
    leaves = (deter.requires_grad_(), stoch.requires_grad_(), a_share.requires_grad_())
    if learned:
        leaves += (w["initial"].detach().clone().requires_grad_(),)
    # fast mode (random projections): a full Jacobian would take hundreds of interpreted launches
    assert torch.autograd.gradcheck(run, leaves, fast_mode=True)


@pytest.mark.parametrize("kind,cfg", [("observe", "v3"), ("actor-onehot", "v3"), ("observe", "ng")])
def test_compiled_unroll_is_one_opaque_node_with_gradients(kind, cfg):
    """torch.compile(fullgraph=True) through the custom ops (aot_eager: the op's fake shapes and
    its registered backward), with the Actor's checks and description traced too (and the 2023
    cell's learned initial state, made outside the op): the same values and gradients as eager."""
    name, args, kwargs, leaves = kind_call(kind, cfg, 2, train=True)

    def unroll():
        return flat_outputs(getattr(entry, name)(*args, **kwargs))

    torch._dynamo.reset()
    compiled = torch.compile(unroll, fullgraph=True, backend="aot_eager")
    assert_grads_equal(grads_of(compiled, (), {}, leaves)[1], grads_of(unroll, (), {}, leaves)[1])


def test_supports():
    rssm = make_rssm("v1", torch.float64)
    assert not entry.supports(rssm.op_spec(), torch.bfloat16)
    assert entry.supports(rssm.op_spec(), torch.float32)


def test_auto_takes_the_2023_dense_gru_fused_only_where_timed():
    """The kernel takes the 2023 dense GRU and its learned initial state. `auto` picks it where the 2023
    preset's update was timed faster fused (tf32, both unrolls with gradients, the bounded normal Actor on
    stop-gradient features) and nowhere else: tf32x3 was slower, bf16 and no-grad unrolls untimed, and an
    Actor the kernel does not sample never. A learned initial state on other cells is not taken."""
    spec = make_rssm("ng", torch.float64).op_spec()
    assert entry.supports(spec, torch.float32) and spec.initial == "learned"

    def fits(precision, kind, grad, dist="bounded_normal"):
        return entry.fits(dict(spec=spec, dtype=torch.float32, precision=precision, grad=grad, kind=kind,
                               policy_dist=dist, stop_features=True))

    assert fits("tf32", "observe", True) and fits("tf32", "actor", True)
    for precision in ("tf32x3", "bf16", "ieee"):
        assert not fits(precision, "observe", True) and not fits(precision, "actor", True)
    assert not fits("tf32", "observe", False) and not fits("tf32", "actor", False)
    assert not fits("tf32", "open", True) and not fits("tf32", "policy", False)
    assert not fits("tf32", "actor", True, dist="categorical")
    spec = dataclasses.replace(spec, deter=1280)  # the kernels take it; the rule stops at deter 1024
    assert entry.supports(spec, torch.float32)
    assert not fits("tf32", "observe", True) and not fits("tf32", "actor", True)
    v3 = dataclasses.replace(make_rssm("v3", torch.float64).op_spec(), initial="learned")
    assert "start episodes from zeros" in entry.unsupported_reason(v3)


def test_plain_callable_policy_falls_back_with_a_warning(monkeypatch):
    monkeypatch.setattr(triton_utils, "_warned", set())
    dtype = torch.float64
    rssm = make_rssm("v1", dtype)
    deter, stoch, *_ = observe_inputs(rssm, 2, 2, dtype)
    noise = rssm.noise((2, 2), generator=torch.Generator(device=DEVICE).manual_seed(4))
    args = (rssm.op_spec(), rssm.op_weights(), deter, stoch, noise["prior"])

    def policy(features, noise=None):
        return torch.tanh(features[..., :A])

    with pytest.warns(UserWarning, match="loop reference, slower than backend='cudnn'.*"
                                         "policy function is not the project's Actor"):
        out = entry.imagine(*args, policy=policy)
    assert_outputs_close(out, reference.imagine(*args, policy=policy), TOL[dtype])


def perturbed_actor(rssm, dist: str, hidden: int) -> wm.Actor:
    """A two-layer LayerNorm / SiLU Actor on the RSSM's features, float64, every parameter perturbed."""
    actor = wm.Actor(rssm.stoch_dim + rssm.deter_dim, A, hidden=hidden, layers=2, dist=dist, norm="layer",
                     act="silu").to(DEVICE, torch.float64)
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return actor


def imagine_with(rssm, policy, batch: int, grad_leaves: bool) -> tuple[tuple, dict]:
    """(args, kwargs) of an imagination of 3 steps with `policy` in the loop (its parameters by name, its
    pre-drawn noise), the start deter and the RSSM's weights requiring grad (and the start stoch where
    `grad_leaves`)."""
    deter, stoch, *_ = observe_inputs(rssm, batch, 3, torch.float64)
    noise = rssm.noise((batch, 3), generator=torch.Generator(device=DEVICE).manual_seed(4))
    w = rssm.op_weights()
    for leaf in (deter, *((stoch,) if grad_leaves else ()), *w.values()):
        leaf.requires_grad_(True)
    kwargs = dict(policy=policy, policy_params=dict(policy.named_parameters()),
                  policy_noise=policy.noise((batch, 3), generator=torch.Generator(device=DEVICE).manual_seed(5)))
    return (rssm.op_spec(), w, deter, stoch, noise["prior"]), kwargs


def launch_calls(monkeypatch) -> list:
    """The actor arguments (None without an Actor) of each `launch.forward` from here on."""
    calls = []
    forward = launch.forward
    monkeypatch.setattr(launch, "forward", lambda *a, **k: calls.append(k.get("actor")) or forward(*a, **k))
    return calls


@pytest.mark.parametrize("cfg", ["v1", "ng", "v3-gauss"])
def test_bounded_normal_actor_runs_in_the_kernel(monkeypatch, cfg):
    """The 2023 reference's bounded normal Actor (N(tanh(mean), (max - min) sigmoid(raw + 2) + min)) is
    sampled in the kernel: values and every gradient (its reverse chain in the fused kernel) equal the
    reference's; `auto` does not pick the kernel for it until timed."""
    monkeypatch.setattr(triton_utils, "_warned", set())
    rssm = make_rssm(cfg, torch.float64)
    actor = perturbed_actor(rssm, "bounded_normal", hidden=5)
    args, kwargs = imagine_with(rssm, actor, batch=3, grad_leaves=False)
    calls = launch_calls(monkeypatch)
    chains = reverse_chain_calls(monkeypatch)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*loop reference")  # no fall back to it
        check_grads_match_reference("imagine", args, kwargs, [args[2], *args[1].values(), *actor.parameters()])
    assert [actor_args["dist"] for actor_args in calls] == [3] and len(chains) == 1
    assert not entry.fits(dict(spec=args[0], dtype=torch.float32, precision="bf16", grad=True, kind="actor",
                               policy_dist="bounded_normal"))


@pytest.mark.parametrize("cfg,dist", [("ng", "bounded_normal"), ("v1-layer", "tanh_normal"), ("v3", "onehot")])
def test_actor_on_stopped_features_runs_in_the_kernel(monkeypatch, cfg, dist):
    """An Actor behind `StopGradientInputs` (a backprop actor's imagination: DreamerV3's 2023 protocol,
    Dreamer V1) runs in the kernel: the same values, and every gradient as the reference's, whose
    features reach the actor through a stop-gradient (the start deter's gradient tells; the fused
    reverse chain leaves the Actor out); `auto` leaves it on cudnn until timed."""
    from worldmodels.models.actor import StopGradientInputs

    monkeypatch.setattr(triton_utils, "_warned", set())
    rssm = make_rssm(cfg, torch.float64)
    actor = perturbed_actor(rssm, dist, hidden=6)
    policy = StopGradientInputs(actor)
    assert policy.op_spec().stop_features and policy.dist_type == dist
    args, kwargs = imagine_with(rssm, policy, batch=2, grad_leaves=True)
    deter = args[2]
    calls = launch_calls(monkeypatch)
    chains = reverse_chain_calls(monkeypatch)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*loop reference")  # no fall back to it
        check_grads_match_reference("imagine", args, kwargs, [deter, args[3], *args[1].values(), *actor.parameters()])
    assert len(calls) == 1 and len(chains) == 1
    # the stop-gradient matters: without it the start state's gradient differs
    got = grads_of(entry.imagine, args, kwargs, [deter])[1][0]
    plain = dict(kwargs, policy=actor, policy_params=dict(actor.named_parameters()))
    assert not torch.allclose(got, grads_of(reference.imagine, args, plain, [deter])[1][0])
    assert not entry.fits(dict(spec=args[0], dtype=torch.float32, precision="bf16", grad=True, kind="actor",
                               policy_dist=dist, stop_features=True))


def _by_identity(named) -> list:
    return [(name, id(p)) for name, p in (named.items() if isinstance(named, dict) else named)]


@pytest.mark.parametrize("kw", [dict(dist="tanh_normal", act="elu", norm="none", layers=1),
                                dict(dist="onehot", act="silu", norm="rms", layers=3),
                                dict(dist="normal", act="elu", norm="layer", layers=2)])
def test_actor_parameters_are_named_parameters(kw):
    """The per-call read of an Actor's parameters (`entry._actor_parameters`, from the modules' own
    tables) is `named_parameters`' (names, tensors, order) for the trees its constructor makes, a Linear
    whose bias was set to None too; None for any other tree (the caller then walks it with
    `named_parameters`): a parameter or a module added outside the leaves, a parameter shared by two
    layers."""
    import copy

    actor = wm.Actor(12, 3, hidden=8, **kw)
    read = entry._actor_parameters
    assert _by_identity(read(actor)) == _by_identity(actor.named_parameters())
    actor.net[0][0].bias = None
    assert _by_identity(read(actor)) == _by_identity(actor.named_parameters())
    others = [copy.deepcopy(actor) for _ in range(4)]
    others[0].temperature = torch.nn.Parameter(torch.ones(1))
    others[1].head = torch.nn.Identity()
    others[2].net[0][1].extra = torch.nn.Linear(2, 2)
    others[3].net = torch.nn.Sequential()
    assert [read(a) for a in others] == [None, None, None, None]
    # a parameter added to a leaf is listed as named_parameters lists it (`ops/actor.weight_names` then refuse it)
    scaled = copy.deepcopy(actor)
    scaled.net[0][2].scale = torch.nn.Parameter(torch.ones(1))
    assert _by_identity(read(scaled)) == _by_identity(scaled.named_parameters())
    if kw["layers"] == 3:
        tied = copy.deepcopy(actor)
        tied.net[2][0].weight = tied.net[1][0].weight
        assert read(tied) is None


# ||out - ref|| / ||ref|| against the float64 reference, per output, for float32 inputs in each mode
PRECISION_TOL = {"ieee": 1e-5, "tf32": 5e-3, "tf32x3": 1e-5, "bf16": 3e-2}


@pytest.mark.parametrize("precision", ["bf16", "tf32"] + (["ieee", "tf32x3"] if DEVICE.type == "cuda" else []))
def test_precision_error_against_float64(precision):
    """The process-wide recurrent matmul precision reaches the kernel's dots (the interpreter emulates
    bf16 by rounding the dot operands, and tf32 by the kernels' own rounding of the operands to tf32;
    tf32x3 is checked on the GPU)."""
    rssm = make_rssm("v1", torch.float64)
    inputs = observe_inputs(rssm, 3, 4, torch.float64)
    want, _ = reference.observe(rssm.op_spec(), rssm.op_weights(), *inputs)
    rssm32 = rssm.float()
    wm.set_recurrent_matmul_precision(precision)
    got, _ = entry.observe(rssm32.op_spec(), rssm32.op_weights(),
                                 *(t.float() if t.is_floating_point() else t for t in inputs))
    for key in want:
        error = ((got[key].double() - want[key]).norm() / want[key].norm()).item()
        assert error < PRECISION_TOL[precision], f"{precision}: {key} relative error {error:.2e}"


@pytest.mark.parametrize("precision", ["bf16", "tf32"] + (["ieee", "tf32x3"] if DEVICE.type == "cuda" else []))
def test_gradient_precision_against_float64(precision):
    """The fused reverse chain's dots take the same precision mode: every gradient of a float32
    observe (V1, Gaussian: no argmax to flip) against the float64 reference's, relative in norm."""
    rssm = make_rssm("v1-layer", torch.float64)
    inputs = observe_inputs(rssm, 3, 4, torch.float64)
    spec, w = rssm.op_spec(), rssm.op_weights()
    leaves = [inputs[0], inputs[1], inputs[2], inputs[3], *w.values()]
    want = grads_of(reference.observe, (spec, w, *inputs), {}, [t.requires_grad_() for t in leaves])[1]
    wm.set_recurrent_matmul_precision(precision)
    w32 = {k: v.detach().float().requires_grad_() for k, v in w.items()}
    in32 = [t.detach().float().requires_grad_(i < 4) if t.is_floating_point() else t for i, t in enumerate(inputs)]
    got = grads_of(entry.observe, (spec, w32, *in32), {}, [*in32[:4], *w32.values()])[1]
    for i, (g, r) in enumerate(zip(got, want)):
        error = ((g.double() - r).norm() / r.norm()).item()
        assert error < 3 * PRECISION_TOL[precision], f"{precision}: leaf {i} relative error {error:.2e}"


def test_autocast_keeps_the_state_in_fp32(monkeypatch):
    """Under bf16 autocast (a DreamerV3 update's mixed precision) a bf16 embedding is taken, the
    state and outputs stay fp32, the dots run with bf16 operands (close to the fp32 reference,
    not equal) and gradients flow to the weights."""
    rssm = make_rssm("v1", torch.float32)
    deter, stoch, action, embed, is_first, post_noise, prior_noise = observe_inputs(rssm, 3, 4, torch.float32)
    spec, w = rssm.op_spec(), {k: v.detach().requires_grad_() for k, v in rssm.op_weights().items()}
    want, _ = reference.observe(spec, w, deter, stoch, action, embed, is_first, post_noise, prior_noise)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        post, _ = entry.observe(spec, w, deter, stoch, action, embed.bfloat16(), is_first, post_noise,
                                      prior_noise)
        assert autograd.forward_precision(deter) == "bf16"  # the kernel's dots take bf16 operands
    assert autograd.forward_precision(deter) == autograd.resolve_precision(None, deter.device)  # outside
    assert all(v.dtype == torch.float32 for v in post.values())
    torch.testing.assert_close(post["deter"], want["deter"], atol=5e-2, rtol=0)
    precisions = []
    chain = launch.reverse_chain
    monkeypatch.setattr(launch, "reverse_chain", lambda *a, **k: precisions.append(a[2]) or chain(*a, **k))
    grad = torch.autograd.grad(post["deter"].sum(), w["gru.w_hh"])[0]  # outside autocast
    assert grad.abs().sum() > 0
    assert precisions == ["bf16"]  # the reverse chain is launched as the forward was (same plan, same dots)
    noise = rssm.noise((3, 4), generator=torch.Generator(device=DEVICE).manual_seed(3))
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):  # imagine: bf16 actions and start state taken
        out = entry.imagine(spec, w, deter.bfloat16(), stoch, noise["prior"], actions=action.bfloat16())
    assert all(out[k].dtype == torch.float32 for k in ("deter", "stoch", "mean", "std"))


def test_constants_first_needed_inside_a_capture_raise_naming_them(monkeypatch):
    """`launch.constants` makes each set of the kernel's scalars on the device once. A set first met
    inside a CUDA-graph capture (its warm-up did not launch the kernel with it) cannot be copied
    there: it raises, naming the set, instead of leaving CUDA to report an invalidated capture."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match=r"constants \(0\.125, 3\.0\).*first needed inside a CUDA-graph capture"):
        launch.constants((0.125, 3.0), torch.float32, torch.device("cuda"))
    assert launch.constants((0.125, 3.0), torch.float32, torch.device("cpu")).tolist() == [0.125, 3.0]
