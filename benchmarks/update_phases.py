"""Where one DreamerV3 update's time goes, by phase, forward and backward each: kernels and their time.

    python -m benchmarks.update_phases --experiment dmc_proprio_2023 --obs state --obs-dim 24 --actions 6 \
        --precision tf32 --backend auto [--device cuda] [--out FILE.json]

The update is `benchmarks.update_profile`'s (the same agent, batch and options), run eagerly with
fused Adam: a CUDA graph replays exactly these kernels, but a replay cannot be split by phase. Under
`torch.profiler`, over `--updates` warm updates, every kernel (on CPU: every aten op that calls no
other) is given a phase and a direction:
- forward: the phase of the innermost labelled call it runs in; labels are put on the update's
  pieces from outside, by wrapping them (nothing in the library changes):
  `encoder` (the encoder), `observe` (`RSSM.observe`), `decoder and heads` (the decoder, the reward
  and continue heads on posterior features), `world-model loss terms` (the rest of the world model's
  loss: KL terms, log-probabilities, sums), `imagination` (`dream`: the imagined rollout with the
  actor in the loop, and the heads on imagined features), `actor and critic losses` (the actor's
  distribution, the critics, the lambda-returns, and whatever else the update's own body computes:
  the losses' arithmetic, the slow critic's average), `optimisers` (each optimiser's step: clipping
  and the Adam / LaProp update, not the backward it starts);
- backward: the phase of the forward op whose autograd node it evaluates (the profiler's
  sequence numbers link the two), so the world model's and the critic's one backward splits too;
  accumulating gradients into `.grad` (nodes with no forward op) is `other`.
For each (phase, direction): kernels per update and their summed time (GPU kernel time on CUDA, the
ops' own CPU time on CPU), against the update's total. Prints a markdown table; `--out` keeps it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
from collections import defaultdict

import torch

from benchmarks._cli import add_out, write_json
from benchmarks.update_profile import build, check_update_options, update_options
from worldmodels.train.config import update_autocast

PHASES = ("encoder", "observe", "decoder and heads", "world-model loss terms", "imagination",
          "actor and critic losses", "optimisers", "other")
BACKWARD_EVENT = "autograd::engine::evaluate_function: "


def _label(owner, name: str, phase: str) -> None:
    """Run `owner.name(...)` inside a profiler range named `phase`."""
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def call(*args, **kwargs):
        with torch.profiler.record_function(phase):
            return inner(*args, **kwargs)

    setattr(owner, name, call)


def label_phases(agent) -> None:
    """Put the phase labels (module docstring) on `agent`'s update, from outside."""
    import worldmodels.algos.dreamer_v3 as dreamer_v3

    wm = agent.world_model
    _label(wm, "loss", "world-model loss terms")
    _label(wm.encoder, "forward", "encoder")
    _label(wm.rssm, "observe", "observe")
    for module in (wm.decoder, wm.reward, wm.cont):
        if module is not None:
            _label(module, "forward", "decoder and heads")
    _label(agent, "dream", "imagination")
    for module in (agent.actor, agent.critic, agent.slow_critic):
        _label(module, "forward", "actor and critic losses")
    _label(agent.actor, "dist", "actor and critic losses")
    _label(agent, "update", "actor and critic losses")  # outermost: the update's own arithmetic is these losses
    _label(dreamer_v3, "lambda_returns", "actor and critic losses")
    for opt in agent.optimizers().values():
        for method in ("step", "apply"):
            _label(opt, method, "optimisers")


def _forward_phase(event) -> str:
    """The phase of the innermost labelled range `event` runs in (`other` if none), imagination
    taking what runs inside it."""
    labels = []
    while event is not None:
        if event.name in PHASES:
            labels.append(event.name)
        event = event.cpu_parent
    if "imagination" in labels:  # the heads and actor called inside the rollout are its cost
        return "imagination"
    return labels[0] if labels else "other"


def _backward_node(event):
    """The `evaluate_function` event `event` runs in (a backward op), else None."""
    while event is not None:
        if event.name.startswith(BACKWARD_EVENT):
            return event
        event = event.cpu_parent
    return None


