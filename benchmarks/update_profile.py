"""Where one DreamerV3 update's time goes: device span, GPU busy time and kernel count per phase.

    python -m benchmarks.update_profile [--model size1m] [--obs pixels|state] [--precision tf32|bf16]
                                        [--backend triton] [--variants base,fused_adam] [--out FILE.json]

The update is the learner suite's (`benchmarks/learner_suite.py`: `DreamerV3.update` built from the
repo's configs, B16 T64, pixels 64x64 with 6 discrete actions, or state observations of 5 floats
with 1 continuous action, like cartpole_swingup). For each variant it prints:
- `update`: the median of CUDA-event timings of whole updates (warm-up first), and the host time
  of the same calls (perf_counter around the Python call, no sync): host time close to the device
  span means the update is bound by the host launching kernels, not by the GPU;
- per phase (world-model loss, its optimiser step, imagination, actor step, critic step): the
  device span between CUDA events recorded at the phase's ends, and its host time;
- from `torch.profiler` over a few updates: GPU busy time per update (the union of kernel
  intervals), kernels per update, and the kernels that take the most time.
Variants change one thing each (`VARIANTS`): `base` (foreach Adam), `fused_adam` (the library's
default), `graphed` (fused Adam, the update replayed from one CUDA graph: `train/graphed_update.py`,
the trainer's default on CUDA), `graphed_compiled_nets` (graphed, with the MLPs around the RSSM
compiled by inductor first: `Agent.compile_nets`, a run's `compile_nets=true`).
The comparison is within one run, warm, by medians. `--launch
KEY=0|1,...` overrides triton RSSM launch keys (`ops/triton_utils.launch_overrides`; e.g.
`--launch KSPLIT_ROWS=0` times the update without the long-K layers' K split). `--set model.KEY=VALUE,...`
changes the model or algo config (a preset's layout: `--model size12m --obs state --set
model.dyn_hidden=2048,model.dyn_norm=all,model.prior_layers=2`). `--experiment NAME` takes the model
and algo config that `scripts/train.py +experiment=NAME` composes instead (`--model` is then unused;
`--set` still applies on top), e.g. the 2023 DMC protocol on walker_walk's shapes:

    python -m benchmarks.update_profile --experiment dmc_proprio_2023 --obs state --obs-dim 24 --actions 6 \
        --backend cudnn --variants graphed,fused_adam
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
import yaml
from omegaconf import OmegaConf
from tensordict import TensorDict

from benchmarks._cli import CONFIGS, add_out, train_config, write_json
from benchmarks.learner_suite import LearnerShape, _Setup, load_configs
from worldmodels.train.config import update_autocast
from worldmodels.train.graphed_update import GraphedUpdate

PHASES = ("wm_loss", "wm_step", "dream", "actor_step", "critic_step")


def _state_batch(shape: LearnerShape, obs_dim: int, device: torch.device) -> TensorDict:
    """The pixel batch of the learner suite with vector observations and one continuous action."""
    batch = _Setup(shape, device)()["batch"]
    gen = torch.Generator().manual_seed(1)
    b, t = batch.batch_size
    batch["obs"] = torch.randn(b, t, obs_dim, generator=gen).to(device)
    batch["action"] = (torch.rand(b, t, shape.action, generator=gen) * 2 - 1).to(device)
    return batch


def experiment_configs(name: str):
    """(model, algo) configs of `scripts/train.py +experiment=NAME`, composed by Hydra."""
    cfg = train_config([f"+experiment={name}", "logger=none", "progress=false"])
    return cfg.model, cfg.algo


def build(args, variant: str, device: torch.device):
    from worldmodels.algos import ALGOS

    if variant not in VARIANTS:
        raise ValueError(f"--variants: {variant!r} is not one of {list(VARIANTS)}")
    model_cfg, algo_cfg = experiment_configs(args.experiment) if args.experiment else load_configs(args.model)
    for key, value in args.set:
        OmegaConf.update({"model": model_cfg, "algo": algo_cfg}[key.split(".")[0]], key.split(".", 1)[1],
                         yaml.safe_load(value), merge=True)
    pixels = args.obs == "pixels"
    shape = LearnerShape(args.model, args.batch, args.steps, action=args.actions or (6 if pixels else 1))
    torch.manual_seed(0)
    obs_shape = (3, 64, 64) if pixels else (args.obs_dim,)
    agent = ALGOS["dreamer_v3"](obs_shape, shape.action, pixels, model_cfg, algo_cfg, backend=args.backend).to(device)
    if not VARIANTS[variant]:  # torch's foreach Adam in place of the fused one the agent built
        for opt in agent.optimizers().values():
            group = opt.opt.param_groups[0]
            opt.opt = torch.optim.Adam(opt.params, lr=group["lr"], eps=group["eps"], foreach=True)
    if variant == "graphed_compiled_nets":
        agent.compile_nets()
    batch = _Setup(shape, device)()["batch"] if pixels else _state_batch(shape, args.obs_dim, device)
    return agent, batch


def _timed_phases(agent, marks: list):
    """Wrap the update's phases so each records a CUDA event and the host clock at its ends."""
    def wrap(owner, name, phase):
        inner = getattr(owner, name)

        def call(*a, **k):
            with torch.profiler.record_function(phase):
                start = torch.cuda.Event(enable_timing=True)
                start.record()
                t0 = time.perf_counter()
                out = inner(*a, **k)
                host = time.perf_counter() - t0
                end = torch.cuda.Event(enable_timing=True)
                end.record()
            marks.append((phase, start, end, host))
            return out
        setattr(owner, name, call)

    wrap(agent.world_model, "loss", "wm_loss")
    wrap(agent.wm_opt, "step", "wm_step")
    wrap(agent, "dream", "dream")
    wrap(agent.actor_opt, "step", "actor_step")
    wrap(agent.critic_opt, "step", "critic_step")


