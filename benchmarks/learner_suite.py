"""Learner rows: one full DreamerV3 update (world-model, actor and critic losses, backward,
optimiser steps) on a replay-shaped batch, ours per backend next to torchrl 0.14's
`DreamerV3Loss` + `DreamerV3OptimizationStepper` stack on the same batch shapes.

Ours is `worldmodels.algos.DreamerV3.update` built from the repo's Hydra configs
(`configs/model/<size>.yaml`, `configs/algo/dreamer_v3.yaml`), pixel observations 64x64, 6
discrete actions. Every backend starts from the same weights (the two-hot output layers random instead of zero, so
that imagined rewards, values and returns are not ~0: `informative_start`) and RNG seed; its first
update's metrics (losses, gradient norms, imagined returns) are checked against the `loop` backend's.
On CUDA each backend also gets a `graphed` row: the update replayed from one CUDA graph
(`train/graphed_update.GraphedUpdate`, the trainer's default there), primed on the batch and rewound,
so its checked call is a first update too.
Our rows: by default every registered backend that implements both RSSM ops and runs on the device.
bf16 rows run the update under bf16 autocast as a run does (`train/config.update_autocast`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from benchmarks import torchrl_learner
from benchmarks._cli import CONFIGS  # the repo's configs/, beside benchmarks/
from benchmarks.runner import Candidate, Group, Unavailable, our_backends, require_backend
from worldmodels.train.config import update_autocast
from worldmodels.train.graphed_update import GraphedUpdate

SEED = 0


@dataclass(frozen=True)
class LearnerShape:
    model: str      # configs/model/<model>.yaml
    batch: int
    steps: int
    action: int = 6
    image: int = 64

    def label(self, precision: str) -> str:
        return f"DreamerV3 update {self.model} B={self.batch} T={self.steps} {precision}"


FULL = [LearnerShape("size1m", 16, 64), LearnerShape("size12m", 16, 64)]
SMALL = [LearnerShape("tiny", 2, 8)]
PRECISIONS = ("fp32", "bf16")
BF16_RTOL = 0.1
RSSM_FAMILIES = ("rssm_observe", "rssm_imagine")  # the registry's op families an update runs


def groups(shapes: list[LearnerShape], device: torch.device, *, backends: Sequence[str] | None = None,
           peer_compile: bool = False) -> list[Group]:
    """`backends`: ours to time (None: every one available for both RSSM ops on `device`)."""
    if not CONFIGS.is_dir():
        raise FileNotFoundError(f"the learner suite reads the repo's Hydra configs, and {CONFIGS} is missing: "
                                f"run `python -m benchmarks` from a worldmodels checkout")
    out = []
    ours = our_backends(RSSM_FAMILIES, device, backends)
    for shape in shapes:
        for precision in PRECISIONS:
            candidates = [_ours(shape, precision, b, device) for b in ours]
            if device.type == "cuda":  # the trainer's default on CUDA: the whole update in one CUDA graph
                candidates += [_ours(shape, precision, b, device, graphed=True) for b in ours if b != "loop"]
            candidates += torchrl_learner.candidates(shape, precision, device, peer_compile,
                                                     configs=functools.partial(load_configs, shape.model))
            out.append(Group("learner", shape.label(precision), "update", _Setup(shape, device), _inputs, candidates,
                             work={"transitions": shape.batch * shape.steps}))
    return out


def load_configs(model: str):
    """(model, algo) configs from the repo's Hydra config groups."""
    try:
        from omegaconf import OmegaConf
    except ImportError as exc:
        raise Unavailable(f"omegaconf not importable: {exc}") from None
    paths = [CONFIGS / "model" / f"{model}.yaml", CONFIGS / "algo" / "dreamer_v3.yaml"]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(f"config files not found: {missing}")
    return tuple(OmegaConf.load(p) for p in paths)


