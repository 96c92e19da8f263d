"""Replay: slices stay inside one episode with interleaved envs and are drawn uniformly over the stored
sequences (the sequence index against brute force); uint8; budget; memmap; save/load."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tests.envs.test_env_factory import env_cfg, suite_cfg
from worldmodels.data import Collector, Replay, ReplayError
from worldmodels.data.sequence_index import SequenceIndex
from worldmodels.envs import make_env


def steps(episode: int, start: int, count: int) -> TensorDict:
    index = torch.arange(start, start + count)
    return TensorDict({
        "obs": (episode * 1000 + index).unsqueeze(-1).float(),
        "pixels": torch.full((count, 3, 4, 4), episode, dtype=torch.uint8),
        "is_first": index == 0, "episode": torch.full((count,), episode), "step": index,
    }, batch_size=[count])


def interleaved(*episodes: tuple[int, int]) -> TensorDict:
    """Steps of several episodes written one step each in turn, as several envs do."""
    parts = [steps(ep, 0, length) for ep, length in episodes]
    rows = [part[t] for t in range(max(len(p) for p in parts)) for part in parts if t < len(part)]
    return torch.stack(rows)


def test_slices_never_cross_episodes():
    replay = Replay(capacity=10_000, batch_size=64, seq_len=6)
    replay.add(interleaved((0, 30), (1, 20), (2, 9)))
    replay.add(interleaved((3, 4)))  # shorter than a slice: never sampled
    for _ in range(10):
        batch = replay.sample()
        assert batch.shape == (64, 6)
        episode = batch["episode"]
        assert (episode == episode[:, :1]).all()
        assert (batch["step"].diff(dim=1) == 1).all()  # consecutive steps of that episode
        assert (batch["obs"].squeeze(-1) == episode * 1000 + batch["step"]).all()
        assert not (episode == 3).any()
        assert batch["pixels"].dtype == torch.uint8
        assert (batch["is_first"] == (batch["step"] == 0)).all()


def stored_sequences(replay: Replay) -> set[tuple[int, ...]]:
    """Brute force from the storage's columns: the slots of every T consecutive steps of one
    trajectory stored (time order), whatever the index knows."""
    stored = replay.buffer.storage._storage[: len(replay)]
    where = {(t, p): slot for slot, (t, p) in enumerate(zip(stored[replay.traj_key].tolist(),
                                                            stored[replay.step_key].tolist()))}
    T = replay.seq_len
    return {tuple(where[(t, p - T + 1 + k)] for k in range(T)) for (t, p) in where
            if all((t, p - k) in where for k in range(1, T))}


def index_sequences(replay: Replay) -> set[tuple[int, ...]]:
    """Every sequence the replay's index can draw."""
    steps = replay.buffer.storage._storage
    slots = replay.index.sequences(len(replay), steps[replay.traj_key], steps[replay.step_key])
    return set(map(tuple, slots.tolist()))


def sampled_sequences(replay: Replay, batches: int) -> set[tuple[int, ...]]:
    seen = set()
    for _ in range(batches):
        batch, slots = replay.sample(with_slots=True)
        assert (batch[replay.traj_key] == batch[replay.traj_key][:, :1]).all()
        assert (batch[replay.step_key].diff(dim=1) == 1).all()
        seen |= set(map(tuple, slots.tolist()))
    return seen


def as_keys(replay: Replay, sequences: set[tuple[int, ...]]) -> set[tuple[int, int]]:
    """(trajectory, first position) of each sequence of slots: comparable across replays."""
    stored = replay.buffer.storage._storage
    traj, pos = stored[replay.traj_key], stored[replay.step_key]
    return {(int(traj[seq[0]]), int(pos[seq[0]])) for seq in sequences}


def test_after_the_ring_wrapped_every_stored_sequence_and_nothing_else_is_drawn():
    """125 steps of 3 interleaved episodes into 100 slots: the sequences drawn over many batches are
    exactly those the storage holds (by brute force), each T consecutive steps of one episode."""
    torch.manual_seed(0)
    replay = Replay(capacity=100, batch_size=8, seq_len=5)
    replay.add(interleaved((0, 40), (1, 35), (2, 50)))
    valid = stored_sequences(replay)
    assert len(valid) > 50 and index_sequences(replay) == valid
    assert sampled_sequences(replay, 300) == valid
    batch = replay.sample()
    assert (batch["obs"].squeeze(-1) == batch["episode"] * 1000 + batch["step"]).all()


