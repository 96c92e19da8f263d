"""Timing one callable: warm-up, then the median of timed repeats and the peak memory.

On CUDA every repeat is bracketed by CUDA events (device time of everything the call queued,
host launch gaps included) and the peak is `torch.cuda.max_memory_allocated` over the timed
repeats, after a reset. On CPU the clock is `time.perf_counter` and there is no peak-memory
counter (reported as None).
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    repeats: int
    peak_mem_mib: float | None  # absolute allocated peak during the repeats (params + inputs + transients)


@dataclass
class TimingConfig:
    warmup: int = 3
    min_repeats: int = 5
    max_repeats: int = 50
    target_s: float = 2.0  # time budget for the repeats of one row, after warm-up


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release_memory(device: torch.device) -> None:
    """Drop what the previous row left behind so peaks are per row."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure(call: Callable[[], object], device: torch.device, config: TimingConfig) -> Timing:
    """Warm `call` up, then time `repeats` calls; the repeat count fits `config.target_s`."""
    start = time.perf_counter()
    for _ in range(max(config.warmup, 1)):
        call()
    synchronize(device)
    per_call_s = (time.perf_counter() - start) / max(config.warmup, 1)
    repeats = math.ceil(config.target_s / max(per_call_s, 1e-6))
    repeats = max(config.min_repeats, min(config.max_repeats, repeats))

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        for begin, end in events:
            begin.record()
            call()
            end.record()
        torch.cuda.synchronize(device)
        samples = [begin.elapsed_time(end) for begin, end in events]
        peak = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        samples = []
        for _ in range(repeats):
            begin = time.perf_counter()
            call()
            samples.append((time.perf_counter() - begin) * 1e3)
        peak = None
    return Timing(statistics.median(samples), min(samples), max(samples), repeats, peak)