def phase_table(events, updates: int) -> dict:
    """(phase, direction) -> {"kernels", "ms"} per update from profiler `events` of `updates` updates.
    Leaves are the CUDA kernels of each CPU op (`FunctionEvent.kernels`) where there are any, else
    the aten ops that call no other aten op (CPU)."""
    events = list(events)
    cpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    # a node's sequence number -> the phase of the forward op that made it. Ops that make no node record
    # the number the next node will take, so the op that made it is the last to start with that number
    # (or one of its own sub-ops, which share its phase).
    seq_phase = {}
    for e in sorted(cpu, key=lambda e: e.time_range.start):
        if e.sequence_nr >= 0 and _backward_node(e) is None:  # aten ops and autograd.Functions
            seq_phase[(e.thread, e.sequence_nr)] = _forward_phase(e)
    on_gpu = any(e.kernels for e in cpu)
    table: dict = defaultdict(lambda: {"kernels": 0.0, "ms": 0.0})
    for e in cpu:
        if on_gpu:
            if e.name.startswith(("cuda", "cu")):  # the runtime's launch calls: their op holds the kernels
                continue
            leaves = [(k.duration / 1e3) for k in e.kernels]
        elif e.name.startswith("aten::") and not any(c.name.startswith("aten::") for c in e.cpu_children):
            leaves = [e.self_cpu_time_total / 1e3]
        else:
            continue
        if not leaves:
            continue
        node = _backward_node(e)
        if node is None:
            key = (_forward_phase(e), "forward")
        else:
            # the forward op that made this node ran on the forward thread (the profiler names it)
            thread = getattr(node, "fwd_thread", None) or node.thread
            key = (seq_phase.get((thread, node.sequence_nr), "other"), "backward")
        table[key]["kernels"] += len(leaves) / updates
        table[key]["ms"] += sum(leaves) / updates
    rows = {f"{phase}/{direction}": table[(phase, direction)] for phase in PHASES
            for direction in ("forward", "backward") if (phase, direction) in table}
    if on_gpu:  # kernels the profiler linked to no op (a launch outside any aten op): counted, not hidden
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
                   and not getattr(e, "is_user_annotation", False)]
        count = len(kernels) / updates - sum(r["kernels"] for r in rows.values())
        if count > 0.5:
            ms = sum(e.time_range.elapsed_us() for e in kernels) / 1e3 / updates - sum(r["ms"] for r in rows.values())
            rows["unattributed/-"] = {"kernels": count, "ms": ms}
    return rows


def profile_phases(args, device: torch.device) -> dict:
    agent, batch = build(args, "fused_adam" if device.type == "cuda" else "base", device)
    label_phases(agent)
    autocast = update_autocast(device.type, torch.bfloat16 if args.precision == "bf16" else None)
    for _ in range(args.warmup):
        with autocast:
            agent.update(batch)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        torch.cuda.synchronize()
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(args.updates):
            with autocast:
                agent.update(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
    rows = phase_table(prof.events(), args.updates)
    total = {"kernels": sum(r["kernels"] for r in rows.values()), "ms": sum(r["ms"] for r in rows.values())}
    return {"phases": rows, "total": total}


def markdown(result: dict, unit: str) -> str:
    lines = [f"| phase | forward {unit} | forward kernels | backward {unit} | backward kernels |",
             "|---|---:|---:|---:|---:|"]
    rows = result["phases"]
    for phase in PHASES:
        fwd, bwd = rows.get(f"{phase}/forward"), rows.get(f"{phase}/backward")
        if fwd is None and bwd is None:
            continue
        cells = [f"{r['ms']:.2f} | {r['kernels']:.0f}" if r else "- | -" for r in (fwd, bwd)]
        lines.append(f"| {phase} | {cells[0]} | {cells[1]} |")
    if "unattributed/-" in rows:
        r = rows["unattributed/-"]
        lines.append(f"| unattributed (no op linked) | {r['ms']:.2f} | {r['kernels']:.0f} | | |")
    total = result["total"]
    lines.append(f"| **all** | {total['ms']:.2f} (both) | {total['kernels']:.0f} (both) | | |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.update_phases", description=__doc__.split("\n\n")[0])
    update_options(p)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--updates", type=int, default=3, help="profiled updates (the figures are per update)")
    add_out(p)
    args = p.parse_args(argv)
    check_update_options(p, args)
    if args.updates < 1:
        p.error(f"--updates={args.updates} must be >= 1 (the figures divide by it)")
    device = torch.device(args.device)
    if device.type == "cuda":
        from benchmarks.__main__ import configure_precision
        configure_precision("ieee" if args.precision == "ieee" else "tf32")
    result = profile_phases(args, device)
    unit = "GPU ms" if device.type == "cuda" else "CPU ms"
    print(markdown(result, unit))
    write_json(args.out, {"args": vars(args), "device": torch.cuda.get_device_name() if device.type == "cuda"
                          else "cpu", "unit": unit, **result})


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
