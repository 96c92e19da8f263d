"""The Actor's math as pure functions of tensors: its MLP, its distribution's parameters and its
sample from pre-drawn noise, given an `ActorSpec` and the weights (`worldmodels.Actor` owns them and
builds the spec: `Actor.op_spec()`; its `named_parameters()` are the weights), as
`ops/rssm/reference.py` is the RSSM's.

    mlp(spec, weights, features [..., F]) -> raw [..., A] ("onehot") or [..., 2A] (mean | raw std)
    dist_params(raw, dist, *, min_std, max_std, unimix) -> (logits,) or (mean, std), each [..., A]
    sample(dist, params, noise [..., A]) -> action [..., A]
    sample_action(spec, weights, features, noise) -> action [..., A]    (the three in turn)

The distribution's two take its fields rather than the spec: the Actor module calls them on its
own (live) attributes, under whatever MLP it holds.

Weights, named as the Actor's parameters: hidden layer i < layers `net.{i}.0.weight` [hidden, in]
(with `net.{i}.0.bias` when there is no norm), its norm's `net.{i}.1.weight` (and `net.{i}.1.bias`
for LayerNorm); the output layer `net.{layers}.weight` [out, hidden] and `net.{layers}.bias`.
Noise (`Actor.noise`): standard Gumbel for "onehot", standard normal eps otherwise.

Distributions (the continuous heads output [mean | raw std]):
- "tanh_normal" (Dreamer V1): tanh(N(mean, softplus(raw) + min_std)), mean soft-clipped to +-5;
- "normal": N(mean, softplus(raw) + min_std);
- "bounded_normal" (DreamerV3's reference): N(tanh(mean), (max_std - min_std) sigmoid(raw + 2) + min_std);
- "onehot": a one-hot categorical with `unimix` of uniform mixed into its probabilities,
  sampled as argmax(logits + Gumbel noise) with straight-through gradients.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from worldmodels.core import torch_fixes
from worldmodels.ops.activations import activate
from worldmodels.ops.sampling import sample_onehot, unimix_logits

Weights = dict[str, torch.Tensor]

DISTS = ("tanh_normal", "normal", "bounded_normal", "onehot")


@dataclasses.dataclass(frozen=True)
class ActorSpec:
    """The static shape of an Actor's math (hashable: a cache key, and what the fused op carries).

    Args:
        feat_dim, action_dim: feature size F and action size A.
        hidden, layers: the MLP's width and its number of hidden layers (hidden 0 without any).
        dist: one of `DISTS`.
        act: the hidden layers' activation, "elu", "silu" or "relu".
        norm: the hidden layers' norm, "none", "rms" or "layer"; eps its epsilon (None without a norm,
            or for an RMSNorm built with eps=None: torch's default).
        min_std, max_std: the continuous distributions' std floor (and "bounded_normal"'s ceiling).
        unimix: uniform mix of the categorical's probabilities ("onehot").
        stop_features: the Actor reads its features through a stop-gradient (`StopGradientInputs`: an actor
            that learns by backpropagation through the dynamics, whose gradient must not reach the
            world model through its own input).
        linear_bias: "auto" (a hidden Linear before a norm has no bias) or "always" (it has one),
            `models/layers.LINEAR_BIASES`.
    """

    feat_dim: int
    action_dim: int
    hidden: int
    layers: int
    dist: str
    act: str
    norm: str
    eps: float | None
    min_std: float
    max_std: float
    unimix: float
    stop_features: bool = False
    linear_bias: str = "auto"


def weight_names(spec: ActorSpec) -> list[str]:
    """The weights' names: the parameters the Actor's constructor makes, in `named_parameters` order."""
    names = []
    for i in range(spec.layers):
        names.append(f"net.{i}.0.weight")
        if spec.norm == "none" or spec.linear_bias == "always":
            names.append(f"net.{i}.0.bias")
        if spec.norm != "none":
            names.append(f"net.{i}.1.weight")
            if spec.norm == "layer":
                names.append(f"net.{i}.1.bias")
    return [*names, f"net.{spec.layers}.weight", f"net.{spec.layers}.bias"]


def mlp(spec: ActorSpec, weights: Weights, features: torch.Tensor) -> torch.Tensor:
    """The head's raw output: `layers` of Linear -> norm -> act, then the output Linear."""
    x = features
    for i in range(spec.layers):
        x = F.linear(x, weights[f"net.{i}.0.weight"], weights.get(f"net.{i}.0.bias"))
        if spec.norm == "rms":
            x = torch_fixes.rms_norm(x, weights[f"net.{i}.1.weight"], spec.eps)
        elif spec.norm == "layer":
            x = F.layer_norm(x, x.shape[-1:], weights[f"net.{i}.1.weight"], weights[f"net.{i}.1.bias"], spec.eps)
        x = activate(spec.act, x)
    return F.linear(x, weights[f"net.{spec.layers}.weight"], weights[f"net.{spec.layers}.bias"])


def dist_params(raw: torch.Tensor, dist: str, *, min_std: float, max_std: float,
                unimix: float) -> tuple[torch.Tensor, ...]:
    """Distribution `dist`'s parameters from the head's raw output: (logits,) or (mean, std)."""
    if dist == "onehot":
        return (unimix_logits(raw, unimix),)
    mean, std = raw.chunk(2, -1)
    if dist == "bounded_normal":
        return torch.tanh(mean), (max_std - min_std) * torch.sigmoid(std + 2.0) + min_std
    if dist == "tanh_normal":
        mean = 5 * torch.tanh(mean / 5)  # keeps the pre-tanh mean out of saturation
    return mean, F.softplus(std) + min_std


def sample(dist: str, params: tuple[torch.Tensor, ...], noise: torch.Tensor) -> torch.Tensor:
    """The action the pre-drawn noise picks from distribution `dist` with these parameters."""
    if dist == "onehot":
        return sample_onehot(params[0], noise)
    mean, std = params
    action = mean + std * noise
    return torch.tanh(action) if dist == "tanh_normal" else action


def sample_action(spec: ActorSpec, weights: Weights, features: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The Actor's call, `Actor(features, noise)` (or `StopGradientInputs(actor)(features, noise)`), on
    explicit weights."""
    raw = mlp(spec, weights, features.detach() if spec.stop_features else features)
    params = dist_params(raw, spec.dist, min_std=spec.min_std, max_std=spec.max_std, unimix=spec.unimix)
    return sample(spec.dist, params, noise)
