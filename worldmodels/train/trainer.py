"""`Trainer`: the training loop of every algorithm, with its run directory.

One iteration: collect `collect_steps` steps in each env (random actions during `prefill`); after
each action, before the envs step, run as many updates as keep (updates * B * T) / (agent steps past
prefill) at `train_ratio` (on CUDA the GPU trains while the CPU steps the envs), and after the last
step those owed by it. On CUDA with `cuda_graphs=true` every update replays one CUDA graph
(graphed_update.py) and every action another (`Agent.policy(graphed=True)`). With
`act_while_training=true` the envs are stepped by a copy of the agent with the weights from before
the latest env step's updates, on its own CUDA stream (acting.py), and batches go to the GPU from
page-locked memory: the host never waits for an update in flight, so it steps the envs and queues
the next updates while the GPU trains. With `algo.replay_context=true` the steps also store the
filter state they were observed from, each update filters its batch from its first step's and writes
its posteriors back (context_write_back.py); `replay.cross_episodes=true` cuts sequences across
episode ends (data/replay.py).
Env steps count frames: agent steps x action repeat x envs. `train_ratio` is DreamerV3's: replayed
steps per agent step (policy steps summed over envs, i.e. frames / action repeat); configs written
before it meant per frame lack `train_ratio_unit` (config.py converts or refuses them).

metrics.jsonl gets, besides the eval lines: one `episode/return`, `episode/length` (agent steps)
line per finished training episode at the frame it ended (what DreamerV3's score files hold), and
per `log_every`: the last update's metrics, `perf/` rates, and the host seconds per phase of the
loop since the previous such line (`time/<phase>_s`, logger.Stopwatch; `time/interval_s` is the
whole interval; on CUDA `time/update_gpu_s` is the updates' GPU time, so `update_gpu_s / interval_s`
is how busy the learner keeps the GPU). Eval and checkpoint time lands in the interval after the line at their step.

On the terminal (rank 0): with `progress=true` a tqdm bar, its env steps/s (`sps`) and updates/s
(`ups`) measured over the latest `RATE_SECONDS` or more and refreshed after each collect, with the
latest training return; with `progress=false` one plain line per `log_every` (env steps, updates,
their rates over the interval, the latest training and eval returns).

Run directory: `config.yaml` (resolved), `metrics.jsonl` (+ the logger backend's files),
`checkpoints/` (see checkpoint.py), `media/` (for image observations, at every eval: GIFs of the
first eval env's episode and of open-loop predictions; also sent to the logger backend).
Starting again on a run directory resumes its newest complete checkpoint after the checks of
run_dir.py (same config where it matters, not finished, not in use); Ctrl-C and SIGTERM save a
checkpoint before exiting; `check_finite=true` stops at the first non-finite loss saving nothing.

Under torchrun (`torchrun --nproc-per-node N scripts/train.py ...`) every rank runs this loop on its
own envs and replay shard with gradients averaged over ranks; counters, `steps`, `batch_size`,
`env.num_envs` and `train_ratio` count over all ranks (distributed.py says how each scales, and what
a checkpoint holds). With one process nothing of it runs: no collective, no extra sync.
"""

from __future__ import annotations

import contextlib
import random
import sys
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
from worldmodels.envs.factory import frame_renderer
from worldmodels.train.acting import ActingCopy
from worldmodels.train.checkpoint import STATE, CheckpointError, Checkpoints, open_file, read_state
from worldmodels.train.context_write_back import ContextWriteBack
from worldmodels.train.config import RunPrecision, check_resume_unit, update_autocast, validate
from worldmodels.train.distributed import Ranks, rank_dir
from worldmodels.train.graphed_update import GraphedUpdate
from worldmodels.train.interrupt import SaveAborted, Stopped, StopSignals
from worldmodels.train.logger import Logger, Stopwatch
from worldmodels.train.run_dir import Run, RunDirError, open_run
from worldmodels.train.video import EpisodeFrames, image_key, openloop_frames


RATE_SECONDS = 2.0
"""The progress bar's sps / ups cover at least this many seconds (one collect's rate is noise)."""

STATE_FIELDS = {"agent": dict, "optimizers": dict, "counters": {"env_steps": int, "updates": int, "episodes": int},
                "collector": dict, "rng": dict, "replay_size": int}
"""What a trainer's `state.pt` holds at least (`Checkpoints.fields`): a state without them is corrupt."""