def _busy_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals (us in, ms out)."""
    total, reach = 0.0, None
    for s, e in sorted(intervals):
        if reach is None or s > reach:
            total += e - s
            reach = e
        elif e > reach:
            total += e - reach
            reach = e
    return total / 1e3


def profile_variant(args, variant: str, device: torch.device) -> dict:
    agent, batch = build(args, variant, device)
    autocast = update_autocast("cuda", torch.bfloat16 if args.precision == "bf16" else None)  # as a run's update
    step = agent.update
    if variant.startswith("graphed"):
        step = GraphedUpdate(agent)
        with autocast:
            step.prime(batch)

    def update():
        with autocast:
            return step(batch)

    for _ in range(args.warmup):
        update()
    torch.cuda.synchronize()
    spans, hosts = [], []
    for _ in range(args.repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        update()
        hosts.append((time.perf_counter() - t0) * 1e3)
        end.record()
        spans.append((start, end))
    torch.cuda.synchronize()
    row = {"variant": variant, "update_ms": statistics.median(s.elapsed_time(e) for s, e in spans),
           "update_host_ms": statistics.median(hosts)}
    if isinstance(step, GraphedUpdate):  # whether the timed updates were graph replays or eager fallbacks
        row.update(captures=step.captures, capture_failures=step.failures, replaying=step.replay is not None)

    row["phases"] = {}
    if not variant.startswith("graphed"):  # a replay has no phases to time
        marks: list = []
        _timed_phases(agent, marks)
        for _ in range(args.repeats):
            update()
        torch.cuda.synchronize()
        row["phases"] = {p: {"span_ms": statistics.median(s.elapsed_time(e) for q, s, e, _ in marks if q == p),
                             "host_ms": statistics.median(h * 1e3 for q, _, _, h in marks if q == p)}
                         for p in PHASES}

    n = args.profile_updates
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            update()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not getattr(e, "is_user_annotation", False) and e.name not in PHASES
               and not e.name.startswith(("Optimizer.", "ProfilerStep"))]
    row["kernels_per_update"] = len(kernels) / n
    row["gpu_busy_ms"] = _busy_ms([(e.time_range.start, e.time_range.end) for e in kernels]) / n
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name, []).append(e.time_range.elapsed_us())
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:args.top]
    row["top_kernels"] = [{"name": k[:90], "ms_per_update": sum(v) / 1e3 / n, "calls_per_update": len(v) / n}
                          for k, v in top]
    return row


def _print(row: dict) -> None:
    print(f"\n== {row['variant']}: update {row['update_ms']:.2f} ms (host {row['update_host_ms']:.2f}), "
          f"GPU busy {row['gpu_busy_ms']:.2f} ms, {row['kernels_per_update']:.0f} kernels / update")
    if "captures" in row:
        print(f"   captures {row['captures']}, failed {row['capture_failures']}, replaying {row['replaying']}")
    for p, v in row.get("phases", {}).items():
        print(f"   {p:12s} span {v['span_ms']:7.2f} ms   host {v['host_ms']:7.2f} ms")
    for k in row["top_kernels"]:
        print(f"   {k['ms_per_update']:6.2f} ms  x{k['calls_per_update']:5.0f}  {k['name']}")


VARIANTS = {"base": False, "fused_adam": True, "graphed": True, "graphed_compiled_nets": True}  # Adam fused?


def update_options(p: argparse.ArgumentParser) -> None:
    """The options that choose the update (its model, batch, precision, backend), shared with update_phases."""
    p.add_argument("--model", default="size1m")
    p.add_argument("--obs", choices=("pixels", "state"), default="pixels")
    p.add_argument("--obs-dim", type=int, default=5)
    p.add_argument("--actions", type=int, default=None, help="action size (default: 6 with pixels, else 1)")
    p.add_argument("--experiment", default=None, help="configs/experiment/NAME: its model and algo config")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--precision", choices=("tf32", "bf16", "ieee", "high-prec"), default="tf32",
                   help="high-prec: TF32 matmuls, the recurrent core's high-prec (a run's precision=high-prec)")
    p.add_argument("--backend", default="triton")
    p.add_argument("--set", default="", help="config overrides, model.KEY=VALUE or algo.KEY=VALUE comma-separated "
                   "(e.g. the dmc_proprio layout: model.dyn_hidden=2048,model.dyn_norm=all,model.prior_layers=2)")


def check_update_options(p: argparse.ArgumentParser, args) -> None:
    """Check `update_options`' values (p.error naming the option); `args.set` becomes (key, value) pairs."""
    pairs = []
    for item in filter(None, args.set.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key.split(".")[0] not in ("model", "algo") or "." not in key:
            p.error(f"--set: expected model.KEY=VALUE or algo.KEY=VALUE, got {item!r}")
        pairs.append((key, value))
    args.set = pairs
    if args.experiment is not None:
        if not (CONFIGS / "experiment" / f"{args.experiment}.yaml").is_file():
            names = sorted(f.stem for f in (CONFIGS / "experiment").glob("*.yaml"))
            p.error(f"--experiment: no configs/experiment/{args.experiment}.yaml; expected one of {names}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.update_profile", description=__doc__.split("\n\n")[0])
    update_options(p)
    p.add_argument("--variants", default="base")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--profile-updates", type=int, default=5)
    p.add_argument("--top", type=int, default=12)
    add_out(p)
    p.add_argument("--launch", default="", help="triton RSSM launch keys, KEY=0|1 comma-separated")
    args = p.parse_args(argv)
    check_update_options(p, args)
    for name in ("batch", "steps", "repeats", "profile_updates"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1 (the medians and per-update "
                    "figures divide by it)")
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {unknown}; expected names from {list(VARIANTS)}")
    launch = {}
    for item in filter(None, args.launch.split(",")):
        key, _, value = item.partition("=")
        if value not in ("0", "1"):
            p.error(f"--launch: expected KEY=0 or KEY=1, got {item!r}")
        launch[key] = value == "1"
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.update_profile times CUDA events: it needs a CUDA device")
    from benchmarks.__main__ import configure_precision
    configure_precision("ieee" if args.precision == "ieee" else "tf32")
    if args.precision == "high-prec":
        from worldmodels.core.precision import set_recurrent_matmul_precision
        set_recurrent_matmul_precision("high-prec")
    from worldmodels.ops.triton_utils import launch_overrides

    rows = []
    for variant in args.variants.split(","):
        with contextlib.suppress(KeyboardInterrupt), launch_overrides("rssm", **launch):
            row = profile_variant(args, variant, torch.device("cuda"))
            _print(row)
            rows.append(row)
    write_json(args.out, {"args": vars(args), "gpu": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
