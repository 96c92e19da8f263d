"""Data-parallel training under torchrun (train/distributed.py), on CPU with the gloo backend:

- two ranks, each updating on its half of a global batch, end with the weights (and mean losses)
  of one process updating on the whole batch (the updates' noise fixed per sample, so both draw
  the same numbers);
- a two-rank torchrun run whose rank 1 is killed resumes from its checkpoint (each rank its own
  replay shard), and a one-process start on it is refused naming both world sizes;
- sizes the ranks split must divide by the world size (config errors naming the field).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from tensordict import TensorDict

from tests._train_config import TINY, run_config
from worldmodels.models.actor import Actor
from worldmodels.models.rssm import RSSM
from worldmodels.ops.sampling import gumbel_noise
from worldmodels.train import Checkpoints, ConfigError, RunDirError, Trainer, validate

ROOT = Path(__file__).resolve().parents[2]
GLOBAL_BATCH, SEQ_LEN, UPDATES = 4, 8, 2
OVERRIDES = [f"batch_size={GLOBAL_BATCH}", f"seq_len={SEQ_LEN}", "env.num_envs=2", "cuda_graphs=false"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fixed(shape: torch.Size, lead: int, draw) -> torch.Tensor:
    """Noise equal for every element of the leading batch dims (`lead` of them): drawn from a fixed
    generator for the rest of the shape, so a sample's noise does not depend on which rank holds it."""
    gen = torch.Generator().manual_seed(7)
    tail = shape[lead:]
    return draw((*([1] * lead), *tail), gen).expand(shape).contiguous()


def _rssm_noise(self, batch_shape, *, generator=None):
    batch_shape = torch.Size(batch_shape)
    sample = (self.stoch, self.classes) if self.classes else (self.stoch,)
    f = self._factory()

    def draw(shape, gen):
        return gumbel_noise(shape, generator=gen, **f) if self.classes else torch.randn(shape, generator=gen, **f)

    noise = _fixed(torch.Size((*batch_shape, *sample)), 1, draw)
    return TensorDict({"prior": noise, "posterior": noise.flip(-1).contiguous()}, batch_size=batch_shape)


def _actor_noise(self, batch_shape, *, generator=None):
    p = next(self.parameters())
    shape = torch.Size((*batch_shape, self.action_dim))

    def draw(shape, gen):
        if self.dist_type == "onehot":
            return gumbel_noise(shape, dtype=p.dtype, device=p.device, generator=gen)
        return torch.randn(shape, dtype=p.dtype, device=p.device, generator=gen)

    return _fixed(shape, 1, draw)


def _fix_noise() -> None:
    RSSM.noise = _rssm_noise
    Actor.noise = _actor_noise


def _global_batch(obs_dim: int, action_dim: int) -> TensorDict:
    gen = torch.Generator().manual_seed(0)
    B, T = GLOBAL_BATCH, SEQ_LEN
    is_first = torch.zeros(B, T, dtype=torch.bool)
    is_first[:, 0] = True
    return TensorDict({
        "obs": torch.randn(B, T, obs_dim, generator=gen), "action": torch.rand(B, T, action_dim, generator=gen) * 2 - 1,
        "reward": torch.randn(B, T, generator=gen), "is_first": is_first,
        "is_terminal": torch.zeros(B, T, dtype=torch.bool)}, batch_size=[B, T])


def _updates(trainer: Trainer, batch: TensorDict) -> tuple[dict, list[dict]]:
    losses = []
    for _ in range(UPDATES):
        metrics = trainer.update_on(batch)
        losses.append({k: float(v) for k, v in trainer.ranks.mean_metrics(metrics).items() if "loss" in k})
    weights = {k: v.detach().clone() for k, v in trainer.agent.state_dict().items()}
    return weights, losses


