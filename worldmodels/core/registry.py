"""The backend registry: backend name -> its ops, where it runs, and when `auto` may pick it.

Every reader of backend names goes through here: the context setting's validation, `auto`, the
modules' dispatch, the run-config checks, the tests' parametrisation and the benchmark rows. So a
new backend is registered once (`register(Backend(...))`) and appears everywhere.

An op is named by its family: `"rnn"` (GRU/LSTM sequences), `"rssm_observe"`, `"rssm_imagine"`.
A backend lists the families it implements as `"module:function"` paths, imported on first use,
so a CPU install never imports Triton. The ops' signatures are those of the reference ops in
`worldmodels/ops/*/reference.py`.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Sequence

import torch

OP_FAMILIES = ("rnn", "rssm_observe", "rssm_imagine")


def _always(device: torch.device) -> str | None:
    return None


def _never_auto(device: torch.device, compiling: bool, vmapped: bool) -> bool:
    return False


@dataclasses.dataclass(frozen=True)
class Backend:
    """One backend and what it implements.

    Args:
        name: the backend's name, as users pass it (`backend="cudnn"`).
        ops: op family -> `"package.module:function"`; families it lacks are not implemented.
        unavailable: `device -> None` when it runs on that device, else the reason it does not.
        auto: `(device, compiling, vmapped) -> bool`, whether `auto` may pick it in that situation.
        fits: `problem -> bool`, whether `auto` may pick it for this problem (a dict the module
            describes its call with: e.g. cell, hidden size, dtype, precision); explicit requests
            of a backend that cannot take a problem get the op's own clear error.
        priority: `auto` tries the backends that may be picked in increasing priority.
        vmappable: whether it runs under `torch.func.vmap` (the vendor RNN ops have no batching rule).
        vmap_fallback: when it is not vmappable and asked for by name under vmap: True falls back to
            `auto`'s vmappable choice with a one-time warning; False raises a clear ValueError.
        description: one line for docs, errors and benchmark tables.
    """

    name: str
    ops: dict[str, str]
    unavailable: Callable[[torch.device], str | None] = _always
    auto: Callable[[torch.device, bool, bool], bool] = _never_auto
    fits: Callable[[dict], bool] = lambda problem: True
    priority: int = 100
    vmappable: bool = True
    vmap_fallback: bool = False
    description: str = ""

    def implements(self, family: str) -> bool:
        return family in self.ops

    def op(self, family: str) -> Callable:
        # a dict lookup once resolved: torch.compile traces it, where it cannot trace an import
        fn = _resolved.get((self.name, family, self.ops[family]))
        if fn is None:
            fn = _resolved[(self.name, family, self.ops[family])] = _import(self.ops[family])
        return fn


def _import(path: str) -> Callable:
    """The function at `"package.module:function"`, imported now."""
    module, _, function = path.partition(":")
    return getattr(importlib.import_module(module), function)


def lazy(path: str) -> Callable:
    """The function at `"package.module:function"`, imported on its first call: how a backend names the
    ops-side rules it needs (`fits`), so `core` imports nothing from `ops`."""
    resolved = []

    def call(*args, **kwargs):
        if not resolved:
            resolved.append(_import(path))
        return resolved[0](*args, **kwargs)

    call.__qualname__ = call.__name__ = f"lazy({path})"
    return call


_registry: dict[str, Backend] = {}
_resolved: dict[tuple[str, str, str], Callable] = {}


def preload(*names: str) -> None:
    """Import the ops of backends `names` now (before any torch.compile traces a call to them)."""
    for name in names:
        backend = _registry[name]
        for family in backend.ops:
            backend.op(family)


def register(backend: Backend) -> Backend:
    """Add (or replace) a backend; returns it."""
    if backend.name == "auto" or not backend.name.isidentifier():
        raise ValueError(f"backend name {backend.name!r} must be an identifier other than 'auto'")
    unknown = set(backend.ops) - set(OP_FAMILIES)
    if unknown:
        raise ValueError(f"backend {backend.name!r}: unknown op families {sorted(unknown)}; "
                         f"expected {list(OP_FAMILIES)}")
    _registry[backend.name] = backend
    return backend


def unregister(name: str) -> None:
    _registry.pop(name, None)


def get(name: str) -> Backend:
    return _registry[name]


def names() -> tuple[str, ...]:
    """Every registered backend, implemented ops or not (the valid `backend=` values besides auto)."""
    return tuple(_registry)


def implemented(family: str | None = None) -> tuple[str, ...]:
    """Backends with at least one op (or with op `family`)."""
    return tuple(n for n, b in _registry.items() if (b.implements(family) if family else b.ops))


def available_backends(device: torch.device | str, family: str | None = None) -> tuple[str, ...]:
    """Backends that run on `device` (and implement `family` when given)."""
    device = torch.device(device)
    return tuple(n for n in implemented(family) if _registry[n].unavailable(device) is None)


def choose_auto(family: str, device: torch.device, *, compiling: bool, vmapped: bool,
                problem: dict | None = None) -> str:
    """`auto`: the first backend by priority that implements `family`, runs on `device`, allows
    itself to be picked in this situation, and fits the problem."""
    for backend in sorted(_registry.values(), key=lambda b: b.priority):
        if (backend.implements(family) and backend.unavailable(device) is None
                and backend.auto(device, compiling, vmapped) and backend.fits(problem or {})):
            return backend.name
    raise RuntimeError(f"no registered backend implements {family!r} on {device}")


def check_runs(name: str, family: str, device: torch.device, *, vmapped: bool = False) -> Backend:
    """The backend `name`, or a clear ValueError saying why it cannot run `family` here."""
    if name not in _registry:
        raise ValueError(f"backend={name!r} is not a registered backend; expected one of {[*names(), 'auto']}")
    backend = _registry[name]
    if not backend.implements(family):
        raise ValueError(f"backend={name!r} is not available for {family!r} in this build (not implemented); "
                         f"available backends: {list(available_backends(device, family))} (or 'auto')")
    reason = backend.unavailable(device)
    if reason is not None:
        raise ValueError(f"backend={name!r} is not available on {device}: {reason}; available backends: "
                         f"{list(available_backends(device, family))} (or 'auto')")
    if vmapped and not backend.vmappable:
        vmappable = [n for n in available_backends(device, family) if _registry[n].vmappable]
        raise ValueError(f"backend={name!r} cannot run under torch.func.vmap; use one of {vmappable} or 'auto'")
    return backend


class RegistryNames(Sequence):
    """A live, read-only view of registered names (iterates, indexes and tests membership like a
    tuple), so constants such as `IMPLEMENTED_BACKENDS` follow later registrations."""

    def __init__(self, read: Callable[[], tuple[str, ...]]):
        self._read = read

    def __getitem__(self, index):
        return self._read()[index]

    def __len__(self) -> int:
        return len(self._read())

    def __eq__(self, other) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, Sequence) else NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))
