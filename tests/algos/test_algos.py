"""Each algorithm trains a few updates through the real trainer on state and pixel envs."""

from __future__ import annotations

import json
import math

import pytest
import torch
from tensordict import TensorDict

from tests._messages import labelled
from tests._train_config import run_config
from worldmodels.algos import lambda_returns
from worldmodels.algos.agent import trajectory_weights
from worldmodels.models.networks import Head, symexp, symlog
from worldmodels.train import Trainer
from worldmodels.train.trainer import NonFiniteLossError

GAUSSIAN_TINY = ["model.classes=null", "model.cell=gru", "model.blocks=1", "model.norm=none", "model.act=elu"]
ALGO_OVERRIDES = {
    "dreamer_v3": [],
    "dreamer_v1": GAUSSIAN_TINY,
    "planet": [*GAUSSIAN_TINY, "algo.cem.horizon=4", "algo.cem.candidates=16", "algo.cem.top=4",
               "algo.cem.iterations=2"],
}
PIXEL_ENV = "env=pendulum"  # gymnasium rgb_array frames (pygame), resized to 64x64: cheaper than MuJoCo EGL


def train_briefly(tmp_path, algo: str, *env: str) -> Trainer:
    """A short run through the real trainer. What it must have done: the updates that train_ratio asks
    for (8 replayed steps per agent step after the prefill, 16 per update), each stepping every parameter
    of each of the algorithm's optimisers once, and a world model whose loss on a replayed batch is lower
    with the trained weights than with the initial ones (the same batch and noise)."""
    import copy

    cfg = run_config(tmp_path, f"algo={algo}", "model=tiny", *ALGO_OVERRIDES[algo], *env, "steps=96", "prefill=48",
                     "log_every=64")
    trainer = Trainer(cfg)
    initial = copy.deepcopy(trainer.agent.world_model)
    trainer.train()
    agent_steps = (cfg.steps - cfg.prefill) // cfg.env.action_repeat
    assert trainer.counters["updates"] == cfg.train_ratio * agent_steps // (cfg.batch_size * cfg.seq_len) > 1
    optimisers = trainer.agent.optimizers()
    assert set(optimisers) == ({"model"} if algo == "planet" else
                               {"model", "actor", "critic" if algo == "dreamer_v3" else "value"})
    for name, opt in optimisers.items():
        params = [p for group in opt.opt.param_groups for p in group["params"]]
        steps = [float(opt.opt.state[p]["step"]) if p in opt.opt.state else 0.0 for p in params]
        assert steps == [trainer.counters["updates"]] * len(params), name
    torch.manual_seed(0)
    batch = trainer.replay.sample()
    with torch.no_grad():
        losses = []
        for world_model in (initial, trainer.agent.world_model):
            torch.manual_seed(1)
            losses.append(float(world_model.loss(batch)[0]))
    assert losses[1] < losses[0], losses
    lines = (trainer.run_dir / "metrics.jsonl").read_text().splitlines()
    assert any('"eval/return"' in line for line in lines)
    logged = [json.loads(line) for line in lines if '"wm/loss"' in line]  # update metrics, read at log time
    assert logged and all(math.isfinite(v) for v in logged[-1].values() if isinstance(v, float))
    assert isinstance(logged[-1]["wm/grad_norm"], float)
    return trainer


@pytest.mark.parametrize("algo", sorted(ALGO_OVERRIDES))
def test_algo_trains_on_state(tmp_path, algo):
    trainer = train_briefly(tmp_path, algo)
    assert trainer.agent.world_model.rssm.classes == (4 if algo == "dreamer_v3" else None)


@pytest.mark.parametrize("algo", sorted(ALGO_OVERRIDES))
def test_algo_trains_on_pixels(tmp_path, algo):
    pytest.importorskip("pygame", reason="pixel Pendulum renders with pygame (the test extras install it)")
    trainer = train_briefly(tmp_path, algo, PIXEL_ENV, "env.pixels=true", "env.time_limit=20")
    assert trainer.info["obs_shape"] == (3, 64, 64)
    gifs = list((trainer.run_dir / "media").glob("openloop-*.gif"))
    assert gifs, "pixel runs save open-loop prediction videos"


def test_dreamer_v3_on_discrete_atari(tmp_path):
    pytest.importorskip("ale_py", reason="ale-py is not installed")
    trainer = train_briefly(tmp_path, "dreamer_v3", "env=pong", "env.time_limit=30")
    assert trainer.agent.discrete and trainer.agent.actor.dist_type == "onehot"


def test_planet_rejects_discrete_actions(tmp_path):
    pytest.importorskip("ale_py", reason="ale-py is not installed")
    with pytest.raises(ValueError, match="planet"):
        Trainer(run_config(tmp_path, "algo=planet", "model=tiny", *GAUSSIAN_TINY, "env=pong"))


