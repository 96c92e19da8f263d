"""Context-local settings (backend choice, recurrent mode) that stay correct under torch.compile.

A setting lives in a `contextvars.ContextVar`, so a worker thread never sees its parent's value
(a thread starts with an empty context) and an asyncio task sees it only because it copies the
context. Dynamo cannot trace `ContextVar.get`; it can read a property whose getter is a C
function and guards on the value it read, re-evaluating the guard in the caller's context on
every call. So compiled code recompiles for a new value instead of baking in the first one.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator, Sequence


class ContextSetting:
    """One named, validated, context-local setting with an env-var default.

    Resolution: the value set in this context (`set`, or `use` as a context manager), else the
    env var read at construction (invalid values raise there, i.e. at import), else `default`.
    """

    def __init__(self, name: str, valid: Sequence[str], default: str, env_var: str | None = None):
        self.name = name
        self.valid = valid  # any sequence; a live view (core/registry.py) follows later registrations
        self.env_var = env_var
        env_value = os.environ.get(env_var, "").strip().lower() if env_var else ""
        self.default = self.validate(env_value, source=env_var) if env_value else default
        # No default on the var itself: `_Reader.value` then returns the reader as "unset" marker.
        self._var: contextvars.ContextVar[str] = contextvars.ContextVar(name)
        reader_type = type(f"_{name}_reader", (), {"__slots__": (), "value": property(self._var.get)})
        self._reader = reader_type()

    def validate(self, value: object, source: str | None = None) -> str:
        if not isinstance(value, str) or value not in self.valid:
            where = source or self.name
            raise ValueError(f"{where}={value!r} is not a valid {self.name}; expected one of {list(self.valid)}")
        return value

    def get(self) -> str:
        value = self._reader.value  # compile-safe read (see module docstring)
        return self.default if value is self._reader else value

    def set(self, value: str | None) -> None:
        """Set the value for the current context (the current thread / task and what copies it).

        `None` clears it, so `get` falls back to the env var / default."""
        self._var.set(self._reader if value is None else self.validate(value))

    @contextlib.contextmanager
    def use(self, value: str) -> Iterator[None]:
        token = self._var.set(self.validate(value))
        try:
            yield
        finally:
            self._var.reset(token)


def resolve(*candidates: str | None, setting: ContextSetting) -> str:
    """First explicit candidate (most specific first), validated, else the setting's value."""
    for value in candidates:
        if value is not None:
            return setting.validate(value)
    return setting.get()
