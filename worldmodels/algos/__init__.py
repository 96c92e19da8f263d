"""Algorithms on the RSSM / unroll API: DreamerV3, Dreamer V1, PlaNet."""

from worldmodels.algos.agent import Agent, lambda_returns
from worldmodels.algos.dreamer_v1 import DreamerV1
from worldmodels.algos.dreamer_v3 import DreamerV3
from worldmodels.algos.planet import PlaNet
from worldmodels.algos.world_model import WorldModel

ALGOS = {"dreamer_v3": DreamerV3, "dreamer_v1": DreamerV1, "planet": PlaNet}
"""`algo.name` -> agent class."""

__all__ = ["ALGOS", "Agent", "DreamerV1", "DreamerV3", "PlaNet", "WorldModel", "lambda_returns"]
