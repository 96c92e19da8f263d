"""dm_control pixel envs record the physics state each frame was rendered from (`RENDER_STATE`, exact
float64 bits, never an observation), the collector stores it with the step, and `frame_renderer`
renders the very same frames again from it in a fresh MuJoCo: in this process for a few states, on
spawned processes for many. Envs without such a state (state envs, gymnasium pixels) have none."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.envs.test_env_factory import env_cfg, needs_gl
from worldmodels.data import Collector, Replay
from worldmodels.envs import env_info, make_env
from worldmodels.envs.factory import frame_renderer
from worldmodels.envs.render_state import RENDER_STATE, state_bits, state_values
from worldmodels.envs.suites import dmc


def collected(cfg, steps: int, seed: int = 0) -> Replay:
    """A replay of `steps` random-action steps of each of the env's copies, written by the collector."""
    env = make_env(cfg, seed=seed)
    info = env_info(env)
    replay = Replay(capacity=10_000, batch_size=2, seq_len=4)
    collector = Collector(env, info["obs_key"], info["action_dim"], replay.add)
    g = torch.Generator().manual_seed(seed)
    collector.collect(lambda obs, first, carry: (torch.rand(obs.shape[0], info["action_dim"], generator=g) * 2 - 1,
                                                 None), steps)
    return replay


def test_state_bits_round_trip_exactly():
    states = np.array([[0.1, -2.5e-300, np.pi, 1e300], [np.nan, -0.0, np.inf, 5e-324]])
    bits = state_bits(states)
    assert bits.dtype == np.int64
    np.testing.assert_array_equal(state_values(torch.from_numpy(bits)).view(np.int64), states.view(np.int64))


@needs_gl
@pytest.mark.parametrize("name, size, time_limit", [("cartpole_swingup", 64, 12), ("cheetah_run", 32, 12),
                                                     ("walker_walk", 48, 12)])
def test_frames_render_again_from_the_states_the_collector_stored(name, size, time_limit):
    cfg = env_cfg(name, pixels=True, size=size, time_limit=time_limit)  # 2 envs, episodes ending inside the run
    env = make_env(cfg, seed=0)
    assert env_info(env)["obs_key"] == "pixels"  # the state is not an observation
    assert env.observation_spec[RENDER_STATE].dtype == torch.int64
    replay = collected(cfg, steps=2 * time_limit + 3)
    steps = replay.buffer.storage[: len(replay)]
    assert steps["is_first"].sum() >= 4  # resets' first frames are in there too
    again = frame_renderer(cfg)(steps[RENDER_STATE])
    assert again.dtype == torch.uint8 and again.shape == steps["obs"].shape == (len(replay), 3, size, size)
    assert torch.equal(again, steps["obs"])


@needs_gl
def test_many_states_render_on_spawned_processes_to_the_same_frames(monkeypatch):
    cfg = env_cfg("cartpole_swingup", pixels=True, size=16, time_limit=20)
    steps = collected(cfg, steps=20).buffer.storage[:42]
    monkeypatch.setattr(dmc, "PARALLEL_FROM", 8)
    monkeypatch.setattr(dmc, "CHUNK", 16)  # 3 chunks over the pool's workers
    assert torch.equal(frame_renderer(cfg)(steps[RENDER_STATE]), steps["obs"])


@pytest.mark.parametrize("max_workers, cores, expected",
                         [(None, 16, dmc.MAX_WORKERS), (16, 16, 16), (16, 3, 3), (2, 4, 2)])
def test_the_pool_takes_at_most_max_workers_and_no_more_than_the_cores(monkeypatch, max_workers, cores, expected):
    pools = []

    class Pool:  # stands in for the spawned processes: renders each chunk as its first state's value
        def __init__(self, workers, mp_context):
            pools.append(workers)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def map(self, fn, keys, chunks):
            return [np.full((len(c), 1), c[0, 0]) for c in chunks]

    monkeypatch.setattr(dmc, "ProcessPoolExecutor", Pool)
    monkeypatch.setattr(dmc.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(dmc, "PARALLEL_FROM", 8)
    monkeypatch.setattr(dmc, "CHUNK", 4)
    args = () if max_workers is None else (max_workers,)
    states = np.arange(10, dtype=np.float64)[:, None]
    frames = dmc.StateRenderer("cartpole/swingup", None, 16, 0, *args)(states)
    assert pools == [expected]
    np.testing.assert_array_equal(frames[:, 0], [0, 0, 0, 0, 4, 4, 4, 4, 8, 8])  # chunks in order


def test_envs_without_a_render_state_have_none():
    assert frame_renderer(env_cfg("pendulum", pixels=True)) is None  # gymnasium renders from its own state
    assert frame_renderer(env_cfg("cartpole_swingup", pixels=False)) is None
    env = make_env(env_cfg("pendulum"), seed=0)
    assert RENDER_STATE not in env.reset().keys()


@needs_gl
def test_a_dmc_state_env_records_no_render_state():
    env = make_env(env_cfg("cartpole_swingup", pixels=False), seed=0)
    assert RENDER_STATE not in env.observation_spec.keys() and env_info(env)["obs_shape"] == (5,)
