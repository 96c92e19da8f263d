"""`Trainer`: the training loop of every algorithm, with its run directory.

One iteration: collect `collect_steps` steps in each env (random actions during `prefill`),
then as many updates as keep (updates * B * T) / (env steps past prefill) at `train_ratio`.
Env steps count frames: agent steps x action repeat x envs.

Run directory: `config.yaml` (resolved), `metrics.jsonl` (+ the logger backend's files),
`checkpoints/` (see checkpoint.py), `media/` (open-loop prediction GIFs for pixel envs).
Starting again on a run directory that has a checkpoint resumes it (`resume=true`); Ctrl-C
saves a checkpoint before exiting.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from worldmodels.algos import ALGOS, Agent
from worldmodels.core import recurrent_backend
from worldmodels.data import Collector, Replay, evaluate
from worldmodels.envs import env_info, make_env
from worldmodels.train.checkpoint import Checkpoints
from worldmodels.train.config import validate
from worldmodels.train.logger import Logger
from worldmodels.train.video import openloop_frames, save_gif


def build_agent(cfg, info: dict) -> Agent:
    """The algorithm's agent for an env described by `env_info`, on `backend.device`."""
    agent = ALGOS[cfg.algo.name](info["obs_shape"], info["action_dim"], info["discrete"], cfg.model, cfg.algo,
                                 backend=cfg.backend.name)
    return agent.to(cfg.backend.device)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_initialized():  # CUDA generators draw the GPU-side noise (sampling, dropout)
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        states = state["cuda"][: torch.cuda.device_count()]  # resumed on fewer GPUs: the first ones
        torch.cuda.set_rng_state_all(states)
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


