"""Dreamer (V1): Gaussian RSSM world model; actor trained by backpropagating lambda-returns
through the imagined dynamics (the differentiable `imagine` path); value regression on them.

As danijar/dreamer (56d4d44, dreamer.py `_train`, `_imagine_ahead`; tools.lambda_return) computes them:
- the actor reads stop-gradient features (`actor(tf.stop_gradient(feat))`): returns reach its
  weights through its actions and the dynamics, not back through its inputs into earlier states;
- the H imagined states s_1..s_H (not the start) get reward r_t = reward(s_t) and value v_t; the
  returns of s_1..s_{H-1} are R_t = r_t + gamma ((1 - lam) v_{t+1} + lam R_{t+1}), bootstrapped
  with R_H = v_H: a state's return counts its own reward;
- actor loss -mean(w R), value loss -mean(w log p(R | s_t)), w_t = prod of the discounts before t.
Only the actor's optimiser steps on the actor loss: each optimiser's backward computes its own
weights' gradients only (`Optimizer.step`), though the actor loss runs back through the dynamics.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torch import nn

from worldmodels.algos.agent import ActorAgent, lambda_returns, trajectory_weights
from worldmodels.models.actor import StopGradientInputs
from worldmodels.algos.optim import Optimizer
from worldmodels.models.networks import Head, linear_bias


class DreamerV1(ActorAgent):
    def __init__(self, obs_shape, action_dim: int, discrete: bool, model, algo, backend: str = "auto"):
        super().__init__(obs_shape, action_dim, discrete, model, algo, backend)
        feat = self.world_model.feat_dim
        layers = algo.get("value_layers") or model.actor_layers  # the paper's code: 3 (its actor: 4)
        self.value = Head(feat, output="normal", units=model.units, layers=layers,
                          norm=model.norm, act=model.act, linear_bias=linear_bias(model))
        opt = algo.optim
        self.wm_opt = Optimizer(self.world_model, lr=opt.model_lr, eps=opt.eps, clip=opt.clip)
        self.actor_opt = Optimizer(self.actor, lr=opt.actor_lr, eps=opt.eps, clip=opt.clip)
        self.value_opt = Optimizer(self.value, lr=opt.critic_lr, eps=opt.eps, clip=opt.clip)
        # one wrapper for every update (an unroll capture is keyed by its policy), not a registered
        # submodule (its parameters are the actor's, saved and stepped once)
        object.__setattr__(self, "_actor_on_stopped_features", StopGradientInputs(self.actor))

    def imagination_policy(self) -> nn.Module:
        return self._actor_on_stopped_features

    def optimizers(self) -> dict:
        return {"model": self.wm_opt, "actor": self.actor_opt, "value": self.value_opt}

    def update(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        wm_loss, post, metrics = self.world_model.loss(batch, self.context_start(batch))
        self.keep_context(batch, post)
        metrics["wm/grad_norm"] = self.wm_opt.step(wm_loss)

        start = post.select("deter", "stoch").detach().reshape(-1)  # [N = B*T]
        _, feat, reward, discount = self.dream(start)  # differentiable through the dynamics
        value = self.value(feat[:, 1:]).mean  # [N, H]: s_1..s_H, the start left out
        returns = lambda_returns(reward[:, :-1], discount[:, :-1], value, cfg.lam)  # [N, H-1]: s_1..s_{H-1}
        weight = trajectory_weights(discount[:, :-1]).detach()
        actor_loss = -(weight * returns).mean()
        metrics["actor/grad_norm"] = self.actor_opt.step(actor_loss)

        value_loss = -(weight * self.value(feat[:, 1:-1].detach()).log_prob(returns.detach())).mean()
        metrics["critic/grad_norm"] = self.value_opt.step(value_loss)
        self.updates += 1
        metrics.update({"actor/loss": actor_loss.detach(), "critic/loss": value_loss.detach(),
                        "critic/value": value.mean().detach(), "imag/return": returns.mean().detach(),
                        "imag/reward": reward.mean().detach()})
        return metrics
