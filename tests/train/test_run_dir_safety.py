"""What a run directory promises beyond surviving kills (test_run_dir_faults.py): one someone else
wrote runs no code it names on load, eval or resume; a run touches only files it wrote, and refuses
a folder that is not a run directory, an empty `run_dir`, a file and a read-only place before it
builds anything; a second stop signal never loses the stop's save; a full disk, a garbage or empty
`state.pt` and a save cut short by a kill each end in a clear message or a repaired run directory.

A base run (tiny model, Pendulum, checkpoints at env steps 48 and 96) is made once and copied; the
code a tampered config names is a probe module written into the test's directory and put on
`sys.path`, so that anything that would import it could: it records an import, and a call.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from tests._train_config import TINY, run_config
from tests.train.test_run_dir_faults import STEP48, STEP96, assert_resumed_from, snapshot
from worldmodels.train import CheckpointError, RunDirError, Trainer, load
from worldmodels.train.interrupt import SaveAborted
from worldmodels.train.trust import UntrustedCodeError

ROOT = Path(__file__).resolve().parents[2]
SHORT = "env.time_limit=20"
_spec = importlib.util.spec_from_file_location("eval_script", ROOT / "scripts" / "eval.py")
eval_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(eval_script)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A finished run at 96 env steps with two complete checkpoints (48 and 96)."""
    root = tmp_path_factory.mktemp("base")
    Trainer(run_config(root, SHORT, "steps=48")).train()
    shutil.copytree(root / "run" / "checkpoints" / STEP48, root / STEP48)
    Trainer(run_config(root, SHORT, "steps=96")).train()  # its save at 96 prunes 48: put it back
    shutil.copytree(root / STEP48, root / "run" / "checkpoints" / STEP48)
    return root / "run"


def copy_of(base: Path, tmp_path: Path) -> Path:
    shutil.copytree(base, tmp_path / "run")
    return tmp_path / "run"


