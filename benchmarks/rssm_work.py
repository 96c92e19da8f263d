"""The work on the carried chain of each triton RSSM case, and the floors it gives.

    python -m benchmarks.rssm_work [--results docs/results/triton_rssm/nograd.json]

For each case of `benchmarks.triton_rssm` (model preset, kind, rows, steps) it counts, from the
models' own weights (`RSSM.op_weights`, `Actor.named_parameters`), the weights one step of the
chain multiplies: the cell (V1: in_stoch, the GRU's w_ih and w_hh; V3: in_deter, in_stoch, dyn_x,
the block-diagonal dyn_h and gates), the head that feeds back (observe: post_deter and post_out;
imagination: prior and prior_out) and, with the Actor in the loop, the Actor and the action layer.
What does not depend on the carry (the embedding's and the action's shares, observe's prior head)
runs off the chain and is not counted. From that:
- MFLOP per step (2 x rows x weights) and per call;
- the tf32 tensor-core time of a call's FLOPs at the H200's dense rate (`TF32_TFLOPS`): the
  arithmetic floor;
- the weights' bytes per step (fp32) and, with `--results`, the measured no-grad triton tf32 time per
  step beside them (the whole call / steps: host and replay included).
On the H200 the measured time was 13-378x the arithmetic floor: the chain is latency-bound (see
docs/kernels.md, "Work per step and the floor"). Runs on any machine: it builds the models on CPU
and launches nothing.
"""

from __future__ import annotations

import argparse
import json

TF32_TFLOPS = 495.0  # H200 dense tf32 tensor-core rate (vendor datasheet, without sparsity)
CHAIN = {  # weight names on the carried chain, by cell and by the head that feeds back
    "gru": ("in_stoch.w", "gru.w_ih", "gru.w_hh"),
    "block_gru": ("in_deter.w", "in_stoch.w", "dyn_x.w", "dyn_h", "gates.w"),
    "observe": ("post_deter.w", "post_out.w"),
    "imagine": ("prior.w", "prior_out.w"),
}


def chain_weights(case: str) -> dict[str, int]:
    """{name: weights} multiplied by one step of `case`'s chain (matrices only: biases and norms are
    elementwise)."""
    import worldmodels as wm
    from benchmarks import shapes
    from benchmarks.triton_rssm import CASES

    preset, kind, _, _ = CASES[case]
    cfg = getattr(shapes, preset)
    w = wm.RSSM(cfg.action, cfg.embed, **cfg.rssm_kwargs()).op_weights()
    spec_cell = cfg.rssm_kwargs()["cell"]
    names = CHAIN[spec_cell] + CHAIN["observe" if kind == "observe" else "imagine"]
    out = {name: w[name].numel() for name in names}
    if kind == "actor":
        actor = wm.Actor(cfg.stoch_dim + cfg.deter, cfg.action, **cfg.actor_kwargs())
        out.update({f"actor.{n}": p.numel() for n, p in actor.named_parameters() if p.dim() == 2})
        out["in_action.w"] = w["in_action.w"].numel()
    return out


def work_rows(measured: dict[str, float] | None = None) -> list[dict]:
    from benchmarks.triton_rssm import CASES

    rows = []
    for case, (_, _, batch, steps) in CASES.items():
        weights = sum(chain_weights(case).values())
        flop_step = 2 * batch * weights
        row = dict(case=case, rows=batch, steps=steps, weights=weights, weight_mb=4 * weights / 2**20,
                   mflop_step=flop_step / 1e6, gflop_call=flop_step * steps / 1e9,
                   tf32_floor_us=flop_step * steps / (TF32_TFLOPS * 1e12) * 1e6)
        if measured and case in measured:
            row["measured_us_step"] = 1e3 * measured[case] / steps
            row["measured_over_floor"] = 1e3 * measured[case] / row["tf32_floor_us"]
        rows.append(row)
    return rows


def measured_from(path: str) -> dict[str, float]:
    """case -> the no-grad triton tf32 default row's ms, from a `benchmarks.triton_rssm` JSON."""
    with open(path) as f:
        results = json.load(f)["rows"]
    return {r["case"]: r["ms"] for r in results if r["impl"] == "triton" and r["variant"] == "default"
            and r["precision"] == "tf32" and "ms" in r}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.rssm_work", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=None, help="a benchmarks.triton_rssm JSON (no grad) to set beside")
    args = p.parse_args(argv)
    measured = measured_from(args.results) if args.results else None
    print("| case | rows x steps | chain weights | MB fp32 | MFLOP / step | GFLOP / call | tf32 floor, us / call "
          "| measured tf32, us / step | measured / floor |\n|---|---|---|---|---|---|---|---|---|")
    for r in work_rows(measured):
        print(f"| {r['case']} | {r['rows']} x {r['steps']} | {r['weights'] / 1e3:.0f} k | {r['weight_mb']:.2f} | "
              f"{r['mflop_step']:.0f} | {r['gflop_call']:.2f} | {r['tf32_floor_us']:.1f} | "
              f"{r.get('measured_us_step', float('nan')):.1f} | {r.get('measured_over_floor', float('nan')):.0f}x |")


if __name__ == "__main__":
    main()
