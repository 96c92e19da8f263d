"""Checkpoints: kill -> resume continues exactly; a crash mid-write keeps the previous one;
Ctrl-C saves; everything saved loads with weights_only=True; `worldmodels.train.load` brings a run
back for imagination; files over PIECE_SIZE are stored as verified pieces, the replay compressed,
and checkpoints of the format before both still load. (Damaged files, signals and changed
configs: test_run_dir_faults.py.)"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from tests._train_config import TINY, interrupt_collect, run_config
from worldmodels.data import Replay
from worldmodels.data.replay import read_saved
from worldmodels.train import CheckpointError, Checkpoints, Trainer, checkpoint, load
from worldmodels.train.checkpoint import open_file

ROOT = Path(__file__).resolve().parents[2]


def test_kill_then_resume_continues_from_the_saved_step(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), *TINY, f"run_dir={run_dir}",
           "steps=100000", "save_every=48", "prefill=32"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    checkpoints = Checkpoints(run_dir / "checkpoints")
    deadline = time.time() + 240
    try:
        while (checkpoints.latest() is None or checkpoints.latest().name.endswith("48")) and time.time() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.5)
        assert checkpoints.latest() is not None, "no checkpoint within 240 s"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    state, path = checkpoints.load()
    trainer = Trainer(run_config(tmp_path, "steps=100000", "prefill=32"))
    assert trainer.counters["env_steps"] == state["counters"]["env_steps"] > 0
    assert trainer.counters["updates"] == state["counters"]["updates"] > 0
    assert len(trainer.replay) == state["replay_size"] > 0
    for name, value in trainer.agent.state_dict().items():
        assert torch.equal(value, state["agent"][name]), name
    saved_moments = state["optimizers"]["model"]["state"]
    assert trainer.agent.wm_opt.state_dict()["state"].keys() == saved_moments.keys()


def test_resume_continues_counters_and_learning_curve(tmp_path):
    first = Trainer(run_config(tmp_path, "steps=64"))
    first.train()
    steps, updates, size = first.counters["env_steps"], first.counters["updates"], len(first.replay)
    params = {k: v.clone() for k, v in first.agent.state_dict().items()}

    second = Trainer(run_config(tmp_path, "steps=128"))
    assert (second.counters["env_steps"], second.counters["updates"], len(second.replay)) == (steps, updates, size)
    assert all(torch.equal(v, params[k]) for k, v in second.agent.state_dict().items())
    second.train()
    assert second.counters["env_steps"] >= 128 and second.counters["updates"] > updates
    evals = [line for line in (second.run_dir / "metrics.jsonl").read_text().splitlines() if "eval/return" in line]
    assert len(evals) == 2  # one per run, appended to the same curve


def test_crash_mid_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    trainer = Trainer(run_config(tmp_path, "steps=64"))
    trainer.train()
    good = trainer.checkpoints.latest()
    saved_steps = trainer.counters["env_steps"]
    trainer.counters["env_steps"] += 8

    def crash(path, **kwargs):
        path.mkdir(parents=True)
        (path / "partial").write_bytes(b"half a replay")
        raise OSError("disk full")

    monkeypatch.setattr(trainer.replay, "save", crash)
    with pytest.raises(CheckpointError, match=rf"could not write checkpoint step-0000000072 .*disk full.*{good.name}"):
        trainer.save()
    assert trainer.checkpoints.latest() == good
    assert not list(trainer.checkpoints.dir.glob("*.tmp"))  # the failed save's files are gone
    resumed = Trainer(run_config(tmp_path, "steps=64"))
    assert resumed.counters["env_steps"] == saved_steps


def test_ctrl_c_saves_a_checkpoint(tmp_path, monkeypatch):
    trainer = Trainer(run_config(tmp_path, "steps=100000"))
    interrupt_collect(monkeypatch, trainer, 20)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    state, _ = trainer.checkpoints.load()
    assert state["counters"]["env_steps"] == trainer.counters["env_steps"] == 19 * trainer.steps_per_collect


def test_load_a_run_and_imagine(tmp_path):
    Trainer(run_config(tmp_path, "steps=64")).train()
    agent = load(tmp_path / "run")
    wm = agent.world_model
    obs = torch.randn(2, 6, 3)  # Pendulum observations [B, T, 3]
    action = torch.rand(2, 6, 1) * 2 - 1
    is_first = torch.zeros(2, 6, dtype=torch.bool)
    is_first[:, 0] = True
    with torch.no_grad():
        post, prior = wm.rssm.observe(wm.encoder(obs), action, is_first)
        dream = wm.rssm.imagine(post[:, -1], 10, policy=agent.actor)
        decoded = wm.decoder(wm.rssm.features(dream))
    assert decoded.shape == (2, 10, 3) and dream["action"].shape == (2, 10, 1)
    with pytest.raises(FileNotFoundError, match="run_dir"):
        load(tmp_path / "missing")


def test_a_run_stored_with_the_previous_batch_start_loads(tmp_path, monkeypatch):
    """A checkpoint whose config holds `algo.start_state=previous_batch` (a start only updates read,
    refused in new configs) loads for eval and imagination, as `initial`."""
    from worldmodels.train.checkpoint import Checkpoints

    Trainer(run_config(tmp_path, "steps=64", "algo=dreamer_v3")).train()
    stored = Checkpoints.load

    def with_previous_batch(self):
        state, info = stored(self)
        state["config"]["algo"]["start_state"] = "previous_batch"
        return state, info

    monkeypatch.setattr(Checkpoints, "load", with_previous_batch)
    assert load(tmp_path / "run").start_state == "initial"




def _draws() -> tuple:
    import random

    import numpy as np
    out = (torch.rand(3), np.random.rand(3), random.random())
    if torch.cuda.is_available():
        out += (torch.rand(3, device="cuda").cpu(),)
    return out


def test_rng_state_round_trip_restores_every_generator(tmp_path):
    """Resume replays the same random stream: torch CPU, numpy, python, and CUDA where initialised."""
    from worldmodels.train.trainer import rng_state, set_rng_state
    if torch.cuda.is_available():
        torch.rand(1, device="cuda")  # initialise CUDA so its generators are saved
    state = rng_state()
    path = tmp_path / "rng.pt"
    torch.save(state, path)
    state = torch.load(path, weights_only=True)  # numpy and python states saved as tensors and lists
    first = _draws()
    set_rng_state(state)
    again = _draws()
    for a, b in zip(first, again):
        assert (torch.as_tensor(a) == torch.as_tensor(b)).all()
    assert ("cuda" in state) == torch.cuda.is_available()


def test_final_eval_is_not_repeated_at_the_step_of_a_periodic_one(tmp_path):
    trainer = Trainer(run_config(tmp_path, "steps=64", "eval_every=32"))
    result = trainer.train()
    evals = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()
             if "eval/return" in line]
    steps = [e["step"] for e in evals]
    assert steps[-1] == trainer.counters["env_steps"] and len(steps) == len(set(steps)) >= 2
    assert result["eval_return"] == evals[-1]["eval/return"]


# ---------------------------------------------------------------------------- pieces and compression

def _filled_replay(steps: int = 300) -> Replay:
    """A replay holding every dtype a run stores: uint8 frames, floats, bools and ints, nested keys."""
    torch.manual_seed(0)
    replay = Replay(capacity=250, batch_size=2, seq_len=4)  # 300 steps into 250 slots: the ring wrapped
    replay.add(TensorDict({
        "obs": TensorDict({"pixels": torch.randint(0, 256, (steps, 3, 8, 8), dtype=torch.uint8),
                           "vector": torch.randn(steps, 5)}, [steps]),
        "action": torch.rand(steps, 2) * 2 - 1, "reward": torch.randn(steps),
        "is_first": torch.arange(steps) % 50 == 0, "is_terminal": torch.zeros(steps, dtype=torch.bool),
        "episode": torch.arange(steps) // 50, "step": torch.arange(steps) % 50}, [steps]))
    return replay


def _save(directory: Path, replay: Replay, step: int = 8) -> Path:
    state = {"weights": torch.arange(3000, dtype=torch.float32), "counters": {"env_steps": step}}
    return Checkpoints(directory).save(f"step-{step:010d}", state, lambda d: replay.save(d / "replay"))


def test_files_over_the_piece_size_are_split_verified_and_reassembled(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "PIECE_SIZE", 4096)
    replay = _filled_replay()
    path = _save(tmp_path, replay)
    files = [p for p in path.rglob("*") if p.is_file()]
    assert max(p.stat().st_size for p in files) <= 4096
    assert not (path / "state.pt").exists() and (path / "state.pt.000").is_file() and (path / "state.pt.002").is_file()
    manifest = json.loads((path / "manifest.json").read_text())["files"]
    entry = manifest["state.pt"]
    assert len(entry["pieces"]) == -(-entry["size"] // 4096)
    whole = b"".join((path / f"state.pt.{i:03d}").read_bytes() for i in range(len(entry["pieces"])))
    assert hashlib.sha256(whole).hexdigest() == entry["sha256"]  # `cat state.pt.*` is the file
    state, loaded = Checkpoints(tmp_path).load()
    assert loaded == path and torch.equal(state["weights"], torch.arange(3000, dtype=torch.float32))

    restored = Replay(capacity=250, batch_size=2, seq_len=4)
    restored.load(path / "replay", example=replay.buffer.storage[:1], size=250, open_file=open_file)
    saved, stored = replay.buffer.storage[:250], restored.buffer.storage[:250]
    for key in saved.keys(True, True):
        assert stored[key].dtype == saved[key].dtype and torch.equal(stored[key], saved[key]), key
    assert restored.buffer._writer._cursor == replay.buffer._writer._cursor == 50
    raw = sum(v.numel() * v.element_size() for v in saved.values(True, True))
    assert sum(p.stat().st_size for p in (path / "replay" / "steps").rglob("*.zlib*")) < raw


def test_a_missing_or_corrupt_piece_is_named_and_the_previous_checkpoint_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "PIECE_SIZE", 4096)
    replay = _filled_replay()
    older = _save(tmp_path, replay, step=8)
    checkpoints = Checkpoints(tmp_path, keep=2)
    newer = checkpoints.save("step-0000000016", {"counters": {"env_steps": 16}}, lambda d: replay.save(d / "replay"))
    piece = newer / "replay" / "steps" / "obs" / "pixels.zlib.001"
    data = bytearray(piece.read_bytes())
    data[100] ^= 0xFF
    piece.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"pixels\.zlib\.001 does not match its checksum .*corrupted.*"
                                              r"piece 2 of \d+ of replay/steps/obs/pixels\.zlib"):
        checkpoints.load(newer)
    with pytest.warns(UserWarning, match=r"skipping incomplete checkpoint step-0000000016: .*pixels\.zlib\.001"):
        state, path = checkpoints.load()
    assert path == older and state["counters"]["env_steps"] == 8
    piece.unlink()
    with pytest.raises(CheckpointError, match=r"pixels\.zlib\.001 is missing \(piece 2 of"):
        checkpoints.load(newer)


def test_a_checkpoint_of_the_format_before_pieces_and_compression_loads(tmp_path):
    """Manifest format 1, whole files, the replay as memory-mapped tensors: what earlier versions wrote."""
    replay = _filled_replay()
    path = tmp_path / "step-0000000008"
    (path / "replay").mkdir(parents=True)
    torch.save({"counters": {"env_steps": 8}}, path / "state.pt")
    replay.buffer.storage[: len(replay)].memmap(path / "replay" / "steps", copy_existing=True)
    torch.save({"cursor": replay.buffer._writer._cursor}, path / "replay" / "writer.pt")
    files = {p.relative_to(path).as_posix(): {"size": p.stat().st_size,
                                              "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for p in sorted(path.rglob("*")) if p.is_file()}
    (path / "manifest.json").write_text(json.dumps({"format": 1, "files": files}))
    state, loaded = Checkpoints(tmp_path).load()
    assert loaded == path and state["counters"]["env_steps"] == 8
    restored = Replay(capacity=250, batch_size=2, seq_len=4)
    restored.load(path / "replay", example=replay.buffer.storage[:1], size=250, open_file=open_file)
    steps, cursor = read_saved(path / "replay", open_file)
    assert cursor == 50 and (restored.buffer.storage[:250] == replay.buffer.storage[:250]).all()
    assert (steps == replay.buffer.storage[:250]).all()


def test_a_run_with_pieces_resumes(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "PIECE_SIZE", 2**16)
    first = Trainer(run_config(tmp_path, "steps=48"))
    first.train()
    path = first.checkpoints.latest()
    assert (path / "state.pt.001").is_file() and max(p.stat().st_size for p in path.rglob("*") if p.is_file()) <= 2**16
    second = Trainer(run_config(tmp_path, "steps=64"))
    assert second.counters["env_steps"] == first.counters["env_steps"] and len(second.replay) == len(first.replay)
    assert (second.replay.buffer.storage[: len(first.replay)] == first.replay.buffer.storage[: len(first.replay)]).all()
    assert all(torch.equal(v, first.agent.state_dict()[k]) for k, v in second.agent.state_dict().items())
