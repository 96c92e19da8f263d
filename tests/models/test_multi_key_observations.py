"""Observations of several keys (danijar's multi-key encoder): vectors through one MLP, images
through one CNN, every key reconstructed; a single observation keeps the plain tensor path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from worldmodels.algos import WorldModel
from worldmodels.models.networks import (
    DictDecoder,
    DictEncoder,
    PixelDecoder,
    PixelEncoder,
    VectorDecoder,
    VectorEncoder,
    make_decoder,
    make_encoder,
    symlog,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MODEL = OmegaConf.load(CONFIGS / "model" / "tiny.yaml")
ALGO = OmegaConf.load(CONFIGS / "algo" / "dreamer_v3.yaml")
SHAPES = {"position": (2,), "camera": (3, 64, 64), "velocity": (4,), "depth": (1, 64, 64)}


def observations(*batch) -> TensorDict:
    return TensorDict({
        "position": torch.randn(*batch, 2), "velocity": 10 * torch.randn(*batch, 4),
        "camera": torch.randint(0, 256, (*batch, 3, 64, 64), dtype=torch.uint8),
        "depth": torch.randint(0, 256, (*batch, 1, 64, 64), dtype=torch.uint8),
    }, batch_size=batch)


def test_one_observation_keeps_the_plain_modules():
    assert type(make_encoder((3,), MODEL)) is VectorEncoder and type(make_decoder((3,), 8, MODEL)) is VectorDecoder
    encoder, decoder = make_encoder((3, 64, 64), MODEL), make_decoder((3, 64, 64), 8, MODEL)
    assert type(encoder) is PixelEncoder and type(decoder) is PixelDecoder
    assert encoder.net[0].weight.shape == (MODEL.depth, 3, 4, 4)  # same parameters as before channels existed
    assert decoder(torch.randn(5, 8)).shape == (5, 3, 64, 64)
    gray = make_encoder((1, 64, 64), MODEL)
    assert gray(torch.zeros(2, 1, 64, 64, dtype=torch.uint8)).shape == (2, encoder.embed_dim)


def test_dict_encoder_is_one_mlp_over_vectors_and_one_cnn_over_images():
    encoder = make_encoder(SHAPES, MODEL)
    assert type(encoder) is DictEncoder
    assert encoder.vector_keys == ["position", "velocity"] and encoder.image_keys == ["camera", "depth"]
    obs = observations(3, 5)
    embed = encoder(obs)
    assert embed.shape == (3, 5, encoder.embed_dim) == (3, 5, encoder.vector.embed_dim + encoder.image.embed_dim)
    vector = encoder.vector.net(symlog(torch.cat([obs["position"], obs["velocity"]], -1)))
    image = encoder.image(torch.cat([obs["camera"], obs["depth"]], -3))
    torch.testing.assert_close(embed, torch.cat([vector, image], -1))


def test_dict_decoder_reconstructs_every_key():
    decoder = make_decoder(SHAPES, 16, MODEL)
    assert type(decoder) is DictDecoder
    feat = torch.randn(3, 5, 16)
    pred = decoder(feat)
    assert {k: tuple(pred[k].shape[2:]) for k in pred.keys(True, True)} == SHAPES
    obs = observations(3, 5)
    logp = decoder.log_prob(feat, obs)
    assert logp.shape == (3, 5)
    for key in SHAPES:  # every key is in the likelihood
        changed = obs.clone()
        changed[key] = changed[key] + 1
        assert not torch.allclose(decoder.log_prob(feat, changed), logp), key


def test_bad_observation_shape_names_the_key():
    with pytest.raises(ValueError, match=r"obs_shape\['grid'\]=\(5, 5\)"):
        make_encoder({"grid": (5, 5), "position": (2,)}, MODEL)


def test_world_model_trains_on_dict_observations():
    model = WorldModel(SHAPES, 2, MODEL, ALGO)
    batch = TensorDict({"obs": observations(2, 6), "action": torch.randn(2, 6, 2), "reward": torch.randn(2, 6),
                        "is_first": torch.zeros(2, 6, dtype=torch.bool),
                        "is_terminal": torch.zeros(2, 6, dtype=torch.bool)}, batch_size=[2, 6])
    batch["is_first"][:, 0] = True
    loss, post, _ = model.loss(batch)
    loss.backward()
    assert post.shape == (2, 6) and torch.isfinite(loss)
    for part in (model.encoder.vector, model.encoder.image, model.decoder.vector, model.decoder.image):
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in part.parameters() if p.requires_grad)
