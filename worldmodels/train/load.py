"""`load(run_dir)`: the trained agent of a run, ready to observe, imagine and decode.

Reads the newest complete checkpoint (checkpoint.py: verified by its manifest, `state.pt` loaded
with `weights_only=True`, so a shared run directory cannot run code) and the config it was
trained with (saved in the checkpoint; `config.yaml` for older checkpoints).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from worldmodels.envs import env_info, make_env
from worldmodels.train.checkpoint import Checkpoints
from worldmodels.train.config import upgrade
from worldmodels.train.trainer import build_agent


def load(run_dir: str | Path, device: str = "cpu"):
    """The agent saved in `run_dir`'s newest complete checkpoint (eval mode), with `.world_model`
    (`.encoder`, `.rssm`, `.decoder`, `.reward`), `.cfg` (the algo config) and `.run_config`.
    Raises FileNotFoundError (not a run directory / no complete checkpoint) or
    `UnsafeCheckpointError` (state.pt holds more than tensors and containers)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run_dir={str(run_dir)!r} does not exist")
    loaded = Checkpoints(run_dir / "checkpoints").load()
    if loaded is None:
        raise FileNotFoundError(f"run_dir={str(run_dir)!r} has no complete checkpoint")
    state, _ = loaded
    if state.get("config") is not None:
        cfg = OmegaConf.create(state["config"])
    elif (run_dir / "config.yaml").exists():
        cfg = OmegaConf.load(run_dir / "config.yaml")
    else:
        raise FileNotFoundError(f"run_dir={str(run_dir)!r} has no config.yaml and its checkpoint no config")
    upgrade(cfg, warn=False)
    algo = cfg.get("algo")
    if algo is not None and algo.get("start_state") == "previous_batch":  # not a choice; only updates read it
        algo.start_state = "initial"
    env = make_env(cfg.env, seed=cfg.seed, num_envs=1)
    info = env_info(env)
    env.close()
    cfg.device = device
    agent = build_agent(cfg, info)
    agent.load_state_dict(state["agent"])
    agent.run_config = cfg
    agent.env_info = info
    return agent.eval()
