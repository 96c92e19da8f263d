"""configs/env_algo/<env>_<algo>.yaml is picked by itself for that env and algo together (PlaNet's
CPU planner on Pendulum), never for another pair, and command-line fields still win over it."""

from __future__ import annotations

from hydra import compose, initialize_config_dir

from tests._train_config import CONFIGS


def cem(*overrides: str):
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        return compose("config", overrides=list(overrides)).algo.get("cem")


def test_pendulum_planet_gets_the_cpu_planner():
    assert dict(cem("env=pendulum", "algo=planet")) == {"horizon": 12, "candidates": 100, "top": 10, "iterations": 5}


def test_other_pairs_keep_the_paper_planner_or_none():
    assert dict(cem("env=cheetah_run", "algo=planet")) == {"horizon": 12, "candidates": 1000, "top": 100,
                                                            "iterations": 10}
    assert cem("env=pendulum", "algo=dreamer_v3") is None


def test_command_line_fields_win_over_the_preset():
    planner = cem("env=pendulum", "algo=planet", "algo.cem.candidates=1000", "algo.cem.top=100")
    assert (planner.candidates, planner.top, planner.iterations) == (1000, 100, 5)
