"""`load(run_dir)`: the trained agent of a run, ready to observe, imagine and decode.

Reads the newest complete checkpoint (checkpoint.py: verified by its manifest, `state.pt` loaded
with `weights_only=True`) and the config it was trained with (saved in the checkpoint;
`config.yaml` for older checkpoints). The agent is built from the env description the checkpoint
holds (`env_info`), so no env is built and nothing the config names is imported; a checkpoint
older than that builds one env, and one whose env names code (a custom `env.entry`) needs
`trust_code=True` (trust.py): a run directory someone shared cannot run code on `load`.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from worldmodels.envs import env_info, make_env
from worldmodels.train.checkpoint import Checkpoints
from worldmodels.train.config import upgrade
from worldmodels.train.trainer import STATE_FIELDS, build_agent
from worldmodels.train.trust import check_trusted


def load(run_dir: str | Path, device: str = "cpu", trust_code: bool = False):
    """The agent saved in `run_dir`'s newest complete checkpoint (eval mode), with `.world_model`
    (`.encoder`, `.rssm`, `.decoder`, `.reward`), `.cfg` (the algo config), `.run_config` and
    `.env_info` (observation key and shape, action size, discrete or not).

    Args:
        run_dir: a run directory of `scripts/train.py`.
        device: where the agent's weights go.
        trust_code: a checkpoint without `env_info` (written by an older version) builds one env of
            its config to learn its shapes; where that config names code (a custom `env.entry`),
            only with `trust_code=True`. Newer checkpoints import nothing either way.

    Raises FileNotFoundError (not a run directory / no complete checkpoint), `UnsafeCheckpointError`
    (state.pt holds more than tensors and containers) or its `UntrustedCodeError`."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run_dir={str(run_dir)!r} does not exist")
    checkpoints = Checkpoints(run_dir / "checkpoints", fields={"agent": STATE_FIELDS["agent"]})
    loaded = checkpoints.load()
    if loaded is None:
        raise FileNotFoundError(f"run_dir={str(run_dir)!r} has no complete checkpoint")
    state, path = loaded
    if state.get("config") is not None:
        cfg, source = OmegaConf.create(state["config"]), path / "state.pt"
    elif (run_dir / "config.yaml").exists():
        cfg, source = OmegaConf.load(run_dir / "config.yaml"), run_dir / "config.yaml"
    else:
        raise FileNotFoundError(f"run_dir={str(run_dir)!r} has no config.yaml and its checkpoint no config")
    upgrade(cfg, warn=False)
    algo = cfg.get("algo")
    if algo is not None and algo.get("start_state") == "previous_batch":  # not a choice; only updates read it
        algo.start_state = "initial"
    info = state.get("env_info")
    if info is None:  # written before checkpoints held it: the env tells
        check_trusted(cfg, trust_code, str(source), "trust_code=True to worldmodels.load")
        env = make_env(cfg.env, seed=cfg.seed, num_envs=1)
        info = env_info(env)
        env.close()
    cfg.device = device
    agent = build_agent(cfg, info)
    agent.load_state_dict(state["agent"])
    agent.run_config = cfg
    agent.env_info = info
    return agent.eval()
