"""`EnvThread`: a batched env whose every call runs on one thread of its own, so that a step can
run while the caller does other work (`Collector` queues the owed updates and samples replay
meanwhile; a pixel run's step is mostly physics and rendering, C code that releases the GIL).

The env is built on that thread (`make()`), and the calls that may step, reset or render it
(`ON_THREAD`) run there: an OpenGL context (dm_control's EGL or OSMesa renders) is current on one
thread only, and the env's first render makes it current on the thread that built it. Everything
else (specs, `batch_size`, `device`, `fake_tensordict`) is read directly from the caller's thread.
`step_and_maybe_reset_async(td)` returns a `Future` of ((out, next root), seconds the step took).

`close()` closes the env and drops it on its thread, so its GL contexts are freed where they are
current, then ends the thread; it also runs at interpreter exit, before dm_control's own exit
handlers would free those contexts from the main thread (which EGL refuses). The thread does not
touch torch's global generator (env RNGs are their own), so a run draws the same random numbers
with or without it.
"""

from __future__ import annotations

import atexit
import gc
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from torchrl.envs import EnvBase

ON_THREAD = frozenset({"reset", "step", "step_and_maybe_reset", "rollout", "rand_step", "set_seed"})
"""EnvBase methods that may step, reset or render the env: called on the env's thread."""


class EnvThread:
    """A batched env built and stepped on a dedicated thread (see the module docstring).

    Args:
        make: builds the env (called once, on the env's thread); an exception it raises is raised
            here, unchanged.
        name: the thread's name.
    """

    def __init__(self, make: Callable[[], EnvBase], name: str = "env"):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        # the thread holds the queue, not this object: an EnvThread no one holds is collected (__del__)
        self._thread = threading.Thread(target=_serve, args=(self._jobs,), name=name, daemon=True)
        self._thread.start()
        try:
            self.env: EnvBase = self.call(make)
        except BaseException:
            self._stop()
            raise
        ref = weakref.ref(self)
        self._at_exit = lambda: (this := ref()) is not None and this.close()
        atexit.register(self._at_exit)  # after the env's GL contexts registered theirs: runs before them

    def submit(self, fn: Callable, *args, **kwargs) -> Future:
        """Run `fn(*args, **kwargs)` on the env's thread, after the calls submitted before it."""
        if self._closed:
            raise RuntimeError("the env's thread is closed: the env cannot be called")
        future: Future = Future()
        self._jobs.put((future, fn, args, kwargs))
        return future

    def call(self, fn: Callable, *args, **kwargs) -> Any:
        """`fn(*args, **kwargs)` run on the env's thread; waits for it."""
        return self.submit(fn, *args, **kwargs).result()

    def step_and_maybe_reset_async(self, td) -> Future:
        """The env's `step_and_maybe_reset(td)`, started on its thread: a Future of
        ((out, next root), the step's seconds on that thread)."""
        env = self.env

        def timed():
            start = time.perf_counter()
            result = env.step_and_maybe_reset(td)
            return result, time.perf_counter() - start
        return self.submit(timed)

    def __getattr__(self, name: str):
        if name == "env":  # not built (a failed make) or closed: no recursion through __getattr__
            raise AttributeError(name)
        attr = getattr(self.env, name)
        if name in ON_THREAD and callable(attr):
            return lambda *args, **kwargs: self.call(attr, *args, **kwargs)
        return attr

    def close(self) -> None:
        """Close the env and free it on its thread, then end the thread (idempotent)."""
        if self._closed:
            return
        atexit.unregister(self._at_exit)
        try:
            self.call(_free, [self.__dict__.pop("env")])
        finally:
            self._stop()

    def _stop(self) -> None:
        self._closed = True
        self._jobs.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def __del__(self):  # dropped unclosed: the env is freed on its thread
        if not self.__dict__.get("_closed", True):
            atexit.unregister(self._at_exit)
            self._jobs.put((Future(), _free, ([self.__dict__.pop("env", None)],), {}))
            # waits for the free (a process that exits while its env thread frees GL contexts aborts),
            # unless collected on that thread itself
            self._stop()


def _serve(jobs: queue.SimpleQueue) -> None:
    """The env thread's loop: run each job, hand its result or exception to its Future; None ends it."""
    while (job := jobs.get()) is not None:
        future, fn, args, kwargs = job
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as err:  # handed to the caller, which raises it
                future.set_exception(err)
        del future, fn, args, kwargs


def _free(box: list) -> None:
    """Close the env in `box` (taken out of it, so nothing else holds it) and collect it here, on the
    env's thread, where its GL contexts are current."""
    env = box.pop()
    if env is not None:
        try:
            env.close()
        finally:
            del env
            gc.collect()  # contexts held in reference cycles are freed now, on this thread


__all__ = ["EnvThread", "ON_THREAD"]
