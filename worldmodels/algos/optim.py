"""Optimiser steps (Adam, or LaProp as DreamerV3's reference runs it) with adaptive gradient clipping
(AGC, as in DreamerV3) or global-norm clipping."""

from __future__ import annotations

import torch
from torch import nn

def adaptive_clip_(params, clip: float, eps: float = 1e-3) -> None:
    """Scale each parameter's gradient so that ||grad|| <= clip * max(||param||, eps)."""
    params = [p for p in params if p.grad is not None]
    grads = [p.grad for p in params]
    limits = torch.stack(torch._foreach_norm([p.detach() for p in params])).clamp(min=eps) * clip
    norms = torch.stack(torch._foreach_norm(grads))
    scales = (limits / norms.clamp(min=1e-12)).clamp(max=1.0)
    torch._foreach_mul_(grads, list(scales.unbind()))


class LaProp(torch.optim.Optimizer):
    """LaProp (Ziyin et al. 2020) as danijar/dreamerv3 (2411f7d, jaxutils.Optimizer with scaler rms,
    momentum on) chains it: the gradient divided by its bias-corrected RMS, then a bias-corrected
    momentum of that, times lr and a linear warmup factor min(1, updates so far / warmup) (0 on the
    first update, as there). Per parameter p with gradient g, at update t = 1, 2, ...:
        v = b2 v + (1 - b2) g^2;  u = g / (sqrt(v / (1 - b2^t)) + eps)
        m = b1 m + (1 - b1) u;    p -= lr * min(1, (t - 1) / warmup) * m / (1 - b1^t)
    The step count is a tensor on the parameters' device, so a step can be captured in a CUDA graph.

    Args:
        params: the parameters.
        lr: learning rate.
        betas: (b1, b2): the momentum's and the RMS's decay.
        eps: added to the RMS (the reference's 1e-20: practically none).
        warmup: updates over which the step size ramps up linearly from 0 (0: none).
    """

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-20,
                 warmup: int = 0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, warmup=warmup, capturable=False))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                if not self.state[p]:
                    self.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=p.device),
                                     "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                     "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
            states = [self.state[p] for p in params]
            b1, b2 = group["betas"]
            grads = [p.grad for p in params]
            steps = [s["step"] for s in states]
            mus, nus = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
            done = steps[0].to(params[0].dtype, copy=True)  # updates so far: every parameter steps together
            warm = (done / group["warmup"]).clamp(max=1.0) if group["warmup"] > 0 else torch.ones_like(done)
            t = done + 1  # this update's number, for the bias corrections
            torch._foreach_add_(steps, 1.0)
            torch._foreach_mul_(nus, b2)
            torch._foreach_addcmul_(nus, grads, grads, value=1 - b2)
            denom = torch._foreach_mul(nus, 1.0 / (1 - torch.pow(b2, t)))
            torch._foreach_sqrt_(denom)
            torch._foreach_add_(denom, group["eps"])
            torch._foreach_mul_(mus, b1)
            torch._foreach_add_(mus, torch._foreach_div(grads, denom), alpha=1 - b1)
            scale = -group["lr"] * warm / (1 - torch.pow(b1, t))
            torch._foreach_add_(params, torch._foreach_mul(mus, scale))
        return None


OPTIMIZERS = ("adam", "laprop")


