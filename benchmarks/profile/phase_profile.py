"""Where a fused RSSM step spends its time, per phase: every program of the triton kernels stamps
%globaltimer when it reaches and when it passes each barrier (`triton_utils.sync`, launch key
`PROFILE`), so each phase's time splits into its own work (passing the previous barrier -> reaching
this one) and the wait for the slowest program of its batch tile (reaching -> passing).

    python -m benchmarks.profile.phase_profile V3-1m-imagine-actor [--grad] [--precision tf32] [--variant k64]   # CUDA

The cases and launch variants are `benchmarks.triton_rssm`'s. The kernels run uncaptured, after a
warm-up, over `--calls` calls; a phase's figures are medians over programs, steps and calls, in us.
The stamps cost a CTA barrier and a store each, so the profiled kernel runs a little slower than the
timed one: compare phases with each other, not with `triton_rssm`'s times. Prints a markdown table
per kernel, its phases named in kernel order (numbered where the names do not fit the count of
barriers), and writes --out.
"""

from __future__ import annotations

import argparse
import statistics

import dataclasses

import torch

from benchmarks._cli import add_out, write_json


def forward_phase_names(dims, actor: dict | None, fold: bool = False) -> list[str]:
    """The barriers of one step of `rssm_kernel`, in order, each named by the phase it ends (`fold`:
    the launch's FOLD_NORMS, where a row norm has no phase of its own)."""
    v3, normed, layers = dims.v3, dims.normed, dims.actor_layers  # fused.launch.Dims

    def dense(name, norm=normed, foldable=True):
        return [f"{name} dot", f"{name} norm"] if norm and not (fold and foldable) else [name]

    names = []
    if actor is not None:
        for layer in range(layers):
            names += dense(f"actor.{layer}", actor["norm"] != 0)
        names += ["actor.out dot", "actor sample"] if actor["dist"] == 0 else ["actor.out + sample"]
        names += dense("in_action", normed and v3)
    if v3:
        names += dense("in_deter + in_stoch") + (["dyn dot", "dyn_out norm"] if normed else ["dyn dot"])
        names += ["gates + update"]
    else:
        names += dense("in", foldable=False) + ["gru"]
    names += dense("head")
    names += ["logits dot", "categorical sample"] if dims.classes > 1 else ["gaussian head + sample"]
    return names


def chain_phase_names(dims, actor: dict | None) -> list[str]:
    """The barriers of one reverse step of `rssm_chain_kernel`, in order (the forward's phases
    backwards; "^T": a forward layer's weight read transposed)."""
    v3, normed, layers = dims.v3, dims.normed, dims.actor_layers  # fused.launch.Dims

    def dense(name, norm=normed):
        return [f"{name} dot^T", f"{name} norm grad"] if norm else [f"{name} dot^T"]

    names = ["head distribution grad", *dense("head"), "cell: g_deter, gate derivatives"]
    if v3:
        names += ["g_u = gate derivatives gates^T"] + (["dyn_out norm grad"] if normed else [])
        names += dense("in_deter + in_stoch")
    else:
        names += dense("in")
    if actor is not None:
        names += dense("in_action", normed) if v3 else []
        names += ["action cotangent", "action distribution grad"]
        for layer in reversed(range(layers)):
            names += dense(f"actor.{layer}", actor["norm"] != 0)
    return names + ["carry: g_deter, g_stoch of step t-1"]


def phases(flags: torch.Tensor, programs: int, steps: int) -> dict:
    """Per phase of a step (barrier index within the step): the median work and wait (us) over programs
    and steps, and the median over steps of the slowest program's work in the grid (a bound on what
    a batch tile's programs wait for); the step's and the kernel's totals."""
    stamps = flags[programs:].view(torch.int64)  # uint64 with the counter barrier: the same stamps
    rec = stamps.view(-1, programs, 2).double() / 1e3  # [epoch, program, reach / pass], us
    written = (rec[:, :, 1] != 0).all(1).nonzero().flatten()
    last = int(written.max())
    if last % steps:
        raise RuntimeError(f"{last} barriers over {steps} steps: not a whole number per step")
    per_step = last // steps
    reach, passed = rec[1:last + 1, :, 0], rec[1:last + 1, :, 1]
    work = torch.cat([torch.full_like(reach[:1], float("nan")), reach[1:] - passed[:-1]])  # first: no start
    wait = passed - reach
    rows = []
    for j in range(per_step):
        w, q = work[j::per_step], wait[j::per_step]  # [steps, programs]
        slowest = w.nan_to_num(float("-inf")).max(1).values
        rows.append(dict(work_us=float(w[~w.isnan()].median()), slowest_us=float(slowest[slowest.isfinite()].median()),
                         wait_us=float(q.median())))
    step = (passed[per_step - 1 + per_step::per_step] - passed[per_step - 1:-per_step:per_step]).flatten()
    return dict(per_step=per_step, phases=rows, step_us=float(step.median()),
                kernel_us=float((passed[-1] - reach[0]).max()))


