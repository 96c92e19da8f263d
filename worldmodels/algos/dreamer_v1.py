"""Dreamer (V1): Gaussian RSSM world model; actor trained by backpropagating lambda-returns
through the imagined dynamics (the differentiable `imagine` path); value regression on them.

Only the actor's optimiser steps on the actor loss: the world model and value take gradients
from it, but each optimiser clears its own gradients before its own backward pass.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from worldmodels.algos.agent import ActorAgent, lambda_returns, trajectory_weights
from worldmodels.algos.optim import Optimizer
from worldmodels.models.networks import Head


class DreamerV1(ActorAgent):
    def __init__(self, obs_shape, action_dim: int, discrete: bool, model, algo, backend: str = "auto"):
        super().__init__(obs_shape, action_dim, discrete, model, algo, backend)
        feat = self.world_model.feat_dim
        layers = algo.get("value_layers") or model.actor_layers  # the paper's code: 3 (its actor: 4)
        self.value = Head(feat, output="normal", units=model.units, layers=layers,
                          norm=model.norm, act=model.act)
        opt = algo.optim
        self.wm_opt = Optimizer(self.world_model, lr=opt.model_lr, eps=opt.eps, clip=opt.clip)
        self.actor_opt = Optimizer(self.actor, lr=opt.actor_lr, eps=opt.eps, clip=opt.clip)
        self.value_opt = Optimizer(self.value, lr=opt.critic_lr, eps=opt.eps, clip=opt.clip)

    def optimizers(self) -> dict:
        return {"model": self.wm_opt, "actor": self.actor_opt, "value": self.value_opt}

    def update(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        wm_loss, post, metrics = self.world_model.loss(batch)
        metrics["wm/grad_norm"] = self.wm_opt.step(wm_loss)

        start = post.select("deter", "stoch").detach().reshape(-1)  # [N = B*T]
        _, feat, reward, discount = self.dream(start)  # differentiable through the dynamics
        value = self.value(feat).mean
        returns = lambda_returns(reward, discount, value, cfg.lam)  # [N, H]
        weight = trajectory_weights(discount).detach()
        actor_loss = -(weight * returns).mean()
        metrics["actor/grad_norm"] = self.actor_opt.step(actor_loss)

        value_loss = -(weight * self.value(feat[:, :-1].detach()).log_prob(returns.detach())).mean()
        metrics["critic/grad_norm"] = self.value_opt.step(value_loss)
        self.updates += 1
        metrics.update({"actor/loss": actor_loss.detach(), "critic/loss": value_loss.detach(),
                        "critic/value": value.mean().detach(), "imag/return": returns.mean().detach(),
                        "imag/reward": reward.mean().detach()})
        return metrics
