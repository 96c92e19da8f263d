"""`python -m benchmarks`: the CPU smoke run, the rows read from the registry, and the checks that
keep its numbers honest."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gru_suite, learner_suite, shapes, unroll_suite
from benchmarks.__main__ import main as bench_main
from benchmarks.parity import ParityError, assert_informative, assert_parity
from benchmarks.runner import Candidate, Group, Unavailable, run_group
from benchmarks.timing import TimingConfig
from worldmodels.core import registry
from worldmodels.core.registry import Backend

ROOT = Path(__file__).resolve().parents[2]
FAST = TimingConfig(warmup=1, min_repeats=2, max_repeats=2, target_s=0.0)


def test_cpu_smoke_run_writes_timed_rows_checked_against_loop(tmp_path):
    """One CLI run over each suite's smallest group on CPU: every row ran, was timed, and every
    row of ours (and the seed peer, and nn.GRU) had its first call checked against `loop`."""
    out = tmp_path / "results.json"
    cmd = [sys.executable, "-m", "benchmarks", "--device", "cpu", "--out", str(out),
           "--backends", "loop,cudnn", "--warmup", "1", "--min-repeats", "1", "--max-repeats", "1",
           "--target-s", "0", "--filter", "GRU,V1-small observe,update tiny B=2 T=8 fp32"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {r["suite"] for r in rows} == {"gru", "unroll", "learner"}
    for r in rows:
        assert r["status"] == "ok", r
        assert r["median_ms"] > 0 and r["repeats"] >= 1, r
    checked = [r for r in rows if r["parity"].startswith("vs ours:loop")]
    assert {r["impl"] for r in checked} >= {"ours:cudnn", "torch.nn.GRU", "seed eager loop"}
    assert all(r["parity_error"] is not None and r["parity_error"] <= 1e-3 for r in checked)
    peers = {r["impl"] for r in rows if r["kind"] == "peer"}
    assert {"torchrl RSSMRollout [eager]", "torchrl DreamerV3Loss [eager]"} <= peers
    assert all(r["ratio_to_ours_best"] > 0 for r in rows)
    assert "ours:loop" in proc.stdout and "median ms" in proc.stdout  # the table
    assert json.loads(out.read_text())["meta"]["command"].startswith("python -m benchmarks --device cpu")


@pytest.fixture
def standin():
    loop = registry.get("loop").ops
    registry.register(Backend("standin", {"rnn": loop["rnn"], "rssm_observe": loop["rssm_observe"],
                                          "rssm_imagine": loop["rssm_imagine"]}, description="a test double"))
    try:
        yield "ours:standin"
    finally:
        registry.unregister("standin")


def _impls(groups) -> list[list[str]]:
    return [[c.impl for c in g.candidates if c.kind == "ours"] for g in groups]


def test_a_registered_backend_gets_rows_in_every_suite_and_passes_parity(standin):
    """No bench edit: the suites' default rows are the registry's backends for their op family."""
    cpu = torch.device("cpu")
    groups = gru_suite.groups(gru_suite.GRUShape(batch=2, steps=4, input=3, hidden=5), cpu)
    unroll = unroll_suite.groups(shapes.SMALL[:1] + shapes.SMALL[2:3], cpu)  # V1-small observe, imagine
    learner = learner_suite.groups(learner_suite.SMALL, cpu)
    for impls in _impls(groups) + _impls(unroll) + _impls(learner):
        assert impls[0] == "ours:loop" and standin in impls, impls
    for group in groups:  # the stand-in's rows run and are checked against loop (eager scan skipped: slow on CPU)
        group.candidates = [c for c in group.candidates if c.impl in ("ours:loop", standin)]
        rows = run_group(group, cpu, FAST, 1e-6, log=lambda _: None)
        assert [(r.impl, r.status, r.parity) for r in rows] == [
            ("ours:loop", "ok", "is the reference"), (standin, "ok", "vs ours:loop")]
        assert rows[1].parity_error == 0.0 and rows[1].median_ms > 0


def test_backends_narrow_the_rows_and_an_unknown_one_names_the_registered(standin):
    cpu = torch.device("cpu")
    assert _impls(gru_suite.groups(gru_suite.SMALL, cpu, ["standin"]))[0] == ["ours:loop", standin]
    with pytest.raises(SystemExit, match=r"unknown backends \['nope'\]; registered: \[.*'loop'.*'standin'"):
        bench_main(["--backends", "loop,nope"])


def _group(*candidates: Candidate) -> Group:
    def setup():
        return {"x": torch.randn(8, 4)}
    return Group("test", "x [8, 4]", "fwd", setup, lambda s: {"x": s["x"]}, list(candidates))


def test_a_row_that_disagrees_with_the_reference_is_not_timed():
    calls = []

    def wrong(s):
        def call():
            calls.append(1)
            return {"y": s["x"].tanh() * 1.01}
        return call

    rows = run_group(_group(Candidate("ours:loop", lambda s: lambda: {"y": s["x"].tanh()}),
                            Candidate("ours:wrong", wrong)), torch.device("cpu"), FAST, 1e-3, log=lambda _: None)
    assert [r.status for r in rows] == ["ok", "parity-failed"]
    assert rows[1].median_ms is None and calls == [1]  # checked once, never timed
    assert "relative error" in rows[1].reason


def test_unavailable_peer_and_missing_reference_are_reported_not_raised():
    def missing(s):
        raise Unavailable("package not installed")

    rows = run_group(_group(Candidate("ours:loop", missing), Candidate("ours:scan", lambda s: lambda: s["x"]),
                            Candidate("peer", lambda s: lambda: s["x"] + 1, kind="peer", parity="none")),
                     torch.device("cpu"), FAST, 1e-3, log=lambda _: None)
    assert [r.status for r in rows] == ["unavailable", "unavailable", "ok"]
    assert "did not run" in rows[1].reason and rows[2].median_ms > 0


@pytest.mark.parametrize("bad", [torch.zeros(4, 3), torch.full((4, 3), 2.0), torch.tensor([1.0, float("nan")])])
def test_degenerate_inputs_are_refused(bad):
    with pytest.raises(ValueError):
        assert_informative({"x": bad}, "input")


def test_parity_is_relative_to_the_reference_scale():
    ref = {"a": torch.tensor([1000.0, 1.0])}
    assert assert_parity({"a": torch.tensor([1000.0, 1.5])}, ref, 1e-3) <= 1e-3  # 0.5 against a scale of 1000
    with pytest.raises(ParityError):
        assert_parity({"a": torch.tensor([1002.0, 1.0])}, ref, 1e-3)
    with pytest.raises(ParityError):
        assert_parity({}, ref, 1e-3)


def test_kernel_asm_counts_copy_widths_per_source_line():
    from benchmarks.profile.kernel_asm import copy_widths

    ptx = "\n".join([
        "\t.loc\t1 104 17",
        "\tcp.async.cg.shared.global [ %r1 + 0 ], [ %rd2 + 0 ], 0x10, %r3;",
        "\tcp.async.cg.shared.global [ %r4 + 0 ], [ %rd5 + 0 ], 0x10, %r6;",
        "\t.loc\t1 158 9",
        "\tcp.async.ca.shared.global [ %r7 + 0 ], [ %rd8 + 0 ], 0x4, %r9;",
        "\tcp.async.commit_group;",
        '\t.file\t1 "/repo/worldmodels/ops/rssm/fused/forward_kernels.py"',
    ])
    assert copy_widths(ptx) == {("forward_kernels.py", 104, 16): 2, ("forward_kernels.py", 158, 4): 1}


def test_kernel_asm_reads_registers_and_spills_from_ptxas():
    from benchmarks.profile.kernel_asm import resource_usage

    report = ("ptxas info    : Function properties for rssm_kernel\n"
              "    112 bytes stack frame, 112 bytes spill stores, 104 bytes spill loads\n"
              "ptxas info    : Used 255 registers, used 1 barriers, 112 bytes cumulative stack size\n")
    assert resource_usage(report) == dict(registers=255, spill_stores=112, spill_loads=104)


@pytest.mark.parametrize("case,block_n,fold", [("V3-1m-imagine-actor", 32, True), ("V3-s512-observe", 16, False)])
def test_kernel_asm_plans_what_the_h200_gets(monkeypatch, tmp_path, case, block_n, fold):
    """On a CPU machine kernel_asm plans for the H200's 132 SMs, its launch rules included: the
    narrow tiles of observe at B16 and the norm fold of V3-1m imagination (a plan made on the
    interpreter's rules would compile a kernel the GPU never runs)."""
    from benchmarks.profile import kernel_asm
    from benchmarks.triton_rssm import make_case
    from worldmodels.ops.rssm.fused import entry, launch, share

    patched = ((launch, ("_base_tiles", "_launch", "_gpu_sms")), (entry, ("_check_runs",)),
               (share, ("action_share",)))
    for module, names in patched:
        for name in names:
            monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test
    kernel_asm._patch_launches(tmp_path, None)
    plans = []
    monkeypatch.setattr(launch, "_launch", lambda kernel, plan, **args: plans.append(plan))
    with torch.no_grad():
        make_case(case, device="cpu")(entry, None)
    assert (plans[0].block_n, plans[0].fold, plans[0].nprog > 1) == (block_n, fold, True)


def test_phase_profile_splits_each_phase_into_work_and_wait():
    from benchmarks.profile.phase_profile import phases

    programs, steps, work, wait = 2, 3, (5.0, 7.0), (1.0, 2.0)  # us per phase of a 2-barrier step
    flags = torch.zeros(programs * (1 + 2 * (2 * steps + 1)), dtype=torch.int64)
    rec = flags[programs:].view(-1, programs, 2)
    passed = torch.tensor([1000.0, 1400.0])  # ns; program 1 starts later and never waits less
    for e in range(1, 2 * steps + 1):
        j = (e - 1) % 2
        reach = passed + 1e3 * work[j]
        passed = torch.full_like(passed, float(reach.max()) + 1e3 * wait[j])
        rec[e, :, 0], rec[e, :, 1] = reach.long(), passed.long()
    got = phases(flags, programs, steps)
    assert got["per_step"] == 2
    assert got["step_us"] == pytest.approx(sum(work) + sum(wait))
    assert [p["work_us"] for p in got["phases"]] == pytest.approx(list(work))
    assert [p["slowest_us"] for p in got["phases"]] == pytest.approx(list(work))
    # program 0 waits for program 1's 0.4 us head start only in the first phase of step 0
    assert [p["wait_us"] for p in got["phases"]] == pytest.approx(list(wait), abs=0.4)
    rec[2 * steps, :, 1] = 0
    rec[2 * steps - 1, :, 1] = 0  # 4 barriers written over 3 steps
    with pytest.raises(RuntimeError, match="whole number per step"):
        phases(flags, programs, steps)


def test_phase_profile_names_every_barrier_of_a_step():
    from benchmarks.profile.phase_profile import chain_phase_names, forward_phase_names

    # barriers per step of V3-1m imagination with the Actor, V3 observe and V1 observe, each way, as
    # counted from the stamps on the H200 (docs/results/triton_rssm_profile/barrier_counts/)
    from worldmodels.ops.rssm.fused.launch import Dims

    v3 = Dims(512, 64, 32, 4, 128, True, True, 6, 64, 3)  # launch.make_plan's dims
    v1 = Dims(200, 200, 30, 1, 30, False, False, 0, 0, 0)
    actor = dict(norm=1, dist=0)
    assert [len(f(v3, actor)) for f in (forward_phase_names, chain_phase_names)] == [19, 19]
    assert [len(f(v3, None)) for f in (forward_phase_names, chain_phase_names)] == [9, 9]
    assert [len(f(v1, None)) for f in (forward_phase_names, chain_phase_names)] == [4, 5]
    assert chain_phase_names(v3, actor)[3] == "cell: g_deter, gate derivatives"
    # FOLD_NORMS: 6 of imagination's 19 barriers go (the Actor's 3 norms, the action layer's, the
    # input layers', the head's; dyn_out's group norm stays), 2 of observe's 9
    assert [len(forward_phase_names(v3, actor, fold=True)), len(forward_phase_names(v3, None, fold=True))] == [13, 7]


def test_timing_only_launch_keys_change_the_barrier_flags():
    import dataclasses

    import worldmodels as wm
    from worldmodels.ops.rssm.fused import launch

    rssm = wm.RSSM(3, 8, deter=24, stoch=5, hidden=20)
    plan = launch.make_plan(rssm.op_spec(), 40, 4, rssm.op_weights(), None, torch.device("cpu"), torch.float32)
    plan = dataclasses.replace(plan, tiles=3, nprog=2)
    assert launch._flags(plan, torch.device("cpu"), 4, "k").dtype == torch.int32
    no_wait = dataclasses.replace(plan, barrier=False)
    assert launch._flags(no_wait, torch.device("cpu"), 4, "k").dtype == torch.int16
    records = []
    flags = launch._flags(dataclasses.replace(plan, profile=records), torch.device("cpu"), 4, "k")
    assert flags.dtype == torch.int64 and records[0][0] == "k" and records[0][2] is flags
    assert flags.numel() >= 6 * (1 + 2 * (4 * 19 + 1))  # room for every barrier's two stamps


def test_host_path_times_the_op_and_the_module_on_cpu():
    """`benchmarks.profile.host_path` (the host's time before a replay, its capture stubbed) runs its cases
    through the op and through the module: its stub must keep taking what `replay_captured` passes."""
    pytest.importorskip("triton", reason="host_path imports the triton op (its kernels never run here)")
    for extra in ([], ["--module"]):
        cmd = [sys.executable, "-m", "benchmarks.profile.host_path", "V3-1m-imagine-actor,V3-s512-observe",
               "--calls", "16", *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert len(re.findall(r"us per call on the host before a replay", proc.stdout)) == 2, proc.stdout


def test_rssm_errors_split_rounding_from_a_parted_trajectory():
    """`benchmarks.triton_rssm.errors`: a flipped categorical sample parts its row from that step on;
    the error before it (`err_kept`) stays the rounding's, the share of parted rows is reported, and a
    Gaussian case (V1) has no flips to part on."""
    from benchmarks.triton_rssm import errors

    gen = torch.Generator().manual_seed(0)
    classes = shapes.V3_1M.classes
    index = torch.randint(classes, (3, 4, 32), generator=gen)
    ref = {"deter": torch.randn(3, 4, 5, generator=gen, dtype=torch.float64),
           "stoch": torch.nn.functional.one_hot(index, classes).flatten(2).double()}
    out = {k: (v + 1e-6).float() for k, v in ref.items()}
    index[1, 2, 7] = (index[1, 2, 7] + 1) % classes           # row 1 flips one latent at step 2 ...
    out["stoch"] = torch.nn.functional.one_hot(index, classes).flatten(2).float()
    out["deter"][1, 2:] += 0.5                                 # ... and its trajectory parts there
    got = errors("V3-1m-imagine-open", out, ref)
    assert got["err"] == pytest.approx(1.0)
    assert got["err_kept"] == pytest.approx(1e-6, rel=0.2)  # fp32 rounding of the 1e-6
    assert got["parted"] == pytest.approx(1 / 3)
    v1 = errors("V1-imagine-open", {"deter": out["deter"]}, {"deter": ref["deter"]})
    assert (v1["err"], v1["err_kept"], v1["parted"]) == (pytest.approx(0.5, rel=1e-4),) * 2 + (0.0,)


def test_cli_writes_json_only_where_asked(tmp_path):
    """`benchmarks/_cli.py`, the benchmark CLIs' shared `--out`: no file without one, indented JSON with one."""
    import argparse

    from benchmarks import _cli
    p = argparse.ArgumentParser()
    _cli.add_out(p)
    _cli.add_device(p)
    args = p.parse_args([])
    assert args.out is None and args.device in ("cpu", "cuda")
    _cli.write_json(args.out, {"rows": []})  # no --out: nothing written
    assert list(tmp_path.iterdir()) == []
    out = tmp_path / "rows.json"
    _cli.write_json(p.parse_args(["--out", str(out)]).out, {"rows": [1]})
    assert json.loads(out.read_text()) == {"rows": [1]} and out.read_text().endswith("\n")


@pytest.mark.parametrize("argv,message", [
    (["--profile-updates", "0"], "--profile-updates=0 must be >= 1"),
    (["--repeats", "0"], "--repeats=0 must be >= 1"),
    (["--variants", "graphed,warp"], "--variants: unknown \\['warp'\\]"),
    (["--set", "deter=512"], "--set: expected model.KEY=VALUE or algo.KEY=VALUE, got 'deter=512'"),
    (["--set", "model.deter"], "--set: expected model.KEY=VALUE"),
    (["--experiment", "dmc_proprio_2042"], "--experiment: no configs/experiment/dmc_proprio_2042.yaml; expected "
     "one of \\[.*'dmc_proprio_2023'"),
])
def test_update_profile_names_a_bad_argument(argv, message, capsys):
    """Refused before anything is built (a --profile-updates of 0 divided by zero after the timed run)."""
    from benchmarks import update_profile
    with pytest.raises(SystemExit):
        update_profile.main(argv)
    assert re.search(message, capsys.readouterr().err)


def test_update_profile_builds_the_update_a_preset_composes():
    """--experiment: the model and algo a run of the preset builds (the 2023 protocol's dense GRU, learned
    initial state and backprop actor), the batch in the env's shapes (--obs-dim, --actions)."""
    import argparse

    from benchmarks import update_profile
    args = argparse.Namespace(experiment="dmc_proprio_2023", model="size1m", set=[("algo.horizon", "3")],
                              obs="state", obs_dim=24, actions=6, batch=2, steps=3, backend="loop")
    agent, batch = update_profile.build(args, "fused_adam", torch.device("cpu"))
    spec = agent.world_model.rssm
    assert (spec.cell, spec.deter_dim, spec.initial_state) == ("norm_gru", 512, "learned")
    assert agent.cfg.actor_grad == "backprop" and agent.cfg.horizon == 3
    assert batch["obs"].shape == (2, 3, 24) and batch["action"].shape == (2, 3, 6)
    assert torch.isfinite(torch.tensor(agent.update(batch)["wm/loss"]))


def test_planner_rate_times_the_plan_and_the_acting_step_a_run_takes(tmp_path):
    """Both rates per row (the eager plan, and the graphed acting step: uncaptured on CPU), the CEM settings
    beside them, written to --out."""
    from benchmarks import planner_rate

    out = tmp_path / "rate.json"
    before = torch.get_float32_matmul_precision()
    planner_rate.main(["--device", "cpu", "--small", "--envs", "2", "--backends", "loop", "--repeats", "1",
                       "--precision", "ieee", "tf32", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["precision"] for r in rows] == ["ieee", "tf32"]
    assert torch.get_float32_matmul_precision() == before  # torch's process-wide setting restored
    row = rows[0]
    assert row["ms_per_plan"] > 0 and row["ms_per_action_graphed"] > 0
    assert row["actions_per_s_graphed"] == pytest.approx(2 / (row["ms_per_action_graphed"] / 1e3), rel=0.01)
    assert (row["candidates"], row["top"], row["iterations"], row["horizon"]) == (64, 8, 3, 12)
