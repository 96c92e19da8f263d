"""docs/python-api.md and the README's imagination example run as written, and what they promise holds.

The page's python blocks run in order (those above "## Load a trained run" on their own; the ones
below it on a tiny trained run at the path the page names), so the page cannot rot. What they
return is then checked against expectations of this file's own: shapes from the arguments, the
feature size from deter + stoch x classes, the horizon from the actions, and a head's values
from its output layer.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

import worldmodels as wm
from tests._train_config import run_config
from worldmodels.models.networks import Head
from worldmodels.train import Trainer

PAGE = Path(__file__).resolve().parents[2] / "docs" / "python-api.md"
README = PAGE.parents[1] / "README.md"
LOAD_HEADING = "## Load a trained run"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def page_blocks() -> tuple[list[str], list[str]]:
    """(the from-scratch blocks, the blocks that load a run), each padded with blank lines so a
    traceback names its line on the page."""
    text = PAGE.read_text()
    split = text.index(LOAD_HEADING)
    blocks = [("\n" * text.count("\n", 0, m.start(1)) + m.group(1), m.start()) for m in BLOCK.finditer(text)]
    scratch = [code for code, at in blocks if at < split]
    loading = [code for code, at in blocks if at > split]
    assert scratch and loading, f"{PAGE} must hold python blocks above and below {LOAD_HEADING!r}"
    return scratch, loading


def run_blocks(blocks: list[str], namespace: dict) -> dict:
    for code in blocks:
        exec(compile(code, str(PAGE), "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def page():
    """The namespace the page's from-scratch blocks leave behind."""
    torch.manual_seed(0)
    return run_blocks(page_blocks()[0], {})


def test_the_page_builds_observes_trains_imagines_and_decodes(page):
    rssm, B, T, H = page["rssm"], 4, 10, 15
    assert rssm.feature_dim == 8 * 8 + 128  # stoch x classes + deter
    assert page["feat"].shape == (B, T, 192) and page["post"]["logits"].shape == (B, T, 8, 8)
    assert page["post"].batch_size == page["prior"].batch_size == (B, T)
    assert page["loss"].dim() == 0 and torch.isfinite(page["loss"])
    for dream in (page["dream"], page["open_loop"]):
        assert dream.batch_size == (B, H) and dream["deter"].shape == (B, H, 128)
    assert page["dream"]["action"].shape == (B, H, 1)
    assert torch.equal(page["open_loop"]["action"], page["plan"])
    assert page["predicted_obs"].shape == (B, H, 3)
    assert page["predicted_reward"].shape == (B, H) and page["predicted_return"].shape == (B,)
    assert torch.allclose(page["predicted_return"], page["reward_head"](page["dream_feat"]).mean.sum(-1))


@pytest.mark.parametrize("classes", [None, 5])
def test_feature_dim_is_the_size_of_the_features(classes):
    rssm = wm.RSSM(2, 6, deter=12, stoch=4, hidden=8, classes=classes)
    assert rssm.feature_dim == 4 * (classes or 1) + 12
    assert rssm.features(rssm.initial(3)).shape == (3, rssm.feature_dim)
    actor = wm.Actor(rssm.feature_dim, 2, hidden=8, layers=1)
    assert rssm.imagine(rssm.initial(3), 2, policy=actor)["action"].shape == (3, 2, 2)


def test_imagine_takes_its_horizon_from_the_actions():
    torch.manual_seed(0)
    rssm = wm.RSSM(2, 6, deter=12, stoch=4, hidden=8, classes=3)
    start, actions = rssm.initial(3), torch.rand(3, 5, 2) * 2 - 1
    noise = rssm.noise((3, 5))
    assert (rssm.imagine(start, actions=actions, noise=noise) == rssm.imagine(start, 5, None, actions, noise)).all()
    with pytest.raises(ValueError, match="horizon"):  # a policy has no length of its own
        rssm.imagine(start, policy=wm.Actor(rssm.feature_dim, 2, hidden=8, layers=1))
    with pytest.raises(ValueError, match=r"actions must have shape \[3, 4, 2\]"):  # given and not their length
        rssm.imagine(start, 4, actions=actions)
    with pytest.raises(ValueError, match=r"actions must have shape \[\*, \*, 2\]"):
        rssm.imagine(start, actions=actions[..., :1])
    with pytest.raises(ValueError, match="actions must hold at least one step"):
        rssm.imagine(start, actions=actions[:, :0])


def _head_with_bias(output: str, bias: torch.Tensor) -> Head:
    """A head whose output layer ignores the features and outputs `bias`."""
    head = Head(6, output=output, units=8, layers=1)
    with torch.no_grad():
        head.net[-1].weight.zero_()
        head.net[-1].bias.copy_(bias)
    return head


def test_head_predict_reads_the_values_its_output_layer_says():
    feat = torch.randn(2, 3, 6)
    twohot_bias = torch.full((255,), -1e4)
    twohot_bias[[130, 131]] = 0.0  # half the mass on each of two bins, symlog-spaced over +-20
    bins = [-20 + 40 * k / 254 for k in (130, 131)]
    symexp = lambda x: math.copysign(math.expm1(abs(x)), x)  # noqa: E731
    cases = {"twohot": (twohot_bias, symexp(sum(bins) / 2)), "normal": (torch.tensor([2.5]), 2.5),
             "binary": (torch.tensor([0.7]), 1 / (1 + math.exp(-0.7)))}
    for output, (bias, want) in cases.items():
        got = _head_with_bias(output, bias).predict(feat)
        assert got.shape == (2, 3)
        torch.testing.assert_close(got, torch.full((2, 3), want), msg=output)
    head = Head(6, output="twohot", units=8, layers=1)
    torch.nn.init.normal_(head.net[-1].weight)
    assert torch.equal(head.predict(feat), head(feat).mean)  # the values the training code reads
    with pytest.raises(ValueError, match=r"features must be \[\.\.\., 6\]"):
        head.predict(torch.randn(2, 5))


def test_the_page_and_the_readme_load_a_trained_run(page, tmp_path, monkeypatch):
    Trainer(run_config(tmp_path, "steps=64", f"run_dir={tmp_path / 'runs' / 'pendulum'}")).train()
    monkeypatch.chdir(tmp_path)
    readme = README.read_text()
    example = next(m.group(1) for m in BLOCK.finditer(readme) if "wm.load(" in m.group(1))
    example = re.sub(r'wm\.load\("[^"]*"\)', 'wm.load("runs/pendulum")', example)  # the README names a run by its time
    shown = {}
    exec(compile(example, str(README), "exec"), shown)
    assert shown["dream"].batch_size == (1, 15) and shown["reward"].shape == (1, 15)
    loaded = run_blocks(page_blocks()[1], dict(page))
    model = loaded["agent"].world_model
    assert loaded["dream"].batch_size == (1, 15) and loaded["dream"]["action"].shape == (1, 15, 1)
    assert loaded["predicted_obs"].shape == (1, 15, 3)
    torch.testing.assert_close(loaded["predicted_reward"], model.reward(loaded["dream_feat"]).mean)
