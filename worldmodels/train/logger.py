"""Metrics: always appended to `run_dir/metrics.jsonl`; also sent to one backend.

Backends (`logger.kind`): "wandb" (offline unless `logger.mode=online` or WANDB_MODE says
otherwise), "csv" (`metrics.csv`), "tensorboard" (needs the tensorboard package), "none".
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

KINDS = ("wandb", "csv", "tensorboard", "none")


class Logger:
    def __init__(self, cfg, run_dir: Path, config: dict):
        if cfg.kind not in KINDS:
            raise ValueError(f"logger.kind={cfg.kind!r} is not valid; expected one of {list(KINDS)}")
        self.kind, self.run_dir = cfg.kind, Path(run_dir)
        self.jsonl = open(self.run_dir / "metrics.jsonl", "a")
        self.csv_file = self.csv_writer = self.tb = self.wandb = None
        if self.kind == "csv":
            self.csv_file = open(self.run_dir / "metrics.csv", "a", newline="")
            self.csv_writer = csv.writer(self.csv_file)
            if self.csv_file.tell() == 0:
                self.csv_writer.writerow(["step", "key", "value"])
        elif self.kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"))
        elif self.kind == "wandb":
            import wandb

            mode = cfg.mode or os.environ.get("WANDB_MODE") or "offline"
            self.wandb = wandb.init(project=cfg.project, dir=str(self.run_dir), config=config, mode=mode,
                                    id=cfg.run_id or self.run_dir.name.replace("/", "-"), resume="allow")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        self.jsonl.flush()
        if self.csv_writer is not None:
            self.csv_writer.writerows([step, k, v] for k, v in metrics.items())
            self.csv_file.flush()
        if self.tb is not None:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def video(self, step: int, name: str, path: Path) -> None:
        """Log a saved video file (GIF) to the backend."""
        if self.wandb is not None:
            import wandb

            self.wandb.log({name: wandb.Video(str(path), format="gif")}, step=step)

    def close(self) -> None:
        self.jsonl.close()
        if self.csv_file is not None:
            self.csv_file.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
