"""`Agent.policy(mode, graphed=True)`: each acting step replayed from a CUDA graph.

On CPU a stand-in for `GraphedUnroll` (the `graphs_on_cpu` fixture, tests/_graphs.py) runs the
function it would capture, so the composition (inputs flattened, a TensorDict of observation keys
rebuilt, the carry threaded, one capture per mode and shape) is checked against the eager policy.
With WORLDMODELS_TEST_DEVICE=cuda the real capture runs for every algorithm and both acting modes.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tests._graphs import EagerGraph
from tests.train.test_graphed_update import DEVICE, make_agent


def run_episode(policy, obs_seq, is_first_seq, seed0):
    carry, actions = None, []
    for t, (obs, first) in enumerate(zip(obs_seq, is_first_seq)):
        torch.manual_seed(seed0 + t)
        action, carry = policy(obs, first, carry)
        actions.append(action)
    return actions, carry


def observations(steps, n, device, keyed=False):
    gen = torch.Generator().manual_seed(0)
    obs = [torch.randn(n, 5, generator=gen).to(device) for _ in range(steps)]
    first = [torch.tensor([t == 0 or (t == 3 and i == 0) for i in range(n)], device=device) for t in range(steps)]
    if keyed:
        obs = [TensorDict({"pos": o[:, :3], "vel": o[:, 3:]}, batch_size=[n]) for o in obs]
    return obs, first


@pytest.mark.parametrize("algo", ["dreamer_v3", "planet"])
@pytest.mark.parametrize("mode", ["explore", "eval"])
def test_graphed_policy_composes_like_the_eager_one(algo, mode, graphs_on_cpu):
    agent = make_agent(algo, device="cpu")
    obs, first = observations(6, 3, "cpu")
    want, want_carry = run_episode(agent.policy(mode), obs, first, 10)
    got, got_carry = run_episode(agent.policy(mode, graphed=True), obs, first, 10)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(got_carry[0]["deter"], want_carry[0]["deter"])
    assert EagerGraph.made == 1 and len(agent.policy_graphs) == 1


def test_graphed_policy_takes_several_observation_keys(graphs_on_cpu):
    model_obs = {"pos": (3,), "vel": (2,)}
    from omegaconf import OmegaConf

    from tests.train.test_graphed_update import CONFIGS
    from worldmodels.algos import ALGOS
    torch.manual_seed(0)
    agent = ALGOS["dreamer_v3"](model_obs, 2, False, OmegaConf.load(CONFIGS / "model" / "tiny.yaml"),
                                OmegaConf.load(CONFIGS / "algo" / "dreamer_v3.yaml"), backend="loop")
    obs, first = observations(4, 2, "cpu", keyed=True)
    want, _ = run_episode(agent.policy("explore"), obs, first, 0)
    got, _ = run_episode(agent.policy("explore", graphed=True), obs, first, 0)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    policy = agent.policy("eval", graphed=True)  # another mode and batch size: another capture
    run_episode(policy, *observations(2, 5, "cpu", keyed=True), 0)
    assert EagerGraph.made == 2


@pytest.mark.skipif(DEVICE.type != "cuda", reason="captures a CUDA graph: set WORLDMODELS_TEST_DEVICE=cuda on a GPU "
                                                  "machine (the composition is covered on CPU above)")
@pytest.mark.parametrize("algo", ["dreamer_v3", "dreamer_v3_2023", "dreamer_v1", "planet"])
@pytest.mark.parametrize("mode", ["explore", "eval"])
def test_cuda_graph_policy_equals_eager(algo, mode):
    agent = make_agent(algo, backend="triton")
    obs, first = observations(6, 3, DEVICE)
    graphed = agent.policy(mode, graphed=True)
    run_episode(graphed, obs[:1], first[:1], 0)  # warm-up and capture draw noise of their own
    want, want_carry = run_episode(agent.policy(mode), obs, first, 10)
    got, got_carry = run_episode(graphed, obs, first, 10)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_carry[0]["deter"], want_carry[0]["deter"], rtol=1e-4, atol=1e-5)
    assert len(agent.policy_graphs) == 1