class LossScale:
    """The dynamic loss scale of float16 compute, as DreamerV3's 2023 reference runs it
    (jaxutils.Optimizer under `precision: float16`): the loss is multiplied by `scale` before the
    backward and the gradients divided by it after; an update whose gradients are not all finite is
    skipped (weights and optimiser state untouched) and halves the scale; `interval` finite updates in a
    row double it at the next finite one; the scale starts at `high` and stays within [low, high]. Its
    state is device tensors updated in place (no host sync), so a captured update carries it.

    Args:
        low, high: the scale's bounds (the reference's 1e-4 and 1e4; it starts at high).
        interval: finite updates in a row before the scale doubles.
    """

    def __init__(self, low: float = 1e-4, high: float = 1e4, interval: int = 1000):
        self.low, self.high, self.interval = low, high, interval
        self.scale: torch.Tensor | None = None  # made on the parameters' device at the first update
        self.good = self.found_inf = None

    def _ensure(self, device: torch.device) -> None:
        if self.scale is None or self.scale.device != device:
            state = None if self.scale is None else self.state_dict()
            self.scale = torch.full((), self.high, dtype=torch.float32, device=device)
            self.good = torch.zeros((), dtype=torch.int32, device=device)
            self.found_inf = torch.zeros((), dtype=torch.float32, device=device)
            if state is not None:
                self.load_state_dict(state)

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        self._ensure(loss.device)
        return loss * self.scale

    def unscale_(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """Divide `grads` by the scale in place; returns `found_inf` (1.0 if any is not finite)."""
        self.found_inf.zero_()
        torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found_inf, self.scale.reciprocal())
        return self.found_inf

    def update_(self) -> None:
        """After the step: the reference's schedule (keep, double after `interval` good, halve on inf)."""
        finite = self.found_inf == 0
        keep = finite & (self.good < self.interval)
        grow = finite & (self.good >= self.interval)
        self.good.copy_(torch.where(keep, self.good + 1, 0))
        scale = torch.where(grow, self.scale * 2, torch.where(finite, self.scale, self.scale * 0.5))
        self.scale.copy_(scale.clamp(self.low, self.high))

    def state_dict(self) -> dict:
        if self.scale is None:
            return {}
        return {"scale": self.scale.detach().cpu().clone(), "good": self.good.detach().cpu().clone()}

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        if self.scale is None:
            self._ensure(state["scale"].device)
        self.scale.copy_(state["scale"])  # in place: a captured update reads these tensors
        self.good.copy_(state["good"])