def build_agent(cfg, info: dict) -> Agent:
    """The algorithm's agent for an env described by `env_info`, on `device`."""
    agent = ALGOS[cfg.algo.name](info["obs_shape"], info["action_dim"], info["discrete"], cfg.model, cfg.algo,
                                 backend=cfg.backend)
    return agent.to(cfg.device)


class _NoLogger:
    """What ranks other than 0 log to: nothing."""

    def log(self, step, metrics) -> None:
        pass

    def video(self, step, name, frames) -> None:
        pass

    def close(self) -> None:
        pass


class NonFiniteLossError(FloatingPointError):
    """A loss (or other update metric) became NaN or infinite under `check_finite=true`."""


def rng_state() -> dict:
    """Every generator's state as tensors, numbers and lists (loads with weights_only=True)."""
    numpy = np.random.get_state(legacy=False)
    version, internal, gauss = random.getstate()
    state = {"torch": torch.get_rng_state(),
             "numpy": {"bit_generator": numpy["bit_generator"],
                       "key": torch.from_numpy(numpy["state"]["key"].astype(np.int64)),
                       "pos": int(numpy["state"]["pos"]), "has_gauss": int(numpy["has_gauss"]),
                       "gauss": float(numpy["gauss"])},
             "python": [version, list(internal), gauss]}
    if torch.cuda.is_initialized():  # CUDA generators draw the GPU-side noise (sampling, dropout)
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        states = state["cuda"][: torch.cuda.device_count()]  # resumed on fewer GPUs: the first ones
        torch.cuda.set_rng_state_all(states)
    numpy = state["numpy"]
    np.random.set_state({"bit_generator": numpy["bit_generator"], "has_gauss": numpy["has_gauss"],
                         "gauss": numpy["gauss"],
                         "state": {"key": numpy["key"].numpy().astype(np.uint32), "pos": numpy["pos"]}})
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


