"""What PlaNet's and Dreamer V1's code do to their inputs and losses, as model / algo fields:
`model.image_bits` (PlaNet's 5-bit images with noise in each bin, planet/tools/preprocess.py),
`model.cnn_act` (Dreamer V1's relu convs beside elu dense layers, dreamer.py `cnn_act`),
`model.act=relu` (PlaNet's `activation`) and `algo.reward_scale` (PlaNet's reward loss x 10)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from torch import nn

from tests._train_config import run_config
from worldmodels.algos import WorldModel
from worldmodels.algos.world_model import kl_terms
from worldmodels.models.networks import PixelEncoder, make_decoder, make_encoder, pixels_to_float
from worldmodels.train.config import ConfigError, validate

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def model_cfg(**fields):
    cfg = OmegaConf.load(CONFIGS / "model" / "tiny.yaml")
    cfg.update(fields)
    return cfg


def test_image_bits_keep_the_top_bits_and_add_noise_within_the_bin():
    """floor(p / 2**(8 - bits)) / 2**bits + U(0, 1 / 2**bits) - 0.5, written out (preprocess.py)."""
    pixels = torch.arange(256, dtype=torch.uint8).repeat(40)  # every value, many noise draws
    torch.manual_seed(0)
    got = pixels_to_float(pixels, 5)
    low = torch.floor(pixels.double() / 8) / 32 - 0.5
    offset = got.double() - low
    assert (offset >= 0).all() and (offset < 1 / 32 + 1e-6).all()
    assert abs(offset.mean().item() - 1 / 64) < 1e-3 and offset.std().item() > 0.008  # uniform in the bin
    assert torch.equal(pixels_to_float(pixels), pixels.float() / 255 - 0.5)  # no bits: as before
    assert pixels_to_float(got, 5) is got  # a float image is taken as converted already
    with pytest.raises(ValueError, match="image_bits=9: expected None or an integer in 1..8"):
        PixelEncoder(depth=2, norm="none", act="elu", image_bits=9)


def test_the_loss_converts_images_once_so_encoder_and_decoder_see_the_same_noise(monkeypatch):
    """As PlaNet's data pipeline: one preprocessed image is the encoder's input and the decoder's target."""
    model = model_cfg(image_bits=5)
    algo = OmegaConf.load(CONFIGS / "algo" / "dreamer_v3.yaml")
    world = WorldModel((3, 64, 64), 2, model, algo, backend="loop")
    seen = {}
    encode, decode = world.encoder.net.forward, world.decoder.log_prob

    def encoder_input(x):
        seen["encoder"] = x.clone()
        return encode(x)

    def decoder_target(features, target):
        seen["target"] = target
        return decode(features, target)

    monkeypatch.setattr(world.encoder.net, "forward", encoder_input)
    monkeypatch.setattr(world.decoder, "log_prob", decoder_target)
    B, T = 2, 3
    flags = torch.zeros(B, T, dtype=torch.bool)
    batch = TensorDict({"obs": torch.randint(0, 256, (B, T, 3, 64, 64), dtype=torch.uint8),
                        "action": torch.rand(B, T, 2), "reward": torch.randn(B, T), "is_first": flags,
                        "is_terminal": flags}, batch_size=[B, T])
    world.loss(batch)
    target = seen["target"]
    assert target.dtype == torch.float32 and not torch.equal(target, pixels_to_float(batch["obs"]))
    # the encoder read the same noisy image (channels-last, flattened over B x T)
    assert torch.allclose(seen["encoder"], target.reshape(-1, 3, 64, 64))
    offset = (target + 0.5) * 32 - torch.floor(batch["obs"].float() / 8)  # in bins: inside each value's own
    assert (offset >= 0).all() and (offset <= 1).all()


