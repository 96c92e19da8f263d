"""What the benchmark CLIs share: the `--out` JSON file, the `--device` default, the GPU line at the
top of a kernel benchmark's output, and the train config a `scripts/train.py` command line composes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def train_config(overrides: list[str]):
    """The config `python scripts/train.py OVERRIDES...` runs with, composed by Hydra from `configs/`."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def add_out(parser: argparse.ArgumentParser, default: str | None = None, help: str = "where the JSON goes") -> None:
    """`--out FILE`: the JSON file a run writes (with no default, none unless asked)."""
    parser.add_argument("--out", default=default, metavar="FILE", help=help)


def add_device(parser: argparse.ArgumentParser) -> None:
    """`--device`, CUDA where there is one."""
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")


def write_json(path: str | Path | None, payload) -> None:
    """`payload` as indented JSON at `path`; nothing when `path` is None (no `--out` given)."""
    if path:
        Path(path).write_text(json.dumps(payload, indent=1) + "\n")


def gpu_info() -> dict:
    """The GPU and the versions a kernel benchmark's rows were timed with (printed, and kept in its JSON)."""
    import triton

    props = torch.cuda.get_device_properties(0)
    info = dict(device=props.name, sms=props.multi_processor_count, torch=torch.__version__, triton=triton.__version__)
    print(info, flush=True)
    return info
