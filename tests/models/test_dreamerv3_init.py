"""`model.init=dreamerv3`: the reference's initialisation (danijar/dreamerv3 2411f7d nets.Initializer),
checked against its formula written out here: truncated normal at +-2 std with std 1/sqrt(fan_in), fan_in
over all blocks of the block GRU, zero biases, outscale 0 (two-hot heads) and 0.01 (actor)."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from tests._train_config import run_config
from worldmodels.algos import DreamerV3
from worldmodels.train.config import ConfigError, upgrade, validate

OBS, A = 24, 6


def agent(tmp_path, init: str, seed: int = 0) -> DreamerV3:
    cfg = run_config(tmp_path, "+experiment=dmc_proprio", "env=walker_walk", "model=size1m", f"model.init={init}")
    validate(cfg)
    torch.manual_seed(seed)
    return DreamerV3((OBS,), A, False, cfg.model, cfg.algo, backend="loop")


def check_trunc_normal(weight: torch.Tensor, fan_in: int, name: str) -> None:
    std = 1 / math.sqrt(fan_in)
    w = weight.detach().flatten().double()
    assert w.abs().max() <= 2 * 1.1368 * std * (1 + 1e-6), name
    assert abs(w.std().item() / std - 1) < 0.1 + 3 / math.sqrt(w.numel()), (name, w.std().item(), std)


def test_weights_follow_the_references_initializer(tmp_path):
    net = agent(tmp_path, "dreamerv3")
    rssm = net.world_model.rssm
    d, g, h, dyn = rssm.deter_dim, rssm.blocks, rssm.hidden, rssm.dyn_hidden
    assert (d, g, h, dyn) == (512, 8, 64, 512)  # size1m in the reference layout
    check_trunc_normal(rssm.dyn_h, d + g * 3 * h, "dyn_h")  # BlockLinear(deter) over [deter block | x] x g
    check_trunc_normal(rssm.dyn_x.weight, d + g * 3 * h, "dyn_x")
    check_trunc_normal(rssm.gates_w, dyn, "gates_w")  # BlockLinear(3 deter) over the hidden layer
    assert not rssm.gates_b.any()
    checked = 0
    for name, m in net.named_modules():
        if name.startswith("slow_critic") or not isinstance(m, nn.Linear) or m is rssm.dyn_x:
            continue
        if m.bias is not None:
            assert not m.bias.any(), name
        if m is net.critic.net[-1] or m is net.world_model.reward.net[-1]:
            assert not m.weight.any(), name  # outscale 0
        elif m is net.actor.net[-1]:
            check_trunc_normal(m.weight / 0.01, m.in_features, name)  # outscale 0.01, mean and std alike
        elif m in (rssm.post_deter, rssm.post_embed):  # one Linear over [deter, embed] there (rssm.py obs0)
            check_trunc_normal(m.weight, rssm.post_deter.in_features + rssm.post_embed.in_features, name)
        else:
            check_trunc_normal(m.weight, m.in_features, name)
        checked += 1
    assert checked > 10
    for p, slow in zip(net.critic.parameters(), net.slow_critic.parameters()):
        assert torch.equal(p, slow)  # the slow critic starts as the critic


def test_torch_init_is_unchanged_and_stored_configs_read_as_it(tmp_path):
    torch_init = agent(tmp_path, "torch")
    assert torch_init.world_model.rssm.dyn_h.std() > 2 * agent(tmp_path, "dreamerv3").world_model.rssm.dyn_h.std()
    stored = OmegaConf.to_container(run_config(tmp_path), resolve=True)
    del stored["model"]["init"]
    assert upgrade(OmegaConf.create(stored), warn=False).model.init == "torch"


def test_bad_init_fails_naming_it(tmp_path):
    with pytest.raises(ConfigError, match="model.init"):
        validate(run_config(tmp_path, "model.init=xavier"))
    with pytest.raises(ConfigError, match="model.init=dreamerv3 is DreamerV3's"):
        validate(run_config(tmp_path, "algo=dreamer_v1", "model.init=dreamerv3"))


def test_the_2023_preset_builds_its_wider_encoder_and_full_scale_actor_output(tmp_path):
    """`+experiment=dmc_proprio_2023`: encoder and decoder MLPs 5 x 1024 beside 2 x 512 heads
    (`model.encoder_units`), and the actor's output at outscale 1 (`model.actor_outscale`), where the
    current preset's is 0.01."""
    cfg = run_config(tmp_path, "+experiment=dmc_proprio_2023", "env=walker_walk")
    validate(cfg)
    torch.manual_seed(0)
    net = DreamerV3((OBS,), A, False, cfg.model, cfg.algo, backend="loop")
    encoder = [m for m in net.world_model.encoder.modules() if isinstance(m, nn.Linear)]
    decoder = [m for m in net.world_model.decoder.modules() if isinstance(m, nn.Linear)]
    assert [m.out_features for m in encoder] == [1024] * 5
    assert [m.out_features for m in decoder[:-1]] == [1024] * 5 and decoder[-1].out_features == OBS
    assert [m.out_features for m in net.critic.modules() if isinstance(m, nn.Linear)][:2] == [512, 512]
    full = net.actor.net[-1].weight  # the 2023 fan: the mean of fan_in and fan_out
    check_trunc_normal(full, (full.shape[0] + full.shape[1]) / 2, "actor output at outscale 1, fan_avg")
    first = encoder[0].weight
    check_trunc_normal(first, (first.shape[0] + first.shape[1]) / 2, "encoder input layer, fan_avg")
    rssm = net.world_model.rssm  # img_in over [stoch, action] and obs_out over [deter, embed] are one Linear
    for parts in [(rssm.in_stoch, rssm.in_action), (rssm.post_deter, rssm.post_embed)]:  # there, each split here
        fan = (sum(m.in_features for m in parts) + parts[0].out_features) / 2
        for m in parts:
            check_trunc_normal(m.weight, fan, f"{m.in_features} of the {fan * 2 - m.out_features:.0f} inputs, fan_avg")
    current = agent(tmp_path, "dreamerv3").actor.net[-1].weight
    assert current.std() < 0.02 * full.std() * math.sqrt((full.shape[0] + full.shape[1]) / 2 / current.shape[1])
