"""Checkpoints: kill -> resume continues exactly; a crash mid-write keeps the previous one;
Ctrl-C saves; everything saved loads with weights_only=True; `worldmodels.train.load` brings a run
back for imagination. (Damaged files, signals and changed configs: test_faults.py.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests._train_config import TINY, run_config
from worldmodels.train import Checkpoints, Trainer, load

ROOT = Path(__file__).resolve().parents[1]


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

    def crash(path):
        path.mkdir(parents=True)
        (path / "partial").write_bytes(b"half a replay")
        raise OSError("disk full")

    monkeypatch.setattr(trainer.replay, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        trainer.save()
    assert trainer.checkpoints.latest() == good
    resumed = Trainer(run_config(tmp_path, "steps=64"))
    assert resumed.counters["env_steps"] == saved_steps


def test_ctrl_c_saves_a_checkpoint(tmp_path, monkeypatch):
    trainer = Trainer(run_config(tmp_path, "steps=100000"))
    collect, calls = trainer.collect, []

    def collect_then_interrupt(**kwargs):
        calls.append(1)
        if len(calls) == 20:
            raise KeyboardInterrupt
        return collect(**kwargs)

    monkeypatch.setattr(trainer, "collect", collect_then_interrupt)
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
