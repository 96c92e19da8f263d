"""Train a world-model agent: `python scripts/train.py env=pendulum [algo=...] [model=...] [field=value]`.

Hydra composes configs/ (groups env, algo, model, logger, backend); the run directory
(`run_dir=...`) holds the resolved config, metrics, checkpoints and media. Running again with
the same `run_dir` resumes from its latest checkpoint.
"""

import sys

import hydra
from omegaconf import DictConfig

from worldmodels.train import ConfigError, Trainer


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        trainer = Trainer(cfg)
    except ConfigError as err:
        sys.exit(f"config error: {err}")
    try:
        result = trainer.train()
    except KeyboardInterrupt:
        sys.exit(130)
    print(f"done: {result['env_steps']} env steps, {result['updates']} updates, eval return {result['eval_return']:.1f}, "
          f"run directory {cfg.run_dir}")


if __name__ == "__main__":
    main()
