"""Train a world-model agent: `python scripts/train.py env=pendulum [algo=...] [model=...] [field=value]`.

Hydra composes configs/ (groups env, algo, model, logger; fields such as device=, backend=); the
run directory (`run_dir=...`) holds the resolved config, metrics, checkpoints and media. Running
again with the same `run_dir` resumes from its newest complete checkpoint; a finished run says so
and exits 0. Exit status: 1 with a message for a refused config or run directory or a non-finite
loss, 128 + signal after SIGINT / SIGTERM (a checkpoint is saved first).

Several GPUs for one run: `torchrun --nproc-per-node N scripts/train.py ...` (worldmodels/train/
distributed.py). Many runs: `python scripts/train.py -m env=walker_walk,cheetah_run seed=0,1,2 ...`
(Hydra's multirun; `hydra/launcher=gpus` runs one per GPU, `hydra/launcher=slurm` on a cluster:
worldmodels/train/sweep.py).
"""

import faulthandler
import sys

import hydra
from omegaconf import DictConfig

from worldmodels.data import ReplayError
from worldmodels.train import ConfigError, Trainer
from worldmodels.train.checkpoint import CheckpointError
from worldmodels.train.interrupt import Stopped
from worldmodels.train.run_dir import RunDirError
from worldmodels.train.sweep import prepare_job
from worldmodels.train.trainer import NonFiniteLossError


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    faulthandler.enable()  # a fatal signal (SIGSEGV, SIGABRT, ...) leaves every thread's traceback on stderr
    prepare_job(cfg)  # a multirun job: its own run directory (and GPU)
    try:
        trainer = Trainer(cfg)
    except ConfigError as err:
        sys.exit(f"config error: {err}")
    except (RunDirError, CheckpointError, ReplayError) as err:
        sys.exit(f"run directory error: {err}")
    if trainer.run.finished:
        trainer.train()  # says so and changes nothing
        return
    try:
        result = trainer.train()
    except Stopped as stop:  # SIGTERM / SIGINT: the checkpoint is saved; the usual 128 + signal status
        sys.exit(128 + stop.signum)
    except KeyboardInterrupt:
        sys.exit(130)
    except NonFiniteLossError as err:
        sys.exit(f"stopped: {err}")
    except CheckpointError as err:  # a save that could not be written (a full disk): what was kept
        sys.exit(f"checkpoint error: {err}")
    if not trainer.ranks.main:  # torchrun: rank 0 reports
        return
    print(f"done: {result['env_steps']} env steps, {result['updates']} updates, "
          f"eval return {result['eval_return']:.1f}, "
          f"run directory {cfg.run_dir}")


if __name__ == "__main__":
    main()
