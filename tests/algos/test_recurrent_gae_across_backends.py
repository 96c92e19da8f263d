"""A PPO-style recurrent critic: an LSTM value function over rollouts with episode resets.

The rollout is collected step by step (recurrent mode "step", the way a collector runs a policy)
and the critic is trained on whole sequences; values, GAE advantages and the gradients of a
clipped PPO value loss must not depend on the backend that ran the sequence.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import worldmodels
from worldmodels.core import recurrent_mode

B, T, OBS, HIDDEN = 3, 6, 3, 5
GAMMA, LAMBDA, CLIP = 0.99, 0.95, 0.2


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = worldmodels.LSTM(OBS, HIDDEN)
        self.value = nn.Linear(HIDDEN, 1)

    def forward(self, obs, hx=None, is_init=None, backend=None):
        features, hx = self.lstm(obs, hx, is_init, backend=backend)
        return self.value(features).squeeze(-1), hx


def gae(rewards, values, dones, last_value, gamma=GAMMA, lam=LAMBDA):
    """Generalised advantage estimation over [B, T]; `dones[:, t]` ends the episode after step t,
    so neither the next value nor later advantages flow back across it."""
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(last_value)
    for t in reversed(range(rewards.shape[1])):
        next_value = last_value if t == rewards.shape[1] - 1 else values[:, t + 1]
        alive = 1.0 - dones[:, t].to(rewards.dtype)
        delta = rewards[:, t] + gamma * next_value * alive - values[:, t]
        running = delta + gamma * lam * alive * running
        advantages[:, t] = running
    return advantages, advantages + values


def value_loss(values, old_values, returns):
    """PPO's clipped value loss."""
    clipped = old_values + (values - old_values).clamp(-CLIP, CLIP)
    return 0.5 * torch.maximum((values - returns).square(), (clipped - returns).square()).mean()


@pytest.fixture
def rollout():
    """Observations for T steps plus the bootstrap step, rewards, done flags and the critic's
    recurrent state carried in from the previous rollout."""
    dones = torch.zeros(B, T, dtype=torch.bool)
    dones[0, 1] = dones[0, 4] = dones[1, 2] = dones[2, T - 1] = True
    first = torch.zeros(B, T + 1, dtype=torch.bool)
    first[:, 1:] = dones  # a new episode starts after each done
    first[1, 0] = True  # env 1 was reset at the rollout boundary
    return {
        "obs": torch.randn(B, T + 1, OBS),
        "rewards": torch.randn(B, T),
        "dones": dones,
        "is_init": first,
        "hx": (torch.randn(1, B, HIDDEN), torch.randn(1, B, HIDDEN)),
    }


def collect_values(critic, rollout):
    """The values a collector records: the critic run one step at a time, no gradients."""
    hx, values = rollout["hx"], []
    with torch.no_grad(), recurrent_mode("step"):
        for t in range(T + 1):
            value, hx = critic(rollout["obs"][:, t], hx, rollout["is_init"][:, t], backend="loop")
            values.append(value)
    return torch.stack(values, 1)


def learner_update(critic, rollout, old_values, backend):
    """Values on the whole sequence, GAE from them, and the value loss's parameter gradients."""
    values, _ = critic(rollout["obs"], rollout["hx"], rollout["is_init"], backend=backend)
    advantages, returns = gae(rollout["rewards"], values[:, :T].detach(), rollout["dones"], values[:, T].detach())
    loss = value_loss(values[:, :T], old_values[:, :T], returns)
    grads = torch.autograd.grad(loss, list(critic.parameters()))
    return values.detach(), advantages, returns, loss.detach(), grads


def test_gae_respects_episode_ends():
    rewards, values = torch.randn(2, 4), torch.randn(2, 4)
    dones = torch.tensor([[False, True, False, True], [False, False, False, False]])
    last_value = torch.randn(2)
    advantages, returns = gae(rewards, values, dones, last_value)
    ends = dones.nonzero(as_tuple=True)
    torch.testing.assert_close(advantages[ends], (rewards - values)[ends])  # no bootstrap at an end
    torch.testing.assert_close(returns, advantages + values)
    # without episode ends, lambda = 1 and gamma = 1 give the undiscounted return-to-go
    full, _ = gae(rewards, values, torch.zeros_like(dones), last_value, gamma=1.0, lam=1.0)
    to_go = rewards.flip(1).cumsum(1).flip(1) + last_value[:, None]
    torch.testing.assert_close(full, to_go - values)


def test_step_collection_equals_sequence_values(rollout):
    critic = Critic()
    collected = collect_values(critic, rollout)
    with torch.no_grad():
        sequence, _ = critic(rollout["obs"], rollout["hx"], rollout["is_init"], backend="loop")
        unreset, _ = critic(rollout["obs"], rollout["hx"], backend="loop")
    torch.testing.assert_close(collected, sequence)
    assert not torch.allclose(sequence, unreset)  # the episode resets change the values


@pytest.mark.parametrize("backend", ["scan", "cudnn"])
def test_ppo_value_update_is_backend_independent(rollout, backend):
    critic = Critic()
    old_values = collect_values(critic, rollout) + 0.3 * torch.randn(B, T + 1)  # a stale critic
    expected = learner_update(critic, rollout, old_values, "loop")
    actual = learner_update(critic, rollout, old_values, backend)
    names = ["values", "advantages", "returns", "loss"]
    for name, a, e in zip(names, actual[:4], expected[:4]):
        torch.testing.assert_close(a, e, msg=lambda m, name=name: f"{name}: {m}")
    for (name, _), a, e in zip(critic.named_parameters(), actual[4], expected[4]):
        torch.testing.assert_close(a, e, msg=lambda m, name=name: f"grad of {name}: {m}")
    assert all(g.abs().sum() > 0 for g in actual[4])
