"""Rows and how each is run: build, check on the first call, then time.

A `Group` is one shape and one mode (e.g. "V1 observe, fwd+bwd"): `setup()` draws the inputs (and
the shared model) once and every `Candidate` of the group (our backends, the peers) runs on them.
The group's first candidate (our `loop` backend) produces the reference outputs; every later
candidate with parity "reference" has its first call compared with them before its timing starts.
Each candidate is built lazily and released after its row, so peak memory is per row.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks.parity import ParityError, assert_informative, assert_parity, detach, flatten
from benchmarks.timing import TimingConfig, measure, release_memory
from worldmodels.core import registry


class Unavailable(Exception):
    """A candidate that cannot run here (missing package, backend not on this device, API not landed)."""


def our_backends(families: Sequence[str], device: torch.device, requested: Sequence[str] | None = None) -> list[str]:
    """The backends of ours a suite times, `loop` (the reference) first: every registered backend
    that implements all op `families` and runs on `device`, or the `requested` ones (a backend that
    cannot run here then gets a row saying why, see `require_backend`)."""
    if requested is None:
        available = [registry.available_backends(device, family) for family in families]
        requested = [b for b in registry.names() if all(b in names for names in available)]
    return ["loop", *[b for b in requested if b != "loop"]]


def check_backend_names(requested: Sequence[str]) -> None:
    """A ValueError naming the registered backends when one of `requested` is not registered."""
    unknown = [b for b in requested if b not in registry.names()]
    if unknown:
        raise ValueError(f"unknown backends {unknown}; registered: {list(registry.names())}")


def require_backend(name: str, device: torch.device, *families: str) -> None:
    """Unavailable when this build / device cannot run op `families` on our backend `name`
    (e.g. triton on CPU, or an RSSM op a backend does not implement)."""
    for family in families:
        try:
            registry.check_runs(name, family, device)
        except ValueError as exc:
            raise Unavailable(str(exc)) from None


@dataclass
class Candidate:
    impl: str                                  # e.g. "ours:cudnn", "torch.nn.GRU", "torchrl RSSMRolloutV3"
    build: Callable[[Any], Callable[[], Any]]  # build(shared) -> the call to time (it returns outputs)
    kind: str = "ours"                         # "ours" | "peer"
    parity: str = "reference"                  # "reference": checked against the group's reference;
                                               # "own:<what>": checked against its own reference (see check)
    check: Callable[[Any], float] | None = None  # for "own:" parity: raises on mismatch, returns the error
    compare: Callable[[str], bool] | None = None  # which reference tensors it must match (default: all)
    rtol: float | None = None                  # parity tolerance when looser than the run's (bf16 rows)
    settings: str = ""                         # how the candidate was configured (compile mode, etc.)


@dataclass
class Group:
    suite: str
    shape: str                                 # label, e.g. "V1 B=50 T=50"
    mode: str                                  # "fwd", "fwd+bwd", "no-grad imagine", "update fp32", ...
    setup: Callable[[], Any]                   # draws the shared inputs / model once for the group
    inputs: Callable[[Any], dict[str, torch.Tensor]] | None = None  # tensors checked to be informative
    candidates: list[Candidate] = field(default_factory=list)
    work: dict[str, float] = field(default_factory=dict)  # e.g. {"transitions": B*T} for throughput


@dataclass
class Row:
    suite: str
    shape: str
    mode: str
    impl: str
    kind: str
    status: str                                # "ok" | "unavailable" | "error" | "parity-failed"
    reason: str = ""
    settings: str = ""
    median_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    repeats: int = 0
    peak_mem_mib: float | None = None
    parity: str = ""                           # what the first call was checked against
    parity_error: float | None = None          # worst relative error of that check
    ratio_to_ours_best: float | None = None
    per_second: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0                        # the whole row: build (and compile), check, warm-up, repeats


def run_group(group: Group, device: torch.device, timing: TimingConfig, rtol: float,
              log: Callable[[str], None] = print) -> list[Row]:
    try:
        shared = group.setup()
        if group.inputs is not None:
            assert_informative(flatten(group.inputs(shared)), f"{group.shape} input")
    except Exception as exc:
        status, reason = _failure(exc, log)
        return [Row(group.suite, group.shape, group.mode, c.impl, c.kind, status, f"setup: {reason}", c.settings)
                for c in group.candidates]
    rows: list[Row] = []
    reference: dict[str, torch.Tensor] = {}
    for index, cand in enumerate(group.candidates):
        row = Row(group.suite, group.shape, group.mode, cand.impl, cand.kind, "ok", settings=cand.settings,
                  parity=_parity_label(cand, index, group.candidates[0].impl))
        start = time.perf_counter()
        try:
            if cand.parity == "reference" and index > 0 and not reference:
                raise Unavailable(f"the reference ({group.candidates[0].impl}) did not run, "
                                  f"so parity cannot be asserted")
            call = cand.build(shared)
            first = call()
            outputs = flatten(first)
            assert_informative(outputs, f"{cand.impl} output")
            if cand.parity == "reference" and index == 0:
                reference, row.parity_error = detach(outputs), 0.0
            elif cand.parity == "reference":
                expected = {k: v for k, v in reference.items() if cand.compare is None or cand.compare(k)}
                row.parity_error = assert_parity(outputs, expected, rtol if cand.rtol is None else cand.rtol)
            elif cand.check is not None:
                row.parity_error = cand.check(first)
            del first, outputs
            t = measure(call, device, timing)
            row.median_ms, row.min_ms, row.max_ms, row.repeats, row.peak_mem_mib = (
                t.median_ms, t.min_ms, t.max_ms, t.repeats, t.peak_mem_mib)
            row.per_second = {k: v / (t.median_ms / 1e3) for k, v in group.work.items()}
        except Exception as exc:  # a crash in one row must not hide the others
            row.status, row.reason = _failure(exc, log)
        finally:
            call = first = outputs = None  # noqa: F841 (release this row's tensors before the next row)
            release_memory(device)
            row.wall_s = time.perf_counter() - start
        log(_progress(row))
        rows.append(row)
    del shared, reference
    release_memory(device)
    _fill_ratios(rows)
    return rows


def _parity_label(cand: Candidate, index: int, reference_impl: str) -> str:
    if cand.parity != "reference":
        return cand.parity.removeprefix("own:")
    if index == 0:
        return "is the reference"
    return f"vs {reference_impl}" + ("" if cand.compare is None else " (outputs, input grads)")


def _failure(exc: Exception, log: Callable[[str], None]) -> tuple[str, str]:
    if isinstance(exc, Unavailable):
        return "unavailable", str(exc)
    if isinstance(exc, ParityError):
        return "parity-failed", str(exc)
    log(traceback.format_exc())
    return "error", f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def _fill_ratios(rows: list[Row]) -> None:
    ours = [r.median_ms for r in rows if r.kind == "ours" and r.status == "ok"]
    if not ours:
        return
    best = min(ours)
    for r in rows:
        if r.status == "ok":
            r.ratio_to_ours_best = r.median_ms / best


def _progress(row: Row) -> str:
    where = f"[{row.suite}] {row.shape} | {row.mode} | {row.impl}"
    if row.status != "ok":
        return f"{where}: {row.status}: {row.reason}"
    return f"{where}: {row.median_ms:.3f} ms (parity {row.parity}: {row.parity_error})"
