"""`Agent`: a world model plus how it acts; the base of every algorithm.

`policy(mode)` returns the collector's policy: it filters observations with the RSSM
(`obs_step`, state and previous action carried between calls) and picks an action from the
posterior with `act` (an actor, or a planner). Subclasses implement `act`, `update` and
`optimizers`; `ActorAgent` is the base of the Dreamers, which act with a learned `Actor`.
"""

from __future__ import annotations

import abc

import torch
from tensordict import TensorDict
from torch import nn

from worldmodels.algos.world_model import WorldModel
from worldmodels.models import Actor

MODES = ("explore", "eval", "random")


class Agent(nn.Module, abc.ABC):
    def __init__(self, obs_shape, action_dim: int, discrete: bool, model, algo, backend: str = "auto"):
        super().__init__()
        self.action_dim, self.discrete, self.cfg = action_dim, discrete, algo
        self.world_model = WorldModel(obs_shape, action_dim, model, algo, backend)
        self.register_buffer("updates", torch.zeros((), dtype=torch.long))

    @property
    def rssm(self):
        return self.world_model.rssm

    def random_action(self, n: int) -> torch.Tensor:
        """[n, A]: uniform in [-1, 1], or uniform one-hot."""
        device = self.updates.device
        if self.discrete:
            return nn.functional.one_hot(torch.randint(self.action_dim, (n,), device=device), self.action_dim).float()
        return torch.rand(n, self.action_dim, device=device) * 2 - 1

    @abc.abstractmethod
    def act(self, state: TensorDict, mode: str) -> torch.Tensor:
        """Action [N, A] from filter state [N]; mode "explore" (sample) or "eval" (greedy)."""

    @abc.abstractmethod
    def update(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        """One training step on a replay batch [B, T]; returns 0-d metric tensors, left on the
        device: reading one waits for the GPU, so the trainer reads them only when it logs."""

    def policy(self, mode: str):
        """The collector's policy: (obs [N, ...], is_first [N], carry) -> (action [N, A], carry)."""
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not valid; expected one of {list(MODES)}")
        device = self.updates.device

        @torch.no_grad()
        def policy(obs: torch.Tensor, is_first: torch.Tensor, carry):
            obs, is_first = obs.to(device), is_first.to(device)
            n = obs.shape[0]
            if mode == "random":
                return self.random_action(n), None
            if carry is None:
                carry = (self.rssm.initial(n), torch.zeros(n, self.action_dim, device=device))
            state, prev_action = carry
            post, _ = self.rssm.obs_step(state, prev_action, self.world_model.encoder(obs), is_first)
            action = self.act(post, mode)
            return action, (post.select("deter", "stoch"), action)

        return policy

    @abc.abstractmethod
    def optimizers(self) -> dict:
        """name -> Optimizer, for checkpoints."""


class ActorAgent(Agent):
    """An agent that acts with a learned `Actor` on the RSSM features (Dreamer V1, DreamerV3)."""

    def __init__(self, obs_shape, action_dim: int, discrete: bool, model, algo, backend: str = "auto"):
        super().__init__(obs_shape, action_dim, discrete, model, algo, backend)
        self.actor = Actor(self.world_model.feat_dim, action_dim, hidden=model.units, layers=model.actor_layers,
                           dist="onehot" if discrete else algo.actor_dist, act=model.act, norm=model.norm,
                           min_std=algo.actor_min_std, unimix=model.unimix)

    def act(self, state: TensorDict, mode: str) -> torch.Tensor:
        feat = self.rssm.features(state)
        if mode == "eval":
            return self.actor.dist(feat).mode
        return self.actor(feat)

    def dream(self, start: TensorDict) -> tuple[TensorDict, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Imagine `cfg.horizon` steps from `start` [N] with the actor in the loop: the trajectory
        [N, H] (with its actions), features [N, H+1, F] (the start first), predicted reward [N, H]
        and discount gamma * P(continue) [N, H] on arriving at each imagined state."""
        traj = self.rssm.imagine(start, self.cfg.horizon, policy=self.actor)  # [N, H]
        feat = torch.cat([self.rssm.features(start).unsqueeze(1), self.rssm.features(traj)], 1)
        reward = self.world_model.reward(feat[:, 1:]).mean
        discount = self.cfg.gamma * self.world_model.continues(feat[:, 1:])
        return traj, feat, reward, discount


def lambda_returns(reward: torch.Tensor, discount: torch.Tensor, value: torch.Tensor, lam: float) -> torch.Tensor:
    """TD(lambda) returns of imagined trajectories.

    reward, discount [N, H]: received / gamma * P(continue) on arriving at state h+1;
    value [N, H+1]: of states 0..H. Returns [N, H], R_h for states 0..H-1, bootstrapped from v_H."""
    ret = value[:, -1]
    out = []
    for h in reversed(range(reward.shape[1])):
        ret = reward[:, h] + discount[:, h] * ((1 - lam) * value[:, h + 1] + lam * ret)
        out.append(ret)
    return torch.stack(out[::-1], 1)


def trajectory_weights(discount: torch.Tensor) -> torch.Tensor:
    """[N, H]: weight of state h = product of discounts before it (1 for the start state)."""
    ones = torch.ones_like(discount[:, :1])
    return torch.cumprod(torch.cat([ones, discount[:, :-1]], 1), 1)
