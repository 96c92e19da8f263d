"""DreamerV3: categorical RSSM world model; REINFORCE actor and two-hot critic in imagination.

Actor-critic update, from every posterior state of the batch (N = B*T starts, H steps):
- imagine with the actor in the loop, under no_grad (stop-gradient imagination; with gradients for
  `actor_grad: backprop`, below);
- rewards (two-hot), continues and critic values of the imagined states;
- lambda-returns R, discounted by gamma * P(continue) (`algo.continue_label`); each imagined state's
  weight w, the start state's continuation (`algo.start_continue`) times the discounts before it;
- return scale S = EMA(per95(R) - per5(R)); advantage (R - v) / max(1, S);
- actor:  -w * (log pi(a|s) * sg(adv) + eta * entropy) (REINFORCE, `actor_grad: reinforce`), or for
  continuous actions with `actor_grad: backprop` -w * (adv + eta * entropy) with the imagination run
  with gradients, so that adv reaches the actor through its reparameterised actions and the
  dynamics (the actor on stop-gradient features): what the 2023 reference (danijar/dreamerv3
  423291a, `actor_grad_cont: backprop`) trained DMC with, the runs its DMC score files hold;
- critic: -w * (log p(R) + slowreg * log p(slow critic's value)), slow critic = EMA of the critic;
  with `replay_critic`, also on the replayed states (`_replay_critic_loss`).
The order within an update (`algo.update_order`):
- "same_weights" (the 2024 reference, 2411f7d): every loss comes from the weights the update started
  with (imagination before the world model steps); the actor steps on its loss, then the world model
  and the critic on one backward of their sum, through which the replay-critic loss reaches the
  world model;
- "world_model_first" (the 2023 reference, 423291a Agent.train): the world model steps on its loss
  first, imagination runs from the posteriors it computed but with the stepped model, then the actor
  and the critic step on theirs, one after the other. No replay-critic loss (it reaches the world
  model through the joint backward of the other order).
"""

from __future__ import annotations

import contextlib
import copy

import torch
from tensordict import TensorDict
from torch import nn

from worldmodels.algos.agent import ActorAgent, lambda_returns, trajectory_weights
from worldmodels.models.actor import StopGradientInputs
from worldmodels.algos.optim import Optimizer
from worldmodels.models.init import init_like_dreamerv3_
from worldmodels.models.layers import check_choice
from worldmodels.models.networks import Head, linear_bias


UPDATE_ORDERS = ("same_weights", "world_model_first")
"""`algo.update_order`: see the module docstring."""

IMAGINED_CONTINUES = ("probability", "mode")
"""`algo.imagined_continue`: an imagined state's continuation flag, the continue head's probability (the
2024 reference) or its mode, 0 or 1 (the 2023 reference's WorldModel.imagine)."""

CONTINUE_LABELS = ("hard", "discounted")
"""`algo.continue_label`: what the continue head learns, 1 - is_terminal, or gamma * (1 - is_terminal)
(the 2024 reference's contdisc), so that its probability is the discount and imagination takes no gamma
besides. The same discount on DMC, whose episodes never terminate; not with `imagined_continue: mode`."""

START_CONTINUES = ("model", "data")
"""`algo.start_continue`: an imagined trajectory's own weight, its start state's continuation: the
continue head's there (the reference since 2024's imag_loss) or the replayed step's 1 - is_terminal (the
2023 and 2411f7d references); see `_start_continues`."""

START_STATES = ("zeros", "initial")
"""`algo.start_state`: what a replayed sequence that does not start an episode is filtered from when
replay holds no context: `zeros` (a zero state, stepped with the action replayed before its first
step), or `initial` (its first step filtered as an episode's first: the model's initial state and
no previous action). Both references' replays mark the first step of every sequence they sample
`is_first` (423291a: embodied/replay/generic.py `_sample`; 2411f7d: replay.py `_annotate_batch`,
where that step is the context), so the state the 2023 Agent.train carries from the previous batch
never reaches its model: `initial` is what its runs did."""


def update_conflict(algo) -> str | None:
    """Why `algo`'s update settings (order, start state) cannot run with the rest of it, or None."""
    if algo.get("update_order") == "world_model_first" and algo.get("replay_critic", 0.0):
        return (f"algo.replay_critic={algo.replay_critic} needs algo.update_order=same_weights: its loss reaches "
                "the world model through one backward with the world model's loss")
    if algo.get("continue_label") == "discounted" and algo.get("imagined_continue") == "mode":
        return ("algo.continue_label=discounted needs algo.imagined_continue=probability: a head that learns "
                "the discount has no 0-or-1 mode to read")
    if algo.get("start_state") == "initial" and algo.get("replay_context", False):
        return ("algo.start_state=initial needs algo.replay_context=false: with replay context a sequence "
                "starts from the state stored with its first step")
    return None


