"""Time the triton RSSM unrolls (`worldmodels/ops/rssm/fused/`) against the `cudnn` (vendor
loop captured in CUDA graphs) and `loop` (the reference) ops: no grad, or with `--grad` forward +
backward (every weight, the inputs and the actor's parameters; fixed random cotangents).

    python -m benchmarks.triton_rssm [--grad] [--graph-call] [--out FILE] [--cases ...] [--variants ...]   # CUDA

`--graph-call` times the cudnn and triton rows as replays of the whole call (with `--grad`, forward
and backward) captured in one CUDA graph, the way the trainer's graphed update runs them: no host
time between the kernels. Each row reports `replay_diff`, the replay's largest difference from the
eager call's outputs and gradients.

Cases (benchmarks/shapes.py presets): V1 observe B50 T50, V3-s512 observe B16 T64, V1 imagine open
loop N1000 H12 (PlaNet's CEM) and with the Actor N2500 H15 (Dreamer V1), V3-1m and V3-12m imagine
N1024 H15, open loop and with the Actor in the loop. Every row (`loop` in fp32 too) is first checked
against the same case in float64 (`loop` on the fp32 draws cast up): `err` is the largest absolute
difference over every output; with `--grad`, `grad_err` is the largest over every gradient of |g - g_ref|
/ max|g_ref| (per tensor). Categorical latents and one-hot actions are argmaxes: where a
reduced-precision mode flips one, that row's trajectory parts and `err` jumps to ~1 (reported, not
an error), so each row also reports `err_kept`, the error over the steps before each row's first
flip (the precision mode's own rounding), and `parted`, the share of rows with a flip (`errors`; the
gradients sum over rows and are not split this way). Times are medians of CUDA-event timings after
warm-up, in ms. The triton kernels of every row are compiled first in parallel worker processes
(Triton's on-disk cache), so compiling stays out of the timed process. Prints a markdown table at
the end.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import statistics
import sys
import time

import torch

from benchmarks._cli import add_out, gpu_info, write_json

CASES = {  # name: (model preset, kind, batch, steps)
    "V1-observe": ("V1", "observe", 50, 50),
    "V3-s512-observe": ("V3_SMALL_512", "observe", 16, 64),
    "V1-imagine-open": ("V1", "open", 1000, 12),   # PlaNet's CEM: 1000 candidates, horizon 12
    "V1-imagine-actor": ("V1", "actor", 2500, 15),  # Dreamer V1's imagination: every state of B50 x T50, H15
    "V3-1m-imagine-open": ("V3_1M", "open", 1024, 15),
    "V3-1m-imagine-actor": ("V3_1M", "actor", 1024, 15),
    "V3-12m-imagine-open": ("V3_12M", "open", 1024, 15),
    "V3-12m-imagine-actor": ("V3_12M", "actor", 1024, 15),
    "V3-12m-observe": ("V3_12M", "observe", 16, 64),  # size12m's training observe (auto's rule with grad at deter 2048)
}
PRECISIONS = ("ieee", "tf32", "tf32x3", "bf16")
# Launch variants (keys of `triton_utils.LAUNCH_KEYS["rssm"]`, docs/kernels.md "Launch defaults"), swept at
# --variant-precisions (default SWEEP_PRECISION). A SPLIT that does not fit the SMs is reported as an error row.
VARIANTS = {
    "default": {},
    "s1": dict(SPLIT=1),                       # no column split: one program per batch tile
    "n16": dict(BLOCK_N=16),                   # more, thinner column tiles (more ranks with work)
    "k64": dict(BLOCK_K=64),                   # fewer, deeper dots per phase
    "b16": dict(BLOCK_B=16, num_warps=4),      # 16-row tiles where a rule widens them
    "b64-w8": dict(BLOCK_B=64, num_warps=8),   # 64-row tiles where the rules keep 16
    "nobarrier": dict(BARRIER=False),          # timing only, results wrong: what the barriers cost
    "nocount": dict(COUNT_BARRIER=False),      # the flag barrier where the counter is the default
    "nofold": dict(FOLD_NORMS=False),          # the norm phases where the fold is the default
    "noksr": dict(KSPLIT_ROWS=False, BLOCKS_KMAJOR=False, PRELOAD_H=False),  # 64-row tiles without their three
}
SWEEP_PRECISION = "tf32"
WARMUP, REPEATS = 3, 15


def make_case(case: str, device="cuda", seed=0, grad=False, dtype=torch.float32):
    """call(op_module, cache) -> the op's outputs, on one case's fixed random inputs (same `seed`,
    same tensors: every impl sees the same weights, inputs and noise). With `grad`, the weights,
    the float inputs and the actor's parameters require gradients, and call.leaves lists them.
    `dtype` float64 gives the reference's case: the same fp32 draws, cast up (weights, inputs, noise)."""
    import worldmodels as wm
    from benchmarks import shapes

    preset, kind, batch, steps = CASES[case]
    cfg = getattr(shapes, preset)
    torch.manual_seed(seed)
    rssm = wm.RSSM(cfg.action, cfg.embed, **cfg.rssm_kwargs()).to(device)
    noise = rssm.noise((batch, steps))
    deter = 0.5 * torch.randn(batch, cfg.deter, device=device)
    if cfg.classes:
        index = torch.randint(cfg.classes, (batch, cfg.stoch), device=device)
        stoch = torch.nn.functional.one_hot(index, cfg.classes).float().flatten(1)
    else:
        stoch = torch.randn(batch, cfg.stoch, device=device)
    rssm.to(dtype).requires_grad_(grad)
    spec, w = rssm.op_spec(), rssm.op_weights()
    noise, deter, stoch = noise.to(dtype), deter.to(dtype), stoch.to(dtype)
    if kind == "observe":
        action = (torch.rand(batch, steps, cfg.action, device=device) * 2 - 1).to(dtype)
        embed = torch.randn(batch, steps, cfg.embed, device=device).to(dtype)
        is_first = torch.rand(batch, steps, device=device) < 1 / steps
        action.requires_grad_(grad), embed.requires_grad_(grad)
        args = (spec, w, torch.zeros_like(deter), torch.zeros_like(stoch), action, embed, is_first,
                noise["posterior"], noise["prior"])
        return _with_leaves(lambda op, cache: op.observe(*args, cache=cache), [*w.values(), action, embed], grad)
    deter.requires_grad_(grad)
    args = (spec, w, deter, stoch, noise["prior"])
    if kind == "open":
        actions = torch.nn.functional.one_hot(torch.randint(cfg.action, (batch, steps), device=device), cfg.action)
        actions = actions.to(dtype)  # once, not in every timed call
        return _with_leaves(lambda op, cache: op.imagine(*args, actions=actions, cache=cache),
                            [*w.values(), deter], grad)
    actor = wm.Actor(cfg.stoch_dim + cfg.deter, cfg.action, **cfg.actor_kwargs()).to(device)
    policy_noise = actor.noise((batch, steps)).to(dtype)
    actor.to(dtype).requires_grad_(grad)
    kwargs = dict(policy=actor, policy_params=dict(actor.named_parameters()), policy_noise=policy_noise)
    return _with_leaves(lambda op, cache: op.imagine(*args, **kwargs, cache=cache),
                        [*w.values(), deter, *actor.parameters()], grad)


