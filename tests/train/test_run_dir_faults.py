"""Faults a run directory must survive: kills (SIGKILL at random moments and at every point of a
save, SIGTERM), damaged files, changed configs, memmap replays, finished runs and a malicious
checkpoint. Each asserts that the newest good checkpoint survives, that a resumed run's counters,
weights and replay equal that checkpoint's, and that the metrics hold each step once.

Most tests copy one small base run (checkpoints at env steps 48 and 96, tiny model) and call the
Trainer in-process; only the kill tests start `scripts/train.py` in a subprocess.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from tests._train_config import TINY, interrupt_collect, run_config
from worldmodels.data import Replay
from worldmodels.data.replay import read_saved
from worldmodels.train import (
    Checkpoints,
    NonFiniteLossError,
    RunDirError,
    Trainer,
    UnsafeCheckpointError,
    load,
    truncate_metrics,
)
from worldmodels.train.checkpoint import open_file

ROOT = Path(__file__).resolve().parents[2]
STEP48, STEP96 = "step-0000000048", "step-0000000096"
EVAL = "eval_every=16"  # an eval line every 16 env steps: duplicates would show
SHORT = "env.time_limit=20"  # short episodes: quick evals, and train/return lines in the metrics


# ---------------------------------------------------------------------------- helpers

@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A finished run at 96 env steps with two complete checkpoints (48 and 96)."""
    root = tmp_path_factory.mktemp("base")
    Trainer(run_config(root, SHORT, "steps=48", EVAL)).train()
    shutil.copytree(root / "run" / "checkpoints" / STEP48, root / STEP48)
    Trainer(run_config(root, SHORT, "steps=96", EVAL)).train()  # its save at 96 prunes 48: put it back
    shutil.copytree(root / STEP48, root / "run" / "checkpoints" / STEP48)
    return root / "run"


def copy_of(base: Path, tmp_path: Path) -> Path:
    shutil.copytree(base, tmp_path / "run")
    return tmp_path / "run"


