"""PlaNet: Gaussian RSSM world model and CEM planning in latent space.

Each action: from the filter state, `iterations` rounds of sampling `candidates` action
sequences [N, C, H, A] from a Gaussian, scoring them all in one batched open-loop
`imagine` (N*C rollouts) by predicted reward, and refitting the Gaussian to the `top` best.
The first action of the final mean is taken (plus exploration noise when collecting).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from worldmodels.algos.agent import Agent
from worldmodels.algos.optim import Optimizer


class PlaNet(Agent):
    def __init__(self, obs_shape, action_dim: int, discrete: bool, model, algo, backend: str = "auto"):
        if discrete:
            raise ValueError("algo.name='planet' plans continuous actions; this env's actions are discrete")
        super().__init__(obs_shape, action_dim, discrete, model, algo, backend)
        opt = algo.optim
        self.wm_opt = Optimizer(self.world_model, lr=opt.model_lr, eps=opt.eps, clip=opt.clip)

    def optimizers(self) -> dict:
        return {"model": self.wm_opt}

    def act(self, state: TensorDict, mode: str) -> torch.Tensor:
        action = self.plan(state)
        if mode == "explore":
            action = (action + self.cfg.explore_noise * torch.randn_like(action)).clamp(-1, 1)
        return action

    @torch.no_grad()
    def plan(self, state: TensorDict) -> torch.Tensor:
        """CEM over action sequences from filter state [N] -> first actions [N, A]."""
        cem = self.cfg.cem
        n, c, h, a = state.shape[0], cem.candidates, cem.horizon, self.action_dim
        start = state.select("deter", "stoch").unsqueeze(1).expand(n, c).reshape(n * c)  # [N*C]
        device = state["deter"].device  # a TensorDict made without a device says None
        mean = torch.zeros(n, 1, h, a, device=device)
        std = torch.ones(n, 1, h, a, device=device)
        for _ in range(cem.iterations):
            actions = (mean + std * torch.randn(n, c, h, a, device=device)).clamp(-1, 1)  # [N, C, H, A]
            traj = self.rssm.imagine(start, h, actions=actions.reshape(n * c, h, a))  # [N*C, H]
            score = self.world_model.reward(self.rssm.features(traj)).mean.sum(-1).reshape(n, c)
            top = score.topk(cem.top, dim=1).indices  # [N, K]
            elite = actions.gather(1, top[:, :, None, None].expand(n, cem.top, h, a))  # [N, K, H, A]
            mean, std = elite.mean(1, keepdim=True), elite.std(1, keepdim=True)
        return mean[:, 0, 0]

    def update(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        loss, post, metrics = self.world_model.loss(batch, self.context_start(batch))
        self.keep_context(batch, post)
        metrics["wm/grad_norm"] = self.wm_opt.step(loss)
        self.updates += 1
        return metrics
