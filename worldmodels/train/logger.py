"""`Logger`: a run's metrics and videos, to the run directory and to one torchrl logger.

Contract:
- `log(step, metrics)` appends {"step": step, **metrics} as one line to `run_dir/metrics.jsonl`,
  whatever the backend: that file is the run's record (scripts/plot.py reads it; a resumed run
  cuts it back to the checkpoint's step), written by this class, not by a backend. Each value
  also goes to the backend.
- `video(step, name, frames)` writes uint8 frames [T, C, H, W] to `run_dir/media/<name>-<step>.gif`
  and sends them to the backend's `log_video`.
- Backends (`logger.kind`) are torchrl's loggers, made by `torchrl.record.loggers.get_logger`:
  "wandb" (files in run_dir/wandb; offline unless `logger.mode=online` or WANDB_MODE says
  otherwise), "csv" (run_dir/csv/scalars/<key>.csv, one "step,value" line per value; videos in
  run_dir/csv/videos), "tensorboard" (run_dir/tensorboard; needs the tensorboard package), "none".
- A backend whose video encoder is missing (moviepy for wandb and tensorboard, torchcodec for
  csv's mp4) gets no videos: one warning names the package; the GIFs in media/ are written anyway.
- `quiet_third_party()`, called by scripts/train.py and scripts/eval.py (never on import): torchrl's
  logger shows warnings and errors only (not its coloured "Initialized LazyTensorStorage" INFO line),
  and gymnasium's "Box ... precision lowered by casting to float32" warnings (a float64 bound of a
  space, read as float32 as intended) are ignored. torchrl's own `RL_LOGGING_LEVEL`, where set, is kept.
- `Stopwatch`: the trainer's time split, host seconds per phase of the loop (`PHASES`), logged
  as `time/<phase>_s` once per logging interval; on CUDA also the updates' GPU seconds
  (`time/update_gpu_s`, CUDA events).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
from torchrl.record.loggers import get_logger

from worldmodels.train.video import save_gif

KINDS = ("wandb", "csv", "tensorboard", "none")
VIDEO_FPS = 10
# What each backend's log_video needs to encode frames (torchrl raises without it), and its install.
VIDEO_ENCODERS = {"wandb": ("moviepy", "pip install 'worldmodels[video]' (moviepy 1.x)"),
                  "tensorboard": ("moviepy", "pip install 'worldmodels[video]' (moviepy 1.x)"),
                  "csv": ("torchcodec", "pip install torchcodec (with FFmpeg's libraries)")}


def make_backend(kind: str, run_dir: Path, config: dict, project: str = "worldmodels", mode: str | None = None,
                 run_id: str | None = None):
    """The torchrl logger for `kind` writing under `run_dir` (None for "none").

    Args:
        kind: one of KINDS.
        run_dir: the run directory; the backend's files go in a folder named after it (wandb/, csv/, tensorboard/).
        config: the resolved run config (wandb stores it with the run).
        project: wandb project.
        mode: wandb mode ("online", "offline", "disabled"); None: WANDB_MODE, else "offline".
        run_id: wandb run id; None: the run directory's name (so a resumed run continues the same run).
    """
    if kind not in KINDS:
        raise ValueError(f"logger.kind={kind!r} is not valid; expected one of {list(KINDS)}")
    if kind == "none":
        return None
    if kind == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
        raise ModuleNotFoundError("logger.kind='tensorboard' needs the tensorboard package: pip install tensorboard "
                                  "(or pick logger=csv, wandb or none)")
    if kind == "wandb":
        mode = mode or os.environ.get("WANDB_MODE") or "offline"
        wandb_kwargs = {"project": project, "id": run_id or run_dir.name, "mode": mode, "config": config,
                        "video_fps": VIDEO_FPS, "log_env_packages": False}
        return get_logger("wandb", str(run_dir), run_dir.name, wandb_kwargs=wandb_kwargs)
    return get_logger(kind, str(run_dir), kind)  # files in run_dir/<kind>/


def quiet_third_party() -> None:
    """Silence the third-party messages a run need not show (see the module docstring)."""
    if "RL_LOGGING_LEVEL" not in os.environ:
        logging.getLogger("torchrl").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*precision lowered by casting to float32", category=UserWarning,
                            module=r"gymnasium\.spaces")


PHASES = ("update", "act", "env", "replay_sample", "replay_add", "eval", "log", "checkpoint")
"""The training loop's phases: the update call, the policy (until its action is on the host), the env
step, replay sampling (with the batch's copy to the device), replay writes, eval, logging, checkpoints."""


class Stopwatch:
    """Host seconds per phase (`PHASES`), summed until `lap`. Only the host clock is read, so timing
    adds no device sync. On CUDA an update is queued and returns; its GPU time shows up in
    whichever phase next waits for the GPU (the policy's action, a batch copy, the metrics read at
    log time), and GPU work that overlaps the env step costs nothing here. So the updates' own GPU
    time is timed apart, with CUDA events (`device_time`), and read at `lap`.

    Args:
        device: the run's device; on CUDA `device_time` records events, elsewhere it does nothing.
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.cuda = torch.device(device).type == "cuda"
        self.events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    @contextmanager
    def device_time(self, phase: str):
        """Time the GPU work queued inside on the current stream (logged as `time/<phase>_gpu_s`)."""
        if not self.cuda:
            yield
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        try:
            yield
        finally:
            end.record()
            self.events.append((phase, start, end))

    def add(self, seconds: dict[str, float]) -> None:
        """Add seconds measured elsewhere (the collector's) and zero them there."""
        for phase in seconds:
            self.seconds[phase] += seconds[phase]
            seconds[phase] = 0.0

    def lap(self) -> dict[str, float]:
        """{"time/<phase>_s": seconds} since the last lap, every phase, and on CUDA
        {"time/<phase>_gpu_s": seconds} of the phases timed on the device (waits for the last event:
        call it where the loop syncs anyway); starts the next lap."""
        out = {f"time/{phase}_s": s for phase, s in self.seconds.items()}
        if self.cuda:
            gpu = {"update": 0.0}
            for phase, start, end in self.events:
                end.synchronize()
                gpu[phase] = gpu.get(phase, 0.0) + start.elapsed_time(end) / 1e3
            out.update({f"time/{phase}_gpu_s": s for phase, s in gpu.items()})
        self.seconds, self.events = dict.fromkeys(PHASES, 0.0), []
        return out


class Logger:
    """Writes `metrics.jsonl` and media/ GIFs, and forwards both to a torchrl logger.

    Args:
        cfg: the `logger` config group: `kind` (one of KINDS), `project`, `mode` and `run_id` (wandb).
        run_dir: the run directory (must exist).
        config: the resolved run config, as a plain dict (wandb stores it with the run).
    """

    def __init__(self, cfg, run_dir: Path, config: dict):
        self.run_dir = Path(run_dir)
        self.kind = cfg.kind
        self.backend = make_backend(cfg.kind, self.run_dir, config, project=cfg.project, mode=cfg.mode,
                                    run_id=cfg.run_id)
        self.jsonl = open(self.run_dir / "metrics.jsonl", "a")
        self._video_warned = False

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        self.jsonl.flush()
        if self.backend is not None:
            self.backend.log_metrics(metrics, step=step)

    def video(self, step: int, name: str, frames: torch.Tensor) -> Path:
        """uint8 frames [T, C, H, W] -> `media/<name>-<step>.gif` and the backend; returns the GIF's path."""
        if frames.dtype != torch.uint8 or frames.dim() != 4 or frames.shape[1] not in (1, 3):
            raise ValueError(f"frames must be uint8 [T, C, H, W] with C in (1, 3); got {frames.dtype} "
                             f"{list(frames.shape)}")
        path = save_gif(frames, self.run_dir / "media" / f"{name}-{step:010d}.gif", fps=VIDEO_FPS)
        if self.backend is not None:
            self._backend_video(step, name, frames.cpu()[None])  # [1, T, C, H, W]
        return path

    def _backend_video(self, step: int, name: str, video: torch.Tensor) -> None:
        try:
            if self.kind == "wandb":  # wandb.Video encodes numpy arrays
                self.backend.log_video(name, video.numpy(), step=step, format="gif")
            else:
                self.backend.log_video(name, video, step=step, fps=VIDEO_FPS)
        # the encoder is missing: torchrl raises ImportError, or a bare Exception naming moviepy (tensorboard)
        except Exception as err:
            if not (isinstance(err, ImportError) or "moviepy" in str(err)):
                raise
            if not self._video_warned:
                self._video_warned = True
                package, install = VIDEO_ENCODERS[self.kind]
                warnings.warn(f"logger.kind={self.kind!r} logs no videos without {package}: {install}; "
                              f"the GIFs are in {self.run_dir / 'media'} ({err})", RuntimeWarning, stacklevel=3)

    def close(self) -> None:
        self.jsonl.close()
        if self.backend is not None:
            self.backend.close()  # wandb: finish the run; tensorboard: close the writer