def snapshot(run_dir: Path) -> dict[str, str]:
    """Every file under `run_dir` -> SHA-256 of its content."""
    return {p.relative_to(run_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def assert_resumed_from(trainer: Trainer, checkpoint: Path) -> None:
    """Counters, weights, optimiser moments and every replay step equal the checkpoint's."""
    state = torch.load(checkpoint / "state.pt", weights_only=True)
    for key in ("env_steps", "updates", "episodes"):
        assert trainer.counters[key] == state["counters"][key], key
    for name, value in trainer.agent.state_dict().items():
        assert torch.equal(value, state["agent"][name]), name
    moments = trainer.agent.optimizers()["model"].state_dict()["state"]
    assert moments.keys() == state["optimizers"]["model"]["state"].keys()
    assert len(trainer.replay) == state["replay_size"] > 0
    saved, _ = read_saved(checkpoint / "replay", open_file)
    stored = trainer.replay.buffer.storage[: len(trainer.replay)]
    for key in saved.keys(True, True):
        assert torch.equal(stored[key], saved[key]), key


def assert_each_step_logged_once(run_dir: Path) -> None:
    seen = set()
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)  # every line parses: no torn or glued records
        for key in record.keys() - {"step"}:
            assert (key, record["step"]) not in seen, f"{key} logged twice at step {record['step']}"
            seen.add((key, record["step"]))


def damage(path: Path, how: str) -> None:
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif how == "empty":
        path.write_bytes(b"")


# ---------------------------------------------------------------------------- damaged files

@pytest.mark.parametrize("how", ["empty", "truncate", "delete", "garbage"])
def test_damaged_latest_pointer_resumes_the_newest_complete_checkpoint(base, tmp_path, how):
    run_dir = copy_of(base, tmp_path)
    pointer = run_dir / "checkpoints" / "latest"
    if how == "garbage":
        pointer.write_text("step-9999999999")
    else:
        damage(pointer, how)
    trainer = Trainer(run_config(tmp_path, SHORT, "steps=200", EVAL))
    assert trainer.counters["env_steps"] == 96
    assert_resumed_from(trainer, run_dir / "checkpoints" / STEP96)
    trainer.save()
    assert (run_dir / "checkpoints" / STEP96 / "manifest.json").exists()


@pytest.mark.parametrize("file, how", [
    ("state.pt", "truncate"), ("state.pt", "delete"), ("manifest.json", "truncate"),
    ("replay/writer.pt", "delete"), ("replay/steps/obs.zlib", "truncate"), ("replay/steps.json", "truncate"),
])
def test_damaged_newest_checkpoint_falls_back_naming_the_file(base, tmp_path, file, how):
    run_dir = copy_of(base, tmp_path)
    damage(run_dir / "checkpoints" / STEP96 / file, how)
    with pytest.warns(UserWarning, match=rf"{STEP96}.*{Path(file).name}"):
        trainer = Trainer(run_config(tmp_path, SHORT, "steps=200", EVAL))
    assert_resumed_from(trainer, run_dir / "checkpoints" / STEP48)
    trainer.save()  # supersedes nothing newer: the damaged step-96 is kept for the user to inspect
    assert (run_dir / "checkpoints" / STEP96).is_dir()


def test_no_complete_checkpoint_is_refused_rather_than_restarted_from_zero(base, tmp_path):
    run_dir = copy_of(base, tmp_path)
    shutil.rmtree(run_dir / "checkpoints" / STEP48)
    damage(run_dir / "checkpoints" / STEP96 / "state.pt", "truncate")
    before = snapshot(run_dir)
    with pytest.warns(UserWarning), pytest.raises(RunDirError, match=r"none is complete.*state\.pt"):
        Trainer(run_config(tmp_path, SHORT, "steps=200", EVAL))
    assert snapshot(run_dir) == before


def test_a_checkpoint_holding_a_pickled_callable_is_refused_and_nothing_runs(base, tmp_path):
    run_dir = copy_of(base, tmp_path)
    marker = tmp_path / "pwned"
    payload = _Payload(str(marker))
    Checkpoints(run_dir / "checkpoints").save("step-0000000200", {"agent": payload, "counters": {"env_steps": 200}})
    with pytest.raises(UnsafeCheckpointError, match=r"step-0000000200/state\.pt.*could run code"):
        Trainer(run_config(tmp_path, SHORT, "steps=400", EVAL))
    with pytest.raises(UnsafeCheckpointError, match=r"state\.pt"):
        load(run_dir)
    assert not marker.exists()
    torch.load(run_dir / "checkpoints" / "step-0000000200" / "state.pt", weights_only=False)  # the payload is live
    assert marker.exists()


class _Payload:
    """Pickles as a call of `open(path, 'w')`: what a shared checkpoint could run on load."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


# ---------------------------------------------------------------------------- config and reruns

@pytest.mark.parametrize("override, field", [
    ("env=half_cheetah", r"env\.name: 'pendulum' -> 'half_cheetah'"),  # same shapes as cheetah_run: must not resume
    ("model.deter=64", r"model\.deter: 32 -> 64"),
    ("algo=dreamer_v1", r"algo\.name: 'dreamer_v3' -> 'dreamer_v1'"),
    ("seed=1", r"seed: 0 -> 1"),
])
def test_changed_config_is_refused_before_anything_is_written(base, tmp_path, override, field):
    run_dir = copy_of(base, tmp_path)
    before = snapshot(run_dir)
    with pytest.raises(RunDirError, match=field):
        Trainer(run_config(tmp_path, SHORT, "steps=200", EVAL, override))
    assert snapshot(run_dir) == before


def test_allowed_changes_resume_and_are_recorded(base, tmp_path):
    run_dir = copy_of(base, tmp_path)
    trainer = Trainer(run_config(tmp_path, SHORT, "steps=200", "eval_every=32", "replay.memmap=true"))
    assert_resumed_from(trainer, run_dir / "checkpoints" / STEP96)
    record = json.loads((run_dir / "changes.jsonl").read_text().splitlines()[-1])
    assert record["step"] == 96
    assert record["changes"]["eval_every"] == [16, 32] and record["changes"]["steps"] == [96, 200]


def test_a_run_resumes_with_its_replay_moved_to_the_device(base, tmp_path):
    """Where the replay is stored (`replay.on_device`) changes nothing that is learned: a run saved with
    the steps on the host resumes with them on the device (here the CPU, the only one CI has)."""
    run_dir = copy_of(base, tmp_path)
    trainer = Trainer(run_config(tmp_path, SHORT, "steps=200", "replay.on_device=true"))
    assert_resumed_from(trainer, run_dir / "checkpoints" / STEP96)
    assert json.loads((run_dir / "changes.jsonl").read_text().splitlines()[-1])["changes"]["replay.on_device"] == \
        [False, True]


def test_resume_false_on_a_run_dir_with_checkpoints_is_refused(base, tmp_path):
    run_dir = copy_of(base, tmp_path)
    before = snapshot(run_dir)
    with pytest.raises(RunDirError, match=r"resume=false.*step-0000000096"):
        Trainer(run_config(tmp_path, SHORT, "steps=200", EVAL, "resume=false"))
    assert snapshot(run_dir) == before


def test_rerunning_a_finished_run_says_so_and_changes_nothing(base, tmp_path, capsys):
    run_dir = copy_of(base, tmp_path)
    before = snapshot(run_dir)
    last_eval = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                 if "eval/return" in line][-1]
    result = Trainer(run_config(tmp_path, SHORT, "steps=96", "eval_every=32")).train()
    assert "already finished" in capsys.readouterr().out
    assert result["env_steps"] == 96 and result["eval_return"] == last_eval["eval/return"]
    assert snapshot(run_dir) == before


# ---------------------------------------------------------------------------- metrics, memmap, NaN

def test_truncate_metrics_cuts_the_runs_own_metric_files_only(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "csv" / "scalars" / "eval").mkdir(parents=True)
    (run_dir / "checkpoints").mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in (8, 16, 24, 32))
                                           + '{"step": 40, "x"')  # torn: the process died mid-write
    scalars = run_dir / "csv" / "scalars"
    (scalars / "eval" / "return.csv").write_text("8,1.0\n16,2.0\n24,3.0\n32,4")  # torchrl's CSVLogger
    (scalars / "updates.csv").write_text("step,value\n8,1\n16,2\n24,3\n")  # a step header is read too
    foreign = {"metrics.csv": "step,key,value\n8,x,1\n16,x,2\n24,x,3\n",  # step-indexed, but not the run's
               "prices.csv": "1,10\n2,20\n30,300\n", "checkpoints/x.csv": "99,1\n"}
    for name, text in foreign.items():
        (run_dir / name).write_text(text)
    cut = truncate_metrics(run_dir, 16)
    assert cut == {"metrics.jsonl": 3, "csv/scalars/eval/return.csv": 2, "csv/scalars/updates.csv": 1}
    assert [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [8, 16]
    assert (scalars / "eval" / "return.csv").read_text() == "8,1.0\n16,2.0\n"
    assert (scalars / "updates.csv").read_text() == "step,value\n8,1\n16,2\n"
    assert {name: (run_dir / name).read_text() for name in foreign} == foreign
    side = (run_dir / "cut" / "metrics.jsonl").read_text().splitlines()
    assert side[-1] == '{"step": 40, "x"' and len(side) == 3
    assert (run_dir / "cut" / "csv" / "scalars" / "eval" / "return.csv").read_text() == "24,3.0\n32,4\n"
    assert sorted(p.relative_to(run_dir / "cut").as_posix() for p in (run_dir / "cut").rglob("*.*")) == [
        "csv/scalars/eval/return.csv", "csv/scalars/updates.csv", "metrics.jsonl"]
    assert truncate_metrics(run_dir, 16) == {}  # idempotent


def test_a_cut_killed_before_its_metric_file_was_rewritten_is_not_cut_twice(tmp_path, monkeypatch):
    """The cut lines go to `cut/` first, then the metric file is rewritten: a kill between the two
    leaves the lines in both, and the next start's cut finds them already in `cut/`."""
    from worldmodels.train import run_dir as run_dir_module

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines = "".join(json.dumps({"step": s, "x": s}) + "\n" for s in (8, 16, 24, 32))
    (run_dir / "metrics.jsonl").write_text(lines)
    with monkeypatch.context() as m:
        m.setattr(run_dir_module, "_atomic_write", lambda path, text: (_ for _ in ()).throw(_Killed()))
        with pytest.raises(_Killed):
            truncate_metrics(run_dir, 16)
    assert (run_dir / "metrics.jsonl").read_text() == lines  # the kill came before the rewrite
    assert truncate_metrics(run_dir, 16) == {"metrics.jsonl": 2}
    assert [json.loads(x)["step"] for x in (run_dir / "cut" / "metrics.jsonl").read_text().splitlines()] == [24, 32]
    assert [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [8, 16]


def test_steps_logged_after_the_checkpoint_are_cut_on_resume(base, tmp_path):
    run_dir = copy_of(base, tmp_path)
    with open(run_dir / "metrics.jsonl", "a") as f:  # what a run killed at 112 had logged past its checkpoint
        f.write(json.dumps({"step": 112, "eval/return": -1.0}) + "\n" + '{"step": 120, "eval/re')
    trainer = Trainer(run_config(tmp_path, SHORT, "steps=128", EVAL))
    trainer.train()
    assert_each_step_logged_once(run_dir)
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()
             if "eval/return" in x]
    assert steps == [16, 32, 48, 64, 80, 96, 112, 128]
    assert '"eval/return": -1.0' in (run_dir / "cut" / "metrics.jsonl").read_text()


def test_memmap_replay_run_resumes_after_ctrl_c(tmp_path, monkeypatch):
    first = Trainer(run_config(tmp_path, SHORT, "steps=100000", "replay.memmap=true"))
    interrupt_collect(monkeypatch, first, 7)  # Ctrl-C in the 7th iteration, after 6 x 8 = 48 env steps
    with pytest.raises(KeyboardInterrupt):
        first.train()
    size = len(first.replay)
    second = Trainer(run_config(tmp_path, SHORT, "steps=64", "replay.memmap=true"))
    assert_resumed_from(second, tmp_path / "run" / "checkpoints" / STEP48)
    second.train()
    assert second.counters["env_steps"] == 64 and len(second.replay) > size


@pytest.mark.parametrize("where", ["replay_add", "update"])
def test_a_stop_signal_inside_a_step_or_an_update_saves_it_whole_and_counted(tmp_path, where):
    """SIGTERM arriving inside a replay write (or an update) is held until the env step with its
    writes (or the update with its count) is done: the checkpoint holds every step written, each
    counted, and every update run, each counted; the resumed run equals it."""
    trainer = Trainer(run_config(tmp_path, SHORT, "steps=100000"))
    per_step = trainer.steps_per_collect // trainer.cfg.collect_steps
    rows, env_steps, updates = [0], [0], [0]
    add, step, update_on = trainer.replay.add, trainer.env.step_and_maybe_reset, trainer.update_on

    def counted_step(td):
        env_steps[0] += 1
        return step(td)

    def add_then_signal(steps):
        add(steps)
        rows[0] += steps.shape[0]
        if where == "replay_add" and env_steps[0] == 30:
            os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode: still inside the write

    def update_then_signal(batch):
        metrics = update_on(batch)
        updates[0] += 1
        if where == "update" and updates[0] == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return metrics

    trainer.env.step_and_maybe_reset, trainer.collector.add = counted_step, add_then_signal
    trainer.update_on = update_then_signal
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    saved = trainer.checkpoints.latest()
    state = torch.load(saved / "state.pt", weights_only=True)
    assert state["replay_size"] == rows[0]  # the write the signal landed in is whole and saved
    assert state["counters"]["env_steps"] == env_steps[0] * per_step  # ... and counted
    assert state["counters"]["updates"] == updates[0]
    assert_resumed_from(Trainer(run_config(tmp_path, SHORT, "steps=100000")), saved)


def test_check_finite_stops_at_the_first_non_finite_loss_and_saves_nothing(base, tmp_path):
    run_dir = copy_of(base, tmp_path)
    checkpoints = snapshot(run_dir / "checkpoints")
    trainer = Trainer(run_config(tmp_path, SHORT, "steps=200", EVAL, "check_finite=true"))
    with torch.no_grad():
        next(trainer.agent.world_model.encoder.parameters()).fill_(float("nan"))
    # the update owed at env step 100 runs inside the collect that starts at 96 (between its actions)
    with pytest.raises(NonFiniteLossError, match=r"wm/loss=nan is not finite at env step 100 .*step-0000000096"):
        trainer.train()
    assert snapshot(run_dir / "checkpoints") == checkpoints


# ---------------------------------------------------------------------------- kills

class _Killed(BaseException):
    """A stand-in for SIGKILL: no handler, no cleanup."""


def _save_ops() -> list[tuple[object, str]]:
    return [(os, "replace"), (os, "fsync"), (shutil, "rmtree"), (torch, "save"), (Path, "write_text"), (Path, "mkdir")]


def _crash_at(monkeypatch, n: int | None) -> list[int]:
    """Patch the file operations a save uses to raise `_Killed` at the n-th call (None: count only)."""
    calls = [0]
    for owner, name in _save_ops():
        real = getattr(owner, name)

        def op(*args, _real=real, **kwargs):
            calls[0] += 1
            if calls[0] == n:
                raise _Killed
            return _real(*args, **kwargs)

        monkeypatch.setattr(owner, name, op)
    return calls


def _replay(size: int) -> Replay:
    replay = Replay(capacity=100, batch_size=1, seq_len=2)
    replay.add(TensorDict({"obs": torch.arange(size).float().unsqueeze(-1),
                           "episode": torch.zeros(size, dtype=torch.long),
                           "step": torch.arange(size)}, batch_size=[size]))
    return replay


@pytest.mark.parametrize("resave", [False, True], ids=["new-step", "same-step"])
def test_a_kill_at_any_point_of_a_save_leaves_a_complete_checkpoint(tmp_path, monkeypatch, resave):
    def save(checkpoints, step, size):
        replay = _replay(size)
        checkpoints.save(f"step-{step:010d}", {"size": size}, lambda d: replay.save(d / "replay"))

    def before(directory: Path) -> Checkpoints:
        checkpoints = Checkpoints(directory)
        save(checkpoints, 8, 3)
        if resave:
            save(checkpoints, 16, 4)
        return checkpoints

    probe = before(tmp_path / "probe")
    with monkeypatch.context() as m:
        calls = _crash_at(m, None)
        save(probe, 16, 5)
    total = calls[0]
    assert total > 10
    old_step, new_step = (16, 16) if resave else (8, 16)
    for n in range(1, total + 1):
        checkpoints = before(tmp_path / f"crash-{n}")
        with monkeypatch.context() as m:
            _crash_at(m, n)
            with pytest.raises(_Killed):
                save(checkpoints, new_step, 5)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the half-written one is skipped with a warning
            state, path = checkpoints.load()
        assert state["size"] in (4 if resave else 3, 5), n
        assert step_of_dir(path) in (old_step, new_step), n
        size = state["size"]
        restored = Replay(capacity=100, batch_size=1, seq_len=2)
        restored.load(path / "replay", example=_replay(1).buffer.storage[:1], size=size)
        assert len(restored) == size
        save(checkpoints, 24, 6)  # the next save succeeds and cleans up what the crash left
        assert [p.name for p in checkpoints.steps()] == ["step-0000000024"], n


def step_of_dir(path: Path) -> int:
    return int(path.name.split("-")[1].split(".")[0])


def _train_script(run_dir: Path, *overrides: str, stdout=subprocess.DEVNULL,
                  new_session: bool = False) -> subprocess.Popen:
    """`scripts/train.py` on the tiny config in a subprocess; `new_session`: in a process group of its own."""
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), *TINY, SHORT, f"run_dir={run_dir}", "steps=100000",
           *overrides]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=stdout, stderr=subprocess.PIPE, start_new_session=new_session)