def test_sequences_are_drawn_uniformly_not_episodes():
    """Episodes of 40 and 10 steps, T = 5: 36 and 6 sequences, so about 6 / 42 of the draws come from
    the short one (a draw uniform over episodes, torchrl's SliceSampler's, gives about 1 / 2), and
    every sequence about as often as any other."""
    torch.manual_seed(0)
    replay = Replay(capacity=1000, batch_size=100, seq_len=5)
    replay.add(interleaved((0, 40), (1, 10)))
    counts: dict[tuple[int, int], int] = {}
    for _ in range(42):
        batch = replay.sample()
        for key in zip(batch["episode"][:, 0].tolist(), batch["step"][:, 0].tolist()):
            counts[key] = counts.get(key, 0) + 1
    draws = 4200
    assert len(counts) == 42
    short = sum(n for (episode, _), n in counts.items() if episode == 1) / draws
    assert abs(short - 6 / 42) < 0.03  # sd 0.005
    chi2 = sum((n - draws / 42) ** 2 / (draws / 42) for n in counts.values())
    assert chi2 < 95  # 41 degrees of freedom: mean 41, sd 9


def collector_order(lengths: list[list[int]]) -> list[TensorDict]:
    """One TensorDict [envs] per agent step, as the collector writes them: env i runs episodes of
    lengths[i] one after another (episode ids in order of their start), and stops when they run out."""
    envs, next_episode = len(lengths), 0
    state = [[0, 0, -1, 0] for _ in range(envs)]  # episode index in lengths[i], step, episode id, stream step
    rows = []
    while True:
        step_rows = []
        for i in range(envs):
            k, step, episode, stream_step = state[i]
            if k >= len(lengths[i]):
                continue
            if step == 0:
                episode, next_episode = next_episode, next_episode + 1
            step_rows.append(dict(obs=float(episode * 1000 + step), episode=episode, step=step, stream=i,
                                  stream_step=stream_step, is_first=step == 0))
            step += 1
            if step == lengths[i][k]:
                k, step = k + 1, 0
            state[i] = [k, step, episode, stream_step + 1]
        if not step_rows:
            return rows
        rows.append(TensorDict({key: torch.tensor([r[key] for r in step_rows]) for key in step_rows[0]},
                               batch_size=[len(step_rows)]))


ENV_EPISODES = [[7, 12, 9, 6], [20, 5, 11], [3, 15, 8, 4, 2]]


@pytest.mark.parametrize("cross", [False, True])
def test_steps_added_one_at_a_time_link_as_one_bulk_add(cross):
    """Three envs in collector order, episodes ending at different times, the ring overwriting the
    oldest: adding one agent step at a time, all at once, or in chunks shuffled within themselves
    stores the same sequences, and each index knows exactly those its storage holds."""
    calls = collector_order(ENV_EPISODES)
    everything = torch.cat(calls)
    one_at_a_time = Replay(capacity=40, batch_size=4, seq_len=4, cross_episodes=cross)
    for step in calls:
        one_at_a_time.add(step)
    bulk = Replay(capacity=40, batch_size=4, seq_len=4, cross_episodes=cross)
    bulk.add(everything[-40:])  # the steps the ring keeps, in one call
    generator = torch.Generator().manual_seed(0)
    shuffled = Replay(capacity=200, batch_size=4, seq_len=4, cross_episodes=cross)
    for chunk in everything.split(10):
        shuffled.add(chunk[torch.randperm(len(chunk), generator=generator)])
    kept = one_at_a_time.buffer.storage._storage
    assert len(everything) > 40 and set(kept["obs"].tolist()) == set(everything["obs"][-40:].tolist())
    for replay in (one_at_a_time, bulk, shuffled):
        assert index_sequences(replay) == stored_sequences(replay)
    assert as_keys(one_at_a_time, index_sequences(one_at_a_time)) == as_keys(bulk, index_sequences(bulk))
    whole = Replay(capacity=200, batch_size=4, seq_len=4, cross_episodes=cross)
    whole.add(everything)
    assert as_keys(shuffled, index_sequences(shuffled)) == as_keys(whole, index_sequences(whole))
    assert sampled_sequences(one_at_a_time, 50) <= index_sequences(one_at_a_time)


def _with_context(step: TensorDict) -> TensorDict:
    """A collector's step with replay-context entries (a nested key) beside the step's own."""
    n = step.shape[0]
    return step.update({"context": {"deter": step["obs"].float().reshape(n, 1).expand(n, 3) + 0.5}})


