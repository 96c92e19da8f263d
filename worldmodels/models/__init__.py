"""Models: drop-in recurrent modules, the RSSM, actor and heads."""

from worldmodels.models.rnn import GRU, LSTM

__all__ = ["GRU", "LSTM"]