def _wait_for_checkpoint_after(proc: subprocess.Popen, checkpoints: Checkpoints, step: int, timeout: float = 240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            latest = checkpoints.latest()
        if latest is not None and step_of_dir(latest) > step:
            return latest
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint after step {step} within {timeout} s")


def _wait_for_logged_step(proc: subprocess.Popen, run_dir: Path, step: int, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    metrics = run_dir / "metrics.jsonl"  # written once the run has started
    while not metrics.is_file() or not any(json.loads(line)["step"] >= step for line in metrics.read_text().splitlines()
                                           if line.endswith("}")):
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.time() < deadline, f"step {step} not logged within {timeout} s"
        time.sleep(0.2)


def test_sigkill_at_a_random_moment_then_sigterm_resume_from_the_last_checkpoint(tmp_path):
    """The first process saves every iteration (8 env steps), so a good share of random kills land
    inside a save (every point of a save is covered deterministically above); it is SIGKILLed at a
    random moment. The second resumes and gets SIGTERM, which must save like Ctrl-C."""
    run_dir, checkpoints = tmp_path / "run", Checkpoints(tmp_path / "run" / "checkpoints")
    proc = _train_script(run_dir, "save_every=8", EVAL)
    try:
        seen = step_of_dir(_wait_for_checkpoint_after(proc, checkpoints, 0))
        time.sleep(random.Random(0).uniform(0.0, 1.5))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a save the kill cut short is skipped with a warning
        survivor = checkpoints.latest()
    assert survivor is not None and step_of_dir(survivor) >= seen  # never behind what was seen saved

    proc = _train_script(run_dir, "save_every=8", EVAL)
    try:
        _wait_for_logged_step(proc, run_dir, step_of_dir(survivor) + 16)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    saved = checkpoints.latest()
    assert saved is not None and step_of_dir(saved) >= step_of_dir(survivor) + 16
    trainer = Trainer(run_config(tmp_path, SHORT, "steps=100000", "save_every=8", EVAL))
    assert_resumed_from(trainer, saved)
    trainer.cfg.steps = step_of_dir(saved) + 16
    trainer.train()
    assert_each_step_logged_once(run_dir)


def test_ctrl_c_to_the_whole_process_group_saves_where_it_stopped(tmp_path):
    """A terminal's Ctrl-C and `timeout -s INT` signal the run's whole process group (its helper
    processes too), not the run alone: it still saves the step it stopped at, says so before the save
    and after it, and exits 128 + SIGINT. With WORLDMODELS_TEST_DEVICE=cuda on a GPU machine: with CUDA
    graphs and the replay in the GPU's memory, as the pixel presets run."""
    run_dir, checkpoints = tmp_path / "run", Checkpoints(tmp_path / "run" / "checkpoints")
    device = os.environ.get("WORLDMODELS_TEST_DEVICE", "cpu")
    on_device = ["replay.on_device=true"] if device == "cuda" else []
    with open(tmp_path / "out.log", "w+") as out:
        proc = _train_script(run_dir, f"device={device}", *on_device, stdout=out, new_session=True)
        try:
            _wait_for_logged_step(proc, run_dir, 24)
            os.killpg(proc.pid, signal.SIGINT)
            assert proc.wait(timeout=120) == 128 + signal.SIGINT, proc.stderr.read().decode()[-3000:]
        finally:
            proc.kill()
            proc.wait()
        out.seek(0)
        log = out.read()
    stopped = [line for line in log.splitlines() if line.startswith("stopped by SIGINT at ")]
    assert len(stopped) == 1, log[-3000:]
    step = int(stopped[0].split(" at ")[1].split()[0])
    saved = checkpoints.latest()
    assert step >= 24 and saved is not None and step_of_dir(saved) == step
    assert f"saved {saved}" in log


def test_a_config_stored_before_rec_scale_laprop_and_replay_critic_resumes_as_what_it_trained(tmp_path):
    """A DreamerV3 config.yaml from before `algo.rec_scale`, `algo.optim.kind/warmup` and
    `algo.replay_critic` trained with half the squared error, Adam and no replay-critic loss: resuming
    it at today's rec_scale=2 is refused naming the field; with algo.rec_scale=1 it resumes, the new
    fields read as what it trained with."""
    from omegaconf import OmegaConf

    from worldmodels.train.run_dir import config_changes

    stored = OmegaConf.to_container(run_config(tmp_path), resolve=True)
    del stored["algo"]["rec_scale"], stored["algo"]["optim"]["kind"], stored["algo"]["optim"]["warmup"]
    del stored["algo"]["replay_critic"]
    stored = OmegaConf.create(stored)
    refused, _ = config_changes(stored, run_config(tmp_path))
    assert refused == {"algo.rec_scale": (1.0, 2.0)}
    assert config_changes(stored, run_config(tmp_path, "algo.rec_scale=1")) == ({}, {})


def test_a_config_stored_with_the_removed_env_thread_resumes(tmp_path):
    """`env_thread` (the envs stepped on a thread of their own) only moved where the same steps ran:
    a run stored with it resumes with no field changed."""
    from omegaconf import OmegaConf

    from worldmodels.train.run_dir import config_changes

    stored = OmegaConf.create({**OmegaConf.to_container(run_config(tmp_path), resolve=True), "env_thread": True})
    assert config_changes(stored, run_config(tmp_path)) == ({}, {})
