"""DreamerV3's continuation: what the continue head learns, how imagination discounts, and what an
imagined trajectory weighs.

- `algo.continue_label`: hard (1 - is_terminal) or discounted (gamma x that, the 2024 reference's
  contdisc): the head's probability is then the discount itself, and `dream` multiplies by no gamma.
- `algo.start_continue`: a trajectory's weight starts at the continue head's P at its start state
  (model) or at the replayed step's 1 - is_terminal (data: the 2023 and 2411f7d references).
- `algo.imagined_continue`: the head's probability or its mode (0 or 1) after the start.
Stored configs read as what they ran with; the presets ask for their reference's settings.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from tests._train_config import run_config
from worldmodels.algos import DreamerV3
from worldmodels.train.config import upgrade

OBS, A, B, T = 5, 2, 3, 6


def tiny_agent(tmp_path, *overrides: str) -> DreamerV3:
    cfg = run_config(tmp_path, "algo=dreamer_v3", *overrides)
    torch.manual_seed(0)
    return DreamerV3((OBS,), A, False, cfg.model, cfg.algo, backend="loop")


def batch_with_terminals() -> TensorDict:
    g = torch.Generator().manual_seed(1)
    is_terminal = torch.zeros(B, T, dtype=torch.bool)
    is_terminal[0, 3] = is_terminal[2, 5] = True
    is_first = torch.zeros(B, T, dtype=torch.bool)
    is_first[:, 0] = True
    is_first[0, 4] = True  # the step after a terminal one starts the next episode
    return TensorDict({"obs": torch.randn(B, T, OBS, generator=g), "action": torch.rand(B, T, A, generator=g) * 2 - 1,
                       "reward": torch.randn(B, T, generator=g), "is_first": is_first, "is_terminal": is_terminal},
                      batch_size=[B, T])


@pytest.mark.parametrize("label", ["hard", "discounted"])
def test_the_continue_head_learns_its_label(tmp_path, label):
    agent = tiny_agent(tmp_path, f"algo.continue_label={label}")
    batch = batch_with_terminals()
    _, post, metrics = agent.world_model.loss(batch)
    head = agent.world_model.cont(agent.rssm.features(post))
    target = (~batch["is_terminal"]).float() * (agent.cfg.gamma if label == "discounted" else 1.0)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(head.logits, target)
    torch.testing.assert_close(metrics["wm/cont"], expected)
    # the soft label's loss is not the hard one's: the discounted head is asked for gamma, not 1
    hard = torch.nn.functional.binary_cross_entropy_with_logits(head.logits, (~batch["is_terminal"]).float())
    assert (label == "hard") == bool(torch.isclose(metrics["wm/cont"], hard))


@pytest.mark.parametrize("label", ["hard", "discounted"])
def test_imagination_discounts_by_gamma_once(tmp_path, label):
    """hard: gamma x P(continue) on arriving at each imagined state; discounted: P alone, its head
    having learnt gamma x P."""
    agent = tiny_agent(tmp_path, f"algo.continue_label={label}")
    start = agent.rssm.initial(4)
    torch.manual_seed(2)
    traj, feat, reward, discount = agent.dream(start)
    p = agent.world_model.continues(feat[:, 1:])
    torch.testing.assert_close(discount, p * (agent.cfg.gamma if label == "hard" else 1.0))


@pytest.mark.parametrize("source", ["model", "data"])
def test_a_trajectory_weighs_its_start_states_continuation(tmp_path, source):
    agent = tiny_agent(tmp_path, f"algo.start_continue={source}")
    batch = batch_with_terminals()
    feat = torch.randn(B * T, agent.world_model.feat_dim)
    start = agent._start_continues(batch, feat)
    if source == "data":  # terminal start states weigh 0, every other 1
        assert torch.equal(start, (~batch["is_terminal"]).reshape(-1).to(start.dtype))
    else:
        torch.testing.assert_close(start, agent.world_model.continues(feat))


def test_a_discounted_label_has_no_mode_to_read(tmp_path):
    with pytest.raises(ValueError, match=r"algo\.continue_label=discounted needs algo\.imagined_continue=probability"):
        tiny_agent(tmp_path, "algo.continue_label=discounted", "algo.imagined_continue=mode")


def test_stored_configs_read_as_they_ran_and_presets_ask_for_their_references(tmp_path):
    stored = {"algo": {"name": "dreamer_v3", "imagined_continue": "probability"}}
    algo = upgrade(OmegaConf.create(stored), warn=False).algo
    assert (algo.continue_label, algo.start_continue) == ("hard", "model")
    stored["algo"]["imagined_continue"] = "mode"  # mode read its start from the data before the field existed
    assert upgrade(OmegaConf.create(stored), warn=False).algo.start_continue == "data"
    assert upgrade(OmegaConf.create({"algo": {"name": "dreamer_v3"}}), warn=False).algo.start_continue == "model"
    for preset, label in (("dmc_proprio", "discounted"), ("dmc_vision", "discounted"), ("dmc_proprio_2023", "hard")):
        cfg = run_config(tmp_path, f"+experiment={preset}")
        assert (cfg.algo.continue_label, cfg.algo.start_continue) == (label, "data"), preset
    default = run_config(tmp_path, "algo=dreamer_v3").algo
    assert (default.continue_label, default.start_continue, default.imagined_continue) == ("hard", "model",
                                                                                            "probability")
