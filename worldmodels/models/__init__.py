"""Models: drop-in recurrent modules, the RSSM, the actor, and their building blocks."""

from worldmodels.models.actor import Actor
from worldmodels.models.rnn import GRU, LSTM
from worldmodels.models.rssm import RSSM

from worldmodels.core import registry

registry.preload("loop", "scan", "cudnn")  # their ops import nothing heavy; Triton's load on first use

__all__ = ["GRU", "LSTM", "RSSM", "Actor"]
