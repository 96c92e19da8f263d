"""Replay context (`algo.replay_context`, DreamerV3's `replay_context: 1`): replay stores with every
step the filter state its observation was filtered from; an update filters its sequence from the
stored state of its first step and writes its own posteriors back (algos/agent.py, data/collector.py,
data/replay.py, train/context_write_back.py, train/graphed_update.py, train/trainer.py)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tests._train_config import run_config
from tests.data.test_replay import interleaved
from tests.envs.test_env_factory import env_cfg
from tests.train.test_graphed_update import ReplayedOnCpu, make_agent, make_batch
from worldmodels.data import Collector, Replay
from worldmodels.envs import make_env
from worldmodels.train.context_write_back import ContextWriteBack
from worldmodels.train.graphed_update import GraphedUpdate
from worldmodels.train.trainer import Trainer


def with_context(agent, batch: TensorDict, start: TensorDict | None = None) -> TensorDict:
    """`batch` [B, T] with a "context" key: zeros, or the entries of `start` [B] at step 0."""
    B, T = batch.batch_size
    context = agent.context_entries(None, B * T).reshape(B, T)
    if start is not None:
        context[:, 0] = agent.context_entries(start)
    batch = batch.clone()
    batch["context"] = context
    return batch


@pytest.mark.parametrize("algo", ["dreamer_v3", "planet"])
def test_entries_hold_the_state_a_sequence_starts_from(algo):
    """Categorical latents are stored as class indices (exact: a sample is one-hot), deter and
    Gaussian latents in bfloat16; `context_start` gives back the state in the model's dtype."""
    agent = make_agent(algo, device="cpu")
    batch = make_batch(0, device="cpu")
    _, post, _ = agent.world_model.loss(batch)
    state = post[:, -1].select("deter", "stoch")
    entries = agent.context_entries(state)
    assert entries["deter"].dtype == torch.bfloat16
    assert entries["stoch"].dtype == (torch.int16 if algo == "dreamer_v3" else torch.bfloat16)
    start = agent.context_start(with_context(agent, batch, state))
    assert start["deter"].dtype == state["deter"].dtype
    torch.testing.assert_close(start["deter"], state["deter"], rtol=1e-2, atol=1e-2)
    if algo == "dreamer_v3":  # the straight-through sample is one-hot up to float rounding
        torch.testing.assert_close(start["stoch"], state["stoch"].detach(), rtol=0, atol=1e-6)
    else:
        torch.testing.assert_close(start["stoch"], state["stoch"], rtol=1e-2, atol=1e-2)
    zeros = agent.context_entries(None, 4)
    assert zeros.batch_size == (4,) and not zeros["deter"].any() and not zeros["stoch"].any()
    assert agent.context_start(batch) is None  # a batch without context starts from zeros


def test_a_sequence_cut_mid_episode_is_filtered_from_the_stored_state():
    """The second half of an episode, trained with the stored state of the step before it, sees at its
    first step the deter that filtering the whole episode gives there; from zeros it does not."""
    agent = make_agent("dreamer_v3", device="cpu")
    whole = make_batch(1, batch=3, steps=12, device="cpu")
    whole["is_first"][:] = False
    whole["is_first"][:, 0] = True
    with torch.no_grad():
        _, post, _ = agent.world_model.loss(whole)
        half = with_context(agent, whole[:, 6:], post[:, 5].select("deter", "stoch"))
        _, resumed, _ = agent.world_model.loss(half, agent.context_start(half))
        _, from_zeros, _ = agent.world_model.loss(whole[:, 6:])
    want = post["deter"][:, 6]
    torch.testing.assert_close(resumed["deter"][:, 0], want, rtol=0, atol=3e-2)
    assert (from_zeros["deter"][:, 0] - want).abs().max() > 0.2


