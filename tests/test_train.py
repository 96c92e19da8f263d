"""The trainer's entry point: bad config values fail early naming the field; a short
DreamerV3 run on Pendulum beats a random policy by a margin no broken learner reaches."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests._train_config import TINY, run_config
from worldmodels.data import evaluate
from worldmodels.envs import make_env
from worldmodels.train import ConfigError, Trainer

ROOT = Path(__file__).resolve().parents[1]


BAD_INPUTS = [
    ("env.name=mars_lander", r"env\.name='mars_lander'"),
    ("steps=-5", r"steps=-5"),
    ("batch_size=0", r"batch_size=0"),
    ("backend=warp", r"backend='warp'"),
    # a device index this machine lacks, whether or not it has CUDA
    (f"device=cuda:{torch.cuda.device_count()}", rf"device='cuda:{torch.cuda.device_count()}'"),
    ("device=tpu9", r"device='tpu9'"),
    ("logger.kind=carrier_pigeon", r"logger\.kind='carrier_pigeon'"),
    ("algo.name=alphago", r"algo\.name='alphago'"),
    ("replay.memory_gb=-1", r"replay\.memory_gb=-1"),
    ("env.pixels=no", r"env\.pixels='no' must be true or false"),
    ("resume=maybe", r"resume='maybe' must be true or false"),
    ("replay.memmap=1", r"replay\.memmap=1 must be true or false"),
    ("check_finite=yes", r"check_finite='yes' must be true or false"),
    ("act_while_training=sometimes", r"act_while_training='sometimes' must be true or false"),
    ("seed=abc", r"seed='abc' must be an int"),
    ("precision=fp16", r"precision='fp16' is not valid"),
    ("threads=-1", r"threads=-1 must be an int >= 1 or null"),
    ("model.deter=0", r"model\.deter=0 must be an int >= 1"),
    ("model.blocks=3", r"model\.blocks=3 must divide model\.deter=32"),
    ("model.cell=lstm", r"model\.cell='lstm' is not valid"),
    ("model.norm=batch", r"model\.norm='batch' is not valid"),
    ("model.unimix=1.5", r"model\.unimix=1\.5"),
    ("replay.memory_gb=1e-8", r"replay\.memory_gb=1e-08 holds fewer than seq_len=8 steps"),
    ("replay.capacity=5", r"replay\.capacity=5 must be >= seq_len=8"),
    ("algo.gamma=1.5", r"algo\.gamma=1\.5 must be a number in \(0, 1\]"),
    ("algo.lam=-0.1", r"algo\.lam=-0\.1"),
    ("algo.optim.model_lr=0", r"algo\.optim\.model_lr=0"),
    ("seq_len=200", r"seq_len=200 is longer than any episode \(pendulum episodes last at most 200 frames"),
    ("env.time_limit=5", r"seq_len=8 is longer than any episode \(env\.time_limit=5"),
    ("train_ratio=nan", r"train_ratio=nan"),
]
"""Bad values, each refused by `validate` naming the field before any env, model or file exists."""


@pytest.mark.parametrize("override, field", BAD_INPUTS)
def test_bad_config_fails_before_building_anything(tmp_path, override, field):
    with pytest.raises(ConfigError, match=field):
        Trainer(run_config(tmp_path, override))
    assert not (tmp_path / "run").exists()


def test_tensorboard_logger_without_the_package_says_how_to_install_it(tmp_path, monkeypatch):
    import importlib.util
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else find_spec(name, *a))
    message = r"logger\.kind='tensorboard' needs the tensorboard package.*worldmodels\[tensorboard\]"
    with pytest.raises(ConfigError, match=message):
        Trainer(run_config(tmp_path, "logger=tensorboard"))
    assert not (tmp_path / "run").exists()


def test_deprecated_backend_cuda_means_device_cuda_and_warns_once(monkeypatch):
    from omegaconf import OmegaConf

    from worldmodels.train import config
    monkeypatch.setattr(config, "_warned", set())
    cfg = OmegaConf.create({"backend": "cuda"})
    with pytest.warns(FutureWarning, match="backend=cuda is deprecated.*device=cuda"):
        config.upgrade(cfg)
    assert (cfg.device, cfg.backend) == ("cuda", "auto")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config.upgrade(OmegaConf.create({"backend": "cuda"}))  # once per process
    stored = OmegaConf.create({"backend": {"name": "loop", "device": "cpu"}})  # a config saved before the split
    assert (config.upgrade(stored, warn=False).backend, stored.device) == ("loop", "cpu")


def test_script_reports_a_bad_field_and_exits_nonzero(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), *TINY,
                             f"run_dir={tmp_path / 'run'}", "steps=-1"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0
    assert "steps=-1" in result.stderr


def test_unknown_env_group_option_is_rejected_by_hydra(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "env=mars_lander",
                             f"run_dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "mars_lander" in result.stderr


LEARN = ["model=small", "steps=5000", "prefill=1000", "batch_size=16", "seq_len=16", "train_ratio=64",
         "algo.gamma=0.99", "algo.optim.model_lr=6e-4", "algo.optim.actor_lr=2e-4", "algo.optim.critic_lr=2e-4",
         "eval_episodes=8", "eval_every=100000", "threads=1"]


@pytest.mark.long
def test_dreamer_v3_learns_pendulum(tmp_path):
    """Trains 1k updates (a few minutes on 2 free CPU cores), then compares 8 greedy eval
    episodes with 8 episodes of uniform random actions on the same eval seeds."""
    cfg = run_config(tmp_path, *LEARN)
    env = make_env(cfg.env, seed=cfg.seed + 10_000, num_envs=cfg.eval_episodes)
    torch.manual_seed(1)
    random_returns = evaluate(env, "observation",
                              lambda obs, is_first, carry: (torch.rand(obs.shape[0], 1) * 2 - 1, None))
    result = Trainer(cfg).train()
    random_mean = float(np.mean(random_returns))
    # a learner that never improves stays within noise of random (std of the mean of 8 episodes ~ 100)
    assert result["eval_return"] > random_mean + 300, (result["eval_return"], random_mean)


@pytest.mark.parametrize("enabled", [True, False])
def test_the_envs_are_stepped_by_a_copy_one_update_behind(tmp_path, enabled):
    """`act_while_training`: the collector's agent is a copy refreshed before each update, so after
    training it holds the weights from before the last one (its update counter one behind)."""
    trainer = Trainer(run_config(tmp_path, "steps=80", f"act_while_training={str(enabled).lower()}"))
    trainer.train()
    learner, acting = trainer.agent, trainer.acting.agent
    assert trainer.counters["updates"] > 1
    assert (acting is not learner) == enabled
    assert int(acting.updates) == int(learner.updates) - (1 if enabled else 0)
    if enabled:
        assert not all(torch.equal(a, b) for a, b in zip(acting.parameters(), learner.parameters()))