def test_lambda_returns_match_the_recursion():
    """R_h = r_h + d_h ((1 - lam) v_{h+1} + lam R_{h+1}), bootstrapped from v_H (the value after the
    last step, not the one before it): the numbers worked out by hand, for lam 0.5, 1 (the discounted
    sum of rewards plus the discounted v_H), 0 (one-step TD) and a per-step lam."""
    reward = torch.tensor([[1.0, 2.0, 3.0]])
    discount = torch.tensor([[0.9, 0.8, 0.5]])  # nonzero at the last step: the bootstrap counts
    value = torch.tensor([[10.0, 20.0, 30.0, 40.0]])
    # lam 0.5: R2 = 3 + 0.5 * 40 = 23; R1 = 2 + 0.8 * (15 + 11.5) = 23.2; R0 = 1 + 0.9 * (10 + 11.6) = 20.44
    torch.testing.assert_close(lambda_returns(reward, discount, value, 0.5), torch.tensor([[20.44, 23.2, 23.0]]))
    # lam 1: R0 = 1 + 0.9 * (2 + 0.8 * (3 + 0.5 * 40)) = 19.36
    torch.testing.assert_close(lambda_returns(reward, discount, value, 1.0), torch.tensor([[19.36, 20.4, 23.0]]))
    # lam 0: r_h + d_h v_{h+1}
    torch.testing.assert_close(lambda_returns(reward, discount, value, 0.0), torch.tensor([[19.0, 26.0, 23.0]]))
    # lam per step [0, 1, 1]: R0 = 1 + 0.9 * 20 = 19 however R1 comes out
    lam = torch.tensor([[0.0, 1.0, 1.0]])
    torch.testing.assert_close(lambda_returns(reward, discount, value, lam), torch.tensor([[19.0, 20.4, 23.0]]))
    assert torch.allclose(trajectory_weights(discount), torch.tensor([[1.0, 0.9, 0.72]]))
    # a start state's own weight (P(continue) there, or 0 at a terminal one) scales its whole trajectory
    start = torch.tensor([0.5])
    assert torch.allclose(trajectory_weights(discount, start), torch.tensor([[0.5, 0.45, 0.36]]))


def test_two_hot_head_learns_large_and_small_targets():
    torch.manual_seed(0)
    head = Head(4, output="twohot", units=32, layers=1)
    x = torch.eye(4)
    target = torch.tensor([-1000.0, -0.5, 3.0, 25_000.0])
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(300):
        opt.zero_grad()
        (-head(x).log_prob(target)).mean().backward()
        opt.step()
    assert torch.allclose(symlog(head(x).mean), symlog(target), atol=0.05)
    assert torch.allclose(symexp(symlog(target)), target)