@pytest.mark.parametrize("cross", [False, True])
def test_writes_into_the_storage_leave_what_torchrls_extend_leaves(monkeypatch, cross):
    """`Replay.add` writes straight into torchrl's storage where the write does not wrap the ring;
    against adds that all go through torchrl's `extend` (the same steps: three envs, one agent step a
    call, the ring wrapping twice, then a call of several steps), every stored column (the "index"
    column and the nested context entries included), the length, the writer's cursor and count, the
    index's links and the sampled batches are the same. Fails when torchrl's writer or storage changes
    what an extend leaves behind."""
    calls = [_with_context(step) for step in collector_order(ENV_EPISODES)]
    calls.append(_with_context(torch.cat(collector_order([[6, 3], [5]]))))
    direct = Replay(capacity=40, batch_size=4, seq_len=4, cross_episodes=cross)
    extended = Replay(capacity=40, batch_size=4, seq_len=4, cross_episodes=cross)
    took, write_in_place = [], direct._write_in_place  # whether each add wrote straight into the storage
    monkeypatch.setattr(direct, "_write_in_place", lambda steps: took.append(write_in_place(steps)) or took[-1])
    for step in calls:
        direct.add(step.clone())
        with monkeypatch.context() as patch:
            patch.setattr(extended, "_write_in_place", lambda steps: None)
            extended.add(step.clone())
        ours, theirs = direct.buffer, extended.buffer
        assert len(ours) == len(theirs) and ours._writer._cursor == theirs._writer._cursor
        assert ours._writer._write_count == theirs._writer._write_count
        assert (ours.storage._storage[: len(ours)] == theirs.storage._storage[: len(theirs)]).all()
    assert 0 < took.count(None) <= len(calls) // 4  # the first add and those that wrap go through `extend`
    assert sum(len(step) for step in calls) > 80  # the ring wrapped twice
    for name in ("prev", "run", "stamp"):
        assert (getattr(direct.index, name) == getattr(extended.index, name)).all()
    assert direct.index.latest == extended.index.latest and direct.index.full == extended.index.full
    torch.manual_seed(0)
    ours, slots = direct.sample(with_slots=True)
    torch.manual_seed(0)
    assert (ours == extended.sample()).all()
    episode, step = direct.held(slots)  # the host's copies of what the slots hold: what `write` checks
    assert torch.equal(episode, ours["episode"]) and torch.equal(step, ours["step"])


def test_a_step_added_alone_links_as_the_vectorised_path_links_it(monkeypatch):
    """`SequenceIndex.link` of one step takes a scalar path: against the vectorised path on the same
    calls (four trajectories, one step a call, a ring of 23 slots overwriting the oldest, two of the
    trajectories written so rarely that their latest step is often overwritten before their next, some
    steps repeated or skipped), the links, chain lengths, stamps, sequence count and latest table agree
    after every call."""
    generator = torch.Generator().manual_seed(0)
    scalar, vector = SequenceIndex(23, 5), SequenceIndex(23, 5)
    vector._link_one = None  # never called: a call of one step must take the vectorised path here
    position, often = [0, 0, 0, 0], torch.tensor([0.45, 0.45, 0.07, 0.03])
    for call in range(600):
        trajectory = int(torch.multinomial(often, 1, generator=generator))
        jump = int(torch.randint(10, (1,), generator=generator))
        position[trajectory] += {0: 0, 1: 2}.get(jump, 1)  # mostly the next step; sometimes a repeat or a gap
        args = torch.tensor([call % 23]), torch.tensor([trajectory]), torch.tensor([position[trajectory]])
        scalar.link(*args)
        vector.link(*(arg.numpy() for arg in args))  # numpy input: the vectorised path
        for name in ("prev", "run", "stamp"):
            assert (getattr(scalar, name) == getattr(vector, name)).all(), (call, name)
        assert scalar.latest == vector.latest and scalar.full == vector.full and scalar.calls == vector.calls
    assert scalar.full > 0


