"""Stop signals as exceptions, never in the middle of a save.

Contract: inside `with StopSignals():` (main thread only; elsewhere it does nothing) SIGINT
(Ctrl-C) and SIGTERM (what `timeout`, schedulers and `kill` send) raise `Stopped`, a
`KeyboardInterrupt`, so one `except KeyboardInterrupt` saves for both. Inside
`with stop.deferred():` a signal is only recorded, and raised when the block ends: a checkpoint
being written is finished first. Inside `with stop.held():` a signal is only recorded, even after the
block: the caller `take()`s it (data-parallel ranks agree on it before all stop together). Inside
`with stop.saving(what):` (the save a stop asked for) a second signal only says, on stderr, that
`what` is still being saved and that another signal aborts it; the third raises `SaveAborted`. The
previous handlers are restored on exit.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """A stop signal arrived (exit status 128 + signum by convention).

    Args:
        signum: the signal's number (`signal.SIGTERM`, ...).
    """

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class SaveAborted(Stopped):
    """A third stop signal during the save a stop asked for: the save was given up."""


class StopSignals:
    """Turns SIGINT / SIGTERM into `Stopped` while entered; `deferred()` holds them back."""

    def __init__(self):
        self._previous: dict[int, object] = {}
        self._deferring = 0
        self._pending: int | None = None
        self._saving: str | None = None  # what the save a stop asked for writes (None: no such save)
        self._signals_while_saving = 0

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if self._saving is not None:
            self._signals_while_saving += 1
            if self._signals_while_saving >= 2:
                raise SaveAborted(signum)
            print(f"{signal.Signals(signum).name}: still saving {self._saving}; one more stop signal aborts the "
                  "save (the newest complete checkpoint is kept)", file=sys.stderr, flush=True)
        elif self._deferring:
            self._pending = signum
        else:
            raise Stopped(signum)

    @contextmanager
    def deferred(self):
        """Within: a stop signal is recorded, then raised as `Stopped` when the block ends."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
            if not self._deferring and self._pending is not None:
                signum, self._pending = self._pending, None
                raise Stopped(signum)

    @contextmanager
    def held(self):
        """Within: a stop signal is only recorded (`take`); nothing is raised, not even at the end."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1

    @contextmanager
    def saving(self, what: str):
        """Within: the save a stop asked for, of `what`; a second signal says so, a third raises
        `SaveAborted` (nothing is recorded to raise later)."""
        self._saving, self._signals_while_saving = what, 0
        try:
            yield
        finally:
            self._saving = None

    def take(self) -> int | None:
        """The signal recorded and not raised yet (or None), cleared."""
        signum, self._pending = self._pending, None
        return signum
