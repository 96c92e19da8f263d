"""worldmodels: model-based RL with learned world models on a fused recurrent core."""

from worldmodels.core import (
    get_recurrent_backend,
    get_recurrent_matmul_precision,
    get_recurrent_mode,
    recurrent_backend,
    recurrent_matmul_precision,
    recurrent_mode,
    set_recurrent_backend,
    set_recurrent_matmul_precision,
    set_recurrent_mode,
)
from worldmodels.models import GRU, LSTM, RSSM, Actor

__version__ = "0.1.0"
__all__ = [
    "GRU", "LSTM", "RSSM", "Actor", "get_recurrent_backend", "get_recurrent_matmul_precision", "get_recurrent_mode",
    "recurrent_backend", "recurrent_matmul_precision", "recurrent_mode", "set_recurrent_backend",
    "set_recurrent_matmul_precision", "set_recurrent_mode",
]


def __getattr__(name: str):
    """`worldmodels.load(run_dir)`, imported on first use (it pulls in the env and training stack)."""
    if name == "load":
        from worldmodels.train.load import load

        return load
    raise AttributeError(f"module 'worldmodels' has no attribute {name!r}")
