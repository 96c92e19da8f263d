"""`Ranks`: data-parallel training under torchrun (`torchrun --nproc-per-node N scripts/train.py ...`).

Launched by torchrun (its variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR / MASTER_PORT; on
several machines the same command with `--nnodes` and `--rdzv-endpoint`, c10d rendezvous), every
rank runs the whole trainer on its own envs and its own replay shard; nothing else is shared
but gradients and a few control values:

- The global batch is `batch_size` sequences: each rank samples `batch_size / N` from its shard.
  `env.num_envs` is the total over ranks (each steps `num_envs / N`), `replay.capacity` and
  `replay.memory_gb` too (each shard holds 1 / N). Env steps (frames), `steps`, `prefill`,
  `eval_every`, ... count frames over all ranks, and `train_ratio` replayed steps (global batch x
  seq_len per update) per agent step over all ranks: so the updates owed at a frame are the
  same number as in one process, each on a batch of the same size, and N GPUs learn what one GPU
  learns, with 1 / N of the env stepping and of each update's compute on each.
- Gradients: each optimiser's gradients are averaged over ranks before clipping and the step
  (`Optimizer.reduce`, set to `average_`): one flat all-reduce per optimiser and dtype, inside the
  update, so on NCCL the CUDA graph of the update (graphed_update.py) holds it. Agent parameters
  are broadcast from rank 0 once at the start, so they stay equal.
- Seeds: rank r seeds torch, numpy and random with `seed + r` after the agent is built (rank 0:
  exactly the one-process run's) and its envs with `seed + r * num_envs / N` (every env of the run
  has its own seed, the ones a one-process run with all the envs would give them).
- Statistics of the whole batch (DreamerV3's 5th and 95th return percentiles) are taken over every
  rank's values, gathered inside the update (`Ranks.gather`, the agent's `all_ranks` hook): the
  return scale is the one-process run's, equal on every rank.
- Rank 0 checks and holds the run directory, logs (metrics averaged over ranks at each progress
  line; episode lines of its own envs), evaluates and writes checkpoints. A checkpoint holds
  rank 0's state and shard as a one-process checkpoint does (`state.pt`, `replay/`), with the
  world size, and each other rank's own state (collector, RNG, last return) and shard in
  `rank-<r>/` (`state.pt`, `replay/`): every rank resumes its own shard. A resume on another
  world size is refused before anything is built, naming both sizes (the shards are per rank).
  Several machines need `run_dir` on a filesystem they share.
- Stop signals (torchrun forwards Ctrl-C / SIGTERM to every rank) are held and agreed on once per
  loop iteration: all ranks save together and stop. A rank that dies (killed) stops the others
  (torchrun ends them); the run resumes from its newest checkpoint when started again.
- Collectives are on the device's backend (NCCL on CUDA, gloo on CPU); barriers and host values
  on a gloo group.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Ranks:
    """This process's place in a torchrun launch (world size 1: one process, nothing shared).

    Args:
        rank: this process's rank, 0 .. world_size - 1.
        world_size: processes in the run (torchrun's WORLD_SIZE).
        local_rank: its rank on this machine (the GPU it takes: cuda:local_rank).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    def __post_init__(self):
        self.control = None  # the gloo group of barriers and host values (None: the default group)

    @classmethod
    def from_env(cls) -> Ranks:
        """torchrun's RANK, WORLD_SIZE, LOCAL_RANK (absent: one process)."""
        def read(name: str, default: int) -> int:
            value = os.environ.get(name)
            try:
                return default if value is None else int(value)
            except ValueError:
                raise ValueError(f"the environment variable {name}={value!r} (torchrun's) must be an int") from None

        world = read("WORLD_SIZE", 1)
        return cls(read("RANK", 0), world, read("LOCAL_RANK", 0))

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        """Rank 0: logs, evaluates, writes checkpoints."""
        return self.rank == 0

    def start(self, device: str) -> None:
        """Join the process group (NCCL for CUDA devices, else gloo); on CUDA take cuda:local_rank
        first, so `device=cuda` means this rank's GPU. Does nothing for one process."""
        if not self.active or dist.is_initialized():
            if self.active:
                self._control_group()
            return
        cuda = torch.device(device).type == "cuda"
        if cuda:
            torch.cuda.set_device(self.local_rank)
        dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=30),
                                **({"device_id": torch.device("cuda", self.local_rank)} if cuda else {}))
        self._control_group()

    def _control_group(self) -> None:
        self.control = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None

    def close(self) -> None:
        if self.active and dist.is_initialized():
            dist.destroy_process_group()

    # ---------------------------------------------------------------- collectives
    def average_(self, grads: list[torch.Tensor]) -> None:
        """Average `grads` over ranks in place: one flat all-reduce per dtype (every rank passes
        its gradients in the same order). Capturable in a CUDA graph on NCCL."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for grad in grads:
            by_dtype.setdefault(grad.dtype, []).append(grad)
        for group in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in group])
            flat.mul_(1.0 / self.world_size)
            dist.all_reduce(flat)
            torch._foreach_copy_(group, [f.view_as(g) for f, g in zip(flat.split([g.numel() for g in group]), group)])

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's `tensor` [n] (the same n on each), concatenated in rank order: [N * n].
        Capturable in a CUDA graph on NCCL."""
        out = tensor.new_empty(self.world_size * tensor.numel())
        dist.all_gather_into_tensor(out, tensor.contiguous())
        return out

    def mean_metrics(self, metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The 0-d metrics averaged over ranks (every rank calls it at the same point with the
        same keys; one all-reduce). Unchanged for one process."""
        if not self.active or not metrics:
            return metrics
        names = sorted(metrics)
        stacked = torch.stack([metrics[k].detach().float().reshape(()) for k in names])
        dist.all_reduce(stacked)
        return dict(zip(names, (stacked / self.world_size).unbind()))

    def all_true(self, flag: bool) -> bool:
        """Whether `flag` holds on every rank (host value, gloo)."""
        if not self.active:
            return flag
        value = torch.tensor([0 if flag else 1])
        dist.all_reduce(value, group=self.control)
        return int(value) == 0

    def any_signal(self, signum: int | None) -> int | None:
        """A stop signal some rank received (the largest number), or None."""
        if not self.active:
            return signum
        value = torch.tensor([signum or 0])
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.control)
        return int(value) or None

    def barrier(self) -> None:
        if self.active:
            dist.barrier(group=self.control)

    def broadcast_object(self, obj):
        """Rank 0's `obj` on every rank (a picklable host value)."""
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def broadcast_module_(self, module: torch.nn.Module) -> None:
        """Rank 0's parameters and buffers into every rank's `module` (in place)."""
        if not self.active:
            return
        with torch.no_grad():
            for tensor in (*module.parameters(), *module.buffers()):
                dist.broadcast(tensor.data, src=0)


def rank_dir(rank: int) -> str:
    """The directory of rank `rank`'s own state and replay shard in a checkpoint (rank 0: its root)."""
    return f"rank-{rank}"


__all__ = ["Ranks", "rank_dir"]
