"""Unroll rows: `RSSM.observe` (B x T, prior + posterior) and `RSSM.imagine` (N starts x H steps,
actor in the loop) on each of our backends, next to the peers on the same shapes and tensors.

Modes: observe "fwd" (forward of a training step, autograd recording) and "fwd+bwd"; imagine
"no-grad" (acting / REINFORCE-style imagination) and "fwd+bwd" (dynamics backprop). Inputs are
random: embeddings N(0, 1), actions U(-1, 1), a random start state, ~1/T episode starts, the
noise from `RSSM.noise` (+ `Actor.noise`), random cotangents for the backward.

Our rows: by default every registered backend that implements the op ("rssm_observe",
"rssm_imagine") and runs on the device (`registry.available_backends`), `loop` first as the reference.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from tensordict import TensorDict

import worldmodels as wm
from worldmodels.core import torch_fixes
from benchmarks import torchrl_peers
from benchmarks.autodiff import Cotangents, forward_backward, forward_only, no_grad
from benchmarks.parity import assert_parity, flatten
from benchmarks.runner import Candidate, Group, Unavailable, our_backends, require_backend
from benchmarks.seed import SeedRSSM, seed_actor
from benchmarks.shapes import UnrollShape

SEED = 0


def groups(shapes: list[UnrollShape], device: torch.device, *, backends: Sequence[str] | None = None,
           peer_compile: bool = False, rtol: float = 1e-3) -> list[Group]:
    """`backends`: ours to time (None: every one available for the shape's op on `device`)."""
    out = []
    for shape in shapes:
        setup = _SharedSetup(shape, device)
        modes = ("fwd", "fwd+bwd") if shape.kind == "observe" else ("no-grad", "fwd+bwd")
        ours = our_backends([_family(shape)], device, backends)
        for mode in modes:
            candidates = [_ours(shape, mode, b, device) for b in ours]
            if "scan" in ours:  # scan is the torch.compile backend: time it compiled too
                candidates.append(_ours(shape, mode, "scan", device, compiled=True))
            candidates.append(_seed(shape, mode))
            candidates += _torchrl(shape, mode, device, peer_compile, rtol)
            out.append(Group("unroll", shape.label, mode, setup, _inputs, candidates,
                             work={"steps": shape.batch * shape.steps}))
    return out


def _family(shape: UnrollShape) -> str:
    return f"rssm_{shape.kind}"  # the registry's op family: "rssm_observe" | "rssm_imagine"


class _SharedSetup:
    """The group's tensors, drawn once per shape (both modes of a shape time the same data)."""

    def __init__(self, shape: UnrollShape, device: torch.device):
        self.shape, self.device = shape, device

    def __call__(self) -> dict:
        shape, cfg, device = self.shape, self.shape.model, self.device
        batch, steps = shape.batch, shape.steps
        torch.manual_seed(SEED)
        rssm = wm.RSSM(cfg.action, cfg.embed, **cfg.rssm_kwargs()).to(device)
        if cfg.v3:
            stoch = F.one_hot(torch.randint(cfg.classes, (batch, cfg.stoch), device=device), cfg.classes)
            stoch = stoch.flatten(-2).float()
        else:
            stoch = torch.randn(batch, cfg.stoch, device=device)
        s = {"rssm": rssm, "cot": Cotangents(),
             "state": TensorDict({"deter": torch.randn(batch, cfg.deter, device=device).tanh(), "stoch": stoch},
                                 batch_size=[batch])}
        noise = rssm.noise((batch, steps))
        if shape.kind == "observe":
            s["embed"] = torch.randn(batch, steps, cfg.embed, device=device).requires_grad_()
            s["action"] = (torch.rand(batch, steps, cfg.action, device=device) * 2 - 1).requires_grad_()
            is_first = torch.rand(batch, steps, device=device) < 1 / steps
            is_first[0, steps // 2] = True  # at least one episode start inside the window
            s["is_first"] = is_first
        else:
            s["actor"] = wm.Actor(cfg.stoch_dim + cfg.deter, cfg.action, **cfg.actor_kwargs()).to(device)
            noise["policy"] = s["actor"].noise((batch, steps))
        s["noise"] = noise
        return s


def _inputs(s: dict) -> dict:
    keys = ("state", "noise", "embed", "action")
    return {k: s[k] for k in keys if k in s}


def _call(mode: str, forward, wrt: dict, cot: Cotangents):
    if mode == "fwd":
        return forward_only(forward)
    if mode == "no-grad":
        return no_grad(forward)
    return forward_backward(forward, wrt, cot)


def _wrt(s: dict, *modules_with_prefix) -> dict:
    wrt = {k: s[k] for k in ("embed", "action") if k in s}
    for prefix, module in modules_with_prefix:
        wrt.update({f"{prefix}.{n}": p for n, p in module.named_parameters() if p.requires_grad})
    return wrt


def _ours(shape: UnrollShape, mode: str, backend: str, device: torch.device, compiled: bool = False) -> Candidate:
    def build(s: dict):
        require_backend(backend, device, _family(shape))
        if compiled and backend == "scan" and not torch_fixes.scan_compiles_correctly():
            raise Unavailable(f"scan under torch.compile is refused on torch {torch.__version__}: its gradients "
                              f"are wrong there (worldmodels/core/torch_fixes.py)")
        # a copy per row: what a backend caches on the module (CUDA graphs) goes away with its row
        rssm = copy.deepcopy(s["rssm"])
        if shape.kind == "observe":
            def forward():
                post, prior = rssm.observe(s["embed"], s["action"], s["is_first"], state=s["state"],
                                           noise=s["noise"], backend=backend)
                return {"post": post.to_dict(), "prior": prior.to_dict()}
            wrt = _wrt(s, ("rssm", rssm))
        else:
            actor = copy.deepcopy(s["actor"])

            def forward():
                return rssm.imagine(s["state"], shape.steps, policy=actor, noise=s["noise"], backend=backend).to_dict()
            wrt = _wrt(s, ("rssm", rssm), ("actor", actor))
        if compiled:  # compiled once here; the runner's warm-up calls absorb the compile
            forward = torch.compile(forward, fullgraph=True)
        return _call(mode, forward, wrt, s["cot"])
    name = f"ours:{backend}" + (" compiled" if compiled else "")
    settings = "worldmodels.RSSM, fp32, fixed noise" + (", torch.compile(fullgraph=True), inductor" if compiled else "")
    return Candidate(name, build, settings=settings)


def _seed(shape: UnrollShape, mode: str) -> Candidate:
    def build(s: dict):
        model = SeedRSSM.from_rssm(s["rssm"])
        if shape.kind == "observe":
            forward = lambda: model.observe(s["embed"], s["action"], s["is_first"], s["state"], s["noise"])  # noqa: E731
            wrt = _wrt(s, ("seed", model))
        else:
            actor = seed_actor(s["actor"])
            forward = lambda: model.imagine(s["state"], shape.steps, actor, s["noise"])  # noqa: E731
            wrt = _wrt(s, ("seed", model), ("actor", actor))
        return _call(mode, forward, wrt, s["cot"])
    cell = "GRUCell + Linear/ELU" if not shape.model.v3 else "block GRU + Linear/RMSNorm/SiLU"
    return Candidate("seed eager loop", build, kind="peer",
                     compare=lambda k: not k.startswith("grad.") or k in ("grad.embed", "grad.action"),
                     settings=f"classic per-step modules ({cell}), our weights and noise")


# ---------------------------------------------------------------------------------------- torchrl
def _torchrl(shape: UnrollShape, mode: str, device: torch.device, compile_: bool, rtol: float) -> list[Candidate]:
    cfg = shape.model
    if shape.kind == "imagine":
        return [_torchrl_imagine(shape, mode, device)]
    if cfg.v3:
        name, make = "torchrl RSSMRolloutV3", functools.partial(torchrl_peers.v3_rollout, cfg, device)
        variants = [("eager", {})]
        if compile_:
            variants += [("compile_rollout('step')", {"compile_scope": "step"}),
                         ("compile_rollout('scan', unroll=8)", {"compile_scope": "scan", "unroll": 8})]
    else:
        name, make = "torchrl RSSMRollout", functools.partial(torchrl_peers.v1_rollout, cfg, device)
        variants = [("eager", {})]
        if compile_:
            variants += [("compile_step=True", {"compile_step": True})]
    return [_torchrl_observe(f"{name} [{label}]", cfg, make, kwargs, mode, rtol) for label, kwargs in variants]


def _torchrl_observe(impl: str, cfg, make, kwargs: dict, mode: str, rtol: float) -> Candidate:
    compiled = bool(kwargs)
    # compile_rollout("scan") draws its uniforms inside the compiled region, from inductor's RNG
    # (torchrl documents that eager and compiled streams differ): only the first step, which no
    # sample has reached yet, can be compared there
    first_step_only = kwargs.get("compile_scope") == "scan"

    def timed(s: dict, module):
        data = torchrl_peers.observe_input(cfg, s)
        forward = lambda: torchrl_peers.observe_outputs(module(data))  # noqa: E731
        return _call(mode, forward, _wrt(s, ("rollout", module)), s["cot"])

    state: dict = {}

    def build(s: dict):
        torch.manual_seed(SEED)
        eager = make()
        module = eager
        if compiled:
            module = make(**kwargs)
            module.load_state_dict(eager.state_dict())
            state["eager"] = timed(s, eager)
        torch.manual_seed(SEED)  # the first call and the check below draw the same random numbers
        return timed(s, module)

    def check(first) -> float:
        torch.manual_seed(SEED)
        actual, reference = flatten(first), flatten(state.pop("eager")())
        if first_step_only:
            pick = lambda outs: {k: v[:, 0] for k, v in outs.items() if k.endswith("_logits")}  # noqa: E731
            actual, reference = pick(actual), pick(reference)
        return assert_parity(actual, reference, rtol)

    settings = "fp32, own weights, same inputs" + ("" if cfg.v3 else ", same noise")
    if compiled:
        parity = "vs torchrl eager, step 0 logits (compiled RNG differs)" if first_step_only else \
            "vs torchrl eager (same seed)"
        return Candidate(impl, build, kind="peer", parity=f"own:{parity}", check=check, settings=settings)
    return Candidate(impl, build, kind="peer", parity="not comparable (own parameterisation)", settings=settings)


def _torchrl_imagine(shape: UnrollShape, mode: str, device: torch.device) -> Candidate:
    def build(s: dict):
        torch.manual_seed(SEED)
        env, actor, params = torchrl_peers.imagination(shape.model, device)
        forward = lambda: torchrl_peers.imagine(env, actor, s["state"], shape.steps)  # noqa: E731
        wrt = {f"param.{i}": p for i, p in enumerate(params) if p.requires_grad}
        return _call(mode, forward, wrt, s["cot"])
    dist = "one-hot" if shape.model.v3 else "tanh-normal"
    return Candidate("torchrl DreamerEnv.rollout", build, kind="peer",
                     parity="not comparable (own parameterisation)",
                     settings=f"eager (the DreamerV3ActorLoss path), {dist} actor + linear reward head, fp32")