def test_a_link_to_a_slot_overwritten_by_another_episode_is_never_used():
    """Episode 0 writes slots 0-3 (its step 3 links to slot 2); episode 1 then overwrites slots 0-2:
    episode 0's step 3 keeps a link to slot 2, which now holds episode 1's step 2; and a step 4 of
    episode 0 does not link to its step 3's slot once that too is overwritten."""
    torch.manual_seed(0)
    replay = Replay(capacity=4, batch_size=16, seq_len=2)
    replay.add(steps(0, 0, 3))
    replay.add(steps(0, 3, 1))
    replay.add(steps(1, 0, 3))
    assert int(replay.index.prev[3]) == 2  # the stale link
    assert index_sequences(replay) == stored_sequences(replay) == {(0, 1), (1, 2)}
    assert sampled_sequences(replay, 20) == {(0, 1), (1, 2)}
    replay.add(steps(1, 3, 1))  # slot 3: episode 0's step 3 is gone
    replay.add(steps(0, 4, 1))  # slot 0: its predecessor is no longer stored
    assert int(replay.index.prev[0]) == replay.index.capacity  # no link
    assert index_sequences(replay) == stored_sequences(replay) == {(1, 2), (2, 3)}


def test_a_step_links_to_its_episodes_latest_step_written_by_an_earlier_add():
    replay = Replay(capacity=100, batch_size=2, seq_len=5)
    replay.add(interleaved((0, 3), (1, 3)))
    assert not replay.ready()
    replay.add(steps(0, 3, 2))  # episode 0: steps 0-2 in slots 0, 2, 4; steps 3-4 in slots 6, 7
    assert replay.ready()
    assert index_sequences(replay) == stored_sequences(replay) == {(0, 2, 4, 6, 7)}


def test_load_after_save_draws_the_same_sequences_and_links_what_comes_next(tmp_path):
    replay = Replay(capacity=100, batch_size=8, seq_len=5)
    for step in interleaved((0, 40), (1, 35), (2, 50), (3, 20)).split(1):  # the ring wrapped: cursor not at 0
        replay.add(step)
    replay.save(tmp_path / "saved")
    restored = Replay(capacity=100, batch_size=8, seq_len=5)
    restored.load(tmp_path / "saved", example=steps(0, 0, 1), size=100)
    assert index_sequences(restored) == index_sequences(replay)
    torch.manual_seed(0)  # the same steps stored and the same RNG: the same batch, whatever the history
    want = replay.sample()
    torch.manual_seed(0)
    assert (restored.sample() == want).all()
    for r in (replay, restored):
        r.add(steps(2, 50, 3))
    assert index_sequences(restored) == index_sequences(replay) == stored_sequences(replay)
    assert (2, 48) in as_keys(restored, index_sequences(restored))  # steps 48-52: across the load


def test_episodes_shorter_than_a_sequence_are_never_ready_and_sampling_says_why():
    replay = Replay(capacity=100, batch_size=2, seq_len=5)
    assert not replay.ready()
    replay.add(interleaved((1, 3), (2, 4)))
    replay.add(steps(3, 1, 4))  # steps 1-4 of an episode whose step 0 is not stored
    assert not replay.ready()
    with pytest.raises(RuntimeError, match=r"no sequence of 5 consecutive steps"):
        replay.sample()


def test_a_sequence_that_lost_its_first_step_to_the_ring_is_not_drawn():
    """capacity = T: one episode fills the ring, then another episode's step overwrites its first step.
    The index still counts a sequence (`ready` is an upper bound), but none is stored: `sample` says so."""
    replay = Replay(capacity=5, batch_size=2, seq_len=5)
    replay.add(steps(0, 0, 5))
    assert replay.ready() and replay.sample().shape == (2, 5)
    replay.add(steps(1, 0, 1))
    assert not stored_sequences(replay) and not index_sequences(replay)
    with pytest.raises(RuntimeError, match=r"no sequence of 5 consecutive steps"):
        replay.sample()


@pytest.mark.parametrize(("batch_size", "seq_len"), [(1, 1), (1, 5), (7, 1)])
def test_batch_of_one_and_sequences_of_one_step(batch_size, seq_len):
    torch.manual_seed(0)
    replay = Replay(capacity=30, batch_size=batch_size, seq_len=seq_len)
    replay.add(interleaved((0, 12), (1, 9), (2, 3)))
    batch, slots = replay.sample(with_slots=True)
    assert batch.shape == slots.shape == (batch_size, seq_len)
    assert (batch["obs"].squeeze(-1) == batch["episode"] * 1000 + batch["step"]).all()
    valid = stored_sequences(replay)
    assert len(valid) == (24 if seq_len == 1 else 8 + 5)
    assert index_sequences(replay) == valid and sampled_sequences(replay, 400 // batch_size) == valid


def test_the_latest_step_table_stays_bounded_over_many_episodes():
    """1000 episodes of 3 steps through 50 slots: the per-trajectory table is pruned of episodes the
    ring has overwritten."""
    replay = Replay(capacity=50, batch_size=2, seq_len=3)
    for episode in range(1000):
        replay.add(TensorDict({"episode": torch.full((3,), episode), "step": torch.arange(3)}, batch_size=[3]))
    assert len(replay.index.latest) < 50  # the episodes stored at the last prune and those written since
    assert index_sequences(replay) == stored_sequences(replay)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="page-locked host memory needs CUDA (the gather itself "
                                                         "is the unpinned sample's, checked above)")
