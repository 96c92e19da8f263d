"""`model.linear_bias`: whether a Linear or conv that a norm follows has a bias.

"auto" drops it there (before a LayerNorm it is redundant, and the 2023 DreamerV3 reference has
none); "always" keeps it everywhere, as the 2024 reference's `nets.Linear` / `Conv2D` (bias True) do
before their RMSNorm, which has no offset. Checked here: which layers get one, that every backend
(the fused kernels too, under Triton's interpreter on CPU) computes the RSSM and the Actor in the
loop with nonzero biases as the loop does, values and gradients, that DreamerV3's init zeroes them,
and that stored configs read as "auto" while the 2024 presets ask for "always"."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

import worldmodels as wm
from tests._train_config import run_config
from tests.models.test_rssm import (A, B, CONFIGS, CPU_BACKENDS, E, assert_grads_close, assert_tds_close,
                                    check_observe_equals_loop, grads, imagine_by_steps, loss_of)
from worldmodels.algos import DreamerV3
from worldmodels.train.config import ConfigError, upgrade, validate


def layers_before_norms(module: nn.Module) -> list[nn.Module]:
    """The Linears and convs of `module` that a norm follows (in module order)."""
    mods = list(module.modules())
    norms = (nn.LayerNorm, nn.RMSNorm)
    out = []
    for i, m in enumerate(mods[:-1]):
        if isinstance(m, (nn.Linear, nn.Conv2d, nn.ConvTranspose2d)):
            after = next((n for n in mods[i + 1:] if not isinstance(n, nn.Sequential)), None)
            if isinstance(after, norms) or type(after).__name__ == "ChannelNorm":
                out.append(m)
    return out


def test_always_gives_a_bias_to_every_layer_a_norm_follows(tmp_path):
    for pixels in (False, True):
        cfg = run_config(tmp_path, "+experiment=dmc_proprio", "env=walker_walk", "model=tiny", "model.norm=rms")
        obs = (3, 64, 64) if pixels else (5,)
        for bias in ("auto", "always"):
            cfg.model.linear_bias = bias
            torch.manual_seed(0)
            agent = DreamerV3(obs, A, False, cfg.model, cfg.algo, backend="loop")
            normed = layers_before_norms(agent)
            assert len(normed) > 8
            assert all((m.bias is not None) == (bias == "always") for m in normed), bias
    rssm = wm.RSSM(A, E, **CONFIGS["v3_2023"], linear_bias="always")  # the joint Linears' one bias each
    assert rssm.in_action.bias is None and rssm.in_stoch.bias is not None
    assert rssm.post_deter.bias is None and rssm.post_embed.bias is not None


def test_dreamerv3_init_zeroes_the_biases(tmp_path):
    cfg = run_config(tmp_path, "+experiment=dmc_proprio", "env=walker_walk", "model=tiny", "model.norm=rms",
                     "model.init=dreamerv3")
    assert cfg.model.linear_bias == "always"
    agent = DreamerV3((5,), A, False, cfg.model, cfg.algo, backend="loop")
    assert all(not m.bias.any() for m in layers_before_norms(agent))


def random_biases_(module: nn.Module) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias") or name == "gates_b":
                p.normal_(0, 0.5)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_every_backend_computes_the_biased_layers_as_the_loop(backend, monkeypatch):
    """Observe with resets, then imagination with the Actor in the loop (its own biased layers),
    values and gradients against the loop of steps; on `triton` both in the fused kernels (the Actor is
    not sent back to the loop reference)."""
    if backend == "triton":
        from worldmodels.ops.rssm.fused import entry

        def refuse(message):
            raise AssertionError(message)

        monkeypatch.setattr(entry, "warn_once", refuse)
    torch.manual_seed(0)
    rssm = wm.RSSM(A, E, **CONFIGS["v3"], linear_bias="always")
    actor = wm.Actor(rssm.stoch_dim + rssm.deter_dim, A, hidden=8, layers=2, dist="bounded_normal", norm="rms",
                     act="silu", linear_bias="always")
    random_biases_(rssm)
    random_biases_(actor)
    post = check_observe_equals_loop(rssm, backend)
    start = post[:, -1].select("deter", "stoch")
    noise = rssm.noise((B, 4))
    noise["policy"] = actor.noise((B, 4))
    params = list(rssm.parameters()) + list(actor.parameters())
    ref = imagine_by_steps(rssm, start, actor, noise)
    out = rssm.imagine(start, 4, policy=actor, noise=noise, backend=backend)
    assert_tds_close(out, ref)
    assert_grads_close(grads(loss_of(out), params), grads(loss_of(ref), params))


def test_stored_configs_read_as_auto_and_bad_values_fail_naming_the_field(tmp_path):
    cfg = run_config(tmp_path)
    stored = OmegaConf.create(OmegaConf.to_container(cfg))
    del stored.model["linear_bias"]
    assert upgrade(stored, warn=False).model.linear_bias == "auto"
    cfg.model.linear_bias = "sometimes"
    with pytest.raises(ConfigError, match="model.linear_bias"):
        validate(cfg)