class Trainer:
    """The training loop of one run (see the module docstring).

    Args:
        cfg: a run config (configs/config.yaml composed by Hydra). It is validated, and the run
            directory checked (run_dir.py), before any env or model is built; a finished run
            builds nothing and `train` only says so.
    """

    def __init__(self, cfg):
        self.ranks = ranks = Ranks.from_env()  # torchrun's; one process: world size 1
        validate(cfg, ranks.world_size, ranks.local_rank)
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.checkpoints = Checkpoints(self.run_dir / "checkpoints", fields=STATE_FIELDS)
        if self.checkpoints.steps():
            check_resume_unit(self.run_dir, cfg)  # a run from before train_ratio_unit keeps its rate
        ranks.start(cfg.device)  # joins torchrun's process group (world size > 1)
        self.run = self._open_run(cfg)  # checks only: nothing in run_dir is written yet
        self.stop = StopSignals()
        self.clock = Stopwatch(cfg.device)  # the time split logged with each progress line
        self.counters = {"env_steps": 0, "updates": 0, "episodes": 0, "resumes": 0}
        self.last_eval: tuple[int | None, float | None] = (None, None)  # (env step, mean return)
        self._saved_step: int | None = None  # env step of the newest checkpoint this process wrote
        if self.run.finished:  # nothing to train and nothing to write: `train` says so
            self.counters.update(self.run.state["counters"])
            self.last_eval = tuple(self.run.state["last_eval"])
            self.run.release()
            return
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        # the run's matmul precision: cuBLAS TF32 or not here; the recurrent core's around the loop (train)
        self.precision = RunPrecision.of(cfg.precision)  # validate() upgraded it: one of the core's names
        self.precision.apply()
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        random.seed(cfg.seed)
        self.device = torch.device(cfg.device)

        self.last_return: float | None = None
        world = ranks.world_size
        local_envs = cfg.env.num_envs // world  # env.num_envs counts the envs of all ranks
        self.env_seed = cfg.seed + ranks.rank * local_envs  # each env of the run its own seed
        self.env = make_env(cfg.env, seed=self.env_seed, num_envs=local_envs if ranks.active else None)
        self.eval_env = make_env(cfg.env, seed=cfg.seed + 10_000, num_envs=cfg.eval_episodes) if ranks.main else None
        self.info = env_info(self.env)
        self.agent = build_agent(cfg, self.info)
        if self.precision.loss_scale:
            for opt in self.agent.optimizers().values():
                opt.use_loss_scale()
        self._all_ready = False  # every rank's replay holds a sequence (ranks start training together)
        if ranks.active:
            ranks.broadcast_module_(self.agent)  # equal weights on every rank
            for opt in self.agent.optimizers().values():
                opt.reduce = ranks.average_  # gradients averaged over ranks inside the update
            self.agent.all_ranks = ranks.gather  # batch statistics (return percentiles) over every rank
            if not ranks.main:  # rank 0 draws as a one-process run does
                torch.manual_seed(cfg.seed + ranks.rank)
                np.random.seed(cfg.seed + ranks.rank)
                random.seed(cfg.seed + ranks.rank)
        self.update = GraphedUpdate(self.agent, enabled=cfg.cuda_graphs)  # agent.update, replayed on CUDA
        self.acting = ActingCopy(self.agent, enabled=cfg.get("act_while_training", True))
        if cfg.get("compile_nets", False):  # after the acting copy: it is copied from the eager modules
            self.agent.compile_nets()
        memmap = self.run_dir / "replay_memmap" if cfg.replay.memmap else None
        if memmap is not None and ranks.active:
            memmap = memmap / rank_dir(ranks.rank)
        memory_gb = cfg.replay.memory_gb
        if memory_gb is not None and ranks.active:
            memory_gb = memory_gb / world
        # this rank's shard; on the GPU with replay.on_device (config.py refuses it beside memmap there)
        self.replay = Replay(capacity=-(-cfg.replay.capacity // world), batch_size=cfg.batch_size // world,
                             seq_len=cfg.seq_len, memory_gb=memory_gb, memmap_dir=memmap,
                             cross_episodes=cfg.replay.get("cross_episodes", False),
                             device=self.device if cfg.replay.get("on_device", False) else None)
        # replay context (DreamerV3's replay_context): steps store the filter state they were observed
        # from, written while acting and rewritten by every update (agent.py says how)
        context, self.write_back = None, None
        if cfg.algo.get("replay_context", False):
            env_device = self.env.device if self.env.device is not None else torch.device("cpu")
            context = lambda carry, n: self.acting.context(carry, n, device=env_device)  # noqa: E731
            self.write_back = ContextWriteBack(self.replay)
        self.collector = Collector(self.env, self.info["obs_key"], self.info["action_dim"], self.replay.add,
                                   atomic=self.stop.deferred, context=context)
        self.render_frames = frame_renderer(cfg.env)  # frames again from their states (None: not this env)
        # frames over all ranks per collect (every rank steps in lockstep)
        self.steps_per_collect = cfg.collect_steps * self.env.batch_size[0] * cfg.env.action_repeat * world
        if self.run.state is not None:
            self.resume(self.run.state, self.run.checkpoint)
        if ranks.main:
            self.run.start(cfg)  # config.yaml, the record of allowed changes, metrics cut back to the checkpoint
            self.logger = Logger(cfg.logger, self.run_dir, OmegaConf.to_container(cfg, resolve=True))
        else:
            self.logger = _NoLogger()

    def _open_run(self, cfg) -> Run:
        """`open_run` on rank 0 (it holds the run directory); the other ranks get its outcome: the
        same error, or the checkpoint to resume, which they read themselves."""
        ranks = self.ranks
        if not ranks.active:
            return open_run(cfg, self.checkpoints)
        run, outcome = None, None
        if ranks.main:
            try:
                run = open_run(cfg, self.checkpoints, ranks.world_size)
                outcome = ("ok", None if run.checkpoint is None else str(run.checkpoint), run.finished)
            except (RunDirError, CheckpointError) as err:
                ranks.broadcast_object((type(err).__name__, str(err), None))
                raise
        outcome = ranks.broadcast_object(outcome)
        if run is not None:
            return run
        kind, checkpoint, finished = outcome
        if kind != "ok":
            raise (RunDirError if kind == "RunDirError" else CheckpointError)(checkpoint)
        run = Run(self.run_dir, finished=finished)
        if checkpoint is not None:  # verified by rank 0
            run.checkpoint = Path(checkpoint)
            run.state = read_state(run.checkpoint / STATE)
        return run

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {
            "agent": self.agent.state_dict(),
            "optimizers": {k: opt.state_dict() for k, opt in self.agent.optimizers().items()},
            "counters": dict(self.counters),
            **self.rank_state_dict(),
            "last_eval": list(self.last_eval),
            "world_size": self.ranks.world_size,
            "config": OmegaConf.to_container(self.cfg, resolve=True),
            "env_info": self.info,  # what `load` builds the agent from, without building the env
        }

    def rank_state_dict(self) -> dict:
        """What is this rank's own: its envs' collector, its generators, its replay shard's size."""
        return {"collector": self.collector.state_dict(), "rng": rng_state(), "last_return": self.last_return,
                "replay_size": len(self.replay)}

    def save(self) -> Path:
        """Write a checkpoint of the current step; a stop signal meanwhile waits until it is written.
        Under torchrun every rank calls it: rank 0 writes the checkpoint, the others their own
        state and replay shard into it (`rank-<r>/`) before it is verified and put in place."""
        name = f"step-{self.counters['env_steps']:010d}"
        with self.stop.deferred():
            if self.ranks.active:
                path = self._save_ranks(name)
            else:
                path = self.checkpoints.save(name, self.state_dict(), lambda d: self._save_replay(d / "replay"))
            self._saved_step = self.counters["env_steps"]  # before a signal held meanwhile is raised
        return path

    def _save_ranks(self, name: str) -> Path:
        ranks = self.ranks
        if ranks.main:
            def write_extra(directory: Path) -> None:
                self._save_replay(directory / "replay")
                ranks.barrier()  # the directory exists: the other ranks write into it
                ranks.barrier()  # they have: the manifest covers their files

            path = self.checkpoints.save(name, self.state_dict(), write_extra)
        else:
            ranks.barrier()
            own = self.checkpoints.dir / f"{name}.tmp" / rank_dir(ranks.rank)
            own.mkdir(parents=True, exist_ok=True)
            torch.save(self.rank_state_dict(), own / STATE)
            self._save_replay(own / "replay")
            ranks.barrier()
            path = self.checkpoints.dir / name
        ranks.barrier()  # the checkpoint is in place
        return path

    def _save_replay(self, path: Path) -> None:
        """The replay into `path`; with `replay.save_frames=false`, its frames left out where they can be
        rendered again from their steps' states (data/replay.py)."""
        key, frames = image_key(self.info), None  # replay stores observations under "obs" (collector.py)
        if key is not None and not self.cfg.replay.get("save_frames", True):
            frames = "obs" if key == self.info["obs_key"] else ("obs", key)
        self.replay.save(path, frames=frames, render=self.render_frames)

    def resume(self, state: dict, path: Path) -> None:
        """Continue from a checkpoint's `state` (read from its directory `path`)."""
        self.agent.load_state_dict(state["agent"])
        for name, opt in self.agent.optimizers().items():
            opt.load_state_dict(state["optimizers"][name])
        self.counters.update(state["counters"])
        self.counters["resumes"] += 1
        self._saved_step = self.counters["env_steps"]  # a stop before the next step has nothing new to save
        self.last_eval = tuple(state.get("last_eval", (None, None)))
        own, replay = state, path / "replay"
        if not self.ranks.main:  # this rank's own state and replay shard
            mine = path / rank_dir(self.ranks.rank)
            own, replay = read_state(mine / STATE), mine / "replay"
        self.collector.load_state_dict(own["collector"])
        self.last_return = own["last_return"]
        set_rng_state(own["rng"])
        self.acting.refresh()  # the copy takes the loaded weights
        self.replay.load(replay, example=self.collector.example_step(), size=own["replay_size"],
                         open_file=open_file,  # files of a checkpoint may be stored as pieces
                         render=self.render_frames)  # for a replay saved without its frames
        if self.replay.rendered_on_load is not None:
            frames, seconds = self.replay.rendered_on_load
            print(f"rendered {frames} frames again from their physics states in {seconds:.1f} s "
                  "(a checkpoint saved with replay.save_frames=false)", flush=True)
        # fresh env episodes after a restart: reseed so they differ from the first run's
        self.env.set_seed(self.env_seed + 1000 * self.counters["resumes"])

    # ------------------------------------------------------------------ loop
    def train(self) -> dict:
        """Train until `steps` env steps; returns the final counters and eval return."""
        cfg, c = self.cfg, self.counters
        if self.run.finished:
            print(f"run_dir={str(self.run_dir)!r} is already finished: its checkpoint {self.run.checkpoint.name} is at "
                  f"{c['env_steps']} env steps >= steps={cfg.steps}; nothing to do (raise steps= to train further)")
            return {**c, "eval_return": self.last_eval[1]}
        bar = tqdm(total=cfg.steps, initial=min(c["env_steps"], cfg.steps), unit="step", dynamic_ncols=True,
                   disable=not cfg.progress or not self.ranks.main)
        next_eval = (c["env_steps"] // cfg.eval_every + 1) * cfg.eval_every
        next_save = (c["env_steps"] // cfg.save_every + 1) * cfg.save_every
        next_log = (c["env_steps"] // cfg.log_every + 1) * cfg.log_every
        window = {"time": time.perf_counter(), "env_steps": c["env_steps"], "updates": c["updates"]}
        shown = dict(window)  # where the bar's rates start
        self.clock.lap()
        clock = self.clock
        train_metrics: dict[str, torch.Tensor] = {}
        ranks = self.ranks
        # ranks hold stop signals and agree on them once per iteration: all save and stop together
        held = self.stop.held() if ranks.active else contextlib.nullcontext()
        result, eval_step = None, None  # eval_step: env step of the latest periodic eval
        try:
            with self.stop, held, recurrent_backend(cfg.backend), self.precision.recurrent_context():
                try:
                    while c["env_steps"] < cfg.steps:
                        before = c["env_steps"]
                        train_metrics = self.collect(train=True) or train_metrics
                        bar.update(c["env_steps"] - before)
                        if not bar.disable:
                            self._show_rates(bar, shown)
                        train_metrics = self.train_owed() or train_metrics
                        if c["env_steps"] >= next_log:
                            next_log += cfg.log_every
                            with clock("log"):
                                self.log_progress(window, train_metrics)
                        if c["env_steps"] >= next_eval:
                            next_eval += cfg.eval_every
                            eval_step = c["env_steps"]
                            if ranks.main:
                                with clock("eval"):
                                    self.eval_and_log()
                        if c["env_steps"] >= next_save:
                            next_save += cfg.save_every
                            with clock("checkpoint"):
                                self.save()
                        if ranks.active and (signum := ranks.any_signal(self.stop.take())) is not None:
                            raise Stopped(signum)
                    # the final eval, unless the periodic one just ran at this very step (every rank decides alike)
                    final_eval = eval_step != c["env_steps"]
                    if ranks.main:
                        result = self.eval_and_log() if final_eval else self.last_eval[1]
                    if final_eval or self._saved_step != c["env_steps"]:  # not twice the same checkpoint
                        self.save()
                except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM (interrupt.Stopped); the handlers stay ours
                    if self._saved_step != c["env_steps"]:
                        self._save_on_stop(stop, bar)
                    raise
        finally:
            bar.close()
            self.logger.close()
            self.run.release()
            ranks.close()
        return {**c, "eval_return": result}

    def _save_on_stop(self, stop: KeyboardInterrupt, bar) -> None:
        """The checkpoint a stop asks for. A second stop signal meanwhile says it is still saving; a third
        aborts the save (`SaveAborted`), saying which checkpoint is kept."""
        where = self.checkpoints.dir / f"step-{self.counters['env_steps']:010d}"
        # flushed before the save: if the process dies during it, the log still says where it was
        bar.write(f"{stop or 'interrupted'} at {self.counters['env_steps']} env steps: "
                  f"saving a checkpoint to {self.run_dir}")
        sys.stdout.flush()
        try:
            with self.stop.saving(str(where)):
                path = self.save()
        except SaveAborted:
            latest = self.checkpoints.latest()
            bar.write(f"save aborted: {where.name} was not written; the newest complete checkpoint is "
                      f"{latest if latest is not None else 'none (this run saved none)'}, "
                      "where the next start resumes")
            sys.stdout.flush()
            raise
        bar.write(f"saved {path}")

    def collect(self, train: bool = False) -> dict[str, torch.Tensor]:
        """`collect_steps` agent steps in every env (fewer where `steps` comes first). With `train`, the
        updates owed by the env steps done so far run after each action and before the envs step
        (`Collector.collect`'s `between`): the device trains while the CPU steps the envs. Returns the
        last update's metrics (or {})."""
        c = self.counters
        mode = "random" if c["env_steps"] < self.cfg.prefill else "explore"
        start, per_step = c["env_steps"], self.steps_per_collect // self.cfg.collect_steps
        # fewer steps where `steps` is nearer: a run resumed off the collect grid ends where one run would
        count = min(self.cfg.collect_steps, -(-(self.cfg.steps - start) // per_step))
        metrics: dict[str, torch.Tensor] = {}

        def between(i: int) -> None:  # called inside the collector's no_grad
            with torch.enable_grad():
                metrics.update(self.train_owed())

        def after(i: int) -> None:  # step i is in replay: the counter holds the steps in replay so far
            c["env_steps"] = start + (i + 1) * per_step  # (train_owed and error messages read it)

        # acting stays in training mode: no layer here depends on it, and `Module.train` walks every
        # submodule, a host cost paid around every interleaved update
        policy = self.acting.policy(mode, graphed=self.cfg.cuda_graphs, device=self.collector.env_device)
        ended = self.collector.collect(policy, count, between if train else None, after)
        if ended:
            with self.clock("log"):
                for episode in ended:  # at the frame it ended: every env stepped (episode.at + 1) times
                    self.logger.log(start + (episode.at + 1) * per_step,
                                    {"episode/return": episode.ret, "episode/length": episode.length})
                c["episodes"] += len(ended)
                self.last_return = float(np.mean([episode.ret for episode in ended]))
                self.logger.log(c["env_steps"], {"train/return": self.last_return, "train/episodes": c["episodes"]})
        return metrics

    def train_owed(self, env_steps: int | None = None) -> dict[str, torch.Tensor]:
        """Updates due at `train_ratio` replayed steps per agent step after `env_steps` (frames;
        default: the env steps counted so far), agent steps being frames / `env.action_repeat`;
        returns the last update's metrics (empty if none ran)."""
        cfg, c, clock = self.cfg, self.counters, self.clock
        env_steps = c["env_steps"] if env_steps is None else env_steps
        replayed = (env_steps - cfg.prefill) * cfg.train_ratio  # x action_repeat: frames, not agent steps
        owed = int(replayed / (cfg.env.action_repeat * cfg.batch_size * cfg.seq_len))
        metrics: dict[str, torch.Tensor] = {}
        if owed <= c["updates"] or not self._ready():
            return metrics
        self.acting.refresh()  # once per env step: the copy acts with the weights from before these updates
        pin = self.device.type == "cuda"
        write_back = self.write_back
        while c["updates"] < owed:
            with clock("replay_sample"):
                if write_back is not None:
                    write_back.flush()  # the entries of earlier updates that have arrived
                    sampled, slots = self.replay.sample(pin_memory=pin, with_slots=True)
                else:
                    sampled = self.replay.sample(pin_memory=pin)  # on the host, or the GPU's with replay.on_device
                batch = self.acting.to_device(sampled, self.device)
            # a stop signal waits for the update and its count: a save never holds half an optimiser step
            with clock("update"), clock.device_time("update"), self.stop.deferred():
                metrics = self.update_on(batch)
                c["updates"] += 1
                if write_back is not None and self.update.context is not None:
                    write_back.push(self.update.context, slots, *self.replay.held(slots))
                if cfg.check_finite:  # ranks check the mean: all stop at once
                    self.check_finite(self.ranks.mean_metrics(metrics))
        return metrics

    def _ready(self) -> bool:
        """The replay can give a batch; under torchrun every rank's (they update together)."""
        if not self.ranks.active:
            return self.replay.ready()
        if not self._all_ready:
            self._all_ready = self.ranks.all_true(self.replay.ready())
        return self._all_ready

    def update_on(self, batch) -> dict[str, torch.Tensor]:
        """One update on a device batch [B, T] at the run's precision (bf16, fp16: under autocast)."""
        with update_autocast(self.device.type, self.precision.autocast):
            metrics = self.update(batch)
        if self.precision.loss_scale:  # the scale each optimiser's loss is multiplied by (it halves on an overflow)
            for name, opt in self.agent.optimizers().items():
                metrics[f"{name}/loss_scale"] = opt.loss_scale.scale
        return metrics

    def check_finite(self, metrics: dict[str, torch.Tensor]) -> None:
        """Raise NonFiniteLossError naming the first non-finite metric (losses first, in the order the
        update computed them) and the step."""
        for name in sorted(metrics, key=lambda k: "loss" not in k):
            if self.precision.loss_scale and name.endswith("grad_norm"):
                continue  # an overflow under a loss scale skips that update, as meant: its gradient norm is inf
            value = metrics[name]
            if not torch.isfinite(value).all():
                latest = self.checkpoints.latest()
                raise NonFiniteLossError(
                    f"{name}={float(value)} is not finite at env step {self.counters['env_steps']} "
                    f"(update {self.counters['updates']}); stopping without saving: the last good checkpoint "
                    f"is {latest if latest is not None else 'none (none was written)'}")

    def _show_rates(self, bar, shown: dict) -> None:
        """The bar's env steps/s and updates/s since `shown` (time and counters), once `RATE_SECONDS`
        have passed; `shown` then moves to now."""
        c, now = self.counters, time.perf_counter()
        elapsed = now - shown["time"]
        if elapsed < RATE_SECONDS:
            return
        sps, ups = (c["env_steps"] - shown["env_steps"]) / elapsed, (c["updates"] - shown["updates"]) / elapsed
        shown.update(time=now, env_steps=c["env_steps"], updates=c["updates"])
        bar.set_postfix({"sps": f"{sps:.0f}", "ups": f"{ups:.1f}",
                         "ret": "-" if self.last_return is None else f"{self.last_return:.0f}"})

    def log_progress(self, window: dict, train_metrics: dict) -> None:
        """The `log_every` line of metrics.jsonl (rates over the interval since `window`, which moves to
        now); with `progress=false`, a plain progress line on stdout too."""
        c = self.counters
        now = time.perf_counter()
        elapsed = max(now - window["time"], 1e-9)
        sps = (c["env_steps"] - window["env_steps"]) / elapsed
        ups = (c["updates"] - window["updates"]) / elapsed
        window.update(time=now, env_steps=c["env_steps"], updates=c["updates"])
        if not self.cfg.progress and self.ranks.main:
            print(self._progress_line(sps, ups), flush=True)
        train_metrics = self.ranks.mean_metrics(train_metrics)  # ranks: the mean over all of them
        train_metrics = {k: float(v) for k, v in train_metrics.items()}  # device tensors: the one sync per log
        self.clock.add(self.collector.seconds)
        times = {**self.clock.lap(), "time/interval_s": elapsed}  # this call's own time counts in the next one
        self.logger.log(c["env_steps"], {**train_metrics, "perf/env_steps_per_s": sps, "perf/updates_per_s": ups,
                                         **times, "updates": c["updates"]})

    def _progress_line(self, sps: float, ups: float) -> str:
        c = self.counters
        train = "-" if self.last_return is None else f"{self.last_return:.1f}"
        step, value = self.last_eval
        evaluated = "-" if value is None else f"{value:.1f} (at {step})"
        return (f"{c['env_steps']}/{self.cfg.steps} env steps, {c['updates']} updates: {sps:.0f} env steps/s, "
                f"{ups:.1f} updates/s, train return {train}, eval return {evaluated}")

    def eval_and_log(self) -> float:
        """Greedy episodes in the eval envs (a progress line counts their steps); logs the mean
        return and, for image observations, the first env's episode and an open-loop video."""
        c = self.counters
        video_key = image_key(self.info)
        episode = EpisodeFrames(video_key) if video_key is not None else None
        self.agent.eval()
        with torch.no_grad(), tqdm(desc="eval", unit="step", leave=False, dynamic_ncols=True,
                                   disable=not self.cfg.progress) as bar:
            def on_step(td, running):
                bar.set_postfix_str(f"{int(running.sum())} episodes running", refresh=False)
                bar.update()
                if episode is not None:
                    episode(td, running)

            policy = self.agent.policy("eval", graphed=self.cfg.cuda_graphs)
            returns = evaluate(self.eval_env, self.info["obs_key"], policy, on_step=on_step)
        result = float(np.mean(returns))
        self.last_eval = (c["env_steps"], result)
        metrics = {"eval/return": result, "eval/return_std": float(np.std(returns)), "updates": c["updates"]}
        self.logger.log(c["env_steps"], metrics)
        if episode is not None:
            self.logger.video(c["env_steps"], "eval_episode", episode.frames())
        if self.info["obs_key"] == "pixels" and self.replay.ready():
            self.save_video()
        self.agent.train()
        return result

    def save_video(self) -> None:
        step = self.counters["env_steps"]
        batch = self.replay.sample().to(self.device)
        frames = openloop_frames(self.agent.world_model, batch, context=min(5, self.cfg.seq_len - 1))
        self.logger.video(step, "openloop", frames)