def test_a_pinned_sample_is_the_same_batch_in_page_locked_memory():
    replay = Replay(capacity=1000, batch_size=8, seq_len=5)
    replay.add(interleaved((0, 40), (1, 35)))
    torch.manual_seed(0)
    want = replay.sample()
    torch.manual_seed(0)
    got = replay.sample(pin_memory=True)
    assert all(leaf.is_pinned() for leaf in got.values(include_nested=True, leaves_only=True))
    assert (got == want).all()


def test_memmap_sample_is_an_in_memory_copy(tmp_path):
    replay = Replay(capacity=500, batch_size=8, seq_len=4, memmap_dir=tmp_path / "memmap")
    replay.add(interleaved((0, 12), (1, 12)))
    batch = replay.sample()
    assert (batch["obs"].squeeze(-1) == batch["episode"] * 1000 + batch["step"]).all()
    batch["obs"].zero_()  # must not write through to the stored steps
    assert replay.buffer.storage[:24]["obs"].abs().sum() > 0


def test_ready_only_with_a_full_sequence():
    replay = Replay(capacity=100, batch_size=2, seq_len=5)
    assert not replay.ready()
    replay.add(steps(0, 0, 4))
    assert not replay.ready()
    replay.add(steps(0, 4, 1))
    assert replay.ready()


def test_memory_budget_caps_capacity():
    one_step_bytes = 4 + 48 + 1 + 8 + 8  # obs f32, pixels 3x4x4 u8, is_first, episode, step
    replay = Replay(capacity=10**9, batch_size=1, seq_len=2, memory_gb=1000 * one_step_bytes / 2**30)
    replay.add(steps(0, 0, 10))
    assert replay.storage_capacity == 1000


def test_memory_budget_too_small_fails_naming_the_field():
    replay = Replay(capacity=100, batch_size=1, seq_len=50, memory_gb=1e-7)
    with pytest.raises(ValueError, match=r"replay\.memory_gb"):
        replay.add(steps(0, 0, 10))


def test_bad_sizes_fail_naming_the_field():
    with pytest.raises(ValueError, match=r"replay\.seq_len=0"):
        Replay(capacity=10, batch_size=1, seq_len=0)


def test_memmap_storage_and_save_load(tmp_path):
    replay = Replay(capacity=500, batch_size=8, seq_len=4, memmap_dir=tmp_path / "memmap")
    replay.add(interleaved((0, 12), (1, 12)))
    assert any((tmp_path / "memmap").rglob("*.memmap"))
    replay.save(tmp_path / "saved")
    restored = Replay(capacity=500, batch_size=8, seq_len=4)
    restored.load(tmp_path / "saved", example=steps(0, 0, 1))
    assert len(restored) == 24
    batch = restored.sample()
    assert (batch["obs"].squeeze(-1) == batch["episode"] * 1000 + batch["step"]).all()


def test_memmap_storage_rebuilds_in_a_directory_a_previous_process_left(tmp_path):
    """A resumed `replay.memmap=true` run builds its storage where the killed run's files still are."""
    first = Replay(capacity=500, batch_size=8, seq_len=4, memmap_dir=tmp_path / "memmap")
    first.add(interleaved((0, 12)))
    second = Replay(capacity=500, batch_size=8, seq_len=4, memmap_dir=tmp_path / "memmap")
    second.add(interleaved((1, 6)))
    assert len(second) == 6 and (second.buffer.storage[:6]["episode"] == 1).all()


