"""Where one replayed no-grad call of the fused RSSM unroll spends its time, on CUDA.

    python -m benchmarks.profile.call_profile [--cases V3-12m-imagine-open,...] [--precision tf32] [--out f.json]

Per case (`benchmarks.triton_rssm`'s cases, inputs and `median_ms`), medians over timed repeats:
- call: one call, CUDA events around it, synchronized (the figure `benchmarks.triton_rssm` reports);
- host: the host's time per call when calls are queued back to back without a sync (what the GPU
  waits for before a call's first copy, in the figure above);
- replay: the captured graph replayed alone (the kernel and the work captured around it);
- the call split at its graph's launch, in synchronized calls (`launch_split`): the host's time from
  the call's entry to `graph.replay()`, the GPU's from the start event to an event recorded there
  (how long the GPU idled before the launch), and from that event to the call's end event; and the
  replay alone after a busy wait of the call's pre-launch host time (whether an idle GPU runs the
  replay slower);
- GPU work per call by kernel, from `torch.profiler` (the kernel, the input copies, the output
  copies when a replay copies them).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks import triton_rssm as bench
from benchmarks._cli import add_out, write_json


def profile_case(case: str, precision: str) -> dict:
    from worldmodels.core.cuda_graphs import UnrollCache
    bench.configure("triton", "default", precision)
    call, op, cache = bench.make_case(case), bench.ops()["triton"], UnrollCache()
    with torch.no_grad():
        for _ in range(5):
            call(op, cache)
        torch.cuda.synchronize()
        row = dict(case=case, precision=precision, call_ms=bench.median_ms(lambda: call(op, cache)))
        host = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                call(op, cache)
            host.append((time.perf_counter() - t0) / 20 * 1e3)
            torch.cuda.synchronize()
        row["host_ms"] = statistics.median(host)
        (graphed, _), = cache.values()
        capture = next(iter(graphed.captures), None) or graphed.copying
        row["replay_ms"] = bench.median_ms(capture.graph.replay)
        row.update(launch_split(lambda: call(op, cache), [*graphed.captures, graphed.copying]))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                call(op, cache)
            torch.cuda.synchronize()
    kernels = {}
    for event in prof.key_averages():
        if event.device_time_total > 0:
            kernels[event.key[:70]] = dict(us_per_call=event.device_time_total / 5, calls=event.count / 5)
    row["gpu_us_per_call"] = dict(sorted(kernels.items(), key=lambda kv: -kv[1]["us_per_call"]))
    return row


def launch_split(call, captures) -> dict:
    """Medians over synchronized calls of `call()`, whose replays run one of `captures` (the graph's
    `replay` stamped for the measurement, then restored): see the module docstring."""
    captures = [c for c in captures if c is not None]
    originals = [c.graph.replay for c in captures]
    stamp = {}

    def stamped(original):
        def replay():
            stamp["host"] = time.perf_counter()
            stamp["event"].record()
            original()
        return replay

    for c, original in zip(captures, originals):
        c.graph.replay = stamped(original)
    pre_host, pre_gpu, from_launch, after_host = [], [], [], []
    try:
        for _ in range(bench.WARMUP + bench.REPEATS):
            start, at, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            stamp["event"] = at
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            start.record()
            call()
            t1 = time.perf_counter()
            end.record()
            torch.cuda.synchronize()
            pre_host.append((stamp["host"] - t0) * 1e3)
            after_host.append((t1 - stamp["host"]) * 1e3)
            pre_gpu.append(start.elapsed_time(at))
            from_launch.append(at.elapsed_time(end))
    finally:
        for c, original in zip(captures, originals):
            del c.graph.replay  # the instance attribute: the class's method again
            assert c.graph.replay == original
    wait_s = statistics.median(pre_host) / 1e3
    replay = captures[0].graph.replay

    def idle_then_replay():
        until = time.perf_counter() + wait_s
        while time.perf_counter() < until:
            pass
        replay()

    return dict(pre_launch_host_ms=statistics.median(pre_host), pre_launch_gpu_ms=statistics.median(pre_gpu),
                launch_to_end_ms=statistics.median(from_launch), after_launch_host_ms=statistics.median(after_host),
                idle_then_replay_ms=bench.median_ms(idle_then_replay))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="V3-12m-imagine-open,V3-12m-imagine-actor,V3-1m-imagine-actor")
    parser.add_argument("--precision", default="tf32")
    add_out(parser, "call_profile.json")
    args = parser.parse_args(argv)
    rows = []
    for case in args.cases.split(","):
        row = profile_case(case, args.precision)
        rows.append(row)
        print(f"## {case} ({args.precision}): call {row['call_ms']:.3f} ms, host {row['host_ms']:.3f} ms, "
              f"graph replay alone {row['replay_ms']:.3f} ms")
        print(f"  synchronized call split at the launch: host before it {row['pre_launch_host_ms']:.3f} ms, GPU "
              f"idle before it {row['pre_launch_gpu_ms']:.3f}, launch to end {row['launch_to_end_ms']:.3f}, host "
              f"after it {row['after_launch_host_ms']:.3f}; replay after a busy wait of the host's pre-launch time "
              f"{row['idle_then_replay_ms']:.3f} ms")
        for name, k in row["gpu_us_per_call"].items():
            print(f"  {k['us_per_call']:9.1f} us  x{k['calls']:g}  {name}")
    write_json(args.out, rows)


if __name__ == "__main__":
    main()
