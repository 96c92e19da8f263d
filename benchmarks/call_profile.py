"""Where one replayed no-grad call of the fused RSSM unroll spends its time, on CUDA.

    python -m benchmarks.call_profile [--cases V3-12m-imagine-open,...] [--precision tf32] [--out f.json]

Per case (`benchmarks.triton_rssm`'s cases, inputs and `median_ms`), medians over timed repeats:
- call: one call, CUDA events around it, synchronized (the figure `benchmarks.triton_rssm` reports);
- host: the host's time per call when calls are queued back to back without a sync (what the GPU
  waits for before a call's first copy, in the figure above);
- replay: the captured graph replayed alone (the kernel and the work captured around it);
- GPU work per call by kernel, from `torch.profiler` (the kernel, the input copies, the output
  copies when a replay copies them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from benchmarks import triton_rssm as bench


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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="V3-12m-imagine-open,V3-12m-imagine-actor,V3-1m-imagine-actor")
    parser.add_argument("--precision", default="tf32")
    parser.add_argument("--out", default="call_profile.json")
    args = parser.parse_args(argv)
    rows = []
    for case in args.cases.split(","):
        row = profile_case(case, args.precision)
        rows.append(row)
        print(f"## {case} ({args.precision}): call {row['call_ms']:.3f} ms, host {row['host_ms']:.3f} ms, "
              f"graph replay alone {row['replay_ms']:.3f} ms")
        for name, k in row["gpu_us_per_call"].items():
            print(f"  {k['us_per_call']:9.1f} us  x{k['calls']:g}  {name}")
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
