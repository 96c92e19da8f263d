"""Composes the Hydra run config of scripts/train.py for tests (tiny models, no logger)."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

CONFIGS = str(Path(__file__).resolve().parents[1] / "configs")
TINY = ["model=tiny", "logger=none", "progress=false", "batch_size=2", "seq_len=8", "eval_episodes=1",
        "prefill=40", "collect_steps=4", "train_ratio=8", "eval_every=1000000", "save_every=1000000",
        "log_every=1000000", "threads=1"]


def run_config(tmp_path: Path, *overrides: str):
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        return compose("config", overrides=[*TINY, f"run_dir={tmp_path / 'run'}", *overrides])


def interrupt_collect(monkeypatch, trainer, call: int) -> None:
    """Ctrl-C at the trainer's `call`-th collect (1-based), before it collects: what a user's
    KeyboardInterrupt in the middle of a run does."""
    collect, calls = trainer.collect, []

    def collect_then_interrupt(**kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return collect(**kwargs)

    monkeypatch.setattr(trainer, "collect", collect_then_interrupt)