def test_load_refuses_an_incomplete_saved_replay_naming_the_file(tmp_path):
    replay = Replay(capacity=500, batch_size=8, seq_len=4)
    replay.add(interleaved((0, 12), (1, 12)))
    replay.save(tmp_path / "saved")
    restored = Replay(capacity=500, batch_size=8, seq_len=4)
    with pytest.raises(ReplayError, match=r"holds 24 steps, the checkpoint recorded 30"):
        restored.load(tmp_path / "saved", example=steps(0, 0, 1), size=30)
    (tmp_path / "saved" / "writer.pt").unlink()
    with pytest.raises(ReplayError, match=r"saved/writer\.pt is missing"):
        restored.load(tmp_path / "saved", example=steps(0, 0, 1), size=24)
    assert len(restored) == 0


def test_capacity_below_one_sequence_is_blamed_on_capacity():
    with pytest.raises(ValueError, match=r"replay\.capacity=5 must be >= seq_len=8"):
        Replay(capacity=5, batch_size=1, seq_len=8)


def test_collector_marks_episode_starts_and_actions_before_observations():
    """Two envs, time limit 3: episodes restart in place; action[t] is the action before obs[t]."""
    env = make_env(env_cfg("pendulum", time_limit=3, action_repeat=1), seed=0)
    written = []
    collector = Collector(env, "observation", 1, written.append)
    counter = iter(range(1, 100))

    def policy(obs, is_first, carry):
        value = float(next(counter)) / 100
        return torch.full((obs.shape[0], 1), value), carry

    finished = collector.collect(policy, 7)
    data = torch.cat(written)
    assert len(finished) == 4  # two episodes of 3 steps in each of 2 envs
    for episode in data["episode"].unique():
        ep = data[data["episode"] == episode]
        assert ep["is_first"][0] and not ep["is_first"][1:].any()
        assert (ep["step"] == torch.arange(len(ep))).all()
        assert (ep["action"][0] == 0).all() and (ep["reward"][0] == 0)
        assert (ep["action"][1:] > 0).all()
    assert data["episode"].unique().numel() == 6  # 2 envs x (2 finished + 1 running)


@pytest.mark.parametrize("entry", [None, "tests.custom_envs:make_dict_env"])
def test_the_example_step_is_laid_out_as_collected_steps_and_changes_nothing(entry):
    """`example_step` (what an empty replay is built from on resume) has the keys, shapes and dtypes
    of the steps `collect` writes, for a vector and a Dict (vector + uint8 image) observation, without
    stepping the env or touching the collector's state."""
    from worldmodels.envs import env_info

    cfg = env_cfg("pendulum", time_limit=5, action_repeat=1) if entry is None else \
        suite_cfg("custom", entry=entry, num_envs=2)
    env = make_env(cfg, seed=0)
    obs_key = env_info(env)["obs_key"]
    written = []
    collector = Collector(env, obs_key, env_info(env)["action_dim"], written.append)
    example = collector.example_step()
    assert collector.root is None and collector.next_episode == 0 and not written
    collector.collect(lambda obs, is_first, carry: (torch.zeros(2, env_info(env)["action_dim"]), carry), 1)
    step = written[-1]
    assert example.batch_size == (1,) and set(example.keys(True, True)) == set(step.keys(True, True))
    for key in step.keys(True, True):
        assert (example[key].shape[1:], example[key].dtype) == (step[key].shape[1:], step[key].dtype), key


def test_collector_writes_to_replay_without_moving_and_runs_between_after_each_action(monkeypatch):
    """The steps it writes carry the replay's device, so the write moves nothing: tensordict's move
    (`_sync_all`) would wait for every kernel queued on the GPU, such as the update `between` launched
    while the envs step. `between(i)` runs once per step, after the action and before the env step."""
    import tensordict.base

    syncs = []
    real = tensordict.base.TensorDictBase._sync_all
    monkeypatch.setattr(tensordict.base.TensorDictBase, "_sync_all", lambda self: syncs.append(1) or real(self))
    env = make_env(env_cfg("pendulum", time_limit=5, action_repeat=1), seed=0)
    replay = Replay(capacity=100, batch_size=1, seq_len=2)
    collector = Collector(env, "observation", 1, replay.add)
    order = []

    def policy(obs, is_first, carry):
        order.append("act")
        return torch.zeros(obs.shape[0], 1), carry

    collector.collect(policy, 6, between=lambda i: order.append(i))
    assert order == [x for i in range(6) for x in ("act", i)]
    assert len(replay) == 2 * (1 + 6 + 1) and not syncs  # 2 envs: first obs, 6 steps, a restart at 5


