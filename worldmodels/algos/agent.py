"""`Agent`: a world model plus how it acts; the base of every algorithm.

`policy(mode)` returns the collector's policy: it filters observations with the RSSM
(`obs_step`, state and previous action carried between calls) and picks an action from the
posterior with `act` (an actor, or a planner). Subclasses implement `act`, `update` and
`optimizers`; `ActorAgent` is the base of the Dreamers, which act with a learned `Actor`.

Replay context (`algo.replay_context`, DreamerV3's `replay_context: 1`): replay stores with every
step the filter state its observation was filtered from (`context_entries`: the posterior of the
step before, zeros at an episode start), written by the collector while acting and rewritten by
every update with the posteriors it computed (`keep_context` leaves them in `context_out`). An
update filters its sequence from the stored state of its first step (`context_start`) instead of
from zeros, so the first steps of a sequence cut from the middle of an episode train from the state
the agent had there. Entries: "deter" [N, D] bfloat16, "stoch" [N, stoch] int16 class indices
(categorical latents: the sample is one-hot, so its index is exact) or [N, S] bfloat16 (Gaussian).
"""

from __future__ import annotations

import abc

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from worldmodels.algos.world_model import WorldModel
from worldmodels.core import cuda_graphs, torch_fixes
from worldmodels.models.actor import Actor
from worldmodels.models.networks import linear_bias

MODES = ("explore", "eval", "random")
COMPILE_BACKEND = "inductor"
"""The torch.compile backend of `Agent.compile_nets` (the run's `compile_nets=true`)."""