def _rank(rank: int, world: int, port: int, tmp: str, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    _fix_noise()
    torch.set_num_threads(1)
    trainer = Trainer(run_config(Path(tmp), *OVERRIDES))
    assert trainer.replay.batch_size == GLOBAL_BATCH // world
    batch = _global_batch(trainer.info["obs_shape"][0], trainer.info["action_dim"])
    share = GLOBAL_BATCH // world
    weights, losses = _updates(trainer, batch[rank * share:(rank + 1) * share])
    torch.save({"weights": weights, "losses": losses}, Path(out) / f"rank{rank}.pt")
    trainer.run.release()
    trainer.ranks.close()


def test_two_ranks_on_halves_equal_one_process_on_the_global_batch(tmp_path, monkeypatch):
    """gloo, two ranks: the gradients are averaged inside each optimiser step and the return percentiles
    taken over both ranks' returns, so after two updates both ranks hold the one-process weights and
    return scale, and the mean of their losses is its loss."""
    port = _free_port()
    mp.start_processes(_rank, args=(2, port, str(tmp_path / "ddp"), str(tmp_path)), nprocs=2, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]

    monkeypatch.setattr(RSSM, "noise", _rssm_noise)
    monkeypatch.setattr(Actor, "noise", _actor_noise)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    trainer = Trainer(run_config(tmp_path / "one", *OVERRIDES))
    batch = _global_batch(trainer.info["obs_shape"][0], trainer.info["action_dim"])
    weights, losses = _updates(trainer, batch)
    trainer.run.release()

    for name, value in weights.items():  # the return scale too: its percentiles are of every rank's returns
        torch.testing.assert_close(ranks[1]["weights"][name], ranks[0]["weights"][name], rtol=0, atol=0,
                                   msg=lambda m: f"ranks differ in {name}: {m}")
        torch.testing.assert_close(ranks[0]["weights"][name], value, rtol=1e-4, atol=2e-5,
                                   msg=lambda m: f"{name}: {m}")
    for one, *per_rank in zip(losses, ranks[0]["losses"], ranks[1]["losses"]):
        assert per_rank[0] == per_rank[1]  # both ranks log the mean over ranks
        for key, value in one.items():
            assert per_rank[0][key] == pytest.approx(value, rel=1e-4, abs=1e-5), key


# ---------------------------------------------------------------------------- torchrun: kill, resume

def _torchrun(run_dir: Path, *overrides: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "scripts" / "train.py"), *TINY, *OVERRIDES, f"run_dir={run_dir}", *overrides]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**env, "OMP_NUM_THREADS": "1"})


def _worker(parent: int, rank: int) -> int | None:
    """The pid of torchrun's worker of `rank` (a child of the agent process `parent`)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (proc / "environ").read_bytes().split(b"\0") if ppid == parent else []
        except (OSError, IndexError, ValueError):
            continue
        if f"RANK={rank}".encode() in environ:
            return int(proc.name)
    return None


@pytest.mark.long
def test_torchrun_run_killed_resumes_and_other_world_size_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    first = _torchrun(run_dir, "steps=100000", "save_every=64")
    checkpoints = Checkpoints(run_dir / "checkpoints")
    deadline = time.time() + 240
    while not checkpoints.complete(warn=False):
        assert first.poll() is None, first.communicate()[0]
        assert time.time() < deadline, "no checkpoint within 240 s"
        time.sleep(0.2)
    saved = checkpoints.latest()
    assert (saved / "rank-1" / "state.pt").is_file() and (saved / "rank-1" / "replay").is_dir()
    worker = _worker(first.pid, 1)
    assert worker is not None
    os.kill(worker, signal.SIGKILL)
    output = first.communicate(timeout=120)[0]
    assert first.returncode != 0, output

    step = int(checkpoints.latest().name.split("-")[1])
    second = _torchrun(run_dir, f"steps={step + 64}", "save_every=64")
    output = second.communicate(timeout=240)[0]
    assert second.returncode == 0, output
    assert f"done: {step + 64} env steps" in output
    state, path = checkpoints.load()
    assert state["world_size"] == 2 and state["counters"]["resumes"] == 1
    assert state["counters"]["env_steps"] == step + 64

    one = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), *TINY, *OVERRIDES,
                          f"run_dir={run_dir}", f"steps={step + 128}"], cwd=ROOT, capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")})
    assert one.returncode == 1
    assert "world size 2" in one.stderr and "world size 1" in one.stderr, one.stderr
    assert "torchrun --nproc-per-node 2" in one.stderr


# ---------------------------------------------------------------------------- checks before anything is built

def test_resume_on_another_world_size_names_both(tmp_path):
    cfg = run_config(tmp_path)
    Checkpoints(Path(cfg.run_dir) / "checkpoints").save("step-0000000064", {
        "counters": {"env_steps": 64, "updates": 0, "episodes": 0, "resumes": 0}, "world_size": 4,
        "config": None, "agent": {}, "optimizers": {}, "collector": {}, "rng": {}, "replay_size": 0})
    with pytest.raises(RunDirError, match=r"world size 4 \(4 torchrun ranks\), this run has world size 1"):
        Trainer(cfg)


@pytest.mark.parametrize("override, field", [("batch_size=3", "batch_size"), ("env.num_envs=3", "env.num_envs"),
                                             ("replay.capacity=10", "replay.capacity")])
def test_sizes_split_over_ranks_must_divide(tmp_path, override, field):
    cfg = run_config(tmp_path, "env.num_envs=2", override)
    with pytest.raises(ConfigError, match=rf"^{field}=.*WORLD_SIZE=2"):
        validate(cfg, world_size=2)
    validate(run_config(tmp_path, "env.num_envs=2"), world_size=2)