class Trainer:
    def __init__(self, cfg):
        validate(cfg)
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, self.run_dir / "config.yaml", resolve=True)
        self.checkpoints = Checkpoints(self.run_dir / "checkpoints")
        resuming = cfg.resume and self.checkpoints.latest() is not None
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        random.seed(cfg.seed)
        self.device = torch.device(cfg.backend.device)

        self.counters = {"env_steps": 0, "updates": 0, "episodes": 0, "resumes": 0}
        self.last_return: float | None = None
        self.last_eval: tuple[int | None, float | None] = (None, None)  # (env step, mean return)
        self.env = make_env(cfg.env, seed=cfg.seed)
        self.eval_env = make_env(cfg.env, seed=cfg.seed + 10_000, num_envs=cfg.eval_episodes)
        self.info = env_info(self.env)
        self.agent = build_agent(cfg, self.info)
        memmap = self.run_dir / "replay_memmap" if cfg.replay.memmap else None
        self.replay = Replay(capacity=cfg.replay.capacity, batch_size=cfg.batch_size, seq_len=cfg.seq_len,
                             memory_gb=cfg.replay.memory_gb, memmap_dir=memmap)
        self.collector = Collector(self.env, self.info["obs_key"], self.info["action_dim"], self.replay.add)
        self.steps_per_collect = cfg.collect_steps * self.env.batch_size[0] * cfg.env.action_repeat
        if resuming:
            self.resume()
        self.logger = Logger(cfg.logger, self.run_dir, OmegaConf.to_container(cfg, resolve=True))

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {
            "agent": self.agent.state_dict(),
            "optimizers": {k: opt.state_dict() for k, opt in self.agent.optimizers().items()},
            "counters": dict(self.counters),
            "collector": self.collector.state_dict(),
            "rng": rng_state(),
            "last_return": self.last_return,
            "replay_size": len(self.replay),
        }

    def save(self) -> Path:
        name = f"step-{self.counters['env_steps']:010d}"
        return self.checkpoints.save(name, self.state_dict(), lambda d: self.replay.save(d / "replay"))

    def resume(self) -> None:
        state, path = self.checkpoints.load()
        self.agent.load_state_dict(state["agent"])
        for name, opt in self.agent.optimizers().items():
            opt.load_state_dict(state["optimizers"][name])
        self.counters.update(state["counters"])
        self.counters["resumes"] += 1
        self.collector.load_state_dict(state["collector"])
        self.last_return = state["last_return"]
        set_rng_state(state["rng"])
        self.replay.load(path / "replay", example=self._example_step())
        # fresh env episodes after a restart: reseed so they differ from the first run's
        self.env.set_seed(self.cfg.seed + 1000 * self.counters["resumes"])

    def _example_step(self):
        """One step as the collector stores it (sets up an empty replay's layout on resume)."""
        steps = []
        self.collector.add = steps.append
        self.collector.reset()
        self.collector.add = self.replay.add
        self.collector.root = None
        self.collector.next_episode -= self.env.batch_size[0]
        return steps[0][:1]

    # ------------------------------------------------------------------ loop
    def train(self) -> dict:
        """Train until `steps` env steps; returns the final counters and eval return."""
        cfg, c = self.cfg, self.counters
        bar = tqdm(total=cfg.steps, initial=min(c["env_steps"], cfg.steps), unit="step", dynamic_ncols=True,
                   disable=not cfg.progress)
        next_eval = (c["env_steps"] // cfg.eval_every + 1) * cfg.eval_every
        next_save = (c["env_steps"] // cfg.save_every + 1) * cfg.save_every
        next_log = (c["env_steps"] // cfg.log_every + 1) * cfg.log_every
        window = {"time": time.perf_counter(), "env_steps": c["env_steps"], "updates": c["updates"]}
        train_metrics: dict[str, torch.Tensor] = {}
        try:
            with recurrent_backend(cfg.backend.name):
                while c["env_steps"] < cfg.steps:
                    self.collect()
                    bar.update(self.steps_per_collect)
                    train_metrics = self.train_owed() or train_metrics
                    if c["env_steps"] >= next_log:
                        next_log += cfg.log_every
                        self.log_progress(window, train_metrics, bar)
                    if c["env_steps"] >= next_eval:
                        next_eval += cfg.eval_every
                        self.eval_and_log()
                    if c["env_steps"] >= next_save:
                        next_save += cfg.save_every
                        self.save()
                # the final eval, unless the periodic one just ran at this very step
                result = self.last_eval[1] if self.last_eval[0] == c["env_steps"] else self.eval_and_log()
                self.save()
        except KeyboardInterrupt:
            bar.write(f"interrupted at {c['env_steps']} env steps: saving a checkpoint to {self.run_dir}")
            self.save()
            raise
        finally:
            bar.close()
            self.logger.close()
        return {**c, "eval_return": result}

    def collect(self) -> None:
        c = self.counters
        mode = "random" if c["env_steps"] < self.cfg.prefill else "explore"
        self.agent.eval()
        returns = self.collector.collect(self.agent.policy(mode), self.cfg.collect_steps)
        self.agent.train()
        c["env_steps"] += self.steps_per_collect
        if returns:
            c["episodes"] += len(returns)
            self.last_return = float(np.mean(returns))
            self.logger.log(c["env_steps"], {"train/return": self.last_return, "train/episodes": c["episodes"]})

    def train_owed(self) -> dict[str, torch.Tensor]:
        """Updates due at `train_ratio`; returns the last update's metrics (empty if none ran)."""
        cfg, c = self.cfg, self.counters
        owed = int((c["env_steps"] - cfg.prefill) * cfg.train_ratio / (cfg.batch_size * cfg.seq_len))
        metrics: dict[str, torch.Tensor] = {}
        if owed <= c["updates"] or not self.replay.ready():
            return metrics
        while c["updates"] < owed:
            batch = self.replay.sample().to(self.device)
            metrics = self.agent.update(batch)
            c["updates"] += 1
        return metrics

    def log_progress(self, window: dict, train_metrics: dict, bar) -> None:
        c = self.counters
        now = time.perf_counter()
        elapsed = max(now - window["time"], 1e-9)
        sps = (c["env_steps"] - window["env_steps"]) / elapsed
        ups = (c["updates"] - window["updates"]) / elapsed
        window.update(time=now, env_steps=c["env_steps"], updates=c["updates"])
        bar.set_postfix({"sps": f"{sps:.0f}", "ups": f"{ups:.1f}",
                         "ret": "-" if self.last_return is None else f"{self.last_return:.0f}"})
        train_metrics = {k: float(v) for k, v in train_metrics.items()}  # device tensors: the one sync per log
        self.logger.log(c["env_steps"], {**train_metrics, "perf/env_steps_per_s": sps, "perf/updates_per_s": ups,
                                         "updates": c["updates"]})

    def eval_and_log(self) -> float:
        c = self.counters
        self.agent.eval()
        with torch.no_grad():
            returns = evaluate(self.eval_env, self.info["obs_key"], self.agent.policy("eval"))
        result = float(np.mean(returns))
        self.last_eval = (c["env_steps"], result)
        metrics = {"eval/return": result, "eval/return_std": float(np.std(returns)), "updates": c["updates"]}
        self.logger.log(c["env_steps"], metrics)
        if self.info["obs_key"] == "pixels" and self.replay.ready():
            self.save_video()
        self.agent.train()
        return result

    def save_video(self) -> None:
        step = self.counters["env_steps"]
        batch = self.replay.sample().to(self.device)
        frames = openloop_frames(self.agent.world_model, batch, context=min(5, self.cfg.seq_len - 1))
        path = save_gif(frames, self.run_dir / "media" / f"openloop-{step:010d}.gif")
        self.logger.video(step, "openloop", path)