class DreamerV3(ActorAgent):
    def __init__(self, obs_shape, action_dim: int, discrete: bool, model, algo, backend: str = "auto"):
        super().__init__(obs_shape, action_dim, discrete, model, algo, backend)
        feat = self.world_model.feat_dim
        self.critic = Head(feat, output="twohot", units=model.units, layers=model.actor_layers,
                           norm=model.norm, act=model.act, twohot_bins=algo.get("twohot_bins", "symlog"),
                           linear_bias=linear_bias(model))
        if model.get("init", "torch") == "dreamerv3":
            init_like_dreamerv3_(self, actor_outscale=model.get("actor_outscale", 0.01),
                                 fan=model.get("init_fan", "in"))
        self.slow_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.register_buffer("return_scale", torch.zeros(()))
        # the percentiles of the return scale, on the device (no host-to-device copy per update)
        self.register_buffer("return_quantiles", torch.tensor([0.05, 0.95]), persistent=False)
        self.all_ranks = None  # data-parallel runs: gathers a tensor [n] from every rank (train/distributed.py)
        opt = algo.optim
        kind = dict(kind=opt.get("kind", "adam"), warmup=opt.get("warmup", 0))  # configs from before: Adam
        # eps and global-norm clip: one for all three, or the world model's own (`model_eps`, `model_clip`)
        clip = opt.get("clip", 0.0)
        self.wm_opt = Optimizer(self.world_model, lr=opt.model_lr, eps=opt.get("model_eps", opt.eps), agc=opt.agc,
                                clip=opt.get("model_clip", clip), **kind)
        self.actor_opt = Optimizer(self.actor, lr=opt.actor_lr, eps=opt.eps, agc=opt.agc, clip=clip, **kind)
        self.critic_opt = Optimizer(self.critic, lr=opt.critic_lr, eps=opt.eps, agc=opt.agc, clip=clip, **kind)
        # continuous actions may learn by backpropagating returns through the dynamics (the 2023
        # reference's actor_grad_cont: backprop); discrete actions always by REINFORCE
        self.actor_grad = "reinforce" if discrete else algo.get("actor_grad", "reinforce")
        # backprop: the actor reads stop-gradient features (not registered: its weights are the actor's)
        object.__setattr__(self, "_actor_on_stopped_features", StopGradientInputs(self.actor))
        self.update_order = check_choice("algo.update_order", algo.get("update_order", "same_weights"), UPDATE_ORDERS)
        self.imagined_continue = check_choice("algo.imagined_continue", algo.get("imagined_continue", "probability"),
                                              IMAGINED_CONTINUES)
        self.continue_label = check_choice("algo.continue_label", algo.get("continue_label", "hard"), CONTINUE_LABELS)
        self.start_continue = check_choice("algo.start_continue", algo.get("start_continue", "model"), START_CONTINUES)
        self.start_state = check_choice("algo.start_state", algo.get("start_state", "zeros"), START_STATES)
        if (conflict := update_conflict(algo)) is not None:
            raise ValueError(conflict)

    def imagination_policy(self) -> nn.Module:
        return self._actor_on_stopped_features if self.actor_grad == "backprop" else self.actor

    def optimizers(self) -> dict:
        return {"model": self.wm_opt, "actor": self.actor_opt, "critic": self.critic_opt}

    def update(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        if self.start_state == "initial":
            batch = starting_episodes(batch)
        wm_loss, post, metrics = self.world_model.loss(batch, self.context_start(batch))
        self.keep_context(batch, post)
        world_model_first = self.update_order == "world_model_first"
        if world_model_first:  # the 2023 order: imagination below runs with the stepped world model
            metrics["wm/grad_norm"] = self.wm_opt.step(wm_loss)

        # same_weights: imagine with the weights the world-model loss saw, the world model steps last
        start = post.select("deter", "stoch").detach().reshape(-1)  # [N = B*T]
        backprop = self.actor_grad == "backprop"
        with torch.no_grad() if not backprop else contextlib.nullcontext():
            traj, feat, reward, discount = self.dream(start)  # [N, H+1, F], [N, H], [N, H]
            value = self.critic(feat).mean
            returns = lambda_returns(reward, discount, value, cfg.lam)  # [N, H]
            weight = trajectory_weights(discount, self._start_continues(batch, feat[:, 0])).detach()
            scale = self._update_return_scale(returns.detach())
            advantage = (returns - value[:, :-1]) / scale

        dist = self.actor.dist(feat[:, :-1].detach())
        entropy = dist.entropy()
        if backprop:  # the normalised advantage itself, differentiable through the imagined dynamics
            actor_loss = -(weight * (advantage + cfg.entropy * entropy)).mean()
        else:
            logp = dist.log_prob(traj["action"].detach())
            actor_loss = -(weight * (logp * advantage + cfg.entropy * entropy)).mean()
        metrics["actor/grad_norm"] = self.actor_opt.step(actor_loss)
        feat, returns, value = feat.detach(), returns.detach(), value.detach()

        critic = self.critic(feat[:, :-1])
        with torch.no_grad():
            slow = self.slow_critic(feat[:, :-1]).mean
        critic_loss = -(weight * (critic.log_prob(returns) + cfg.slow_reg * critic.log_prob(slow))).mean()
        if cfg.get("replay_critic", 0.0):
            critic_loss = critic_loss + cfg.replay_critic * self._replay_critic_loss(batch, post, returns[:, 0])
        if world_model_first:
            metrics["critic/grad_norm"] = self.critic_opt.step(critic_loss)
        else:  # one backward for both: the replay-critic loss reaches the world model through its features
            self.wm_opt.zero_grad()
            self.critic_opt.zero_grad()
            (wm_loss + critic_loss).backward()
            metrics["wm/grad_norm"] = self.wm_opt.apply()
            metrics["critic/grad_norm"] = self.critic_opt.apply()
        with torch.no_grad():  # the references' SlowUpdater: a whole copy at the first update, then the EMA
            rate = torch.where(self.updates == 0, 1.0, cfg.slow_rate)
            for slow_p, p in zip(self.slow_critic.parameters(), self.critic.parameters()):
                slow_p.lerp_(p, rate.to(p.dtype))
        self.updates += 1
        metrics.update({"actor/loss": actor_loss.detach(), "actor/entropy": entropy.mean().detach(),
                        "critic/loss": critic_loss.detach(), "critic/value": value.mean().detach(),
                        "imag/return": returns.mean().detach(), "imag/reward": reward.mean().detach(),
                        "imag/return_scale": self.return_scale.clone()})
        return metrics

    def _start_continues(self, batch: TensorDict, start_feat: torch.Tensor) -> torch.Tensor:
        """[N]: whether the episode goes on from each start state, its imagined trajectory's weight: the
        continue head's P(continue) there (`start_continue: model`; the reference since 2024: imag_loss's
        weight from con[:, 0]), or the replayed step's own flag, 1 - is_terminal (`data`: the 2023
        reference's first_cont, 2411f7d's startcon). A trajectory imagined from a terminal state teaches
        the actor and critic nothing."""
        if self.start_continue == "data":
            return (~batch["is_terminal"]).reshape(-1)
        return self.world_model.continues(start_feat)

    def _replay_critic_loss(self, batch: TensorDict, post: TensorDict, imagined: torch.Tensor) -> torch.Tensor:
        """The reference's replay-critic loss (danijar/dreamerv3 2411f7d, agent.py `replay_critic_loss`,
        bootstrap "imag", replay_critic_grad True): the critic on the replayed posterior states [B, T]
        regresses lambda-returns of the real rewards, bootstrapped at every step from `imagined` [B*T],
        the imagined return from that state, and towards the slow critic; its gradient also reaches the
        world model through the features. A sequence that runs on past an episode's last step
        (`replay.cross_episodes`) stops its returns there (`replay_returns`)."""
        cfg = self.cfg
        B, T = batch.batch_size
        feat = self.world_model.rssm.features(post)[:, :-1]  # [B, T-1]: states with a next step
        with torch.no_grad():
            is_last = batch["is_last"] if "is_last" in batch.keys() else torch.zeros_like(batch["is_first"])
            returns, weight = replay_returns(batch["reward"].to(feat.dtype), batch["is_terminal"], is_last,
                                             imagined.reshape(B, T), cfg.gamma, cfg.lam)
            slow = self.slow_critic(feat.detach()).mean
        critic = self.critic(feat)
        return -(weight * (critic.log_prob(returns) + cfg.slow_reg * critic.log_prob(slow))).mean()

    def _update_return_scale(self, returns: torch.Tensor) -> torch.Tensor:
        """EMA of the 5-95 percentile range of returns (of every rank's, in a data-parallel run), from 0
        and without bias correction as the reference's `Moments(impl="perc")`: the first updates divide
        advantages by 1, not by a range one batch measured; divide advantages by max(1, it)."""
        values = returns.flatten() if self.all_ranks is None else self.all_ranks(returns.flatten())
        low, high = torch.quantile(values, self.return_quantiles.to(returns.dtype))
        self.return_scale.lerp_(high - low, self.cfg.return_norm_rate)
        return self.return_scale.clamp(min=1.0)


def replay_returns(reward: torch.Tensor, is_terminal: torch.Tensor, is_last: torch.Tensor, boot: torch.Tensor,
                   gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The replay-critic targets of a replayed sequence [B, T] (the reference's `replay_critic_loss`):
    lambda-returns of the rewards received, bootstrapped from `boot` [B, T] (each state's imagined
    return), for states 0..T-2, and their weights. Where step t+1 ends its episode (`is_last`), the
    return of state t bootstraps fully from it (lambda 0) and the return of state t+1, which would run
    into the next episode, gets weight 0. Returns (returns [B, T-1], weight [B, T-1])."""
    live = gamma * (~is_terminal[:, 1:]).to(boot.dtype)
    lam_t = lam * (~is_last[:, 1:]).to(boot.dtype)
    returns = lambda_returns(reward[:, 1:], live, boot, lam_t)
    return returns, (~is_last[:, :-1]).to(boot.dtype)


def starting_episodes(batch: TensorDict) -> TensorDict:
    """`start_state=initial`: a shallow copy of the replayed `batch` [B, T] whose first step is marked
    `is_first` in every row (the RSSM resets there: initial state, no previous action); the rest shared."""
    is_first = batch["is_first"].clone()
    is_first[:, 0] = True
    out = batch.clone(recurse=False)
    out["is_first"] = is_first
    return out