def _with_leaves(call, leaves, grad):
    """`call` with .leaves (the tensors whose gradients a grad case asks for)."""
    call.leaves = [t for t in leaves if grad and t.requires_grad]
    return call


def forward_backward(call, op, cache) -> dict[str, torch.Tensor]:
    """One forward and backward of sum(output * cotangent) over the outputs (fixed cotangents: a
    per-output random vector seeded by the output's name, drawn on the first call and kept on
    `call`, so the timed calls do not draw them, as in `benchmarks.autodiff`); the gradients by
    leaf index."""
    out = flat(call(op, cache))
    cotangents = call.__dict__.setdefault("cotangents", {})
    loss = 0
    for name, v in sorted(out.items()):
        if v.requires_grad:
            if name not in cotangents:
                gen = torch.Generator(device=v.device).manual_seed(sum(map(ord, name)))
                cotangents[name] = torch.randn(v.shape, device=v.device, generator=gen)
            loss = loss + (v * cotangents[name]).sum()
    grads = torch.autograd.grad(loss, call.leaves, allow_unused=True)
    return {**{k: v.detach() for k, v in out.items()}, **{f"grad.{i}": g for i, g in enumerate(grads) if g is not None}}


def ops():
    from worldmodels.ops.rssm import cudnn, fused, reference
    return {"loop": reference, "cudnn": cudnn, "triton": fused}


