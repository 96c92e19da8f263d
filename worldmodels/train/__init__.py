"""Training: the trainer loop, checkpoints, logging, videos, config checks, loading runs."""

from worldmodels.train.checkpoint import CheckpointError, Checkpoints, UnsafeCheckpointError
from worldmodels.train.config import ConfigError, validate
from worldmodels.train.load import load
from worldmodels.train.run_dir import RunDirError, truncate_metrics
from worldmodels.train.trainer import NonFiniteLossError, Trainer, build_agent

__all__ = ["CheckpointError", "Checkpoints", "ConfigError", "NonFiniteLossError", "RunDirError", "Trainer",
           "UnsafeCheckpointError", "build_agent", "load", "truncate_metrics", "validate"]