class Agent(nn.Module, abc.ABC):
    def __init__(self, obs_shape, action_dim: int, discrete: bool, model, algo, backend: str = "auto"):
        super().__init__()
        self.action_dim, self.discrete, self.cfg = action_dim, discrete, algo
        self.world_model = WorldModel(obs_shape, action_dim, model, algo, backend)
        self.register_buffer("updates", torch.zeros((), dtype=torch.long))
        self.context_out: TensorDict | None = None  # `keep_context`'s entries of the latest update
        self.policy_graphs = cuda_graphs.UnrollCache(max_entries=4)  # `policy(graphed=True)`'s captures

    @property
    def rssm(self):
        return self.world_model.rssm

    def context_entries(self, state: TensorDict | None, n: int | None = None,
                        device: torch.device | str | None = None) -> TensorDict:
        """The filter state [N] (deter, stoch) as replay stores it; `state=None`: zeros for `n` steps,
        made on `device` (default: the agent's)."""
        rssm = self.rssm
        if state is None:
            device = self.updates.device if device is None else device
            stoch = (torch.zeros(n, rssm.stoch, dtype=torch.int16, device=device) if rssm.classes
                     else torch.zeros(n, rssm.stoch_dim, dtype=torch.bfloat16, device=device))
            return TensorDict({"deter": torch.zeros(n, rssm.deter_dim, dtype=torch.bfloat16, device=device),
                               "stoch": stoch}, batch_size=[n], device=device)
        deter, stoch = state["deter"].detach(), state["stoch"].detach()
        if rssm.classes:
            stoch = stoch.unflatten(-1, (rssm.stoch, rssm.classes)).argmax(-1).to(torch.int16)
        else:
            stoch = stoch.to(torch.bfloat16)
        return TensorDict({"deter": deter.to(torch.bfloat16), "stoch": stoch}, batch_size=deter.shape[:-1],
                          device=deter.device)

    def context_start(self, batch: TensorDict) -> TensorDict | None:
        """The RSSM state [B] the sequence `batch` [B, T] is filtered from: its first step's stored
        context in the model's dtype (one-hot categoricals), or None (zeros) when it holds none."""
        if "context" not in batch.keys():
            return None
        rssm, entries = self.rssm, batch["context"][:, 0]
        dtype = rssm.post_embed.weight.dtype
        stoch = entries["stoch"]
        if rssm.classes:
            stoch = nn.functional.one_hot(stoch.long(), rssm.classes).flatten(-2)
        return TensorDict({"deter": entries["deter"].to(dtype), "stoch": stoch.to(dtype)}, batch_size=entries.shape)

    def keep_context(self, batch: TensorDict, post: TensorDict) -> None:
        """After the world-model loss on `batch` [B, T] with its `post` [B, T]: `context_out` [B, T-1]
        holds the entries for steps 1..T-1 (the posterior of each step before; zeros at an episode's
        first step, which a sequence across episode ends may hold), which replay writes back at those
        steps (None when the batch holds no context)."""
        if "context" not in batch.keys():
            self.context_out = None
            return
        starts = batch["is_first"][:, 1:]

        def zero_at_starts(x: torch.Tensor) -> torch.Tensor:
            return x.masked_fill(starts.reshape(*starts.shape, *(1,) * (x.dim() - 2)), 0)

        self.context_out = self.context_entries(post[:, :-1]).apply(zero_at_starts)

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

    def policy(self, mode: str, *, graphed: bool = False):
        """The collector's policy: (obs [N, ...], is_first [N], carry) -> (action [N, A], carry).

        `graphed`: on CUDA each call replays one CUDA graph per (mode, input shapes) instead of
        launching the filter step's and the actor's (or planner's) kernels one by one
        (`core/cuda_graphs.GraphedUnroll`; the graph reads the live weights, so updates are seen)."""
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not valid; expected one of {list(MODES)}")
        device = self.updates.device

        def step(obs, is_first, deter, stoch, prev_action):
            state = TensorDict({"deter": deter, "stoch": stoch}, batch_size=[deter.shape[0]])
            post, _ = self.rssm.obs_step(state, prev_action, self.world_model.encoder(obs), is_first)
            return self.act(post, mode), post["deter"], post["stoch"]

        @torch.no_grad()
        def policy(obs, is_first: torch.Tensor, carry):
            obs, is_first = obs.to(device), is_first.to(device)
            n = obs.shape[0]
            if mode == "random":
                return self.random_action(n), None
            if carry is None:
                carry = (self.rssm.initial(n), torch.zeros(n, self.action_dim, device=device))
            state, prev_action = carry
            inputs = (obs, is_first, state["deter"], state["stoch"], prev_action)
            if graphed and cuda_graphs.captures_graphs(is_first):
                action, deter, stoch = self._graphed_step(mode, step, inputs)
            else:
                action, deter, stoch = step(*inputs)
            return action, (TensorDict({"deter": deter, "stoch": stoch}, batch_size=[n]), action)

        return policy

    def _graphed_step(self, mode: str, step, inputs: tuple):
        """`step(*inputs)` replayed from a CUDA graph captured once per signature
        (`cuda_graphs.replay_captured`); observations that are a TensorDict (several keys) go in as
        their leaf tensors."""
        obs, rest = inputs[0], inputs[1:]
        keys = list(obs.keys(include_nested=True, leaves_only=True)) if isinstance(obs, TensorDictBase) else None
        tensors = [obs[k] for k in keys] if keys is not None else [obs]

        def unroll(_groups, flat):
            with cuda_graphs.inside_outer_graph():  # the planner's unrolls: held by this graph
                if keys is not None:
                    td = TensorDict({}, batch_size=[flat[0].shape[0]], device=flat[0].device)
                    for k, t in zip(keys, flat[:len(keys)]):
                        td.set(k, t)
                    flat = [td, *flat[len(keys):]]
                action, deter, stoch = step(*flat)
            return {"action": action, "deter": deter, "stoch": stoch}

        # the storage of `updates` stands for all of the agent's: it moves when the agent is moved
        key = ("policy", mode, tuple(keys or ()), self.updates.data_ptr())
        out = cuda_graphs.replay_captured(self.policy_graphs, key, unroll, [], [*tensors, *rest],
                                          what=f"{type(self).__name__} {mode} policy step")
        return out["action"], out["deter"], out["stoch"]

    @abc.abstractmethod
    def optimizers(self) -> dict:
        """name -> Optimizer, for checkpoints."""

    def compile_nets(self, backend=None) -> list[str]:
        """Compile in place (`torch_fixes.compile_module`) the `.net` of every module around the RSSM: the
        encoder's and decoder's MLPs or CNNs, the heads', the Actor's and the critics'. Their layers,
        norms and activations are most of an update's small kernels; the RSSM runs its own ops.
        Parameters, state_dict and outputs stay as they were. `backend`: torch.compile's, a name or a
        callable (default `COMPILE_BACKEND`). Returns the owners' names."""
        compiled, seen = [], set()
        for name, module in self.named_modules():
            net = getattr(module, "net", None)
            if not isinstance(net, nn.Sequential) or id(net) in seen:  # the RSSM's layers have no `.net`
                continue
            seen.add(id(net))
            torch_fixes.compile_module(net, backend or COMPILE_BACKEND)
            compiled.append(name)
        return compiled


