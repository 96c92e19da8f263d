"""Data: the sequence replay buffer and the collector that fills it."""

from worldmodels.data.collector import Collector, evaluate
from worldmodels.data.replay import Replay, ReplayError

__all__ = ["Collector", "Replay", "ReplayError", "evaluate"]