@pytest.mark.parametrize("precision, dtype", [("tf32", None), ("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_precision_sets_the_matmul_precision_and_half_precisions_train_under_autocast(tmp_path, precision, dtype):
    """precision=tf32 / bf16 / fp16 sets torch's float32 matmul precision to "high" (cuBLAS TF32; the
    recurrent core follows it); bf16 and fp16 also run every update under autocast in their dtype, and
    fp16 scales every optimiser's loss, the scale kept in the checkpoint."""
    cfg = run_config(tmp_path, "algo=dreamer_v3", "model=tiny", f"precision={precision}", "steps=64", "prefill=48",
                     "log_every=56", "algo.update_order=world_model_first")
    trainer = Trainer(cfg)
    assert torch.get_float32_matmul_precision() == "high"
    seen, cached = [], []
    update = trainer.update

    def spy(batch):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        cached.append(torch.is_autocast_cache_enabled())
        return update(batch)
    trainer.update = spy
    trainer.train()
    assert seen and all(s == dtype for s in seen)
    assert not any(cached) or dtype is None  # each use of a weight casts: test_run_precision.py says why
    lines = (trainer.run_dir / "metrics.jsonl").read_text().splitlines()
    losses = [json.loads(line)["wm/loss"] for line in lines if '"wm/loss"' in line]
    assert losses and all(math.isfinite(v) for v in losses)
    scales = {name: opt.loss_scale for name, opt in trainer.agent.optimizers().items()}
    if precision != "fp16":
        assert all(s is None for s in scales.values())
        return
    assert all(s.good.item() == len(seen) and s.scale.item() == 1e4 for s in scales.values())  # no overflow here
    logged = [json.loads(line) for line in lines if '"wm/loss"' in line][-1]
    assert {name: logged.get(f"{name}/loss_scale") for name in scales} == {name: 1e4 for name in scales}
    inf = torch.tensor(float("inf"))
    trainer.check_finite({"wm/loss": torch.tensor(1.0), "wm/grad_norm": inf})  # an overflow skips that update
    with pytest.raises(NonFiniteLossError, match="wm/loss=inf"):
        trainer.check_finite({"wm/loss": inf, "wm/grad_norm": inf})
    saved = torch.load(max((trainer.run_dir / "checkpoints").glob("*/state.pt*")), weights_only=False)
    assert {name: opt["loss_scale"]["good"].item() for name, opt in saved["optimizers"].items()} == \
        {name: len(seen) for name in scales}


@pytest.mark.parametrize("algo, squares", [("dreamer_v3", 1.0), ("dreamer_v1", 0.5), ("planet", 0.5)])
def test_reconstruction_loss_is_the_references_multiple_of_the_squared_error(algo, squares):
    """DreamerV3's reference scores reconstruction as the sum of squares (jaxutils.MSEDist), PlaNet's
    and V1's code as a unit-variance Gaussian's negative log-likelihood: half of it. `wm/rec` is
    that multiple of the decoder's squared error on symlog targets, summed over features."""
    from tests.train.test_graphed_update import make_agent

    wm = make_agent(algo, device="cpu").world_model
    B, T = 3, 4
    flags = torch.zeros(B, T, dtype=torch.bool)
    batch = TensorDict({"obs": 3 * torch.randn(B, T, 5), "action": torch.randn(B, T, 2), "reward": torch.randn(B, T),
                        "is_first": flags, "is_terminal": flags}, batch_size=[B, T])
    _, post, metrics = wm.loss(batch)
    target = symlog(batch["obs"]) if wm.decoder.symlog_inputs else batch["obs"]
    squared = (wm.decoder.net(wm.rssm.features(post)) - target).pow(2).sum(-1).mean()
    torch.testing.assert_close(metrics["wm/rec"], squares * squared.detach())


def test_dreamer_v3_trains_with_the_references_laprop(tmp_path):
    """`algo.optim.kind=laprop` (the reference's optimiser) steps all three optimisers; the warmup's
    first update leaves the weights where they were (scale 0, as in the reference)."""
    trainer = Trainer(run_config(tmp_path, "steps=48", "algo.optim.kind=laprop", "algo.optim.warmup=1000",
                                 "algo.optim.eps=1e-20"))
    start = {k: v.clone() for k, v in trainer.agent.state_dict().items() if "critic" in k}
    trainer.train()
    assert trainer.counters["updates"] > 1
    opts = trainer.agent.optimizers()
    assert all(type(o.opt).__name__ == "LaProp" for o in opts.values())
    assert all(float(s["step"]) == trainer.counters["updates"] for s in opts["critic"].opt.state.values())
    moved = [k for k, v in trainer.agent.state_dict().items() if k in start and not torch.equal(v, start[k])]
    assert moved  # later updates move the weights


@pytest.mark.parametrize("crosses", [False, True], ids=["within-episodes", "across-an-episode-end"])
def test_replay_critic_loss_is_the_references(crosses):
    """The reference's replay-critic returns (agent.py at 2411f7d, bootstrap "imag"), written out as it
    writes them, equal `lambda_returns` on the real rewards bootstrapped from the imagined returns; the
    loss regresses the critic on replayed states to them and to the slow critic. A slice that runs on
    past an episode's last step (`replay.cross_episodes`) stops its returns there and gives the last
    step weight 0, as the reference's `is_last` does."""
    from tests.train.test_graphed_update import make_agent

    agent = make_agent("dreamer_v3", device="cpu")
    algo = agent.cfg
    algo.replay_critic = 0.3
    B, T = 3, 6
    flags = torch.zeros(B, T, dtype=torch.bool)
    terminal, last, first = flags.clone(), flags.clone(), flags.clone()
    terminal[1, 4] = True
    if crosses:  # row 0 ends its episode at step 2 and the next one starts at step 3; row 2 at its step 4
        last[0, 2], first[0, 3], last[2, 4], first[2, 5] = True, True, True, True
    batch = TensorDict({"obs": torch.randn(B, T, 5), "action": torch.rand(B, T, 2) * 2 - 1, "is_last": last,
                        "reward": torch.randn(B, T), "is_first": first, "is_terminal": terminal}, batch_size=[B, T])
    _, post, _ = agent.world_model.loss(batch)
    imagined = torch.randn(B * T)
    boot = imagined.reshape(B, T)
    live = (~terminal[:, 1:]).float() * algo.gamma  # the reference: 1 - 1/horizon, horizon 333
    cont = (~last[:, 1:]).float() * algo.lam  # (~is_last) x return_lambda_replay
    interm = batch["reward"][:, 1:] + (1 - cont) * live * boot[:, 1:]
    rets = [boot[:, -1]]
    for t in reversed(range(T - 1)):
        rets.append(interm[:, t] + live[:, t] * cont[:, t] * rets[-1])
    want_returns = torch.stack(list(reversed(rets))[:-1], 1)
    feat = agent.world_model.rssm.features(post).detach()[:, :-1]
    critic, slow = agent.critic(feat), agent.slow_critic(feat).mean
    weight = (~last[:, :-1]).float()
    want = -(weight * (critic.log_prob(want_returns) + algo.slow_reg * critic.log_prob(slow))).mean()
    torch.testing.assert_close(agent._replay_critic_loss(batch, post, imagined), want)
    if not crosses:  # a batch from before `is_last` was stored: the same loss
        torch.testing.assert_close(agent._replay_critic_loss(batch.exclude("is_last"), post, imagined), want)
    agent.update(batch)  # and the update runs with it


def test_the_replay_critic_loss_reaches_the_world_model():
    """replay_critic_grad True at 2411f7d: the loss's gradient flows into the world model through the
    replayed features, so the same update with and without it moves the world model differently; the
    update's losses all come from its starting weights, so that is the only difference in the step."""
    from tests.train.test_graphed_update import make_agent

    def update(replay_critic: float) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        agent = make_agent("dreamer_v3", device="cpu")
        agent.cfg.replay_critic = replay_critic
        with torch.no_grad():  # a zero-initialised output layer passes no gradient back to the features
            agent.critic.net[-1].weight.normal_(0, 0.1)
        B, T = 3, 6
        torch.manual_seed(1)
        batch = TensorDict({"obs": torch.randn(B, T, 5), "action": torch.rand(B, T, 2) * 2 - 1,
                            "reward": torch.randn(B, T), "is_first": torch.zeros(B, T, dtype=torch.bool),
                            "is_terminal": torch.zeros(B, T, dtype=torch.bool)}, batch_size=[B, T])
        if replay_critic:
            _, post, _ = agent.world_model.loss(batch)
            loss = agent._replay_critic_loss(batch, post, torch.randn(B * T))
            grads = torch.autograd.grad(loss, list(agent.world_model.encoder.parameters()))
            assert all(g.abs().sum() > 0 for g in grads)
        torch.manual_seed(2)
        agent.update(batch)
        return {k: v.clone() for k, v in agent.world_model.state_dict().items()}

    without, with_it = update(0.0), update(0.3)
    assert any(not torch.equal(without[k], with_it[k]) for k in without)


def test_dreamer_v1_explores_with_the_papers_additive_gaussian_noise(monkeypatch):
    """Collection adds N(0, explore_noise) to the actor's sample and clips to [-1, 1] (danijar/dreamer's
    additive_gaussian, 0.3 in the preset); eval is greedy and noiseless; explore_noise=0 leaves the sample."""
    from tests.train.test_graphed_update import make_agent

    agent = make_agent("dreamer_v1", device="cpu")
    assert agent.cfg.explore_noise == 0.3
    state = agent.rssm.initial(20_000)
    monkeypatch.setattr(agent.actor, "forward", lambda feat, noise=None: torch.full((feat.shape[0], 2), 0.9))
    torch.manual_seed(0)
    action = agent.act(state, "explore")
    assert action.max() == 1.0 and action.min() > -1.0  # clipped at the top
    inside = action[action < 1.0] - 0.9
    a = 0.1 / 0.3  # the unclipped noise is N(0, 0.3) below 0.1: mean -0.3 phi(a) / Phi(a)
    truncated_mean = -0.3 * math.exp(-a * a / 2) / math.sqrt(2 * math.pi) / (0.5 * (1 + math.erf(a / math.sqrt(2))))
    assert abs(float(inside.mean()) - truncated_mean) < 0.01
    assert 0.2 < float((action - 0.9).std()) < 0.3
    assert torch.equal(agent.act(state, "eval"), agent.actor.dist(agent.rssm.features(state)).mode)
    agent.cfg.explore_noise = 0.0
    assert torch.equal(agent.act(state, "explore"), torch.full((20_000, 2), 0.9))


@pytest.mark.parametrize("free_on", ["step", "mean"])
def test_free_nats_clamp_each_step_or_the_batch_mean(tmp_path, free_on):
    """kl.free_on=step clamps each step's KL at `free` (DreamerV3, PlaNet); mean clamps the batch mean
    (Dreamer V1's code: div = max(mean KL, free_nats)); the loss is checked against both formulas."""
    from worldmodels.algos.world_model import WorldModel, kl_terms

    cfg = run_config(tmp_path, "algo=dreamer_v1", "model=tiny", *GAUSSIAN_TINY, f"algo.kl.free_on={free_on}",
                     "algo.kl.free=0.15")  # between this batch's per-step KLs, below their mean
    torch.manual_seed(0)
    wm = WorldModel((3,), 1, cfg.model, cfg.algo, backend="loop")
    B, T = 2, 5
    flags = torch.zeros(B, T, dtype=torch.bool)
    batch = TensorDict({"obs": torch.randn(B, T, 3), "action": torch.rand(B, T, 1) * 2 - 1, "reward": torch.randn(B, T),
                        "is_first": flags, "is_terminal": flags}, batch_size=[B, T])
    free = float(cfg.algo.kl.free)
    torch.manual_seed(1)
    loss, post, metrics = wm.loss(batch)
    torch.manual_seed(1)  # the same posterior samples
    embed = wm.encoder(batch["obs"])
    post, prior = wm.rssm.observe(embed, batch["action"], batch["is_first"])
    feat = wm.rssm.features(post)
    rest = (-wm.rec_scale * wm.decoder.log_prob(feat, batch["obs"]) - wm.reward(feat).log_prob(batch["reward"])).mean()
    dyn, rep = kl_terms(post, prior)
    on_mean = dyn.mean().clamp(min=free) + rep.mean().clamp(min=free)
    on_step = (dyn.clamp(min=free) + rep.clamp(min=free)).mean()
    assert (dyn < free).any() and (dyn > free).any() and not torch.allclose(on_mean, on_step)
    assert torch.allclose(loss, rest + (on_mean if free_on == "mean" else on_step), rtol=1e-5)


def test_the_return_scale_is_the_references_percentile_ema_from_zero():
    """jaxutils.Moments(impl="perc") at 2411f7d: low and high EMAs start at 0 with no bias correction, and
    advantages are divided by max(1, high - low): a run's first updates divide by 1."""
    from tests.train.test_graphed_update import make_agent

    agent = make_agent("dreamer_v3", device="cpu")
    rate = agent.cfg.return_norm_rate
    returns = torch.linspace(0.0, 100.0, 1001).reshape(91, 11)  # 5th / 95th percentiles 5 and 95
    low = high = 0.0
    for _ in range(300):
        got = agent._update_return_scale(returns)
        low, high = (1 - rate) * low + rate * 5.0, (1 - rate) * high + rate * 95.0
        assert float(got) == pytest.approx(max(1.0, high - low), rel=1e-5)


def reference_lambda_return(reward, value, pcont, bootstrap, lam):
    """danijar/dreamer 56d4d44 tools.lambda_return, time on dim 1, as a loop."""
    next_values = torch.cat([value[:, 1:], bootstrap[:, None]], 1)
    inputs = reward + pcont * next_values * (1 - lam)
    out, agg = [], bootstrap
    for t in reversed(range(reward.shape[1])):
        agg = inputs[:, t] + pcont[:, t] * lam * agg
        out.append(agg)
    return torch.stack(out[::-1], 1)


def test_dreamer_v1_losses_are_the_authors_code(monkeypatch):
    """dreamer.py `_train`: imag_feat are the H imagined states (not the start); reward and value of each;
    returns = lambda_return(reward[:-1], value[:-1], pcont[:-1], bootstrap=value[-1]); weights
    cumprod([1, pcont[:-2]]); actor loss -mean(w R); value loss -mean(w log p(R)) on value(imag_feat)[:-1]."""
    from tests.train.test_graphed_update import make_agent, make_batch

    agent = make_agent("dreamer_v1", device="cpu")
    N, H, F = 18, agent.cfg.horizon, agent.world_model.feat_dim
    g = torch.Generator().manual_seed(3)
    feat = torch.randn(N, H + 1, F, generator=g)
    reward = torch.randn(N, H, generator=g)
    discount = torch.full((N, H), agent.cfg.gamma)
    monkeypatch.setattr(agent, "dream", lambda start: (None, feat, reward, discount))
    metrics = agent.update(make_batch(0, device="cpu"))

    imag_feat, lam = feat[:, 1:], agent.cfg.lam
    fresh = make_agent("dreamer_v1", device="cpu")  # the value head before the update's step (make_agent seeds)
    with torch.no_grad():
        value = fresh.value(imag_feat).mean
        returns = reference_lambda_return(reward[:, :-1], value[:, :-1], discount[:, :-1], value[:, -1], lam)
        w = torch.cumprod(torch.cat([torch.ones(N, 1), discount[:, :-2]], 1), 1)
        want_actor = -(w * returns).mean()
        want_value = -(w * fresh.value(imag_feat[:, :-1]).log_prob(returns)).mean()
    torch.testing.assert_close(metrics["actor/loss"], want_actor)
    torch.testing.assert_close(metrics["critic/loss"], want_value)


def test_dreamer_v1_needs_two_imagined_steps(tmp_path):
    from tests._train_config import run_config
    from worldmodels.train.config import ConfigError, validate

    with pytest.raises(ConfigError, match=r"algo.horizon=1 must be >= 2 for algo.name=dreamer_v1"):
        validate(run_config(tmp_path, "algo=dreamer_v1", "algo.horizon=1"))
    validate(run_config(tmp_path, "algo=dreamer_v1", "algo.horizon=2"))


def test_dreamer_v1_imagines_with_the_actor_on_stop_gradient_features(monkeypatch):
    """`_imagine_ahead`: policy = actor(tf.stop_gradient(feat)): the action carries no gradient back into
    the state it read, only into the actor's weights; the update imagines with that policy."""
    from tests.train.test_graphed_update import make_agent, make_batch

    agent = make_agent("dreamer_v1", device="cpu")
    policy = agent.imagination_policy()
    features = torch.randn(4, agent.world_model.feat_dim, requires_grad=True)
    action = policy(features)
    assert torch.autograd.grad(action.sum(), features, allow_unused=True) == (None,)
    assert all(g is not None for g in torch.autograd.grad(action.sum(), list(agent.actor.parameters())))
    assert "_actor_on_stopped_features" not in dict(agent.named_modules())  # the actor's weights, saved once
    seen = []
    imagine = agent.rssm.imagine
    monkeypatch.setattr(agent.rssm, "imagine", lambda *a, **k: seen.append(k["policy"]) or imagine(*a, **k))
    agent.update(make_batch(0, device="cpu"))
    assert seen == [policy]


def backprop_agent(discrete: bool = False, grad: str = "backprop"):
    from omegaconf import OmegaConf

    from tests.train.test_graphed_update import CONFIGS
    from worldmodels.algos import ALGOS

    model = OmegaConf.load(CONFIGS / "model" / "tiny.yaml")
    algo = OmegaConf.load(CONFIGS / "algo" / "dreamer_v3.yaml")
    algo.actor_grad = grad
    torch.manual_seed(0)
    return ALGOS["dreamer_v3"]((5,), 2, discrete, model, algo, backend="loop")


def test_the_backprop_actor_loss_is_the_2023_references(monkeypatch):
    """`actor_grad: backprop` (danijar/dreamerv3 423291a, ImagActorCritic.loss with actor_grad_cont
    backprop; VFunction.score): loss = mean(w * -(adv + actent * entropy)), adv = (R - v) / max(1, S),
    R the lambda-returns of the imagined rewards bootstrapped from the critic, written out as there;
    its gradient reaches the actor through the imagined dynamics (the RSSM's weights get one too),
    not through the actor's inputs. REINFORCE's loss does not depend on the dynamics."""
    from tests.train.test_graphed_update import make_batch

    agent = backprop_agent()
    with torch.no_grad():  # heads that read their input (zero-initialised ones predict a constant at first)
        for p in [*agent.world_model.reward.parameters(), *agent.critic.parameters()]:
            p.normal_(0, 0.1)
    batch = make_batch(0, device="cpu")
    seen = {}
    dream, step = agent.dream, agent.actor_opt.step

    def keep_dream(start):
        seen["dream"] = out = dream(start)
        return out

    def keep_loss(loss):  # the actor's gradients, and one of the dynamics' weights (the block GRU's gates)
        seen["loss"] = loss
        seen["start"] = agent.world_model.continues(seen["dream"][1][:, 0]).detach()  # before the model steps
        params = [*agent.actor.parameters(), agent.rssm.gates_w]
        if loss.requires_grad:
            seen["grads"] = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        return step(loss)

    monkeypatch.setattr(agent, "dream", keep_dream)
    monkeypatch.setattr(agent.actor_opt, "step", keep_loss)
    agent.update(batch)
    traj, feat, reward, discount = seen["dream"]
    algo = agent.cfg
    value = agent.critic(feat).mean
    cont = discount / algo.gamma  # the reference's traj['cont'][1:], times its discount 1 - 1/horizon
    vals = [value[:, -1]]
    interm = reward + cont * algo.gamma * value[:, 1:] * (1 - algo.lam)
    for t in reversed(range(reward.shape[1])):
        vals.append(interm[:, t] + cont[:, t] * algo.gamma * algo.lam * vals[-1])
    ret = torch.stack(list(reversed(vals))[:-1], 1)
    scale = agent.return_scale.clamp(min=1.0)  # after this update's EMA step, as the reference's Moments
    adv = (ret - value[:, :-1]) / scale
    ent = agent.actor.dist(feat[:, :-1].detach()).entropy()
    weight = torch.cumprod(torch.cat([seen["start"].unsqueeze(1), discount[:, :-1]], 1), 1)  # start: P(continue)
    want = (weight.detach() * -(adv + algo.entropy * ent)).mean()
    torch.testing.assert_close(seen["loss"], want)
    actor_grads, dynamics_grad = seen["grads"][:-1], seen["grads"][-1]
    assert all(g is not None and g.abs().sum() > 0 for g in actor_grads)
    assert dynamics_grad is not None and dynamics_grad.abs().sum() > 0  # the loss runs through the dynamics

    agent = backprop_agent(grad="reinforce")
    dream, step = agent.dream, agent.actor_opt.step
    monkeypatch.setattr(agent, "dream", keep_dream)
    monkeypatch.setattr(agent.actor_opt, "step", keep_loss)
    agent.update(batch)
    assert seen["grads"][-1] is None  # REINFORCE: the loss does not reach the dynamics


def test_discrete_actions_learn_by_reinforce_whatever_actor_grad_says():
    assert backprop_agent(discrete=True).actor_grad == "reinforce"
    assert backprop_agent().actor_grad == "backprop"


def test_the_backprop_actor_step_leaves_the_other_gradients_alone(monkeypatch):
    """The backprop actor loss runs through the world model and the critic, but the actor's step
    neither makes nor adds into their gradients: the update's later zero_grad would drop them, and
    a captured update would then write, on every replay, into memory its graph does not own (an
    illegal address on the H200 once `torch.cuda.empty_cache` unmapped it, at the first eval)."""
    from tests.train.test_graphed_update import make_batch

    agent = backprop_agent()
    with torch.no_grad():  # heads that read their input: the loss then depends on the dynamics
        for p in [*agent.world_model.reward.parameters(), *agent.critic.parameters()]:
            p.normal_(0, 0.1)
    actor = {id(p) for p in agent.actor.parameters()}
    others = [p for p in agent.parameters() if p.requires_grad and id(p) not in actor]
    kept = [torch.full_like(p, 7.0) for p in others]
    for p, g in zip(others, kept):
        p.grad = g
    seen = {}
    zero_grad = agent.wm_opt.zero_grad

    def check_then_zero():  # called once, after the actor's step and before the world model's backward
        seen["untouched"] = all(p.grad is g and bool((g == 7.0).all()) for p, g in zip(others, kept))
        zero_grad()

    monkeypatch.setattr(agent.wm_opt, "zero_grad", check_then_zero)
    agent.update(make_batch(0, device="cpu"))
    assert seen["untouched"]


def test_dreamer_v3_trains_with_the_backprop_actor(tmp_path):
    cfg = run_config(tmp_path, "env=pendulum", "algo=dreamer_v3", "steps=120", "algo.actor_grad=backprop")
    out = Trainer(cfg).train()
    assert out["updates"] > 0


@pytest.mark.parametrize("order", ["same_weights", "world_model_first"])
def test_the_update_order_decides_which_world_model_imagines(monkeypatch, order):
    """`algo.update_order`: "same_weights" (the 2024 reference) imagines with the world model the
    update started with and steps it last; "world_model_first" (the 2023 reference's Agent.train)
    steps it first, so imagination runs with the stepped model. Either way each of the three
    optimisers steps once, and the world model's step is the same (its loss does not depend on the
    order)."""
    from tests.train.test_graphed_update import make_batch

    agent = backprop_agent()
    agent.cfg.update_order = order
    agent.update_order = order
    twin = backprop_agent()
    gates = agent.rssm.gates_w
    start, seen = gates.detach().clone(), {}
    dream = agent.dream

    def keep_weights(start_states):
        seen["gates"] = gates.detach().clone()
        return dream(start_states)

    monkeypatch.setattr(agent, "dream", keep_weights)
    steps = {name: opt.opt.step for name, opt in agent.optimizers().items()}
    counts = dict.fromkeys(steps, 0)
    for name, opt in agent.optimizers().items():
        def counted(*args, name=name, **kwargs):
            counts[name] += 1
            return steps[name](*args, **kwargs)
        monkeypatch.setattr(opt.opt, "step", counted)
    batch = make_batch(0, device="cpu")
    torch.manual_seed(3)
    metrics = agent.update(batch)
    torch.manual_seed(3)
    twin.update(batch)
    assert counts == {"model": 1, "actor": 1, "critic": 1}
    assert {"wm/grad_norm", "actor/grad_norm", "critic/grad_norm"} <= set(metrics)
    stepped = gates.detach()
    assert not torch.equal(stepped, start)
    assert torch.equal(seen["gates"], stepped if order == "world_model_first" else start)
    torch.testing.assert_close(stepped, twin.rssm.gates_w.detach())  # the twin: the default order


def test_dreamer_v3_trains_in_the_2023_order(tmp_path):
    cfg = run_config(tmp_path, "env=pendulum", "algo=dreamer_v3", "steps=120", "algo.actor_grad=backprop",
                     "algo.update_order=world_model_first", "algo.start_state=initial")
    out = Trainer(cfg).train()
    assert out["updates"] > 0


def test_the_2023_preset_updates_alike_on_the_fused_kernels_and_the_loop(monkeypatch):
    """The `dmc_proprio_2023` preset's agent (the 2023 dense GRU, its learned initial state, the bounded
    normal Actor learning by backprop through imagination) makes the same updates on `backend=triton`
    (observe and imagination in the fused kernels: under Triton's interpreter on CPU, compiled with
    WORLDMODELS_TEST_DEVICE=cuda, where the unrolls run as CUDA-graph replays) as on `loop`: the losses and
    every weight after two updates."""
    pytest.importorskip("triton", reason="the triton package is not installed: the triton backend cannot run")
    from tests._triton import DEVICE, import_op
    from tests.train.test_graphed_update import make_agent, make_batch

    import_op("worldmodels.ops.rssm.fused.entry", "worldmodels.ops.rssm.fused.forward_kernels",
              "worldmodels.ops.rssm.fused.launch")
    from worldmodels.ops.rssm.fused import launch

    fused, loop = make_agent("dreamer_v3_2023", backend="triton", device=DEVICE), make_agent(
        "dreamer_v3_2023", backend="loop", device=DEVICE)
    for agent in (fused, loop):  # 5 imagined steps: what 15 would check, at a third of the interpreter's time
        agent.cfg.horizon = 5
    assert loop.world_model.rssm.op_spec().initial == "learned"
    calls = []
    forward = launch.forward
    monkeypatch.setattr(launch, "forward", lambda *a, **k: calls.append(k["actor"] is not None) or forward(*a, **k))
    for i in range(2):
        batch = make_batch(i, device=DEVICE)
        torch.manual_seed(100 + i)
        want = loop.update(batch)
        torch.manual_seed(100 + i)
        got = fused.update(batch)
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5, msg=labelled(f"update {i}, {k}"))
    for (name, x), y in zip(loop.state_dict().items(), fused.state_dict().values()):
        torch.testing.assert_close(y, x, rtol=1e-4, atol=1e-5, msg=labelled(name))
    if torch.device(DEVICE).type == "cuda":  # each signature's first calls warm up and capture, replays call nothing
        assert calls[0] is False and True in calls, calls
    else:  # per update: observe, then imagination with the Actor, in the kernel
        assert calls == [False, True] * 2


def test_compile_nets_compiles_the_mlps_around_the_rssm_and_changes_no_result(tmp_path):
    """`Agent.compile_nets` (a run's `compile_nets=true`) compiles the `.net` of the encoder, decoder,
    heads, Actor and critics, not the RSSM's: each reaches the backend (here one that records the graphs
    and runs them as traced: the plumbing, not inductor's code), and the update computes what the eager
    one does. state_dict keys are unchanged."""
    import copy

    from torch._dynamo.testing import CompileCounter

    from tests.train.test_graphed_update import make_batch
    from worldmodels.algos import ALGOS

    cfg = run_config(tmp_path, "+experiment=dmc_proprio_2023", "env=walker_walk", "algo.horizon=2",
                     "model.encoder_units=32", "model.units=16", "model.deter=16", "model.hidden=16")
    torch.manual_seed(0)
    agent = ALGOS["dreamer_v3"]((5,), 2, False, cfg.model, cfg.algo, backend="loop")
    twin = copy.deepcopy(agent)
    backend = CompileCounter()
    assert twin.compile_nets(backend=backend) == [
        "world_model.encoder", "world_model.decoder", "world_model.reward", "world_model.cont", "actor",
        "critic", "slow_critic"]
    assert list(twin.state_dict()) == list(agent.state_dict())
    batch = make_batch(1, device="cpu")
    torch.manual_seed(3)
    want = agent.update(batch.clone())
    torch.manual_seed(3)
    got = twin.update(batch.clone())
    for key in ("wm/loss", "actor/loss", "critic/loss"):
        torch.testing.assert_close(got[key], want[key])
    for (name, p), q in zip(agent.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q, p, msg=labelled(name))
    assert backend.frame_count >= 7, backend.frame_count  # each net traced at least once (more for other shapes)


def test_initial_start_state_filters_every_sequence_as_an_episode_start():
    """`algo.start_state=initial` (the references' replay marks each sampled sequence's first step
    is_first): an update on sequences that start mid-episode, after some action, is the update on the
    same steps marked as episode starts with no action before them; the caller's batch is left as it was."""
    from tests.train.test_graphed_update import make_batch

    mid = make_batch(0, device="cpu")
    mid["is_first"][:, 0] = False
    mid["action"][:, 0] = 0.5
    held = mid.clone()
    first = mid.clone()
    first["is_first"][:, 0] = True
    first["action"][:, 0] = 0.0
    agents = []
    for start_state, batch in (("initial", mid), ("zeros", first), ("zeros", mid)):
        agent = backprop_agent()
        agent.start_state = start_state
        torch.manual_seed(3)
        agent.update(batch)
        agents.append(agent)
    assert (mid == held).all()
    initial, episode_start, zeros = (dict(a.named_parameters()) for a in agents)
    for name, p in initial.items():
        torch.testing.assert_close(p, episode_start[name], rtol=0, atol=0, msg=labelled(name))
    assert not torch.equal(initial["world_model.rssm.gates_w"], zeros["world_model.rssm.gates_w"])


def test_initial_start_state_and_replay_context_are_refused_together(tmp_path):
    from worldmodels.train import ConfigError, Trainer

    cfg = run_config(tmp_path, "env=pendulum", "algo.start_state=initial", "algo.replay_context=true")
    with pytest.raises(ConfigError, match="algo.start_state=initial needs algo.replay_context=false"):
        Trainer(cfg)
    cfg = run_config(tmp_path, "env=pendulum", "algo.start_state=previous_batch")
    with pytest.raises(ConfigError, match="previous_batch' is not a choice.*algo.start_state=initial"):
        Trainer(cfg)
    cfg = run_config(tmp_path, "env=pendulum", "algo.start_state=carry")
    with pytest.raises(ConfigError, match="algo.start_state"):
        Trainer(cfg)
