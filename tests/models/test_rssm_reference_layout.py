"""DreamerV3's reference RSSM layout (danijar/dreamerv3 2411f7d, nets.py `RSSM._gru` blockgru and
`_prior`): the block GRU's hidden layer `deter` wide (`dyn_hidden`), normalised over all blocks at
once (`dyn_norm="all"`, the reference's block_norm False), and a two-layer prior head
(`prior_layers=2`, its imglayers). The cell is checked against the reference's formula written
out independently (a BlockLinear over [deter block | shared input] per block); every CPU backend
equals the loop on it (values and gradients, resets, float64 gradcheck); the fused triton op
names why it does not take it; the run config validates the fields, stored configs read as the
compact layout, and the DMC presets ask for the reference's."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

import worldmodels as wm
from tests._train_config import run_config
from tests.models.test_rssm import (CPU_BACKENDS, assert_grads_close, assert_tds_close, check_observe_equals_loop,
                                    grads, imagine_by_steps, inputs, loss_of)
from worldmodels.core.unroll import compiled_loop_unroll, loop_unroll
from worldmodels.ops.rssm import reference as rssm_ops
from worldmodels.train.config import ConfigError, upgrade, validate

A, E, B, T = 2, 5, 3, 5
REFERENCE = dict(deter=8, stoch=3, classes=4, hidden=6, cell="block_gru", blocks=2, norm="rms", act="silu",
                 dyn_hidden=8, dyn_norm="all", prior_layers=2)


def make(dtype=torch.float32, seed=0, **overrides) -> wm.RSSM:
    torch.manual_seed(seed)
    return wm.RSSM(A, E, **{**REFERENCE, **overrides}).to(dtype=dtype)


def test_parameters_have_the_references_shapes():
    rssm = make()
    g, d, h = 2, 8, 6
    assert rssm.dyn_x.weight.shape == (d, 3 * h)  # the shared input's share of every block's D/G outputs
    assert rssm.dyn_h.shape == (g, d // g, d // g)
    assert rssm.gates_w.shape == (g, d // g, 3 * d // g)
    assert rssm.dyn_out[0].weight.shape == (d,)  # one norm over the whole layer
    assert len(rssm.prior_head) == 3  # two dense layers and the logits
    compact = make(dyn_hidden=None, dyn_norm="block", prior_layers=1)
    assert compact.dyn_x.weight.shape == (h, 3 * h) and compact.dyn_out[0].weight.shape == (h // g,)
    assert len(compact.prior_head) == 2


def reference_cell(rssm: wm.RSSM, deter, stoch, action):
    """The reference's blockgru step, written as it is there: x = [dynin0(deter), dynin1(stoch),
    dynin2(action)] repeated per block and concatenated after the block's deter slice, then
    BlockLinear(deter, g) -> norm over the flat layer -> act -> BlockLinear(3 deter, g) -> gates."""
    g, d = rssm.blocks, rssm.deter_dim
    action = action / action.abs().clamp(min=1)

    def dense(seq, v):
        linear, norm, act = seq
        return act(norm(linear(v)))

    x = torch.cat([dense(rssm.in_deter, deter), dense(rssm.in_stoch, stoch), dense(rssm.in_action, action)], -1)
    x = torch.cat([deter.unflatten(-1, (g, -1)), x[:, None, :].expand(-1, g, -1)], -1)  # [B, G, D/G + 3H]
    # the BlockLinear kernel [G, D/G + 3H, D/G] of the reference, from our two pieces
    w_x = rssm.dyn_x.weight.T.unflatten(-1, (g, -1)).permute(1, 0, 2)  # [G, 3H, D/G]
    kernel = torch.cat([rssm.dyn_h, w_x], 1)
    u = torch.einsum("bgi,gio->bgo", x, kernel).flatten(-2)
    if rssm.dyn_x.bias is not None:
        u = u + rssm.dyn_x.bias
    norm, act = rssm.dyn_out
    u = act(F.rms_norm(u, (d,), norm.weight, norm.eps)).unflatten(-1, (g, -1))
    gates = torch.einsum("bgi,gio->bgo", u, rssm.gates_w) + rssm.gates_b
    reset, cand, update = gates.chunk(3, -1)
    cand = torch.tanh(torch.sigmoid(reset) * cand)
    update = torch.sigmoid(update - 1)
    return (update * cand + (1 - update) * deter.unflatten(-1, (g, -1))).flatten(-2)


def test_the_cell_is_the_references_blockgru():
    rssm = make(dtype=torch.float64)
    gen = torch.Generator().manual_seed(3)
    deter = torch.randn(4, 8, generator=gen, dtype=torch.float64)
    stoch = torch.randn(4, 12, generator=gen, dtype=torch.float64)
    action = 2 * torch.randn(4, A, generator=gen, dtype=torch.float64)
    spec, w = rssm.op_spec(), rssm.op_weights()
    got = rssm_ops.cell(spec, w, deter, stoch, rssm_ops.action_in(spec, w, action))
    torch.testing.assert_close(got, reference_cell(rssm, deter, stoch, action))
    # per-block norms give another cell: the test tells the two layouts apart
    per_block = rssm_ops.cell(spec.__class__(**{**spec.__dict__, "dyn_norm": "block"}),
                              {**w, "dyn_out.norm_w": w["dyn_out.norm_w"].unflatten(0, (2, -1))[0]},
                              deter, stoch, rssm_ops.action_in(spec, w, action))
    assert not torch.allclose(per_block, got)


def test_the_prior_head_is_two_dense_layers():
    rssm = make(dtype=torch.float64)
    deter = torch.randn(4, 8, dtype=torch.float64)
    first, second, out = rssm.prior_head
    want = out(second(first(deter)))
    noise = rssm.noise((4,))["prior"]
    got = rssm_ops.prior(rssm.op_spec(), rssm.op_weights(), deter, noise)["logits"]
    torch.testing.assert_close(got, rssm_ops.unimix_logits(want.unflatten(-1, (3, 4)), rssm.unimix))


@pytest.mark.parametrize("backend", [b for b in CPU_BACKENDS if b != "triton"])  # triton: refuses it (below)
def test_every_backend_equals_the_loop_of_steps(backend):
    rssm = make()
    post = check_observe_equals_loop(rssm, backend)
    params = list(rssm.parameters())

    actor = wm.Actor(rssm.stoch_dim + rssm.deter_dim, A, hidden=5, layers=1, dist="tanh_normal")
    start = post.select("deter", "stoch")[:, -1]
    img_noise = rssm.noise((B, 4))
    img_noise["policy"] = actor.noise((B, 4))
    want_img = imagine_by_steps(rssm, start, actor, img_noise)
    got_img = rssm.imagine(start, 4, policy=actor, noise=img_noise, backend=backend)
    assert_tds_close(got_img, want_img)
    assert_grads_close(grads(loss_of(got_img), params), grads(loss_of(want_img), params))


def test_the_compiled_step_equals_the_loop_of_steps(monkeypatch):
    """cudnn's compiled step (WORLDMODELS_CUDNN_STEP=compiled, CUDA only) is the same math. Here its
    driver runs on CPU with torch.compile's aot_eager backend (dynamo's trace and AOTAutograd's joint
    graph, without inductor's code): observe with resets and imagination with the Actor in the loop,
    values and gradients, against the loop of steps; a second RSSM call reuses the compiled step."""
    from worldmodels.ops.rssm import cudnn

    torch._dynamo.reset()
    compiled = functools.partial(compiled_loop_unroll, backend="aot_eager")
    monkeypatch.setattr(cudnn, "driver", lambda spec, deter: compiled)
    with torch._dynamo.config.patch(error_on_recompile=False):
        test_every_backend_equals_the_loop_of_steps("cudnn")
        frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        assert frames >= 2  # the observe step and the imagination step, compiled
        test_every_backend_equals_the_loop_of_steps("cudnn")
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames  # nothing compiled again


def test_the_compiled_step_runs_only_where_switched_on_and_able():
    from worldmodels.ops.rssm import cudnn

    spec, deter = make().op_spec(), torch.zeros(2, 8)
    assert cudnn.driver(spec, deter) is loop_unroll  # "eager" unless switched on
    with cudnn.cudnn_step.use("compiled"):
        assert cudnn.driver(spec, deter) is loop_unroll  # CPU tensors: the plain loop
        if torch.cuda.is_available():
            assert cudnn.driver(spec, deter.cuda()) is compiled_loop_unroll
            dense = make(cell="gru", dyn_hidden=None, dyn_norm="block", prior_layers=1, classes=None).op_spec()
            assert cudnn.driver(dense, deter.cuda()) is loop_unroll  # the dense GRU: torch's fused gru_cell
    with pytest.raises(ValueError, match="cudnn step"):
        cudnn.cudnn_step.set("fused")


@pytest.mark.parametrize("backend", ["loop", "cudnn"])
def test_gradcheck_float64(backend):
    rssm = make(dtype=torch.float64, classes=None, norm="layer", act="elu")  # Gaussian: smooth in the inputs
    embed, action, is_first = inputs(batch=1, steps=3, dtype=torch.float64)
    embed, action = embed.detach().requires_grad_(), action.detach().requires_grad_()
    noise = rssm.noise((1, 3))

    def fn(embed, action):
        post, prior = rssm.observe(embed, action, is_first, noise=noise, backend=backend)
        return post["stoch"], prior["mean"], prior["std"]

    assert torch.autograd.gradcheck(fn, (embed, action), eps=1e-6, atol=1e-5)


def test_the_fused_op_names_why_it_does_not_take_the_reference_layout():
    from worldmodels.ops.rssm import fused

    reason = fused.unsupported_reason(make().op_spec())
    assert reason is not None and "dyn_hidden=8" in reason and "prior_layers=2" in reason
    assert fused.unsupported_reason(make(dyn_hidden=None, dyn_norm="block", prior_layers=1).op_spec()) is None


def test_bad_fields_fail_naming_them():
    with pytest.raises(ValueError, match="dyn_norm"):
        make(dyn_norm="group")
    with pytest.raises(ValueError, match="blocks=2 must divide deter=8 and dyn_hidden=7"):
        make(dyn_hidden=7)
    with pytest.raises(ValueError, match="prior_layers must be a positive int"):
        make(prior_layers=0)


def test_run_config_validates_the_fields_and_stored_configs_read_as_the_compact_layout(tmp_path):
    with pytest.raises(ConfigError, match="model.dyn_norm"):
        validate(run_config(tmp_path, "model.dyn_norm=group"))
    with pytest.raises(ConfigError, match=r"model.blocks=4 must divide model.dyn_hidden=6"):
        validate(run_config(tmp_path, "model.dyn_hidden=6"))
    with pytest.raises(ConfigError, match="model.prior_layers"):
        validate(run_config(tmp_path, "model.prior_layers=0"))
    stored = OmegaConf.to_container(run_config(tmp_path), resolve=True)
    for field in ("dyn_hidden", "dyn_norm", "prior_layers"):
        del stored["model"][field]
    model = upgrade(OmegaConf.create(stored), warn=False).model
    assert (model.dyn_hidden, model.dyn_norm, model.prior_layers) == (None, "block", 1)


@pytest.mark.parametrize("preset", ["dmc_proprio", "dmc_vision"])
def test_the_dmc_presets_ask_for_the_references_layout_and_optimiser(tmp_path, preset):
    cfg = run_config(tmp_path, f"+experiment={preset}", "env=cheetah_run", "model=size1m")
    validate(cfg)
    assert (cfg.model.dyn_hidden, cfg.model.dyn_norm, cfg.model.prior_layers) == (cfg.model.deter, "all", 2)
    assert cfg.algo.replay_critic == 0.3
    opt = cfg.algo.optim
    assert (opt.kind, opt.model_lr, opt.actor_lr, opt.critic_lr, opt.eps, opt.warmup) == \
        ("laprop", 4e-5, 4e-5, 4e-5, 1e-20, 1000)