def main(argv=None) -> None:
    from benchmarks.triton_rssm import CASES, VARIANTS, configure, forward_backward, make_case, run_case
    from worldmodels.ops.rssm import fused
    from worldmodels.ops.triton_utils import launch_overrides

    p = argparse.ArgumentParser(prog="python -m benchmarks.profile.phase_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("case", choices=list(CASES))
    p.add_argument("--grad", action="store_true", help="also the backward's reverse-chain kernel")
    p.add_argument("--precision", default="tf32", choices=("ieee", "tf32", "tf32x3", "bf16"))
    p.add_argument("--variant", default="default", choices=[v for v in VARIANTS if v not in ("nobarrier",)])
    p.add_argument("--calls", type=int, default=3)
    add_out(p, help="JSON file for the table")
    args = p.parse_args(argv)
    if args.calls < 1:
        p.error(f"--calls={args.calls} must be >= 1")
    if not torch.cuda.is_available():
        p.error("needs CUDA (the stamps read the GPU's %globaltimer)")
    configure("triton", args.variant, args.precision)
    records: list = []
    call = make_case(args.case, grad=args.grad)

    def run():
        with launch_overrides("rssm", PROFILE=records):
            return forward_backward(call, fused, None) if args.grad else run_case(call, fused, None)

    run()  # compile and warm up
    torch.cuda.synchronize()
    records.clear()
    for _ in range(args.calls):
        run()
    torch.cuda.synchronize()
    steps = CASES[args.case][3]
    tables = {}
    for kernel, plan, flags in records:
        programs = plan.tiles * plan.nprog
        tables.setdefault(kernel, []).append((plan, phases(flags.cpu(), programs, steps)))
    report = dict(case=args.case, precision=args.precision, variant=args.variant, grad=args.grad, kernels={})
    actor = None
    if CASES[args.case][1] == "actor":
        actor = dict(norm=1, dist=0)  # the V3 presets' Actor: RMSNorm layers, one-hot actions
    for kernel, runs in tables.items():
        plan, first = runs[0]
        per_step = first["per_step"]
        if kernel == "rssm_kernel":  # the forward folds its norms only where it saves nothing (no --grad)
            names = forward_phase_names(plan.dims, actor, plan.fold and not args.grad)
        else:
            names = chain_phase_names(plan.dims, actor)
        if len(names) != per_step:
            names = [f"phase {j + 1}" for j in range(per_step)]
        rows = []
        for j, name in enumerate(names):
            rows.append(dict(phase=name, **{k: statistics.median(r["phases"][j][k] for _, r in runs)
                                            for k in ("work_us", "slowest_us", "wait_us")}))
        step = statistics.median(r["step_us"] for _, r in runs)
        span = statistics.median(r["kernel_us"] for _, r in runs)
        cfg = {k: v for k, v in dataclasses.asdict(plan).items() if k not in ("dims", "slots", "profile")}
        report["kernels"][kernel] = dict(grid=(plan.tiles, plan.nprog), cfg=cfg,
                                         barriers_per_step=per_step, step_us=step, kernel_us=span, phases=rows)
        sums = {k: sum(r[k] for r in rows) for k in ("work_us", "slowest_us", "wait_us")}
        print(f"\n{kernel}: grid {plan.tiles} x {plan.nprog}, {per_step} barriers per step, step {step:.1f} us "
              f"(sums of the medians: work {sums['work_us']:.1f}, slowest program's work {sums['slowest_us']:.1f}, "
              f"waits {sums['wait_us']:.1f}), kernel {span / 1e3:.3f} ms"
              f"\n\n| phase | work us | slowest program us | wait us |\n|---|---|---|---|")
        for r in rows:
            print(f"| {r['phase']} | {r['work_us']:.2f} | {r['slowest_us']:.2f} | {r['wait_us']:.2f} |")
    write_json(args.out, report)


if __name__ == "__main__":
    main()
