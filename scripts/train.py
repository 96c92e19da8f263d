"""Train a world-model agent: `python scripts/train.py env=pendulum [algo=...] [model=...] [field=value]`.

Hydra composes configs/ (groups env, algo, model, logger; fields such as device=, backend=); the
run directory (`run_dir=...`) holds the resolved config, metrics, checkpoints and media. Running
again with the same `run_dir` resumes from its newest complete checkpoint; a finished run says so
and exits 0. Exit status: 1 with a message for a refused config or run directory or a non-finite
loss, 128 + signal after SIGINT / SIGTERM (a checkpoint is saved first).

`--help` lists every field with its value and comment for the groups chosen on the same command
line (`python scripts/train.py algo=planet --help`; worldmodels/train/config_help.py); `--hydra-help`
is Hydra's own. A key configs/ does not define is refused before anything is built, with or without
Hydra's `+`, naming the nearest field (config.py: `check_overrides`); keys under `env.kwargs` are free
(`+env.kwargs.NAME=VALUE`: the env factory's keyword arguments). torchrl's INFO lines and gymnasium's
"precision lowered" warnings are silenced (logger.py: `quiet_third_party`). A finished run prints the
eval and plot commands that come next.

Several GPUs for one run: `torchrun --nproc-per-node N scripts/train.py ...` (worldmodels/train/
distributed.py). Many runs: `python scripts/train.py -m env=walker_walk,cheetah_run seed=0,1,2 ...`
(Hydra's multirun; `hydra/launcher=gpus` runs one per GPU, `hydra/launcher=slurm` on a cluster:
worldmodels/train/sweep.py).
"""

import faulthandler
import shlex
import sys
from pathlib import Path

import hydra
from hydra._internal.utils import get_args_parser
from omegaconf import DictConfig

from worldmodels.data import ReplayError
from worldmodels.train import ConfigError, Trainer
from worldmodels.train.checkpoint import CheckpointError
from worldmodels.train.config import ConfigSchema, check_overrides
from worldmodels.train.config_help import help_text
from worldmodels.train.interrupt import Stopped
from worldmodels.train.logger import quiet_third_party
from worldmodels.train.run_dir import RunDirError
from worldmodels.train.sweep import prepare_job
from worldmodels.train.trainer import NonFiniteLossError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
HELP_FLAGS = ("--help", "-h")


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    faulthandler.enable()  # a fatal signal (SIGSEGV, SIGABRT, ...) leaves every thread's traceback on stderr
    quiet_third_party()
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
    print(next_commands(cfg.run_dir))


def next_commands(run_dir: str) -> str:
    """What a finished run is evaluated and plotted with."""
    run = shlex.quote(str(run_dir))
    return (f"next: python scripts/eval.py run_dir={run}   (greedy episodes and a video into {run}/media)\n"
            f"      python scripts/plot.py {run}   (learning curves into {run}/curves.png)")


def before_hydra(argv: list[str]) -> None:
    """What the command line settles before Hydra composes: `--help` / `-h` prints the fields (for the
    groups `argv` picks) and exits 0; a key configs/ does not define exits 1 naming the nearest field."""
    args = [arg for arg in argv if arg not in HELP_FLAGS]
    overrides = get_args_parser().parse_known_args(args)[0].overrides
    try:
        check_overrides(overrides, ConfigSchema.read(CONFIGS))
    except ConfigError as err:
        sys.exit(f"config error: {err}")
    if len(args) < len(argv):
        print(help_text(CONFIGS, overrides))
        sys.exit(0)


if __name__ == "__main__":
    before_hydra(sys.argv[1:])
    main()