class _Setup:
    """The replay-shaped batch (random pixels, one-hot actions, rewards, episode starts/ends)."""

    def __init__(self, shape: LearnerShape, device: torch.device):
        self.shape, self.device = shape, device

    def __call__(self) -> dict:
        shape, device = self.shape, self.device
        b, t = shape.batch, shape.steps
        gen = torch.Generator().manual_seed(SEED)
        is_first = torch.rand(b, t, generator=gen) < 1 / t
        is_first[:, 0] = True
        is_terminal = torch.roll(is_first, -1, 1) & (torch.rand(b, t, generator=gen) < 0.5)
        is_terminal[:, -1] = False
        action = torch.nn.functional.one_hot(torch.randint(shape.action, (b, t), generator=gen), shape.action).float()
        action[is_first] = 0  # the action before an episode's first observation
        batch = TensorDict({
            "obs": torch.randint(0, 256, (b, t, 3, shape.image, shape.image), dtype=torch.uint8, generator=gen),
            "action": action,
            "reward": torch.randn(b, t, generator=gen),
            "is_first": is_first,
            "is_terminal": is_terminal,
        }, batch_size=[b, t]).to(device)
        return {"batch": batch, "shape": shape}


def _inputs(s: dict) -> dict:
    return {"obs": s["batch"]["obs"].float(), "reward": s["batch"]["reward"], "action": s["batch"]["action"]}


def informative_start(agent) -> None:
    """DreamerV3 zero-initialises its two-hot output layers (reward, critic): at a first update the
    imagined rewards, values and returns are then ~1e-7, rounding noise, and a relative parity check
    of `imag/return` or `critic/value` measures nothing (it failed rows at 7e-2 and passed them by
    luck). Every backend starts from the same small random output layers instead, their biases
    tilted to the positive bins so that the mean reward and return are not ~0 either."""
    gen = torch.Generator().manual_seed(SEED + 2)
    with torch.no_grad():
        for head in (agent.world_model.reward, agent.critic):
            last = head.net[-1]
            last.weight.copy_(torch.randn(last.weight.shape, generator=gen) * 0.1)
            last.bias.copy_(torch.linspace(-0.25, 0.25, last.bias.numel()))  # tilted up: means away from 0
        agent.slow_critic.load_state_dict(agent.critic.state_dict())


def autocast(device: torch.device, precision: str):
    """As a run's update (`train/config.update_autocast`): bf16 rows under bf16 autocast."""
    return update_autocast(device.type, torch.bfloat16 if precision == "bf16" else None)


def _ours(shape: LearnerShape, precision: str, backend: str, device: torch.device, graphed: bool = False) -> Candidate:
    def build(s: dict):
        require_backend(backend, device, *RSSM_FAMILIES)
        try:
            from worldmodels.algos import ALGOS
        except Exception as exc:  # the training stack is not in this build
            raise Unavailable(f"worldmodels.algos not importable: {type(exc).__name__}: {exc}") from None
        model_cfg, algo_cfg = load_configs(shape.model)
        torch.manual_seed(SEED)  # same initial weights for every backend
        agent = ALGOS["dreamer_v3"]((3, shape.image, shape.image), shape.action, True, model_cfg, algo_cfg,
                                    backend=backend).to(device)
        informative_start(agent)
        batch = s["batch"]
        update = agent.update
        if graphed:  # captured here, then rewound: the first timed call replays a first update
            update = GraphedUpdate(agent)
            with autocast(device, precision):
                update.prime(batch)
        torch.manual_seed(SEED + 1)  # the first update draws the same noise on every backend

        def call() -> dict:
            with autocast(device, precision):
                metrics = update(batch)
            return {k: v.detach().float() for k, v in metrics.items()}
        return call
    settings = (f"DreamerV3.update{' in one CUDA graph (GraphedUpdate)' if graphed else ''}: world model + actor + "
                f"critic, 3 Adam steps; "
                f"{'bf16 autocast' if precision == 'bf16' else 'fp32'}")
    # bf16: one rounding per op, and a flipped categorical draw changes the trajectory: looser check
    impl = f"ours:{backend}{' graphed' if graphed else ''}"
    return Candidate(impl, build, settings=settings, rtol=BF16_RTOL if precision == "bf16" else None)
