"""Data: the sequence replay buffer and the collector that fills it."""

import worldmodels.envs  # noqa: F401  first: its MuJoCo GL check runs before torchrl imports MuJoCo
from worldmodels.data.collector import Collector, evaluate
from worldmodels.data.replay import Replay, ReplayError

__all__ = ["Collector", "Replay", "ReplayError", "evaluate"]
