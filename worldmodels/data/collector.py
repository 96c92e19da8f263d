"""`Collector`: steps a batched torchrl env with a recurrent policy and writes steps to replay.

Observations: `obs_key` names one key (the policy and replay see a tensor [N, ...]) or a list of
keys (they see a TensorDict [N] of those keys; replay stores it under "obs" the same way).
A policy is `policy(obs [N, ...], is_first [N], carry) -> (action [N, A], carry)`; `carry` is
whatever it needs between steps (the RSSM filter state and the previous action), None at the
start. The collector keeps it across `collect` calls, so a filter runs through whole episodes.
Episodes that end (terminated or truncated) are reset in place; the reset observation becomes a
step with `is_first=True`, and the step an episode ends on has `is_last=True`. Each env writes one
stream of steps across its episodes: `stream` (an id, new for every env at every `reset`, i.e. at
the start and after a resume) and `stream_step` (its position in that stream), from which replay
can cut sequences that run on from one episode into the next (`Replay(cross_episodes=True)`).
`collect` returns each ended episode's return, length and the step it ended at. With
`context(carry, n)`, every step also stores under "context" the entries it returns for the carry
its observation will be filtered from (`Agent.context_entries`; `carry=None`: zeros for `n` steps,
as at an episode start). Where the env adds the simulator state its frames were rendered from
(`RENDER_STATE`, envs/render_state.py), every step stores it too. `seconds` sums the host time of
the policy (acting, until its action is on the host), the env step and the replay writes, for the
trainer's time split (it clears it).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, ContextManager, NamedTuple

import torch
from tensordict import TensorDict
from torchrl.envs import EnvBase

from worldmodels.envs.render_state import RENDER_STATE

Policy = Callable[[torch.Tensor, torch.Tensor, Any], tuple[torch.Tensor, Any]]
ObsKey = str | tuple | list  # one key (str or nested tuple), or a list of them


def observation(td: TensorDict, obs_key: ObsKey):
    """The observation in `td` [N]: the tensor under one key, or a TensorDict [N] of a list of keys."""
    return td.select(*obs_key) if isinstance(obs_key, list) else td[obs_key]


def env_action(env: EnvBase, action: torch.Tensor) -> torch.Tensor:
    """The action as the env takes it: in the spec's dtype and, for bounded continuous actions,
    clipped to the spec's box. A policy's sample may leave the box (an unsquashed Gaussian, or
    exploration noise); the env gets it clipped and replay keeps the sample, as the reference's
    `ClipAction` wrapper does."""
    spec = env.action_spec
    if spec.domain == "continuous" and hasattr(spec, "space") and hasattr(spec.space, "low"):
        action = action.clamp(spec.space.low.to(action), spec.space.high.to(action))
    return action.to(spec.dtype)


class EpisodeEnd(NamedTuple):
    """An episode that ended during `Collector.collect`."""

    ret: float  # the sum of its rewards
    length: int  # agent steps
    at: int  # the index i of the collect step it ended on (0-based)


class Collector:
    """Args:
        env: a batched env [N] (`make_env`).
        obs_key: the observation key, or a list of keys (`env_info(env)["obs_key"]`).
        action_dim: action size A.
        add: called with each TensorDict [n] of new steps (`Replay.add`).
        atomic: a context manager factory around each env step with its writes (and the first reset):
            the trainer's `StopSignals.deferred`, so a stop signal never lands between a step and the
            replay write that records it, nor inside the write (default: no protection).
        context: `context(carry, n)` -> TensorDict [n] on the env device: the replay-context entries of
            the policy's carry (`ActingCopy.context`), stored with the step that carry will filter;
            None stores none.
    """

    def __init__(self, env: EnvBase, obs_key: ObsKey, action_dim: int, add: Callable[[TensorDict], None],
                 atomic: Callable[[], ContextManager] = contextlib.nullcontext,
                 context: Callable[[Any, int], TensorDict] | None = None):
        self.env, self.obs_key, self.action_dim, self.add, self.atomic = env, obs_key, action_dim, add, atomic
        self.context = context
        self.num_envs = env.batch_size[0]
        self.env_device = env.device if env.device is not None else torch.device("cpu")
        self.next_episode = 0  # global episode ids (kept in checkpoints so ids stay unique)
        self.next_stream = 0  # global stream ids (likewise)
        self.root: TensorDict | None = None  # the env's current root tensordict
        self.seconds = {"act": 0.0, "env": 0.0, "replay_add": 0.0}  # host seconds per phase, until cleared

    def _start_episodes(self, root: TensorDict, where: torch.Tensor) -> None:
        """Give new episodes to envs in `where` [N] (bool) and store their first observation."""
        count = int(where.sum())
        self.episode[where] = torch.arange(self.next_episode, self.next_episode + count)
        self.next_episode += count
        self.step[where] = 0
        self.ep_return[where] = 0.0
        obs = observation(root, self.obs_key)[where]
        context = self.context(None, count) if self.context is not None else None
        no = torch.zeros(count, dtype=torch.bool)
        self.add(self._record(obs, torch.zeros(count, self.action_dim), torch.zeros(count), ~no, no, no, where,
                              context, _render_state(root, where)))

    def _record(self, obs, action, reward, is_first, is_terminal, is_last, where, context=None,
                render_state=None) -> TensorDict:
        extra = {} if context is None else {"context": context}
        if render_state is not None:
            extra[RENDER_STATE] = render_state
        stream_step = self.stream_step[where].clone()
        self.stream_step[where] += 1
        return TensorDict({**extra,
            "obs": obs, "action": action.float(), "reward": reward.float(), "is_first": is_first,
            "is_terminal": is_terminal, "is_last": is_last, "episode": self.episode[where].clone(),
            "step": self.step[where].clone(), "stream": self.stream[where].clone(), "stream_step": stream_step,
        }, batch_size=[obs.shape[0]], device=self.env_device)  # a device: writing it to a replay on that
        # device copies nothing, where a device-less TensorDict is moved first, and tensordict's move waits
        # for all the work queued on the GPU (an update in flight) when CUDA is initialised

    def example_step(self) -> TensorDict:
        """One step [1] laid out as `collect` stores it (shapes and dtypes from the env's specs; no
        env step, nothing changes): what an empty replay is built from before loading saved steps."""
        fake = self.env.fake_tensordict()
        obs = observation(fake, self.obs_key)[:1]
        flag = torch.zeros(1, dtype=torch.bool)
        extra = {} if self.context is None else {"context": self.context(None, 1)}
        if RENDER_STATE in fake.keys():
            extra[RENDER_STATE] = fake[RENDER_STATE][:1]
        index = {k: torch.zeros(1, dtype=torch.long) for k in ("episode", "step", "stream", "stream_step")}
        return TensorDict({**extra,
            "obs": obs, "action": torch.zeros(1, self.action_dim), "reward": torch.zeros(1), "is_first": ~flag,
            "is_terminal": flag, "is_last": flag, **index,
        }, batch_size=[1], device=self.env_device)

    def reset(self) -> None:
        n = self.num_envs
        self.episode = torch.zeros(n, dtype=torch.long)
        self.step = torch.zeros(n, dtype=torch.long)
        self.ep_return = torch.zeros(n)
        self.stream = torch.arange(self.next_stream, self.next_stream + n)
        self.next_stream += n
        self.stream_step = torch.zeros(n, dtype=torch.long)
        self.carry = None
        self.root = self.env.reset()
        self.is_first = torch.ones(n, dtype=torch.bool)
        self._start_episodes(self.root, torch.ones(n, dtype=torch.bool))

    @torch.no_grad()
    def collect(self, policy: Policy, steps: int, between: Callable[[int], None] | None = None,
                after: Callable[[int], None] | None = None) -> list[EpisodeEnd]:
        """Run `steps` env steps (each of all N envs); returns the episodes that ended.

        `between(i)`, if given, runs after step i's action is on the host and before the envs step:
        work queued on the device there (a training update) runs while the envs step on the CPU.
        `after(i)`, if given, runs once step i is in the replay, inside the same `atomic` block."""
        if self.root is None:
            with self.atomic():
                self.reset()
        finished: list[EpisodeEnd] = []
        everywhere = torch.ones(self.num_envs, dtype=torch.bool)
        clock, seconds = time.perf_counter, self.seconds
        for i in range(steps):
            t0 = clock()
            action, self.carry = policy(observation(self.root, self.obs_key), self.is_first, self.carry)
            action = action.to(self.env_device)  # wait for the action now, before `between` queues more work
            context = self.context(self.carry, self.num_envs) if self.context is not None else None
            seconds["act"] += clock() - t0
            if between is not None:
                between(i)
            with self.atomic():
                t1 = clock()
                self.root["action"] = env_action(self.env, action)
                out, next_root = self.env.step_and_maybe_reset(self.root)
                t2 = clock()
                seconds["env"] += t2 - t1
                nxt = out["next"]
                reward = nxt["reward"].reshape(-1)
                self.step += 1
                self.ep_return += reward
                done = nxt["done"].reshape(-1)
                self.add(self._record(observation(nxt, self.obs_key), action, reward, torch.zeros_like(everywhere),
                                      nxt["terminated"].reshape(-1), done, everywhere, context,
                                      _render_state(nxt, everywhere)))
                finished += [EpisodeEnd(r, n, i)
                             for r, n in zip(self.ep_return[done].tolist(), self.step[done].tolist())]
                self.is_first = done.clone()
                self.root = next_root
                if done.any():
                    self._start_episodes(next_root, done)
                if after is not None:
                    after(i)
                seconds["replay_add"] += clock() - t2  # the writes and their bookkeeping
        return finished

    def state_dict(self) -> dict:
        return {"next_episode": self.next_episode, "next_stream": self.next_stream}

    def load_state_dict(self, state: dict) -> None:
        """Restore the id counters; the envs restart fresh episodes (and streams) on the next `collect`.
        A checkpoint from before streams: replay reads its steps as one stream per episode
        (`Replay.load`), so new stream ids start past its episode ids."""
        self.next_episode = state["next_episode"]
        self.next_stream = state.get("next_stream", self.next_episode)
        self.root = None


def _render_state(td: TensorDict, where: torch.Tensor) -> torch.Tensor | None:
    """The envs in `where`'s `RENDER_STATE` entries, if the env gives them."""
    return td[RENDER_STATE][where] if RENDER_STATE in td.keys() else None


@torch.no_grad()
def evaluate(env: EnvBase, obs_key: ObsKey, policy: Policy,
             on_step: Callable[[TensorDict, torch.Tensor], None] | None = None) -> list[float]:
    """One episode in each of the env's N copies with `policy`; returns the N episode returns.
    `on_step(td, running)`, if given, sees the reset tensordict [N] and then every step's
    "next" tensordict [N], with `running` [N] (bool) marking the envs still in their episode."""
    n = env.batch_size[0]
    root = env.reset()
    is_first = torch.ones(n, dtype=torch.bool)
    returns, running = torch.zeros(n), torch.ones(n, dtype=torch.bool)
    if on_step is not None:
        on_step(root, running.clone())
    carry = None
    while running.any():
        action, carry = policy(observation(root, obs_key), is_first, carry)
        root["action"] = env_action(env, action)
        out, root = env.step_and_maybe_reset(root)  # envs that finish early restart; ignored below
        returns += out["next", "reward"].reshape(-1) * running
        if on_step is not None:
            on_step(out["next"], running.clone())
        is_first = out["next", "done"].reshape(-1).clone()
        running &= ~is_first
    return returns.tolist()