def test_acting_reads_images_with_the_same_preprocessing():
    """PlaNet's agent preprocesses each observation too (mpc_agent.py): the encoder applies the bits to uint8."""
    encoder = make_encoder((3, 64, 64), model_cfg(image_bits=5))
    pixels = torch.randint(0, 256, (4, 3, 64, 64), dtype=torch.uint8)
    torch.manual_seed(3)
    got = encoder(pixels)
    torch.manual_seed(3)
    assert torch.equal(got, encoder(pixels_to_float(pixels, 5)))


def test_cnn_act_sets_the_convs_activation_and_act_the_rest():
    cfg = model_cfg(act="elu", cnn_act="relu")
    shapes = {"camera": (3, 64, 64), "position": (2,)}
    for net in (make_encoder(shapes, cfg), make_decoder(shapes, 8, cfg)):
        acts = {type(m) for m in net.image.modules() if isinstance(m, (nn.ELU, nn.SiLU, nn.ReLU))}
        assert acts == {nn.ReLU}
        assert {type(m) for m in net.vector.modules() if isinstance(m, (nn.ELU, nn.SiLU, nn.ReLU))} == {nn.ELU}
    plain = make_encoder((3, 64, 64), model_cfg(act="elu", cnn_act=None))  # null: the convs use act
    assert {type(m) for m in plain.modules() if isinstance(m, (nn.ELU, nn.ReLU))} == {nn.ELU}


def test_reward_scale_weighs_the_reward_loss(tmp_path):
    """loss = mean(rec + reward_scale * reward NLL + KL terms), against the formula written out."""
    cfg = run_config(tmp_path, "algo=planet", "model=tiny", "model.classes=null", "model.cell=gru", "model.blocks=1",
                     "model.norm=none", "model.act=relu", "algo.reward_scale=10")
    torch.manual_seed(0)
    world = WorldModel((3,), 1, cfg.model, cfg.algo, backend="loop")
    B, T = 2, 4
    flags = torch.zeros(B, T, dtype=torch.bool)
    batch = TensorDict({"obs": torch.randn(B, T, 3), "action": torch.rand(B, T, 1) * 2 - 1,
                        "reward": torch.randn(B, T), "is_first": flags, "is_terminal": flags}, batch_size=[B, T])
    torch.manual_seed(1)
    loss, _, _ = world.loss(batch)
    torch.manual_seed(1)
    post, prior = world.rssm.observe(world.encoder(batch["obs"]), batch["action"], batch["is_first"])
    feat = world.rssm.features(post)
    dyn, rep = kl_terms(post, prior)
    free = float(cfg.algo.kl.free)
    want = (-world.decoder.log_prob(feat, batch["obs"]) - 10 * world.reward(feat).log_prob(batch["reward"])
            + dyn.clamp(min=free) + rep.clamp(min=free)).mean()
    assert torch.allclose(loss, want, rtol=1e-5)
    assert any(isinstance(m, nn.ReLU) for m in world.reward.modules())


@pytest.mark.parametrize("override,message", [
    ("model.image_bits=9", r"model\.image_bits=9 must be an int in 1\.\.8 or null"),
    ("model.image_bits=0", r"model\.image_bits=0 must be an int >= 1"),
    ("model.cnn_act=tanh", r"model\.cnn_act='tanh' is not valid; expected one of \['elu', 'relu', 'silu'\]"),
    ("algo.reward_scale=-1", r"algo\.reward_scale=-1 must be a number in \(0, inf\)"),
])
def test_bad_fields_are_named(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        validate(run_config(tmp_path, override))


def test_configs_stored_before_the_fields_read_as_what_they_trained_with():
    from worldmodels.train import config

    stored = OmegaConf.create({"model": {"act": "elu"}, "algo": {"name": "planet"}, "train_ratio": 512,
                               "train_ratio_unit": "agent_step"})
    config.upgrade(stored, warn=False)
    assert (stored.model.cnn_act, stored.model.image_bits, stored.algo.reward_scale) == (None, None, 1.0)