def flat(out) -> dict[str, torch.Tensor]:
    if isinstance(out, tuple):
        post, prior = out
        return {**{f"post.{k}": v for k, v in post.items()}, **{f"prior.{k}": v for k, v in prior.items()}}
    return dict(out)


_launch = contextlib.ExitStack()


def configure(impl: str, variant: str, precision: str) -> None:
    """The precision every impl runs in (torch's for loop / cudnn, the recurrent one for triton)
    and, until the next call, the triton launch variant's keys."""
    import worldmodels as wm
    from worldmodels.ops.triton_utils import launch_overrides
    torch.set_float32_matmul_precision("highest" if precision in ("ieee", "tf32x3") else "high")
    wm.set_recurrent_matmul_precision(precision)
    _launch.close()
    _launch.enter_context(launch_overrides("rssm", **(VARIANTS.get(variant, {}) if impl == "triton" else {})))


def run_case(call, op, cache) -> dict[str, torch.Tensor]:
    """Outputs (and with a `make_case(grad=True)` call, the gradients) of one call."""
    if call.leaves:
        return forward_backward(call, op, cache)
    with torch.no_grad():
        return flat(call(op, cache))


def warm(row):
    """Compile a row's kernels (in a worker process: Triton caches them on disk)."""
    try:
        case, impl, variant, precision = row
        configure(impl, variant, precision)
        with torch.no_grad():
            make_case(case)(ops()[impl], None)
        torch.cuda.synchronize()
        return None
    except Exception as e:  # reported again by the timed run
        return f"{row}: {type(e).__name__}: {e}"


