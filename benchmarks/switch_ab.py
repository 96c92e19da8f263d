"""Interleaved A/B of one switch of the triton RSSM op module, in one process, on CUDA.

    python -m benchmarks.switch_ab --switch input_table [--cases V3-12m-imagine-open,...] [--rounds 6]
                                   [--precision tf32] [--out switch_ab.json]

Rows of `benchmarks.triton_rssm` in separate processes differ by ~3-5% on the H200 (the same tree
measured 1.53 and 1.64-1.67 ms at V3-12m open loop on two days), more than some changes it is
asked to judge. Here both settings of a `worldmodels.ops.rssm.triton` switch (`capture_no_grad`,
`fused_share`, `input_table`) time the same case's call (`triton_rssm.make_case`: fixed inputs,
no grad, each setting with its own capture cache) in alternating order over `--rounds` rounds of
`triton_rssm.median_ms`'s 15 CUDA-event timings, after warm-up. Two input patterns per round:
`same` (the same tensors every call, as `benchmarks.triton_rssm` times them) and `fresh` (the
RSSM's noise rewritten in place before each call, outside the timed region, as training draws it
anew each call). Prints and
writes the median over rounds per (setting, pattern) and every round's median.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from benchmarks import triton_rssm as bench

SWITCHES = ("capture_no_grad", "fused_share", "input_table")
def ab_case(case: str, switch: str, rounds: int) -> dict[str, list[float]]:
    """{"on/same": [round medians], "off/same": ..., "on/fresh": ..., "off/fresh": ...}."""
    from worldmodels.core.cuda_graphs import UnrollCache
    from worldmodels.ops.rssm import triton as triton_rssm

    call, op = bench.make_case(case), bench.ops()["triton"]
    caches = {True: UnrollCache(), False: UnrollCache()}
    noise = [t for t in call.noise.values() if t is not None]
    pool = [[torch.randn_like(t) for t in noise] for _ in range(2)]  # (the timings are the point, not the values)

    def run(on: bool):
        setattr(triton_rssm, switch, on)
        return call(op, caches[on])

    def fresh(i: int):
        for t, new in zip(noise, pool[i % 2]):
            t.copy_(new)

    out: dict[str, list[float]] = {f"{setting}/{p}": [] for setting in ("on", "off") for p in ("same", "fresh")}
    try:
        with torch.no_grad():
            for on in (True, False):
                for _ in range(3):
                    run(on)
            torch.cuda.synchronize()
            for r in range(rounds):
                for pattern, refresh in (("same", lambda i: None), ("fresh", fresh)):
                    for on in ((True, False) if r % 2 == 0 else (False, True)):
                        out[f"{'on' if on else 'off'}/{pattern}"].append(bench.median_ms(lambda: run(on), 0, refresh))
    finally:
        setattr(triton_rssm, switch, True)  # every switch is on by default
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.switch_ab", description=__doc__.split("\n\n")[0])
    p.add_argument("--switch", required=True, choices=SWITCHES)
    p.add_argument("--cases", default="V3-12m-imagine-open,V3-1m-imagine-actor")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--precision", default="tf32", choices=bench.PRECISIONS)
    p.add_argument("--out", default="switch_ab.json")
    args = p.parse_args(argv)
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in bench.CASES]
    if unknown:
        p.error(f"--cases: unknown {unknown}; the cases: {', '.join(bench.CASES)}")
    if args.rounds < 1:
        p.error(f"--rounds={args.rounds} must be >= 1")
    if not torch.cuda.is_available():
        p.error("needs a CUDA device (it times CUDA-graph replays)")
    bench.configure("triton", "default", args.precision)
    results = {}
    for case in cases:
        results[case] = ab_case(case, args.switch, args.rounds)
        for key, medians in results[case].items():
            print(f"{case:24s} {args.switch}={key:10s} median {statistics.median(medians):.4f} ms  "
                  f"rounds {[round(m, 3) for m in medians]}", flush=True)
    with open(args.out, "w") as f:
        json.dump(dict(switch=args.switch, precision=args.precision, results=results), f, indent=1)


if __name__ == "__main__":
    main()