def test_the_env_gets_actions_clipped_to_its_box_and_replay_keeps_the_sample(monkeypatch):
    """An unsquashed policy (DreamerV3's bounded normal) samples outside [-1, 1] (the rescaled action box):
    the env steps with the clipped action, replay stores the sample, as the reference's ClipAction."""
    env = make_env(env_cfg("pendulum", time_limit=5, action_repeat=1), seed=0)
    sent = []
    real_step = type(env).step_and_maybe_reset
    monkeypatch.setattr(type(env), "step_and_maybe_reset",
                        lambda self, td: sent.append(td["action"].clone()) or real_step(self, td))
    written = []
    collector = Collector(env, "observation", 1, written.append)
    wanted = torch.tensor([[5.0], [-0.5]])
    collector.collect(lambda obs, is_first, carry: (wanted, carry), 2)
    assert torch.equal(sent[0], torch.tensor([[1.0], [-0.5]]))
    assert torch.equal(written[-1]["action"], wanted)


def test_collector_writes_each_envs_steps_as_one_stream_across_its_episodes():
    """Two envs, time limit 3: each env's steps form one stream (`stream`, `stream_step` 0, 1, 2, ...)
    across its episodes; an episode's final step is `is_last`, the reset after it `is_first`."""
    env = make_env(env_cfg("pendulum", time_limit=3, action_repeat=1), seed=0)
    written = []
    collector = Collector(env, "observation", 1, written.append)
    collector.collect(lambda obs, is_first, carry: (torch.zeros(obs.shape[0], 1), carry), 7)
    data = torch.cat(written)
    assert data["stream"].unique().tolist() == [0, 1]
    for stream in (0, 1):
        mine = data[data["stream"] == stream]
        assert torch.equal(mine["stream_step"], torch.arange(len(mine)))
        assert mine["episode"].unique().numel() == 3  # two finished, one running
        ends = mine["is_last"].nonzero().flatten()
        assert torch.equal(ends, torch.tensor([3, 7])) and mine["is_first"][ends + 1].all()
        assert torch.equal(mine["step"][ends], torch.tensor([3, 3]))
    collector.load_state_dict(collector.state_dict())  # a resume: fresh streams, ids past the old ones
    collector.collect(lambda obs, is_first, carry: (torch.zeros(obs.shape[0], 1), carry), 1)
    assert torch.cat(written)["stream"].unique().tolist() == [0, 1, 2, 3]
    collector.load_state_dict({"next_episode": 50})  # a checkpoint from before streams
    assert collector.next_stream == 50


def stream_steps(lengths: list[int]) -> TensorDict:
    """One env's stream: episodes of the given lengths one after another."""
    parts = []
    for episode, length in enumerate(lengths):
        part = steps(episode, 0, length)
        part["is_last"] = part["step"] == length - 1
        parts.append(part)
    data = torch.cat(parts)
    data["stream"] = torch.zeros(len(data), dtype=torch.long)
    data["stream_step"] = torch.arange(len(data))
    return data


def test_slices_across_episodes_run_on_into_the_next_episode_and_cover_its_first_steps():
    """With `cross_episodes`, a slice is any T consecutive steps of an env's stream; an episode's first
    step is then in as many slices as any other (within episodes: in one slice of every T)."""
    data = stream_steps([10, 10])
    counts = {}
    for cross in (False, True):
        torch.manual_seed(0)
        replay = Replay(capacity=20, batch_size=64, seq_len=4, cross_episodes=cross)
        replay.add(data)
        seen = torch.zeros(20)
        for _ in range(40):
            batch, slots = replay.sample(with_slots=True)
            assert (batch["stream_step"].diff(dim=1) == 1).all()
            crosses = batch["is_first"][:, 1:].any(1)
            assert crosses.any() == cross  # an episode start inside a slice: only across episodes
            seen += torch.bincount(slots.flatten(), minlength=20)
        counts[cross] = seen
    middle = counts[True][4:8].mean()
    assert counts[True][10] > 0.7 * middle  # the second episode's first step
    assert counts[False][10] < 0.4 * counts[False][14:17].mean()


def test_a_replay_saved_before_streams_loads_as_one_stream_per_episode(tmp_path):
    old = interleaved((0, 6), (1, 6))
    replay = Replay(capacity=12, batch_size=2, seq_len=4)
    replay.add(old)
    replay.save(tmp_path / "replay")
    example = old[:1].clone()
    example["stream"] = example["stream_step"] = torch.zeros(1, dtype=torch.long)
    example["is_last"] = torch.zeros(1, dtype=torch.bool)
    fresh = Replay(capacity=12, batch_size=2, seq_len=4, cross_episodes=True)
    fresh.load(tmp_path / "replay", example=example, size=12)
    stored = fresh.buffer.storage._storage[:12]
    assert torch.equal(stored["stream"], stored["episode"]) and torch.equal(stored["stream_step"], stored["step"])
    assert not stored["is_last"].any()
    batch = fresh.sample()
    assert (batch["episode"] == batch["episode"][:, :1]).all()  # each slice within one episode


