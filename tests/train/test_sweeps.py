"""Sweeps (worldmodels/train/sweep.py): `scripts/train.py -m` on the one-run-per-GPU launcher runs
every run into its own run directory under the sweep folder, and `scripts/plot.py <sweep folder>`
draws one curve per task; a run process takes a GPU no other holds."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._train_config import TINY
from worldmodels.train import sweep

ROOT = Path(__file__).resolve().parents[2]
TASKS = ("Pendulum-v1", "MountainCarContinuous-v0")


@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is None,
                    reason="needs worldmodels[sweeps] (hydra-joblib-launcher)")
def test_multirun_on_the_gpus_launcher_runs_each_run_and_plot_reads_the_sweep(tmp_path):
    folder = tmp_path / "sweep"
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), "-m", *TINY, "env=gym",
           f"env.task={','.join(TASKS)}", "steps=64", "hydra/launcher=gpus", f"hydra.sweep.dir={folder}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    runs = sorted(p.parent for p in folder.rglob("metrics.jsonl"))
    assert [p.name for p in runs] == [f"{i}-{task}-dreamer_v3-seed0" for i, task in enumerate(TASKS)]
    for run in runs:  # each run its own directory: config, metrics, checkpoint
        assert (run / "config.yaml").is_file() and (run / "checkpoints" / "latest").is_file()
        assert any("eval/return" in json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines())

    out = tmp_path / "curves.png"
    plot = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot.py"), str(folder), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert plot.returncode == 0, plot.stderr
    assert out.stat().st_size > 0
    curves = [line for line in plot.stdout.splitlines() if not line.startswith((" ", "wrote"))]
    assert len(curves) == len(TASKS), plot.stdout  # one curve per task


def test_plot_folder_without_runs_names_it(tmp_path):
    (tmp_path / "empty").mkdir()
    plot = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot.py"), str(tmp_path / "empty"), "--out",
                           str(tmp_path / "x.png")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert plot.returncode == 2
    assert "holds no run directory" in plot.stderr and "empty" in plot.stderr


def test_each_run_process_claims_a_gpu_no_other_holds(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "_claimed", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    held = os.open(tmp_path / "gpu-3.lock", os.O_RDWR | os.O_CREAT)  # another run holds GPU 3
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        assert sweep.claim_gpu(tmp_path, poll_s=0.01) == "5"
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"
        assert sweep.claim_gpu(tmp_path) == "5"  # the same process's next run: the same GPU
    finally:
        os.close(held)
        os.close(sweep._claimed[1])
    monkeypatch.setattr(sweep, "_claimed", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert sweep.claim_gpu(tmp_path) is None  # one GPU: nothing to share


def test_runs_per_gpu_fills_every_gpu_before_sharing_one(tmp_path, monkeypatch):
    taken, fds = [], []
    try:
        for _ in range(4):  # four run processes, two slots on each of two GPUs
            monkeypatch.setattr(sweep, "_claimed", None)
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
            taken.append(sweep.claim_gpu(tmp_path, per_gpu=2))
            fds.append(sweep._claimed[1])
            assert os.environ["CUDA_VISIBLE_DEVICES"] == taken[-1]
        assert taken == ["3", "5", "3", "5"]
        monkeypatch.setattr(sweep, "_claimed", None)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
        with pytest.raises(TimeoutError):  # every slot held: a fifth run waits
            _claim_with_deadline(tmp_path, per_gpu=2)
    finally:
        for fd in fds:
            os.close(fd)


def _claim_with_deadline(lock_dir, per_gpu):
    import signal

    def expire(*_):
        raise TimeoutError
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    try:
        return sweep.claim_gpu(lock_dir, poll_s=0.01, per_gpu=per_gpu)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("value", [0, -1, 1.5, "two", True])
def test_runs_per_gpu_refuses_what_is_not_a_positive_int(value):
    with pytest.raises(ValueError, match="runs_per_gpu"):
        sweep.gpu_count(value)


def test_the_launcher_runs_gpus_times_runs_per_gpu_jobs(monkeypatch):
    from omegaconf import OmegaConf
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    launcher = OmegaConf.load(ROOT / "configs" / "hydra" / "launcher" / "gpus.yaml")
    cfg = OmegaConf.create({"runs_per_gpu": 3, "launcher": launcher})
    assert cfg.launcher.n_jobs == 6
