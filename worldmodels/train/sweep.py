"""Sweeps: many runs of scripts/train.py from one command, on Hydra's multirun (`-m`).

    python scripts/train.py -m env=walker_walk,cheetah_run seed=0,1,2 device=cuda hydra/launcher=gpus

- Every run of a sweep gets its own run directory: `hydra.sweep.dir` (default
  `runs/sweep-<time>`) / `<job number>-<env>-<algo>-seed<seed>` (configs/config.yaml), unless the
  command sets `run_dir=` itself (`sweep_run_dir`). One `metrics.jsonl` per run; `scripts/plot.py
  <sweep dir>` draws each config's mean and band over seeds. Starting the same sweep again with
  `hydra.sweep.dir=<that dir>` resumes each run from its own checkpoints.
- On one machine (`hydra/launcher=gpus`: Hydra's joblib launcher, `pip install
  'worldmodels[sweeps]'`), `runs_per_gpu` runs per GPU at a time (`wm_gpu_count`: GPUs x
  runs_per_gpu; default 1), the others queued; each run process with `device=cuda` takes a slot
  of a GPU no other holds (`claim_gpu`: an exclusive lock file per slot, held until the process
  ends, GPUs filled round-robin, and CUDA_VISIBLE_DEVICES set to it before CUDA starts), so a run
  always sees its GPU as cuda:0. Runs sharing a GPU only gain together under NVIDIA MPS (README:
  several runs on one GPU); without it the GPU time-slices between them.
- On a SLURM cluster (`hydra/launcher=slurm`: Hydra's submitit launcher), each run is a job of one
  GPU; SLURM gives it the GPU.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from worldmodels.train.distributed import Ranks

_claimed: tuple[str, int] | None = None  # (the GPU this process holds, its lock's file descriptor)


def runs_per_gpu(value) -> int:
    """`runs_per_gpu` checked: a positive integer, else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"runs_per_gpu must be a positive integer (runs sharing each GPU), got {value!r}")
    return value


def gpu_count(per_gpu: int = 1) -> int:
    """The GPUs this process can see, counted without starting CUDA (NVML), times `per_gpu` runs
    each; 1 x per_gpu without GPUs, so a launcher with this many jobs runs one at a time per slot."""
    import torch

    return max(1, torch.cuda.device_count()) * runs_per_gpu(per_gpu)


def _visible_gpus() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [v.strip() for v in visible.split(",") if v.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def claim_gpu(lock_dir: Path | None = None, poll_s: float = 5.0, per_gpu: int = 1) -> str | None:
    """Take one of the `per_gpu` slots of a visible GPU that no other process of this user on this
    machine holds, for the rest of this process (waiting while all are taken), and make that GPU
    the only one CUDA will see. Slots fill round-robin (every GPU's first, then every GPU's second),
    so runs spread over the GPUs before they share one. Returns the GPU's id (as
    CUDA_VISIBLE_DEVICES named it), or None when at most one GPU is visible (nothing to choose).
    Call it before anything starts CUDA: CUDA reads CUDA_VISIBLE_DEVICES once."""
    global _claimed
    if _claimed is not None:  # a launcher's worker process running its next job: same GPU
        return _claimed[0]
    gpus = _visible_gpus()
    if len(gpus) <= 1:
        return None
    lock_dir = Path(lock_dir or Path(tempfile.gettempdir()) / f"worldmodels-gpus-{os.getuid()}")
    lock_dir.mkdir(parents=True, exist_ok=True)
    slots = [(gpu, f"gpu-{gpu}.lock" if slot == 0 else f"gpu-{gpu}-{slot}.lock")
             for slot in range(runs_per_gpu(per_gpu)) for gpu in gpus]
    while True:
        for gpu, name in slots:
            fd = os.open(lock_dir / name, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            _claimed = (gpu, fd)
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu
            return gpu
        time.sleep(poll_s)


def sweep_run_dir(cfg: DictConfig, output_dir: str, overrides: list[str]) -> None:
    """In a multirun job: the run directory is the job's own Hydra output directory, unless the
    command line sets `run_dir=` (then it is that)."""
    if any(o.split("=", 1)[0].lstrip("+~") == "run_dir" for o in overrides):
        return
    with open_dict(cfg):
        cfg.run_dir = output_dir


def in_multirun() -> tuple[str, list[str]] | None:
    """(this job's output directory, its overrides) inside a Hydra multirun job, else None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hydra = HydraConfig.get()
    if hydra.mode != RunMode.MULTIRUN:
        return None
    return hydra.runtime.output_dir, list(hydra.overrides.task)


def prepare_job(cfg: DictConfig) -> None:
    """What scripts/train.py does first in a multirun job: its own run directory, and with
    `device=cuda` outside torchrun its own GPU (`claim_gpu`)."""
    job = in_multirun()
    if job is None:
        return
    sweep_run_dir(cfg, *job)
    if str(cfg.get("device", "cpu")) == "cuda" and not Ranks.from_env().active:
        claim_gpu(per_gpu=cfg.get("runs_per_gpu", 1))


if not OmegaConf.has_resolver("wm_gpu_count"):
    OmegaConf.register_new_resolver("wm_gpu_count", gpu_count)

__all__ = ["claim_gpu", "gpu_count", "in_multirun", "prepare_job", "sweep_run_dir"]
