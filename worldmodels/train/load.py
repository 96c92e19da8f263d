"""`load(run_dir)`: the trained agent of a run, ready to observe, imagine and decode."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from worldmodels.envs import env_info, make_env
from worldmodels.train.checkpoint import Checkpoints
from worldmodels.train.trainer import build_agent


def load(run_dir: str | Path, device: str = "cpu"):
    """The agent saved in `run_dir`'s latest checkpoint (eval mode), with `.world_model`
    (`.encoder`, `.rssm`, `.decoder`, `.reward`), `.cfg` (the algo config) and `.run_config`."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise FileNotFoundError(f"run_dir={str(run_dir)!r} has no config.yaml: not a run directory")
    cfg = OmegaConf.load(run_dir / "config.yaml")
    loaded = Checkpoints(run_dir / "checkpoints").load()
    if loaded is None:
        raise FileNotFoundError(f"run_dir={str(run_dir)!r} has no complete checkpoint")
    env = make_env(cfg.env, seed=cfg.seed, num_envs=1)
    info = env_info(env)
    env.close()
    cfg.backend.device = device
    agent = build_agent(cfg, info)
    agent.load_state_dict(loaded[0]["agent"])
    agent.run_config = cfg
    agent.env_info = info
    return agent.eval()