class ActorAgent(Agent):
    """An agent that acts with a learned `Actor` on the RSSM features (Dreamer V1, DreamerV3)."""

    imagined_continue = "probability"  # `dream`'s continuation flags (DreamerV3's `algo.imagined_continue`)
    continue_label = "hard"  # what the continue head learns (DreamerV3's `algo.continue_label`)

    def __init__(self, obs_shape, action_dim: int, discrete: bool, model, algo, backend: str = "auto"):
        super().__init__(obs_shape, action_dim, discrete, model, algo, backend)
        self.actor = Actor(self.world_model.feat_dim, action_dim, hidden=model.units, layers=model.actor_layers,
                           dist="onehot" if discrete else algo.actor_dist, act=model.act, norm=model.norm,
                           min_std=algo.actor_min_std,
                           max_std=algo.get("actor_max_std", 1.0), unimix=model.unimix,
                           init_std=None if discrete else algo.get("actor_init_std"), linear_bias=linear_bias(model))

    def act(self, state: TensorDict, mode: str) -> torch.Tensor:
        feat = self.rssm.features(state)
        if mode == "eval":
            return self.actor.dist(feat).mode
        action = self.actor(feat)
        noise = self.cfg.get("explore_noise", 0.0)  # Dreamer V1's additive Gaussian exploration (continuous)
        if noise and not self.discrete:
            action = (action + noise * torch.randn_like(action)).clamp(-1, 1)
        return action

    def imagination_policy(self) -> nn.Module:
        """The policy `dream` imagines with: the actor."""
        return self.actor

    def dream(self, start: TensorDict) -> tuple[TensorDict, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Imagine `cfg.horizon` steps from `start` [N] with the actor in the loop: the trajectory
        [N, H] (with its actions), features [N, H+1, F] (the start first), predicted reward [N, H]
        and discount gamma * P(continue) [N, H] on arriving at each imagined state (P(continue) alone with
        `continue_label: discounted`, whose head learns gamma * P)."""
        traj = self.rssm.imagine(start, self.cfg.horizon, policy=self.imagination_policy())  # [N, H]
        feat = torch.cat([self.rssm.features(start).unsqueeze(1), self.rssm.features(traj)], 1)
        reward = self.world_model.reward(feat[:, 1:]).mean
        cont = self.world_model.continues(feat[:, 1:])
        if self.imagined_continue == "mode":  # the 2023 DreamerV3's flags, 0 or 1
            cont = (cont > 0.5).to(cont.dtype)
        discount = cont if self.continue_label == "discounted" else self.cfg.gamma * cont
        return traj, feat, reward, discount


def lambda_returns(reward: torch.Tensor, discount: torch.Tensor, value: torch.Tensor,
                   lam: float | torch.Tensor) -> torch.Tensor:
    """TD(lambda) returns of imagined trajectories.

    reward, discount [N, H]: received / gamma * P(continue) on arriving at state h+1;
    value [N, H+1]: of states 0..H; lam: a number, or [N, H] per arrival (0 where the return must
    not run on past state h+1: it bootstraps there fully). Returns [N, H], R_h for states 0..H-1,
    bootstrapped from v_H."""
    ret = value[:, -1]
    out = []
    for h in reversed(range(reward.shape[1])):
        lam_h = lam[:, h] if isinstance(lam, torch.Tensor) else lam
        ret = reward[:, h] + discount[:, h] * ((1 - lam_h) * value[:, h + 1] + lam_h * ret)
        out.append(ret)
    return torch.stack(out[::-1], 1)


def trajectory_weights(discount: torch.Tensor, start: torch.Tensor | None = None) -> torch.Tensor:
    """[N, H]: weight of state h = product of discounts before it, times `start` [N], the start
    state's own weight (None: 1)."""
    first = torch.ones_like(discount[:, :1]) if start is None else start.to(discount.dtype).unsqueeze(1)
    return torch.cumprod(torch.cat([first, discount[:, :-1]], 1), 1)