def median_ms(fn, warmup: int = WARMUP, before=None) -> float:
    """Median ms of REPEATS timed calls of `fn` after `warmup` untimed ones; `before(i)`, when given,
    runs ahead of timed call i, outside the timed region."""
    for _ in range(warmup):
        fn()
    times = []
    for i in range(REPEATS):
        if before is not None:
            before(i)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def captured(fn):
    """(replay, outputs): `fn` captured whole into one CUDA graph after warm-up on a side stream, as
    the trainer's graphed update captures forward and backward (`train/graphed_update.py`)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


def parted_from(case: str, out: dict, reference: dict) -> torch.Tensor:
    """[B, T] bool: True from the first step where one of a row's argmax samples (V3's categorical
    latents, a one-hot Actor's actions) differs from the reference's. From there the row's trajectory
    follows another sample, so its differences are no longer rounding."""
    from benchmarks import shapes
    cfg = getattr(shapes, CASES[case][0])
    flips = None
    for k, ref in reference.items():
        name = k.rsplit(".", 1)[-1]
        if not cfg.v3 or name not in ("stoch", "action"):
            continue
        size = cfg.classes if name == "stoch" else ref.shape[-1]
        flip = (out[k].double().unflatten(-1, (-1, size)).argmax(-1) != ref.unflatten(-1, (-1, size)).argmax(-1))
        flip = flip.flatten(2).any(-1)   # [B, T]
        flips = flip if flips is None else flips | flip
    if flips is None:
        return torch.zeros(next(iter(reference.values())).shape[:2], dtype=torch.bool)
    return flips.cumsum(1).bool().cpu()


def errors(case: str, out: dict, reference: dict) -> dict:
    """Against the float64 reference: `err`, the largest absolute difference over every output;
    `err_kept`, the same over the steps before each row's first flipped sample (`parted_from`: the
    precision mode's own error, not a different trajectory's); `parted`, the share of rows with a
    flip; with gradients, `grad_err`, the largest |g - g_ref| / max|g_ref| per tensor."""
    values = [k for k in reference if not k.startswith("grad.")]
    parted = parted_from(case, out, reference)
    diff = {k: (out[k].double() - reference[k]).abs().cpu() for k in values}
    kept = [d[~parted] for d in diff.values() if d.dim() >= 2 and d.shape[:2] == parted.shape]
    r = dict(err=max((d.max().item() for d in diff.values()), default=float("nan")),
             err_kept=max((d.max().item() for d in kept if d.numel()), default=float("nan")),
             parted=parted.any(1).float().mean().item())
    grads = [k for k in reference if k.startswith("grad.")]
    if grads:
        r["grad_err"] = max((out[k].double() - reference[k]).abs().max().item()
                            / reference[k].abs().max().clamp_min(1e-30).item() for k in grads)
    return r


def run_row(row, reference: dict, grad: bool, graph_call: bool = False) -> dict:
    from worldmodels.core.cuda_graphs import UnrollCache
    case, impl, variant, precision = row
    configure(impl, variant, precision)
    call = make_case(case, grad=grad)
    op, cache = ops()[impl], UnrollCache()
    out = run_case(call, op, cache)
    r = dict(case=case, impl=impl, variant=variant, precision=precision, **errors(case, out, reference))

    def timed():
        return run_case(call, op, cache)

    if graph_call and impl != "loop":
        timed, replayed = captured(timed)
        timed()
        torch.cuda.synchronize()
        # the replay computes what the eager call did (same inputs; reduced precisions may part trajectories)
        r["replay_diff"] = max((replayed[k].double() - out[k].double()).abs().max().item() for k in out)
    r["ms"] = median_ms(timed)
    return r


def main():
    parser = argparse.ArgumentParser()
    add_out(parser, "triton_rssm.json")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="the default launch's rows")
    parser.add_argument("--variant-precisions", default=SWEEP_PRECISION,
                        help="the other variants' rows (an A/B of a variant in bf16: --variant-precisions bf16)")
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--grad", action="store_true", help="time forward + backward (default: no grad)")
    parser.add_argument("--no-compile", action="store_true", help="skip the parallel compile (cache filled)")
    parser.add_argument("--graph-call", action="store_true",
                        help="time the cudnn / triton rows as replays of the whole call captured in one CUDA graph "
                             "(as the trainer's graphed update runs them; with --grad, forward and backward)")
    args = parser.parse_args()
    cases, variants, precisions, variant_precisions = (
        a.split(",") for a in (args.cases, args.variants, args.precisions, args.variant_precisions))
    unknown = [v for v in variants if v not in VARIANTS] + [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown variants / cases {unknown}; variants: {', '.join(VARIANTS)}")
    wrong = [p for p in precisions + variant_precisions if p not in PRECISIONS]
    if wrong:
        parser.error(f"--precisions / --variant-precisions: {wrong} not in {list(PRECISIONS)}")
    info = gpu_info()
    rows = []
    for case in cases:
        rows += [(case, "loop", "-", "ieee"), (case, "cudnn", "-", "ieee"), (case, "cudnn", "-", "tf32")]
        rows += [(case, "triton", "default", p) for p in precisions]
        rows += [(case, "triton", v, p) for v in variants if v != "default" for p in variant_precisions]
    if not args.no_compile:
        start = time.time()
        triton_rows = [r for r in rows if r[1] == "triton"]
        with mp.get_context("spawn").Pool(args.workers) as pool:
            failures = [f for f in pool.map(warm, triton_rows, chunksize=1) if f]
        print(f"compiled {len(triton_rows)} rows in {time.time() - start:.0f} s; failures: {failures}", flush=True)
    results, references = [], {}
    for row in rows:
        try:
            if row[0] not in references:
                configure("loop", "-", "ieee")
                reference = run_case(make_case(row[0], grad=args.grad, dtype=torch.float64), ops()["loop"], None)
                references[row[0]] = {k: v.detach() for k, v in reference.items()}
            r = run_row(row, references[row[0]], args.grad, args.graph_call)
        except Exception as e:
            r = dict(case=row[0], impl=row[1], variant=row[2], precision=row[3], error=f"{type(e).__name__}: {e}")
        print(r, flush=True)
        results.append(r)
        write_json(args.out, dict(info=info, rows=results))
    mode = ("fwd+bwd" if args.grad else "no grad") + (", one CUDA graph" if args.graph_call else "")
    print(f"\n| case | impl | variant | precision | max abs err vs float64 | before a flip | rows parted | "
          f"grad rel err | ms ({mode}) |\n|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['case']} | {r['impl']} | {r['variant']} | {r['precision']} | {r['error']} | - | - | - | - |")
        else:
            print(f"| {r['case']} | {r['impl']} | {r['variant']} | {r['precision']} | {r['err']:.1e} | "
                  f"{r['err_kept']:.1e} | {r['parted']:.0%} | {r.get('grad_err', float('nan')):.1e} | "
                  f"{r['ms']:.3f} |")


if __name__ == "__main__":
    sys.exit(main())