class Optimizer:
    """Adam (or LaProp) on one module's parameters; `step(loss)` = zero_grad, backward, clip, step.
    `reduce`, when set (a callable on the list of gradients), runs right after the backward: under
    torchrun the trainer sets it to average the gradients over ranks (`train/distributed.py`).

    Args:
        module: whose parameters (those that require grad) it steps.
        lr: learning rate.
        eps: added to the second-moment root.
        agc: > 0: clip each parameter's gradient adaptively (||g|| <= agc * max(||p||, 1e-3)).
        clip: > 0 (and agc 0): clip the global gradient norm.
        kind: "adam" (torch's fused Adam) or "laprop" (`LaProp`, DreamerV3's reference).
        warmup: LaProp's linear warmup in updates (0: none; Adam takes none).
        loss_scale: scale the loss for float16 compute (`LossScale`); Adam only (its fused step skips
            an update with non-finite gradients on the device). `use_loss_scale()` turns it on later.
    """

    def __init__(self, module: nn.Module, *, lr: float, eps: float = 1e-8, agc: float = 0.0, clip: float = 0.0,
                 kind: str = "adam", warmup: int = 0, loss_scale: bool = False):
        if kind not in OPTIMIZERS:
            raise ValueError(f"kind={kind!r} is not an optimiser here; expected one of {list(OPTIMIZERS)}")
        if warmup and kind != "laprop":
            raise ValueError(f"warmup={warmup} is LaProp's (kind='laprop'); kind={kind!r} takes none")
        self.kind = kind
        self.params = [p for p in module.parameters() if p.requires_grad]
        # torch's fused Adam: a few launches per step for all parameters
        self.opt = (torch.optim.Adam(self.params, lr=lr, eps=eps, fused=True) if kind == "adam"
                    else LaProp(self.params, lr=lr, eps=eps, warmup=warmup))
        self.agc, self.clip = agc, clip
        self.reduce = None  # data-parallel runs: averages the gradients over ranks in place (train/distributed.py)
        self.version = 0  # counts load_state_dict calls (`train/graphed_update.py` captures again)
        self.loss_scale: LossScale | None = None
        self._own_backward = False  # inside step(): apply() follows the backward of this optimiser's loss
        if loss_scale:
            self.use_loss_scale()

    def use_loss_scale(self) -> None:
        """Scale this optimiser's loss from now on (float16 compute: `LossScale`)."""
        if self.kind != "adam":
            raise ValueError(f"a loss scale needs kind='adam' (its fused step skips non-finite updates); "
                             f"kind={self.kind!r} has none")
        if self.loss_scale is None:
            self.loss_scale = LossScale()

    def step(self, loss: torch.Tensor) -> torch.Tensor:
        """One update; returns the gradient norm before clipping (0-d, on the device: no sync).

        The backward computes this optimiser's gradients only. A loss that also reaches other
        modules' weights (an actor loss backpropagated through the world model's dynamics) leaves
        their `.grad` as it was: in a captured update, accumulating into a gradient that another
        optimiser's `zero_grad` then drops would write, on every replay, into memory the graph does
        not own (freed, reused, and unmapped by the next `torch.cuda.empty_cache()`)."""
        self.zero_grad()
        if self.loss_scale is not None:
            loss = self.loss_scale.scaled(loss)
        loss.backward(inputs=self.params)
        self._own_backward = True
        try:
            return self.apply()
        finally:
            self._own_backward = False

    def zero_grad(self) -> None:
        self.opt.zero_grad(set_to_none=True)

    def apply(self) -> torch.Tensor:
        """Step on the gradients already there (reduced over ranks, clipped); their norm before clipping.
        With `zero_grad` around one backward of a sum of losses, several optimisers step from it; not
        with a loss scale, which needs the backward of this optimiser's own scaled loss (`step`)."""
        if self.loss_scale is not None and not self._own_backward:
            raise RuntimeError("this optimiser scales its loss (float16): step(loss) runs the backward of its "
                               "own scaled loss; apply() after a shared backward would divide unscaled gradients")
        grads = [p.grad for p in self.params if p.grad is not None]
        if self.reduce is not None:  # before the norm and clipping: those of the global batch's gradient
            self.reduce(grads)
        if self.loss_scale is not None:  # the fused step skips the update where found_inf is set
            self.opt.found_inf = self.loss_scale.unscale_(grads)
        norm = torch.nn.utils.get_total_norm(grads)
        if self.agc > 0:
            adaptive_clip_(self.params, self.agc)
        elif self.clip > 0:  # clip_grad_norm_ with the norm above, not computed a second time
            torch.nn.utils.clip_grads_with_norm_(self.params, self.clip, norm)
        self.opt.step()
        if self.loss_scale is not None:
            self.loss_scale.update_()
        if torch.is_autocast_enabled(self.params[0].device.type):
            # an update run inside one autocast region: forwards after this step must cast the new
            # weights, not reuse the casts autocast cached before it (torch keeps them per region)
            torch.clear_autocast_cache()
        return norm.detach()

    def capturable_(self) -> None:
        """Let `step` be captured in a CUDA graph (torch's `capturable`: the step counts on the device)."""
        for group in self.opt.param_groups:
            group["capturable"] = True
        for p, state in self.opt.state.items():
            if "step" in state and state["step"].device != p.device:
                state["step"] = state["step"].to(p.device, torch.float32)

    def reset_state_(self) -> None:
        """Back to a fresh Adam (zero moments, step 0), in place: the state keeps its storage, so a
        CUDA graph that captured `step` stays valid."""
        for state in self.opt.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    value.zero_()

    def state_dict(self) -> dict:
        state = self.opt.state_dict()
        if self.loss_scale is not None:
            state["loss_scale"] = self.loss_scale.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        scale = state.pop("loss_scale", {})
        self.opt.load_state_dict(state)
        if self.loss_scale is not None:
            self.loss_scale.load_state_dict(scale)  # none stored (a run without it): it starts afresh
        self.version += 1  # new state tensors: a captured step reads the old ones
