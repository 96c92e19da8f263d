"""`EnvThread`: the env is built, stepped, reset and freed on one thread of its own, specs are read
directly; a step runs beside the caller's work; errors reach the caller; a run collects the same
steps with it as without it."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import weakref
from pathlib import Path

import pytest
import torch

from tests.envs.test_env_factory import env_cfg, needs_gl, suite_cfg
from worldmodels.data import Collector
from worldmodels.envs import EnvThread, make_env

ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    """A stand-in env that records the thread of every call."""

    batch_size = (1,)

    def __init__(self, fail_close: bool = False):
        self.threads: dict[str, int] = {"make": threading.get_ident()}
        self.fail_close = fail_close

    def _record(self, name):
        self.threads[name] = threading.get_ident()

    def reset(self):
        self._record("reset")
        return "root"

    def set_seed(self, seed):
        self._record("set_seed")

    def step_and_maybe_reset(self, td):
        self._record("step_and_maybe_reset")
        return ("out", td)

    def spec_read(self):
        self._record("spec_read")
        return "spec"

    def close(self):
        self._record("close")
        if self.fail_close:
            raise OSError("close failed")


def test_the_env_is_built_stepped_and_closed_on_its_thread_and_read_directly():
    env = EnvThread(Recorder, name="env-under-test")
    inner = env.env
    assert env.reset() == "root" and env.step_and_maybe_reset("td") == ("out", "td")
    env.set_seed(3)
    assert env.spec_read() == "spec" and env.batch_size == (1,)  # not a stepping call: read here
    (out, took), = [env.step_and_maybe_reset_async("td2").result()]
    assert out == ("out", "td2") and took >= 0
    thread = env._thread.ident
    here = threading.get_ident()
    assert thread != here and env._thread.name == "env-under-test"
    assert {k: v == thread for k, v in inner.threads.items()} == {
        "make": True, "reset": True, "step_and_maybe_reset": True, "set_seed": True, "spec_read": False}
    alive = weakref.ref(inner)
    del inner
    env.close()
    assert alive() is None and not env._thread.is_alive()  # freed, and the thread ended
    env.close()  # idempotent
    with pytest.raises(RuntimeError, match="the env's thread is closed"):
        env.submit(print)


def test_errors_reach_the_caller_unchanged():
    def bad_make():
        raise ValueError("env.name='mars' is not a task")

    with pytest.raises(ValueError, match="env.name='mars'"):
        EnvThread(bad_make)
    env = EnvThread(Recorder)
    with pytest.raises(ZeroDivisionError):
        env.call(lambda: 1 / 0)
    assert env.reset() == "root"  # the thread serves on after a failed call
    failing = EnvThread(lambda: Recorder(fail_close=True))
    with pytest.raises(OSError, match="close failed"):
        failing.close()
    assert not failing._thread.is_alive()
    env.close()


def test_an_env_thread_dropped_unclosed_frees_its_env_on_its_thread():
    env = EnvThread(Recorder)
    inner, thread = weakref.ref(env.env), env._thread
    del env
    gc.collect()
    thread.join(timeout=10)
    assert not thread.is_alive() and inner() is None


def test_a_step_runs_beside_between_and_the_collector_waits_for_both():
    """The env's step waits until `between` has started: only a step on the env's thread, running
    while `between` runs, lets the collect finish."""
    started = threading.Event()

    def make():
        env = make_env(env_cfg("pendulum", time_limit=5, action_repeat=1), seed=0)
        step = env.step_and_maybe_reset

        def step_when_between_started(td):
            assert started.wait(timeout=30), "between did not run while the env stepped"
            started.clear()
            return step(td)
        env.step_and_maybe_reset = step_when_between_started
        return env

    env = EnvThread(make)
    written = []
    collector = Collector(env, "observation", 1, written.append)
    calls = []
    collector.collect(lambda obs, is_first, carry: (torch.zeros(obs.shape[0], 1), carry), 4,
                      between=lambda i: calls.append(i) or started.set())
    assert calls == [0, 1, 2, 3] and len(written) == 1 + 4
    seconds = collector.seconds
    assert seconds["env_thread"] > 0 and seconds["env"] >= 0
    env.close()


@pytest.mark.parametrize("cfg", [env_cfg("pendulum", time_limit=7, action_repeat=2),
                                 env_cfg("pendulum", time_limit=7, action_repeat=2, parallel=True),
                                 pytest.param(suite_cfg("dmc", "cartpole/swingup", pixels=True, size=16,
                                                        action_repeat=2, time_limit=6, num_envs=2),
                                              marks=needs_gl, id="dmc-pixels")],
                         ids=lambda c: ("pendulum-parallel" if c.get("parallel") else "pendulum")
                         if c.get("name") == "pendulum" else None)
def test_the_collector_writes_the_same_steps_with_the_env_on_its_thread(cfg):
    """Same seeds, same policy noise: the steps written, the episodes ended and the torch RNG draws
    of `between` (replay sampling's) are equal with and without the thread; a ParallelEnv (worker
    processes, which answer any attribute the collector would probe) steps either way."""
    def collect(env):
        torch.manual_seed(0)
        written, draws = [], []
        collector = Collector(env, "pixels" if cfg.get("pixels") else "observation", 1, written.append)
        policy = lambda obs, is_first, carry: (torch.rand(obs.shape[0], 1) * 2 - 1, carry)  # noqa: E731
        ended = collector.collect(policy, 9, between=lambda i: draws.append(torch.randint(1000, (3,))))
        return torch.cat(written), ended, torch.stack(draws)

    plain = collect(make_env(cfg, seed=5))
    threaded_env = EnvThread(lambda: make_env(cfg, seed=5))
    threaded = collect(threaded_env)
    threaded_env.close()
    assert plain[1] == threaded[1] and torch.equal(plain[2], threaded[2])
    assert set(plain[0].keys(True, True)) == set(threaded[0].keys(True, True))
    for key in plain[0].keys(True, True):
        assert torch.equal(plain[0][key], threaded[0][key]), key


@needs_gl
def test_pixel_env_on_its_thread_exits_without_gl_errors():
    """A dm_control pixel env renders on its thread; its GL contexts are freed there, before
    dm_control's exit handlers would try from the main thread (EGL refuses a context current on
    another thread): closed, left open until exit, or dropped unclosed just before the process
    exits (the drop waits for the free: a process exiting while its env thread frees GL contexts
    aborts, as `scripts/train.py` once did after its last eval)."""
    head = ("from tests.envs.test_env_factory import suite_cfg\n"
            "from worldmodels.envs import EnvThread, make_env\n"
            "cfg = suite_cfg('dmc', 'cartpole/swingup', pixels=True, size=16, action_repeat=2, num_envs=1)\n")
    open_and_closed = (
        "envs = [EnvThread(lambda: make_env(cfg, seed=s)) for s in (0, 1)]\n"
        "for env in envs:\n"
        "    root = env.reset()\n"
        "    root['action'] = env.action_spec.rand()\n"
        "    (out, root), _ = env.step_and_maybe_reset_async(root).result()\n"
        "    assert out['next', 'pixels'].shape == (1, 3, 16, 16)\n"
        "envs[0].close()\n")
    dropped = ("def run():\n"
               "    env = EnvThread(lambda: make_env(cfg, seed=2))\n"
               "    env.reset()\n"
               "run()\n")
    for body in (open_and_closed, dropped):
        done = subprocess.run([sys.executable, "-c", head + body + "print('stepped')\n"], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "stepped" in done.stdout, done.stderr[-3000:]
        assert not any(word in done.stderr for word in ("Error", "Exception ignored", "terminate")), done.stderr[-3000:]