@pytest.mark.parametrize("algo", ["dreamer_v3", "dreamer_v1", "planet"])
def test_an_update_leaves_its_posteriors_for_the_steps_after_them(algo):
    """`context_out` [B, T-1]: the entries of the posteriors of steps 0..T-2, written back at steps
    1..T-1 (the state each of those is filtered from), zeros where one of those is an episode's first
    step; None for a batch without context."""
    agent = make_agent(algo, device="cpu")
    batch = make_batch(2, device="cpu")
    agent.update(batch)
    assert agent.context_out is None
    batch = with_context(agent, batch)
    seen = {}
    loss = agent.world_model.loss

    def keep_post(*args):
        out = loss(*args)
        seen["post"] = out[1]
        return out

    agent.world_model.loss = keep_post
    agent.update(batch)
    want = agent.context_entries(seen["post"][:, :-1])
    starts = batch["is_first"][:, 1:]
    assert starts.any()
    want[starts] = agent.context_entries(None, int(starts.sum()))
    assert agent.context_out.batch_size == (3, 5)
    for key in ("deter", "stoch"):
        assert torch.equal(agent.context_out[key], want[key]), key


def test_a_graphed_update_gives_the_context_of_the_update_it_replayed():
    eager, graphed = make_agent(device="cpu"), make_agent(device="cpu")
    update = ReplayedOnCpu(graphed, warmup=1)
    for i in range(3):
        batch = with_context(eager, make_batch(i, device="cpu"))
        torch.manual_seed(i)
        eager.update(batch)
        torch.manual_seed(i)
        update(batch.clone())
        assert torch.equal(update.context["deter"], eager.context_out["deter"]), i
        assert torch.equal(update.context["stoch"], eager.context_out["stoch"]), i
    assert update.replay is not None


def test_the_collector_stores_the_state_each_step_is_filtered_from():
    """Each step stores the entries of the carry the policy left after the step before (zeros at an
    episode start): here the carry counts the policy's calls in each env."""
    env = make_env(env_cfg("pendulum", time_limit=3, action_repeat=1), seed=0)
    written = []

    def policy(obs, is_first, carry):
        calls = torch.zeros(obs.shape[0]) if carry is None else carry
        return torch.zeros(obs.shape[0], 1), calls + 1

    def context(carry, n):
        value = torch.zeros(n) if carry is None else carry
        return TensorDict({"calls": value}, batch_size=[n])

    collector = Collector(env, "observation", 1, written.append, context=context)
    assert "context" in collector.example_step().keys()
    collector.collect(policy, 7)
    data = torch.cat(written)
    for episode in data["episode"].unique():
        ep = data[data["episode"] == episode]
        first_call = ep["context"]["calls"][1]
        assert ep["context"]["calls"][0] == 0  # the reset step: zeros
        # then one more call per step: the carry the step's observation will be filtered from
        assert torch.equal(ep["context"]["calls"][1:], first_call + torch.arange(len(ep) - 1)), episode


def test_replay_writes_back_only_where_the_sampled_step_still_lives(tmp_path):
    data = interleaved((0, 8), (1, 8))
    data["context"] = TensorDict({"deter": torch.zeros(16, 2)}, batch_size=[16])
    replay = Replay(capacity=16, batch_size=2, seq_len=4)
    replay.add(data)
    batch, slots = replay.sample(with_slots=True)
    assert torch.equal(replay.buffer.storage._storage["obs"][slots], batch["obs"])
    episode, step = batch["episode"].clone(), batch["step"].clone()
    step[0, 0] += 100  # as if this slot had been reused by another step since the sample
    values = TensorDict({"context": {"deter": torch.ones(2, 4, 2)}}, batch_size=[2, 4])
    assert replay.write(slots, episode, step, values) == 7
    stored = replay.buffer.storage._storage["context", "deter"]
    assert (stored[slots.flatten()[1:]] == 1).all() and (stored[slots[0, 0]] == 0).all()
    # entries are a cache of the model's posteriors: a checkpoint leaves them out, a load gives zeros
    replay.save(tmp_path / "replay")
    assert not any("context" in p.name for p in (tmp_path / "replay" / "steps").iterdir())
    fresh = Replay(capacity=16, batch_size=2, seq_len=4)
    fresh.load(tmp_path / "replay", example=data[:1], size=16)
    assert not fresh.buffer.storage._storage["context", "deter"].any()
    assert torch.equal(fresh.buffer.storage._storage["obs"][:16], replay.buffer.storage._storage["obs"][:16])


