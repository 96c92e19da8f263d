"""The two-hot heads' two bin spacings against the reference's formulas, written out here.

danijar/dreamerv3 2411f7d (the code behind the published DMC scores) predicts rewards and values with
`symexp_twohot` (nets.Dist): 255 bins symexp(linspace(-20, 0, 128)) mirrored about 0, targets two-hot
encoded as they are between their two nearest bins, mean E[bin] summed from the middle out
(jaxutils.TwoHotDist). The paper's spacing (`symlog`) encodes symlog(target) over linspace(-20, 20)
and reads symexp(E[bin]): below the expected value once the prediction is spread.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests._train_config import run_config
from worldmodels.algos import DreamerV3
from worldmodels.models.networks import Head, TwoHot, symexp, twohot_bin_values
from worldmodels.train.config import ConfigError, validate


def reference_symexp_bins(n: int) -> list[float]:
    """nets.Dist 'symexp_twohot', in float64."""
    if n % 2:
        half = [math.copysign(math.expm1(abs(x)), x) for x in torch.linspace(-20, 0, (n - 1) // 2 + 1,
                                                                               dtype=torch.float64).tolist()]
        return half + [-v for v in half[:-1][::-1]]
    half = [math.copysign(math.expm1(abs(x)), x) for x in torch.linspace(-20, 0, n // 2, dtype=torch.float64).tolist()]
    return half + [-v for v in half[::-1]]


def two_hot(bins: torch.Tensor, x: float) -> torch.Tensor:
    """The reference's target weights (jaxutils.TwoHotDist.log_prob) for one value, float64."""
    b = bins.double()
    below = int((b <= x).sum()) - 1
    above = len(b) - int((b > x).sum())
    below, above = max(0, min(below, len(b) - 1)), max(0, min(above, len(b) - 1))
    target = torch.zeros(len(b), dtype=torch.float64)
    if below == above:
        target[below] = 1.0
        return target
    to_below, to_above = abs(float(b[below]) - x), abs(float(b[above]) - x)
    target[below] = to_above / (to_below + to_above)
    target[above] = to_below / (to_below + to_above)
    return target


@pytest.mark.parametrize("n", [255, 254, 7])
def test_symexp_bins_are_the_references(n):
    bins = twohot_bin_values(n, "symexp")
    torch.testing.assert_close(bins.double(), torch.tensor(reference_symexp_bins(n), dtype=torch.float64),
                               rtol=1e-6, atol=0)
    if n % 2:
        assert torch.all(bins[1:] > bins[:-1]) and bins[n // 2] == 0
    else:  # the reference's even spacing holds 0 twice (both halves end there)
        assert torch.all(bins[1:] >= bins[:-1]) and bins[n // 2 - 1] == bins[n // 2] == 0


@pytest.mark.parametrize("target", [0.0, 0.37, -2.5, 1.0, 17.25, -480.0, 3.3e4])
def test_symexp_log_prob_is_the_cross_entropy_against_the_references_two_hot(target):
    torch.manual_seed(0)
    bins = twohot_bin_values(255, "symexp")
    logits = torch.randn(255, dtype=torch.float64)
    dist = TwoHot(logits, bins.double(), symlog_space=False)
    want = float((two_hot(bins, target) * torch.log_softmax(logits, -1)).sum())
    assert float(dist.log_prob(torch.tensor(target, dtype=torch.float64))) == pytest.approx(want, rel=1e-9, abs=1e-9)
    # a prediction equal to the encoding reads the target back
    encoded = TwoHot(two_hot(bins, target).clamp_min(1e-300).log(), bins.double(), symlog_space=False)
    assert float(encoded.mean) == pytest.approx(target, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("spacing", ["symexp", "symlog"])
def test_log_prob_at_the_ends_of_the_bins_is_the_references(spacing):
    """Targets inside the outermost intervals (bins K-2..K-1 and 0..1), on the end bins and beyond them
    (the reference puts all the weight on the end bin): the cross-entropy against the reference's
    two-hot, in the bins' own space (symlog(target) for the paper's spacing)."""
    torch.manual_seed(0)
    bins = twohot_bin_values(255, spacing).double()
    logits = torch.randn(255, dtype=torch.float64)
    dist = TwoHot(logits, bins, symlog_space=spacing == "symlog")
    top, below_top = float(bins[-1]), float(bins[-2])
    ends = [0.5 * (top + below_top), 0.25 * top + 0.75 * below_top, top, 2 * top + 3]
    for x in ends + [-v for v in ends]:  # in the bins' space
        target = math.copysign(math.expm1(abs(x)), x) if spacing == "symlog" else x
        want = float((two_hot(bins, x) * torch.log_softmax(logits, -1)).sum())
        got = float(dist.log_prob(torch.tensor(target, dtype=torch.float64)))
        assert got == pytest.approx(want, rel=1e-9, abs=1e-9), (spacing, x)


def test_a_spread_prediction_reads_its_expectation_only_with_symexp_bins():
    """Half the mass on 0, half on 2 (a walker reward the model is unsure of): the reference reads 1;
    symlog bins read symexp(symlog(2) / 2) = 0.73. This is what the presets' `symexp` changes."""
    for spacing, want in (("symexp", 1.0), ("symlog", float(symexp(torch.log1p(torch.tensor(2.0)) / 2)))):
        bins = twohot_bin_values(255, spacing).double()
        symlog_space = spacing == "symlog"
        encode = (lambda v: two_hot(bins, math.log1p(v))) if symlog_space else (lambda v: two_hot(bins, v))
        probs = 0.5 * encode(0.0) + 0.5 * encode(2.0)
        got = float(TwoHot(probs.clamp_min(1e-300).log(), bins, symlog_space).mean)
        assert got == pytest.approx(want, rel=1e-6)
    assert want < 0.75


@pytest.mark.parametrize("spacing", ["symexp", "symlog"])
def test_a_zero_initialised_head_predicts_exactly_zero(spacing):
    head = Head(8, output="twohot", units=16, layers=1, twohot_bins=spacing)
    assert torch.equal(head(torch.randn(5, 8)).mean, torch.zeros(5))


def test_a_symexp_head_learns_large_and_small_targets():
    """Slower than symlog bins for small targets: a tail probability p on a bin of 4.9e8 moves the mean
    by p * 4.9e8, so the head must drive its tails far below 1e-9 (the reference's behaviour too)."""
    torch.manual_seed(0)
    head = Head(4, output="twohot", units=32, layers=1, twohot_bins="symexp")
    target = torch.tensor([-1000.0, -0.5, 3.0, 25_000.0])
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(2000):
        opt.zero_grad()
        (-head(torch.eye(4)).log_prob(target)).mean().backward()
        opt.step()
    torch.testing.assert_close(head(torch.eye(4)).mean, target, rtol=1e-3, atol=0.25)


def test_the_dmc_presets_use_the_references_bins_for_reward_and_critic(tmp_path):
    cfg = run_config(tmp_path, "+experiment=dmc_proprio", "env=walker_walk", "model=size1m")
    validate(cfg)
    assert cfg.algo.twohot_bins == "symexp"
    agent = DreamerV3((24,), 6, False, cfg.model, cfg.algo, backend="loop")
    for head in (agent.world_model.reward, agent.critic, agent.slow_critic):
        assert not head.symlog_space
        torch.testing.assert_close(head.bins, twohot_bin_values(255, "symexp"))
    bad = run_config(tmp_path, "algo.twohot_bins=linear")
    with pytest.raises(ConfigError, match=r"algo.twohot_bins='linear' is not valid; expected one of "
                                          r"\['symexp', 'symlog'\]"):
        validate(bad)
