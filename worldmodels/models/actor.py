"""`Actor`: the policy read by imagination and by the collector.

`actor(features[..., F], noise=None) -> action[..., A]`, sampled from pre-drawn noise (see
`noise`), so `RSSM.imagine` gives the same rollout on every backend. `dist(features)` gives the
distribution for log-probs and entropies (REINFORCE, exploration bonuses).

The distributions (`DISTS`) and their formulas are the pure op's (`ops/actor.py`). "bounded_normal"
(DreamerV3's reference, danijar/dreamerv3 2411f7d nets.Dist "normal") also initialises the output
layer's weights times 0.01 (outscale) and its bias to zero; its samples are not squashed: the
collector clips what it sends to the env and stores the sample, as the reference's ClipAction does.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from worldmodels.models.dists import TanhNormal, gumbel_noise
from worldmodels.models.layers import ACT_MODULES, check_choice, mlp
from worldmodels.ops.actor import DISTS, ActorSpec, dist_params, sample


class Actor(nn.Module):
    """The policy: features [..., F] -> action [..., A] (a sample; `dist(features).mode` for the
    deterministic one). On an RSSM, F is its `feature_dim`.

    Args:
        feat_dim: feature size F (`RSSM.feature_dim`).
        action_dim: action size A.
        hidden: MLP width.
        layers: hidden layers of the MLP.
        dist: one of `DISTS` (see the module docstring); "onehot" for discrete actions.
        act: activation ("elu", "silu", "relu").
        norm: feature norm after each hidden layer ("none", "rms", "layer").
        min_std: the continuous distributions' std floor.
        max_std: "bounded_normal"'s std ceiling.
        init_std: "tanh_normal" / "normal": the std before training, min_std + init_std (None: softplus of
            the initial raw output). Dreamer V1's code shifts the raw std by softplus^-1(5) (action_init_std
            5); setting the std outputs' bias to that shift is the same function and the same gradients.
        unimix: uniform mix of the categorical's probabilities ("onehot").
        linear_bias: "auto" (a hidden layer before a norm has no bias) or "always" (`layers.LINEAR_BIASES`).
    """

    def __init__(self, feat_dim: int, action_dim: int, *, hidden: int, layers: int, dist: str = "tanh_normal",
                 act: str = "elu", norm: str = "none", min_std: float = 0.1, max_std: float = 1.0,
                 unimix: float = 0.01, init_std: float | None = None, linear_bias: str = "auto"):
        super().__init__()
        self.dist_type = check_choice("dist", dist, DISTS)
        if dist == "bounded_normal" and not 0 < min_std < max_std:
            raise ValueError(f"bounded_normal needs 0 < min_std < max_std, got min_std={min_std}, max_std={max_std}")
        self.feat_dim, self.action_dim = feat_dim, action_dim
        self.min_std, self.max_std, self.unimix = min_std, max_std, unimix
        out = action_dim if dist == "onehot" else 2 * action_dim
        self.net = mlp(feat_dim, out, hidden, layers, norm, act, linear_bias)
        if init_std is not None:
            if dist not in ("tanh_normal", "normal") or init_std <= 0:
                raise ValueError(f"init_std={init_std} needs dist tanh_normal or normal and a positive value")
            with torch.no_grad():
                self.net[-1].bias[action_dim:] = math.log(math.expm1(init_std))  # softplus^-1(init_std)
        if dist == "bounded_normal":
            with torch.no_grad():
                self.net[-1].weight.mul_(0.01)
                self.net[-1].bias.zero_()

    def op_spec(self) -> ActorSpec:
        """This Actor's math as `ops/actor.py` takes it (its `named_parameters()` are the weights), read
        from its modules as they are: a norm or an activation swapped in place shows here."""
        *blocks, _ = self.net  # (unpacked: a Sequential's int index walks its modules each time)
        hidden, act, norm, eps, bias = 0, "elu", "none", None, "auto"
        if blocks:
            linear, norm_layer, activation = blocks[0]
            hidden, eps = linear.out_features, getattr(norm_layer, "eps", None)
            act = {module: name for name, module in ACT_MODULES.items()}[type(activation)]
            norm = "none" if isinstance(norm_layer, nn.Identity) else (
                "rms" if isinstance(norm_layer, nn.RMSNorm) else "layer")
            bias = "always" if norm != "none" and linear.bias is not None else "auto"
        return ActorSpec(feat_dim=self.feat_dim, action_dim=self.action_dim, hidden=hidden, layers=len(blocks),
                         dist=self.dist_type, act=act, norm=norm, eps=eps, min_std=self.min_std,
                         max_std=self.max_std, unimix=self.unimix, linear_bias=bias)

    def _params(self, features: torch.Tensor):
        if features.shape[-1] != self.feat_dim:
            raise ValueError(f"features must be [..., {self.feat_dim}], got {list(features.shape)}")
        return dist_params(self.net(features), self.dist_type, min_std=self.min_std, max_std=self.max_std,
                           unimix=self.unimix)

    def noise(self, batch_shape, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """The noise one call per element of `batch_shape` consumes: [*batch_shape, A]."""
        p = next(self.parameters())
        shape = (*batch_shape, self.action_dim)
        if self.dist_type == "onehot":
            return gumbel_noise(shape, dtype=p.dtype, device=p.device, generator=generator)
        return torch.randn(shape, dtype=p.dtype, device=p.device, generator=generator)

    def forward(self, features: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        if noise is None:
            noise = self.noise(features.shape[:-1])
        return sample(self.dist_type, self._params(features), noise)

    def dist(self, features: torch.Tensor) -> torch.distributions.Distribution:
        params = self._params(features)
        if self.dist_type == "onehot":
            # straight-through samples are one-hot only up to rounding (onehot + p - p.detach())
            return torch.distributions.OneHotCategoricalStraightThrough(logits=params[0], validate_args=False)
        if self.dist_type == "tanh_normal":
            return TanhNormal(*params)
        # no argument validation: it reads device values (a sync, and illegal in a CUDA-graph capture)
        return torch.distributions.Independent(torch.distributions.Normal(*params, validate_args=False), 1,
                                               validate_args=False)


class StopGradientInputs(nn.Module):
    """A policy on stop-gradient features: `policy(features.detach(), *noise)` (an actor that learns by
    backpropagating returns through the imagined dynamics reads its state so, as the references do).
    Wrapping an `Actor`, it is one to the fused imagination kernel too (`op_spec` says stop_features).

    Args:
        policy: the module it wraps (the actor; its parameters stay the actor's, named `policy.*` here).
    """

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.policy = policy

    def forward(self, features: torch.Tensor, *noise):
        return self.policy(features.detach(), *noise)

    def noise(self, *args, **kwargs):
        return self.policy.noise(*args, **kwargs)

    @property
    def dist_type(self) -> str | None:
        return getattr(self.policy, "dist_type", None)

    def op_spec(self) -> ActorSpec:
        """The wrapped Actor's spec with `stop_features` set."""
        return dataclasses.replace(self.policy.op_spec(), stop_features=True)


def is_stopped_actor(policy: object) -> bool:
    """Whether `policy` is an `Actor` behind `StopGradientInputs`: what the fused imagination kernel runs
    as that Actor, with its spec's `stop_features` set."""
    return isinstance(policy, StopGradientInputs) and isinstance(policy.policy, Actor)