def test_write_back_off_cuda_writes_at_once_and_refuses_a_bad_depth():
    data = interleaved((0, 6))
    data["context"] = TensorDict({"deter": torch.zeros(6, 3)}, batch_size=[6])
    replay = Replay(capacity=6, batch_size=1, seq_len=6)
    replay.add(data)
    batch, slots = replay.sample(with_slots=True)
    write_back = ContextWriteBack(replay)
    write_back.push(TensorDict({"deter": torch.arange(15.0).reshape(1, 5, 3)}, batch_size=[1, 5]),
                    slots, batch["episode"], batch["step"])
    stored = replay.buffer.storage._storage["context", "deter"]
    assert write_back.written == 5 and not write_back.pending
    assert torch.equal(stored[slots[0, 1:]], torch.arange(15.0).reshape(5, 3)) and not stored[slots[0, 0]].any()
    with pytest.raises(ValueError, match="depth=0"):
        ContextWriteBack(replay, depth=0)


@pytest.mark.parametrize("cross", [False, True], ids=["within-episodes", "across-episodes"])
def test_a_run_with_replay_context_stores_trains_from_and_rewrites_the_states(tmp_path, monkeypatch, cross):
    """Also with sequences that run on across episode ends (the presets' `replay.cross_episodes`):
    episodes of 10 agent steps here (11 stored), sequences of 8."""
    cfg = run_config(tmp_path, "env=pendulum", "algo=dreamer_v3", "steps=160", "algo.replay_context=true",
                     "env.time_limit=10", f"replay.cross_episodes={str(cross).lower()}")
    trainer = Trainer(cfg)
    starts, resets_inside = [], []
    loss = trainer.agent.world_model.loss

    def record_start(batch, start=None):
        starts.append(start)
        resets_inside.append(bool(batch["is_first"][:, 1:].any()))
        return loss(batch, start)

    monkeypatch.setattr(trainer.agent.world_model, "loss", record_start)
    collect, acted = trainer.collect, []  # replay's size when the agent starts acting (after prefill)

    def collect_and_note(**kwargs):
        if not acted and trainer.counters["env_steps"] >= cfg.prefill:
            acted.append(len(trainer.replay))
        return collect(**kwargs)

    monkeypatch.setattr(trainer, "collect", collect_and_note)
    trainer.train()
    assert starts and all(s is not None for s in starts)
    assert any(resets_inside) == cross
    stored = trainer.replay.buffer.storage._storage[: len(trainer.replay)]
    first = stored["is_first"]
    assert not stored["context", "deter"][first].any()  # episode starts: zeros
    acting = ~first & (torch.arange(len(first)) >= acted[0])
    assert acting.sum() > 20 and stored["context", "deter"][acting].abs().sum(-1).gt(0).all()  # every other: a state
    assert trainer.write_back.written > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA graph's outputs and the pinned write-back "
                    "need a GPU (their composition is covered on CPU above)")
def test_on_cuda_the_graphed_update_context_is_written_back_after_its_update():
    """The real capture: `GraphedUpdate.context` equals the eager update's entries, and the write-back
    copies them to the host behind the update and writes them once they have arrived."""
    eager, graphed = make_agent(device="cuda"), make_agent(device="cuda")
    update = GraphedUpdate(graphed, warmup=1)
    data = interleaved((0, 8), (1, 8))
    data["context"] = eager.context_entries(None, 16).cpu()
    replay = Replay(capacity=16, batch_size=1, seq_len=4)  # one sequence: no slot written twice in a batch
    replay.add(data.exclude("pixels").set("obs", torch.randn(16, 5)).set("action", torch.rand(16, 2))
               .set("reward", torch.randn(16)).set("is_terminal", torch.zeros(16, dtype=torch.bool)))
    write_back = ContextWriteBack(replay, depth=2)
    for i in range(4):
        host, slots = replay.sample(pin_memory=True, with_slots=True)
        batch = host.to("cuda")
        torch.manual_seed(i)
        eager.update(batch)
        torch.manual_seed(i)
        update(batch.clone())
        torch.testing.assert_close(update.context["deter"].float(), eager.context_out["deter"].float(),
                                   rtol=1e-2, atol=1e-2)
        want = update.context.clone()
        write_back.push(update.context, slots, host["episode"], host["step"])
        torch.cuda.synchronize()
        write_back.flush()
        stored = replay.buffer.storage._storage
        assert torch.equal(stored["context", "deter"][slots[:, 1:].flatten()], want["deter"].cpu().flatten(0, 1))
    assert update.captures == 1 and write_back.written == 4 * 3