def rewrite_state(checkpoint: Path, edit=None, raw: bytes | None = None) -> None:
    """Replace `checkpoint`'s state.pt (by `edit(state)`'s result, or by `raw` bytes) and put its new size
    and SHA-256 into the manifest: what someone who tampers with a run directory does."""
    path = checkpoint / "state.pt"
    if raw is None:
        state = torch.load(path, weights_only=True)
        torch.save(edit(state), path)
    else:
        path.write_bytes(raw)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    data = path.read_bytes()
    manifest["files"]["state.pt"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


# ---------------------------------------------------------------------------- code a config names

@pytest.fixture
def probe(tmp_path, monkeypatch):
    """A module on sys.path that records its import and a call of its `make` (which returns Pendulum)."""
    name = f"wm_probe_{hashlib.sha256(str(tmp_path).encode()).hexdigest()[:12]}"
    marker = tmp_path / "probe-ran"
    (tmp_path / f"{name}.py").write_text(
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('imported')\n"
        "def make(**kwargs):\n"
        f"    pathlib.Path({str(marker)!r}).write_text('called')\n"
        "    import gymnasium\n"
        "    return gymnasium.make('Pendulum-v1')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, marker
    sys.modules.pop(name, None)


def code_naming_fields(module: str) -> dict[str, dict]:
    """Every field of a stored config that could name code, tampered to name the probe: a custom env's
    factory, gymnasium's `module:Env-v0` id, and the fields read by name (suite, algo, logger, backend,
    activations, precision) given an import path."""
    entry = f"{module}:make"
    return {
        "env.entry": {"env": {"suite": "custom", "entry": entry, "task": None, "kwargs": {}}},
        "env.task (gym module:id)": {"env": {"suite": "gym", "task": f"{module}:Probe-v0"}},
        "env.suite": {"env": {"suite": entry}},
        "algo.name": {"algo": {"name": entry}},
        "logger.kind": {"logger": {"kind": entry}},
        "backend": {"backend": entry},
        "model.act": {"model": {"act": entry}},
        "precision": {"precision": entry},
    }


def tamper_config(checkpoint: Path, change: dict, drop_env_info: bool = False) -> None:
    def edit(state):
        for group, values in change.items():
            if isinstance(values, dict):
                state["config"][group].update(values)
            else:
                state["config"][group] = values
        if drop_env_info:  # a checkpoint written before checkpoints held it
            state.pop("env_info")
        return state

    rewrite_state(checkpoint, edit)


@pytest.mark.parametrize("field", list(code_naming_fields("m")))
def test_load_eval_and_resume_run_nothing_a_tampered_config_names(base, tmp_path, probe, field):
    module, marker = probe
    run_dir = copy_of(base, tmp_path)
    tamper_config(run_dir / "checkpoints" / STEP96, code_naming_fields(module)[field])
    try:
        load(run_dir)
    except Exception:  # refused, or failed on a name that is no algo / backend / ...: either way nothing ran
        pass
    try:  # eval builds the env: refused where it names code
        eval_script.evaluate_run(run_dir, episodes=1, video=False)
    except Exception:
        pass
    try:  # the command line's config (Pendulum) is what a resume builds; the stored one is only compared
        Trainer(run_config(tmp_path, SHORT, "steps=200"))
    except RunDirError:
        pass
    assert not marker.exists() and module not in sys.modules


def test_load_builds_no_env_and_eval_needs_trust_code_for_a_custom_entry(base, tmp_path, probe, capsys):
    module, marker = probe
    run_dir = copy_of(base, tmp_path)
    tamper_config(run_dir / "checkpoints" / STEP96, code_naming_fields(module)["env.entry"])
    agent = load(run_dir)  # the agent is built from the checkpoint's env_info
    assert agent.env_info == {"obs_key": "observation", "obs_shape": (3,), "action_dim": 1, "discrete": False}
    with pytest.raises(UntrustedCodeError, match=rf"env\.entry='{module}:make'.*trust_code=true to scripts/eval"):
        eval_script.evaluate_run(run_dir, episodes=1, video=False)
    assert eval_script.main([f"run_dir={run_dir}", "episodes=1", "video=false"]) == 1
    assert "trust_code=true" in capsys.readouterr().err
    assert not marker.exists()
    result = eval_script.evaluate_run(run_dir, episodes=1, video=False, trust_code=True)  # the user's consent
    assert marker.read_text() == "called" and len(result["returns"]) == 1


def test_an_older_checkpoint_builds_a_custom_env_only_with_trust_code(base, tmp_path, probe):
    module, marker = probe
    run_dir = copy_of(base, tmp_path)
    tamper_config(run_dir / "checkpoints" / STEP96, code_naming_fields(module)["env.entry"], drop_env_info=True)
    with pytest.raises(UntrustedCodeError, match=r"env\.entry=.*trust_code=True to worldmodels\.load"):
        load(run_dir)
    assert not marker.exists()
    agent = load(run_dir, trust_code=True)
    assert marker.read_text() == "called" and agent.env_info["obs_shape"] == (3,)


def test_eval_script_refuses_the_issues_subprocess_payload(base, tmp_path):
    """The reported attack, end to end: `subprocess:run` as the factory, `touch` as its argument."""
    run_dir, marker = copy_of(base, tmp_path), tmp_path / "PWNED"
    tamper_config(run_dir / "checkpoints" / STEP96, {"env": {
        "suite": "custom", "entry": "subprocess:run", "task": None, "kwargs": {"args": ["touch", str(marker)]}}})
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "eval.py"), f"run_dir={run_dir}", "video=false"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 1 and "env.entry='subprocess:run'" in done.stderr, done.stderr[-2000:]
    assert not marker.exists()


# ---------------------------------------------------------------------------- what a run may touch

def test_an_existing_folder_that_is_not_a_run_directory_is_refused_untouched(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "prices.csv").write_text("1,10\n2,20\n")
    (folder / "metrics.jsonl").write_text('{"step": 5, "mine": 1}\n')
    before = snapshot(folder)
    monkeypatch.setattr("worldmodels.train.trainer.make_env", _never_built)
    with pytest.raises(RunDirError, match=r"run_dir=.* already holds files that are not a worldmodels run's "
                                          r"\(metrics\.jsonl, prices\.csv\)"):
        Trainer(run_config(tmp_path, SHORT, "steps=48"))
    assert snapshot(folder) == before and sorted(p.name for p in folder.iterdir()) == ["metrics.jsonl", "prices.csv"]


def test_files_a_user_put_into_a_run_directory_are_never_touched(base, tmp_path):
    run_dir = copy_of(base, tmp_path)
    mine = {"notes.csv": "1,10\n200,20\n", "analysis/metrics.jsonl": '{"step": 500}\n', "analysis/x.csv": "999,1\n"}
    for name, text in mine.items():
        (run_dir / name).parent.mkdir(exist_ok=True)
        (run_dir / name).write_text(text)
    with open(run_dir / "metrics.jsonl", "a") as f:  # the run's own line past its checkpoint: cut
        f.write(json.dumps({"step": 120, "eval/return": -1.0}) + "\n")
    Trainer(run_config(tmp_path, SHORT, "steps=200"))
    assert {name: (run_dir / name).read_text() for name in mine} == mine
    assert sorted(p.relative_to(run_dir / "cut").as_posix() for p in (run_dir / "cut").rglob("*") if p.is_file()) \
        == ["metrics.jsonl"]


def _never_built(*args, **kwargs):
    raise AssertionError("an env was built before the run directory was checked")


def test_a_read_only_filesystem_is_refused_before_anything_is_built(tmp_path, monkeypatch):
    real = os.statvfs

    class ReadOnly:
        def __init__(self, path):
            self.stat = real(path)

        def __getattr__(self, name):
            return os.ST_RDONLY if name == "f_flag" else getattr(self.stat, name)

    monkeypatch.setattr(os, "statvfs", ReadOnly)
    monkeypatch.setattr("worldmodels.train.trainer.make_env", _never_built)
    with pytest.raises(RunDirError, match=r"run_dir=.* is on a read-only filesystem"):
        Trainer(run_config(tmp_path, SHORT, "steps=48"))
    assert not (tmp_path / "run").exists()


def test_the_command_line_refuses_an_empty_run_dir_a_file_and_a_bad_config_leaving_nothing(tmp_path):
    """scripts/train.py, as a user runs it: `run_dir=` (empty), a run_dir that is a file, and a refused
    config each exit 1 with a message naming what is wrong; no directory or file is left behind (Hydra
    makes none: configs/config.yaml's hydra.run.dir)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "a-file").write_text("mine\n")
    cases = {"empty": (["run_dir="], r"run_dir='' names no directory"),
             "file": ([f"run_dir={work / 'a-file'}"], r"run_dir='.*a-file' is a file, not a directory"),
             "config": ([f"run_dir={work / 'new' / 'run'}", "batch_size=-4"], r"config error: batch_size")}
    procs = {name: subprocess.Popen([sys.executable, str(ROOT / "scripts" / "train.py"), *TINY, *args],
                                    cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, (args, _) in cases.items()}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 1, (name, err[-2000:])
        assert __import__("re").search(cases[name][1], err), (name, err[-2000:])
    assert sorted(p.name for p in work.iterdir()) == ["a-file"] and (work / "a-file").read_text() == "mine\n"


# ---------------------------------------------------------------------------- stop signals during the save

def _stop_in_an_update(trainer: Trainer, signum: int, at: int = 3) -> None:
    """`signum` to this process inside the `at`-th update: the stop lands between two env steps."""
    update_on, count = trainer.update_on, [0]

    def update_then_signal(batch):
        metrics = update_on(batch)
        count[0] += 1
        if count[0] == at:
            os.kill(os.getpid(), signum)
        return metrics

    trainer.update_on = update_then_signal


def _signals_in_the_save(trainer: Trainer, signums: list[int]) -> None:
    """Send `signums` to this process while the stop's checkpoint is being written (in its replay save)."""
    save_replay = trainer._save_replay

    def save_replay_with_signals(path):
        if trainer.stop._saving is not None:  # the stop's save, not a periodic one
            for signum in signums:
                os.kill(os.getpid(), signum)
        save_replay(path)

    trainer._save_replay = save_replay_with_signals


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_stop_signal_during_the_stops_save_says_so_and_the_save_completes(tmp_path, capfd, signum):
    trainer = Trainer(run_config(tmp_path, SHORT, "steps=100000"))
    _stop_in_an_update(trainer, signum)
    _signals_in_the_save(trainer, [signum])
    with pytest.raises(KeyboardInterrupt) as stopped:
        trainer.train()
    assert not isinstance(stopped.value, SaveAborted)
    step = trainer.counters["env_steps"]
    saved = trainer.checkpoints.latest()
    assert saved is not None and saved.name == f"step-{step:010d}"
    err = capfd.readouterr().err
    assert f"{signal.Signals(signum).name}: still saving {saved}; one more stop signal aborts the save" in err
    assert_resumed_from(Trainer(run_config(tmp_path, SHORT, "steps=100000")), saved)


def test_a_third_stop_signal_aborts_the_save_saying_which_checkpoint_is_kept(tmp_path, capsys):
    trainer = Trainer(run_config(tmp_path, SHORT, "steps=100000", "save_every=16"))
    _stop_in_an_update(trainer, signal.SIGINT, at=12)
    _signals_in_the_save(trainer, [signal.SIGINT, signal.SIGINT])
    with pytest.raises(SaveAborted):
        trainer.train()
    kept = trainer.checkpoints.latest()
    step = trainer.counters["env_steps"]
    assert kept is not None and kept.name != f"step-{step:010d}"
    assert (f"save aborted: step-{step:010d} was not written; the newest complete checkpoint is {kept}"
            in capsys.readouterr().out)
    assert_resumed_from(Trainer(run_config(tmp_path, SHORT, "steps=100000", "save_every=16")), kept)


def test_a_run_stopped_between_env_steps_resumes_to_exactly_steps(tmp_path):
    """A stop inside a collect leaves the run off the collect grid; the resumed run still ends at `steps`,
    with the updates one run to `steps` owes, not one collect (and its updates) past it."""
    trainer = Trainer(run_config(tmp_path, SHORT, "steps=100000"))
    _stop_in_an_update(trainer, signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    stopped = trainer.counters["env_steps"]
    assert stopped % trainer.steps_per_collect != 0  # off the grid: the case that overshot
    steps = (stopped // trainer.steps_per_collect + 4) * trainer.steps_per_collect
    resumed = Trainer(run_config(tmp_path, SHORT, f"steps={steps}"))
    result = resumed.train()
    cfg = resumed.cfg
    owed = int((steps - cfg.prefill) * cfg.train_ratio / (cfg.env.action_repeat * cfg.batch_size * cfg.seq_len))
    assert (result["env_steps"], result["updates"]) == (steps, owed)


# ---------------------------------------------------------------------------- failures that must be clear

def test_a_full_disk_says_what_failed_and_keeps_the_last_checkpoint(base, tmp_path):
    """A real failed write: a file-size limit (`ulimit -f`; Python ignores SIGXFSZ) fails torch.save
    as a full disk does, with torch's `enforce fail at inline_container.cc`."""
    run_dir = copy_of(base, tmp_path)
    trainer = Trainer(run_config(tmp_path, SHORT, "steps=200"))
    trainer.counters["env_steps"] += 8
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(CheckpointError) as failed:
            trainer.save()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    message = str(failed.value)
    assert "could not write checkpoint step-0000000104" in message and "GiB are free there" in message
    assert f"the newest complete checkpoint, {STEP96}, is kept" in message
    assert trainer.checkpoints.latest() == run_dir / "checkpoints" / STEP96
    assert not list((run_dir / "checkpoints").glob("*.tmp"))


@pytest.mark.parametrize("state, problem", [
    (b"\x00garbage where a state should be" * 40, r"not a torch\.save file"),
    ({}, r"it has no agent"),
    ({"agent": {}, "optimizers": {}, "counters": {"env_steps": 96}, "collector": {}, "rng": {}, "replay_size": 1},
     r"it has no counters\.updates"),
], ids=["garbage", "empty", "no-updates-counter"])
def test_a_state_that_is_not_a_checkpoints_falls_back_to_the_previous_one(base, tmp_path, state, problem):
    """Garbage or a state without a trainer's fields, under a manifest that matches it: corrupt, not
    unsafe (no pickle names code here), so the run resumes from the previous checkpoint with a warning."""
    run_dir = copy_of(base, tmp_path)
    if isinstance(state, bytes):
        rewrite_state(run_dir / "checkpoints" / STEP96, raw=state)
    else:
        rewrite_state(run_dir / "checkpoints" / STEP96, lambda _: state)
    with pytest.warns(UserWarning, match=rf"skipping checkpoint {STEP96}: .*state\.pt.*{problem}"):
        trainer = Trainer(run_config(tmp_path, SHORT, "steps=200"))
    assert_resumed_from(trainer, run_dir / "checkpoints" / STEP48)


# ---------------------------------------------------------------------------- saves a kill cut short

@pytest.mark.parametrize("cut_at", ["renamed-away", "new-copy-in-place"])
def test_a_finished_run_killed_mid_resave_is_repaired_on_its_next_start(base, tmp_path, cut_at):
    """A re-save of step 96 moves the old copy to `.old`, renames its `.tmp` into place, then deletes
    `.old`; killed between those, the run is finished and trains nothing, but its next start puts the
    complete copy under the step's name and deletes the rest."""
    run_dir = copy_of(base, tmp_path)
    checkpoints = run_dir / "checkpoints"
    shutil.copytree(checkpoints / STEP96, checkpoints / f"{STEP96}.old")
    if cut_at == "renamed-away":
        shutil.rmtree(checkpoints / STEP96)
        (checkpoints / f"{STEP96}.tmp").mkdir()
        (checkpoints / f"{STEP96}.tmp" / "state.pt").write_bytes(b"half")
    trainer = Trainer(run_config(tmp_path, SHORT, "steps=96"))
    assert trainer.run.finished
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", STEP48, STEP96]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every checkpoint left is complete
        assert trainer.checkpoints.latest() == checkpoints / STEP96


def test_the_last_step_is_saved_once_when_the_periodic_save_just_wrote_it(tmp_path):
    trainer = Trainer(run_config(tmp_path, SHORT, "steps=48", "save_every=24", "eval_every=24"))
    save, names = trainer.checkpoints.save, []
    trainer.checkpoints.save = lambda name, *args: names.append(name) or save(name, *args)
    trainer.train()
    assert names == ["step-0000000024", "step-0000000048"]
