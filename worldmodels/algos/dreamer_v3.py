"""DreamerV3: categorical RSSM world model; REINFORCE actor and two-hot critic in imagination.

Actor-critic update, from every posterior state of the batch (N = B*T starts, H steps):
- imagine with the actor in the loop, under no_grad (stop-gradient imagination);
- rewards (symexp two-hot), continues and critic values of the imagined states;
- lambda-returns R; return scale S = EMA(per95(R) - per5(R)); advantage (R - v) / max(1, S);
- actor:  -w * (log pi(a|s) * sg(adv) + eta * entropy);
- critic: -w * (log p(R) + slowreg * log p(slow critic's value)), slow critic = EMA of the critic.
"""

from __future__ import annotations

import copy

import torch
from tensordict import TensorDict

from worldmodels.algos.agent import ActorAgent, lambda_returns, trajectory_weights
from worldmodels.algos.optim import Optimizer
from worldmodels.models.networks import Head


class DreamerV3(ActorAgent):
    def __init__(self, obs_shape, action_dim: int, discrete: bool, model, algo, backend: str = "auto"):
        super().__init__(obs_shape, action_dim, discrete, model, algo, backend)
        feat = self.world_model.feat_dim
        self.critic = Head(feat, output="twohot", units=model.units, layers=model.actor_layers,
                           norm=model.norm, act=model.act)
        self.slow_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.register_buffer("return_scale", torch.zeros(()))
        # the percentiles of the return scale, on the device (no host-to-device copy per update)
        self.register_buffer("return_quantiles", torch.tensor([0.05, 0.95]), persistent=False)
        opt = algo.optim
        kind = dict(kind=opt.get("kind", "adam"), warmup=opt.get("warmup", 0))  # configs from before: Adam
        self.wm_opt = Optimizer(self.world_model, lr=opt.model_lr, eps=opt.eps, agc=opt.agc, **kind)
        self.actor_opt = Optimizer(self.actor, lr=opt.actor_lr, eps=opt.eps, agc=opt.agc, **kind)
        self.critic_opt = Optimizer(self.critic, lr=opt.critic_lr, eps=opt.eps, agc=opt.agc, **kind)

    def optimizers(self) -> dict:
        return {"model": self.wm_opt, "actor": self.actor_opt, "critic": self.critic_opt}

    def update(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        wm_loss, post, metrics = self.world_model.loss(batch)
        metrics["wm/grad_norm"] = self.wm_opt.step(wm_loss)

        start = post.select("deter", "stoch").detach().reshape(-1)  # [N = B*T]
        with torch.no_grad():
            traj, feat, reward, discount = self.dream(start)  # [N, H+1, F], [N, H], [N, H]
            value = self.critic(feat).mean
            returns = lambda_returns(reward, discount, value, cfg.lam)  # [N, H]
            weight = trajectory_weights(discount)
            scale = self._update_return_scale(returns)
            advantage = (returns - value[:, :-1]) / scale

        dist = self.actor.dist(feat[:, :-1])
        logp = dist.log_prob(traj["action"])
        entropy = dist.entropy()
        actor_loss = -(weight * (logp * advantage + cfg.entropy * entropy)).mean()
        metrics["actor/grad_norm"] = self.actor_opt.step(actor_loss)

        critic = self.critic(feat[:, :-1])
        with torch.no_grad():
            slow = self.slow_critic(feat[:, :-1]).mean
        critic_loss = -(weight * (critic.log_prob(returns) + cfg.slow_reg * critic.log_prob(slow))).mean()
        metrics["critic/grad_norm"] = self.critic_opt.step(critic_loss)
        with torch.no_grad():
            for slow_p, p in zip(self.slow_critic.parameters(), self.critic.parameters()):
                slow_p.lerp_(p, cfg.slow_rate)
        self.updates += 1
        metrics.update({"actor/loss": actor_loss.detach(), "actor/entropy": entropy.mean().detach(),
                        "critic/loss": critic_loss.detach(), "critic/value": value.mean().detach(),
                        "imag/return": returns.mean().detach(), "imag/reward": reward.mean().detach(),
                        "imag/return_scale": self.return_scale.clone()})
        return metrics

    def _update_return_scale(self, returns: torch.Tensor) -> torch.Tensor:
        """EMA of the 5-95 percentile range of returns; divide advantages by max(1, it)."""
        low, high = torch.quantile(returns.flatten(), self.return_quantiles.to(returns.dtype))
        rate = self.cfg.return_norm_rate
        # the first update sets it; torch.where, not `if`: reading `updates` would sync the device
        self.return_scale.copy_(torch.where(self.updates == 0, high - low, self.return_scale.lerp(high - low, rate)))
        return self.return_scale.clamp(min=1.0)