def test_memory_mapped_files_cannot_hold_steps_on_a_gpu(tmp_path):
    with pytest.raises(ValueError, match=r"replay\.memmap stores steps in host files; it cannot hold them on cuda"):
        Replay(capacity=10, batch_size=1, seq_len=2, memmap_dir=tmp_path, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a replay stored on a GPU needs CUDA (the host columns "
                                                         "its index walks are the same code on CPU, checked above)")
def test_a_replay_on_the_gpu_samples_writes_and_saves_what_the_host_replay_does(tmp_path):
    """The same adds (three envs one agent step a call, context entries, the ring wrapping) into a replay
    in host memory and one on the GPU: the same batches and slots for the same seed, gathered on the GPU;
    `write` keeps the same entries; each one's save loads into the other and draws the same batch."""
    calls = [_with_context(step) for step in collector_order(ENV_EPISODES)]
    host, gpu = (Replay(capacity=40, batch_size=4, seq_len=4, device=device) for device in (None, "cuda"))
    for step in calls:
        host.add(step.clone())
        gpu.add(step.clone())
    assert len(host) == len(gpu) and host.buffer._writer._cursor == gpu.buffer._writer._cursor
    torch.manual_seed(0)
    want, want_slots = host.sample(with_slots=True)
    torch.manual_seed(0)
    got, got_slots = gpu.sample(with_slots=True, pin_memory=True)  # nothing to pin: gathered on the GPU
    assert got["obs"].is_cuda and not got_slots.is_cuda and torch.equal(got_slots, want_slots)
    assert (got.cpu() == want).all()
    assert all(torch.equal(a, b) and not a.is_cuda for a, b in zip(gpu.held(got_slots), host.held(want_slots)))
    fresh = TensorDict({"context": {"deter": torch.full((4, 3, 3), 7.0)}}, batch_size=[4, 3])
    stale = want["episode"][:, 1:].clone()
    stale[0] += 1  # the first sequence's slots "were reused since": skipped
    assert host.write(want_slots[:, 1:], stale, want["step"][:, 1:], fresh) == \
        gpu.write(want_slots[:, 1:], stale.cuda(), want["step"][:, 1:].cuda(), fresh.cuda()) > 0
    assert (gpu.buffer.storage[:40].cpu() == host.buffer.storage[:40]).all()
    for source, target in ((gpu, Replay(capacity=40, batch_size=4, seq_len=4)),
                           (host, Replay(capacity=40, batch_size=4, seq_len=4, device="cuda"))):
        source.save(tmp_path / str(id(source)))
        target.load(tmp_path / str(id(source)), example=calls[0][:1], size=40)
        torch.manual_seed(1)
        first = source.sample().exclude("context")  # not saved (a cache the updates rewrite): zeros when loaded
        torch.manual_seed(1)
        assert (target.sample().exclude("context").cpu() == first.cpu()).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="work queued on a GPU needs CUDA")
def test_a_replay_on_the_gpu_never_waits_for_the_work_queued_before_it():
    """With a long kernel queued on the current stream (an update in flight), adds (written straight into
    the storage), a sample and a write on a GPU replay all return while that kernel still runs: the
    loop's host work overlaps the updates. (A call that waited would find the kernel ended.)"""
    calls = [_with_context(step) for step in collector_order(ENV_EPISODES)]
    replay = Replay(capacity=400, batch_size=4, seq_len=4, device="cuda")
    for step in calls[:-3]:
        replay.add(step)
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU time queued
    for step in calls[-3:]:
        replay.add(step)
    batch, slots = replay.sample(with_slots=True)
    fresh = TensorDict({"context": {"deter": torch.ones(4, 3, 3).pin_memory()}}, batch_size=[4, 3])
    replay.write(slots[:, 1:], *(x[:, 1:] for x in replay.held(slots)), fresh)
    assert not torch.cuda.current_stream().query(), "the queued kernel ended before the replay's calls returned"
    torch.cuda.synchronize()
    assert (batch["episode"] == batch["episode"][:, :1]).all()
