"""`ActingCopy`: the collector acts with a copy of the agent a few updates behind the learner.

On CPU the copy's semantics are checked directly: its own storage, no optimisers, empty graph
caches; after `refresh` + an update it acts as the learner did before that update; `refresh`
alone makes it equal; disabled it is the learner; the trainer refreshes it once per batch of owed
updates. With WORLDMODELS_TEST_DEVICE=cuda: acting and batch moves return while an update is still
running on the learner's stream, and see the right weights.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests._train_config import run_config
from tests.algos.test_graphed_policy import observations, run_episode
from tests.train.test_graphed_update import DEVICE, make_agent, make_batch
from worldmodels.train.acting import ActingCopy
from worldmodels.train.trainer import Trainer


def weights(agent):
    return [t.detach().clone() for t in (*agent.parameters(), *agent.buffers())]


@pytest.mark.parametrize("algo", ["dreamer_v3", "planet"])
def test_the_copy_acts_one_update_behind(algo):
    agent = make_agent(algo, device="cpu")
    acting = ActingCopy(agent)
    assert acting.agent is not agent
    live = {t.data_ptr() for t in (*agent.parameters(), *agent.buffers())}
    assert not live & {t.data_ptr() for t in (*acting.agent.parameters(), *acting.agent.buffers())}
    obs, first = observations(4, 2, "cpu")
    before = copy.deepcopy(agent)
    for seed in (1, 2):  # two updates: the copy trails by one after each
        acting.refresh()
        agent.update(make_batch(seed, device="cpu"))
        want, _ = run_episode(before.policy("eval"), obs, first, 0)
        got, _ = run_episode(acting.policy("eval"), obs, first, 0)
        fresh, _ = run_episode(agent.policy("eval"), obs, first, 0)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        assert not all(torch.equal(a, b) for a, b in zip(got, fresh)), "the update changed no action"
        before = copy.deepcopy(agent)
    acting.refresh()
    assert all(torch.equal(a, b) for a, b in zip(weights(acting.agent), weights(agent)))
    assert int(acting.agent.updates) == int(agent.updates) == 2


def test_the_copy_holds_no_optimisers_gradients_or_captures(graphs_on_cpu):
    agent = make_agent("dreamer_v3", device="cpu")
    run_episode(agent.policy("explore", graphed=True), *observations(2, 2, "cpu"), 0)
    assert len(agent.policy_graphs) == 1
    acting = ActingCopy(agent)
    assert len(acting.agent.policy_graphs) == 0 and len(acting.agent.rssm.unroll_cache) == 0
    assert not any(p.requires_grad for p in acting.agent.parameters())
    assert all(getattr(acting.agent, name) is None for name in ("wm_opt", "actor_opt", "critic_opt"))


def test_disabled_acts_with_the_learner():
    agent = make_agent("dreamer_v3", device="cpu")
    acting = ActingCopy(agent, enabled=False)
    assert acting.agent is agent and acting.stream is None
    before = weights(agent)
    acting.refresh()
    assert all(torch.equal(a, b) for a, b in zip(weights(agent), before))
    batch = make_batch(0, device="cpu")
    assert torch.equal(acting.to_device(batch, torch.device("cpu"))["obs"], batch["obs"])


def test_the_trainer_refreshes_the_copy_once_per_batch_of_owed_updates(tmp_path):
    """The updates owed at one env step run back to back, queued behind each other; the copy takes
    the weights once, before them (a refresh before each update would make the host wait for the
    update before it on CUDA). So after `train_owed` the copy holds the weights from before its updates."""
    trainer = Trainer(run_config(tmp_path, "train_ratio=32"))
    c = trainer.counters
    while c["env_steps"] < trainer.cfg.prefill or not trainer.replay.ready():
        trainer.collect()  # random actions, no updates
    assert c["updates"] == 0
    c["env_steps"] += 4  # owes several updates at once
    refreshes = []
    refresh = trainer.acting.refresh
    trainer.acting.refresh = lambda: (refreshes.append(c["updates"]), refresh())[1]
    before = weights(trainer.agent)
    trainer.train_owed()
    assert c["updates"] >= 3 and refreshes == [0]
    assert all(torch.equal(a, b) for a, b in zip(weights(trainer.acting.agent), before))
    assert not all(torch.equal(a, b) for a, b in zip(weights(trainer.agent), before))


CUDA = pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA streams: set WORLDMODELS_TEST_DEVICE=cuda on a GPU "
                                                        "machine (the copy's semantics are covered on CPU above)")


@CUDA
@pytest.mark.parametrize("graphed", [False, True])
def test_acting_does_not_wait_for_the_learners_stream(graphed):
    import time

    agent = make_agent("dreamer_v3", backend="triton")
    acting = ActingCopy(agent)
    obs, first = observations(3, 2, "cpu")
    policy = acting.policy("explore", graphed=graphed)
    run_episode(policy, obs, first, 0)  # warm (and captured)
    batch = make_batch(0, device="cpu").pin_memory()  # as Replay.sample(pin_memory=True) gives it
    acting.to_device(batch, DEVICE)
    acting.refresh()
    torch.cuda.synchronize()
    done = torch.cuda.Event()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time on the learner's stream: an update in flight
    done.record()
    host, carry = {}, None
    for t, (o, f) in enumerate(zip(obs, first)):  # no reseeding here: only acting and the batch move
        t0 = time.perf_counter()
        action, carry = policy(o, f, carry)
        host[f"policy step {t}"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    moved = acting.to_device(batch, DEVICE)
    host["to_device"] = time.perf_counter() - t0
    waited = done.query()
    assert not waited, f"acting or the batch move waited for the learner's stream; host seconds: {host}"
    assert action.device.type == "cpu" and action.shape == (2, 2)
    torch.testing.assert_close(moved["obs"].cpu(), batch["obs"])
    torch.cuda.synchronize()


@CUDA
def test_the_acting_stream_outranks_the_learners():
    acting = ActingCopy(make_agent("dreamer_v3", backend="triton"))
    assert acting.stream.priority < torch.cuda.current_stream().priority  # lower is higher in CUDA


@CUDA
def test_after_refresh_on_cuda_the_copy_acts_as_the_learner_did_before_its_update():
    agent = make_agent("dreamer_v3", backend="triton")
    acting = ActingCopy(agent)
    obs, first = observations(3, 2, DEVICE)
    run_episode(acting.policy("eval", graphed=True), obs, first, 0)  # warm-up and capture draw noise of their own
    acting.refresh()
    before = copy.deepcopy(agent)
    agent.update(make_batch(1))
    want, _ = run_episode(before.policy("eval"), obs, first, 0)
    got, _ = run_episode(acting.policy("eval", graphed=True), obs, first, 0)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b.cpu(), rtol=1e-4, atol=1e-5)
