"""The RSSM's math as pure functions of tensors, and its unrolls on the loop driver (the reference).

    observe(spec, weights, deter, stoch, action, embed, is_first, post_noise, prior_noise)
        -> (post, prior): dicts of [B, T, ...] tensors
    imagine(spec, weights, deter, stoch, prior_noise, *, actions=None, policy=None,
            policy_params=None, policy_noise=None) -> dict of [N, H, ...] tensors

Shapes: deter [B, D], stoch [B, S] (S = stoch, or stoch * classes flattened); action [B, T, A]
(the action taken before observation t); embed [B, T, E]; is_first [B, T] bool (state and action
reset to zeros before step t); noise [B, T, stoch] (Gaussian eps) or [B, T, stoch, classes] (Gumbel).
Outputs: "deter", "stoch" and the distribution's parameters ("mean"/"std" or "logits");
`imagine` adds "action". `policy(features, noise) -> action` runs in the loop, called through
`functional_call` with `policy_params` when given, so the weights it reads are explicit inputs; a
policy may also be an `ActorSpec`, the Actor's pure op (`ops/actor.py`) on `policy_params`.
`cache` (an `UnrollCache` the module owns) is for backends that keep per-shape state (cudnn's
CUDA graphs); the reference ignores it.

The weights are a flat dict named by role (built by `RSSM.op_weights`): a dense layer `name`
has `name.w`, optional `name.b`, and with a norm `name.norm_w` (and `name.norm_b` for LayerNorm).

One prior step:      x = in(stoch, action); deter = cell(x, deter); prior = prior_head(deter)
One filtering step:  the prior step's deter, then post = post_head(deter, embed), stoch ~ post.
Work that does not depend on the carry runs once over all steps, off the recurrent chain: the
action's share of the cell input, the embedding's share of the posterior, and in `observe` the
prior head.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F
from torch.func import functional_call

from worldmodels.core import torch_fixes
from worldmodels.core.unroll import Driver, loop_unroll
from worldmodels.ops import activations
from worldmodels.ops.actor import ActorSpec, sample_action
from worldmodels.ops.sampling import gaussian_params, sample_gaussian, sample_onehot, unimix_logits
from worldmodels.ops.rnn.reference import gru_cell

Weights = dict[str, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class RSSMSpec:
    """The static shape of an RSSM's math (hashable: a cache key for compiled/captured unrolls).

    Args:
        cell: "gru" (PlaNet / V1, dense GRUCell), "norm_gru" (the 2023 DreamerV3's dense GRU: one
            normalised Linear over [deter, x] gives the gates) or "block_gru" (DreamerV3, block-diagonal).
        deter, stoch, hidden: state, latent and hidden sizes; classes: None (Gaussian) or classes per latent.
        blocks: block count of the block GRU.
        norm: "none", "rms" or "layer"; norm_eps its epsilon; act: "elu", "silu" or "relu".
        min_std: Gaussian std floor; unimix: uniform mix of categorical probabilities.
        dyn_hidden: width of the block GRU's hidden layer over all blocks (0: `hidden`; DreamerV3's
            reference: `deter`); dyn_norm: that layer normalised per block ("block") or as one
            vector ("all", the reference's); prior_layers: hidden layers of the prior head.
        initial: the state an episode starts from: "zeros", or "learned" (the 2023 DreamerV3's: deter
            = tanh(w["initial"]), stoch the prior's mode there; `with_initial` adds them to the weights).
    """

    cell: str
    deter: int
    stoch: int
    hidden: int
    classes: int | None
    blocks: int
    norm: str
    norm_eps: float
    act: str
    min_std: float
    unimix: float
    dyn_hidden: int = 0
    dyn_norm: str = "block"
    prior_layers: int = 1
    initial: str = "zeros"


# ---------------------------------------------------------------------- layers
def normalize(spec: RSSMSpec, w: Weights, name: str, x: torch.Tensor) -> torch.Tensor:
    if spec.norm == "rms":
        return torch_fixes.rms_norm(x, w[f"{name}.norm_w"], spec.norm_eps)  # fused under bf16 autocast too
    if spec.norm == "layer":
        return F.layer_norm(x, x.shape[-1:], w[f"{name}.norm_w"], w[f"{name}.norm_b"], spec.norm_eps)
    return x


def activate(spec: RSSMSpec, x: torch.Tensor) -> torch.Tensor:
    return activations.activate(spec.act, x)


def linear(w: Weights, name: str, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w[f"{name}.w"], w.get(f"{name}.b"))


def dense(spec: RSSMSpec, w: Weights, name: str, x: torch.Tensor) -> torch.Tensor:
    """Linear -> norm -> act."""
    return activate(spec, normalize(spec, w, name, linear(w, name, x)))


# ---------------------------------------------------------------------- pieces of one step
def action_in(spec: RSSMSpec, w: Weights, action: torch.Tensor) -> torch.Tensor:
    """The action's share of the cell input (independent of the carry). Actions are scaled by
    max(1, |a|) so that out-of-range actions cannot blow up the state."""
    action = action / torch.clamp(action.abs(), min=1).detach()
    return linear(w, "in_action", action) if spec.cell in ("gru", "norm_gru") else dense(spec, w, "in_action", action)


def embed_in(w: Weights, embed: torch.Tensor) -> torch.Tensor:
    """The embedding's share of the posterior's first layer."""
    return linear(w, "post_embed", embed)


def cell(spec: RSSMSpec, w: Weights, deter, stoch, action_share, vendor: bool = False) -> torch.Tensor:
    """The next deter. `vendor`: the dense GRU step as torch's fused `gru_cell` kernel."""
    if spec.cell == "norm_gru":  # danijar/dreamerv3 423291a nets.RSSM img_in and _gru
        x = activate(spec, normalize(spec, w, "in", linear(w, "in_stoch", stoch) + action_share))
        gates = normalize(spec, w, "gates", linear(w, "gates", torch.cat([deter, x], -1)))
        reset, cand, update = gates.chunk(3, -1)
        cand = torch.tanh(torch.sigmoid(reset) * cand)
        update = torch.sigmoid(update - 1)
        return update * cand + (1 - update) * deter
    if spec.cell == "gru":
        x = activate(spec, normalize(spec, w, "in", linear(w, "in_stoch", stoch) + action_share))
        if vendor:
            return torch.gru_cell(x, deter, w["gru.w_ih"], w["gru.w_hh"], w.get("gru.b_ih"), w.get("gru.b_hh"))
        gates_x = F.linear(x, w["gru.w_ih"], w.get("gru.b_ih"))
        return gru_cell(deter, gates_x, w["gru.w_hh"], w.get("gru.b_hh"), "ieee")
    # block GRU: every block [..., G, D/G] reads the shared input and its own slice of deter
    x = torch.cat([dense(spec, w, "in_deter", deter), dense(spec, w, "in_stoch", stoch), action_share], -1)
    blocks = deter.unflatten(-1, (spec.blocks, -1))
    u = linear(w, "dyn_x", x).unflatten(-1, (spec.blocks, -1)) + torch.einsum("...gd,gdh->...gh", blocks, w["dyn_h"])
    if spec.dyn_norm == "all":
        u = activate(spec, normalize(spec, w, "dyn_out", u.flatten(-2))).unflatten(-1, (spec.blocks, -1))
    else:
        u = activate(spec, normalize(spec, w, "dyn_out", u))
    gates = torch.einsum("...gh,gho->...go", u, w["gates.w"]) + w["gates.b"]
    reset, cand, update = gates.chunk(3, -1)
    cand = torch.tanh(torch.sigmoid(reset) * cand)
    update = torch.sigmoid(update - 1)  # bias -1: start out keeping the old state
    return (update * cand + (1 - update) * blocks).flatten(-2)


def dist(spec: RSSMSpec, stats: torch.Tensor, noise: torch.Tensor) -> dict[str, torch.Tensor]:
    """Distribution parameters and a sample from a head's output."""
    if spec.classes:
        logits = unimix_logits(stats.unflatten(-1, (spec.stoch, spec.classes)), spec.unimix)
        return {"stoch": sample_onehot(logits, noise).flatten(-2), "logits": logits}
    mean, std = gaussian_params(stats, spec.min_std)
    return {"stoch": sample_gaussian(mean, std, noise), "mean": mean, "std": std}


def prior(spec: RSSMSpec, w: Weights, deter, noise) -> dict[str, torch.Tensor]:
    h = dense(spec, w, "prior", deter)
    for i in range(1, spec.prior_layers):
        h = dense(spec, w, f"prior{i}", h)
    return {"deter": deter, **dist(spec, linear(w, "prior_out", h), noise)}


def posterior(spec: RSSMSpec, w: Weights, deter, embed_share, noise) -> dict[str, torch.Tensor]:
    h = activate(spec, normalize(spec, w, "post", linear(w, "post_deter", deter) + embed_share))
    return {"deter": deter, **dist(spec, linear(w, "post_out", h), noise)}


def call_policy(policy, policy_params, features, *noise, action_dim: int):
    """The policy on explicit weights when it has them (a module, or an `ActorSpec`: the Actor's pure
    op on `policy_params`), else as it is; its action is checked here (static shapes: free under
    tracing), so a wrong return fails clearly."""
    if isinstance(policy, ActorSpec):
        action = sample_action(policy, policy_params, features, *noise)
    elif policy_params:
        action = functional_call(policy, policy_params, (features, *noise))
    else:
        action = policy(features, *noise)
    if not isinstance(action, torch.Tensor):
        raise TypeError(f"policy(features, noise) must return an action tensor [N, {action_dim}], "
                        f"got {type(action).__name__}")
    if action.shape != (*features.shape[:-1], action_dim):
        raise ValueError(f"policy(features, noise) must return [N, action_dim] = "
                         f"{[*features.shape[:-1], action_dim]}, got {list(action.shape)}")
    return action


def with_initial(spec: RSSMSpec, w: Weights) -> Weights:
    """The weights, with the learned initial state ("initial.deter" [D], "initial.stoch" [S]) where
    `spec.initial` is "learned": computed once per unroll (inside a capture, from the parameter)."""
    if spec.initial != "learned":
        return w
    deter = torch.tanh(w["initial"])
    noise_shape = (spec.stoch, spec.classes) if spec.classes else (spec.stoch,)
    # zero noise: the sample is the mode, and its gradient the reference's `dist.mode()`'s: a Gaussian's mean
    # passes one, a categorical's one-hot none (its straight-through sample would also train the prior
    # head and `initial` on every episode's first step)
    mode = prior(spec, w, deter, torch.zeros(noise_shape, dtype=deter.dtype, device=deter.device))["stoch"]
    return {**w, "initial.deter": deter, "initial.stoch": mode.detach() if spec.classes else mode}


# ---------------------------------------------------------------------- step functions (carry, x, params)
def obs_step_fn(spec: RSSMSpec, vendor: bool = False):
    """x = (action_share, embed_share, reset [B, 1], posterior noise); params = the weights
    (`with_initial`'s, for a learned initial state)."""
    def step(carry, x, w):
        deter, stoch = carry
        action_share, embed_share, reset, noise = x
        if spec.initial == "learned":
            deter0, stoch0 = w["initial.deter"], w["initial.stoch"]
        else:
            deter0, stoch0 = torch.zeros_like(deter), torch.zeros_like(stoch)  # the initial state is zeros
        deter, stoch = torch.where(reset, deter0, deter), torch.where(reset, stoch0, stoch)
        post = posterior(spec, w, cell(spec, w, deter, stoch, action_share, vendor), embed_share, noise)
        return (post.pop("deter"), post.pop("stoch")), post
    return step


def img_step_fn(spec: RSSMSpec, vendor: bool = False, policy=None):
    """x = (noise, action_share) open loop, or (noise[, policy noise]) with the policy in the loop;
    params = (weights, policy params)."""
    def step(carry, x, params):
        w, policy_params = params
        deter, stoch = carry
        noise, *rest = x
        if policy is None:
            action_share, out = rest[0], {}
        else:
            action = call_policy(policy, policy_params, torch.cat([stoch, deter], -1), *rest,
                                 action_dim=w["in_action.w"].shape[-1])
            action_share, out = action_in(spec, w, action), {"action": action}
        state = prior(spec, w, cell(spec, w, deter, stoch, action_share, vendor), noise)
        return (state.pop("deter"), state.pop("stoch")), {**state, **out}
    return step


# ---------------------------------------------------------------------- unrolls
def observe_inputs(spec: RSSMSpec, w: Weights, action, embed, is_first, post_noise):
    """The time-major per-step inputs of the filtering step, computed off the chain."""
    reset = is_first.unsqueeze(-1)
    action_share = action_in(spec, w, torch.where(reset, torch.zeros_like(action), action))
    return tuple(v.transpose(0, 1) for v in (action_share, embed_in(w, embed), reset, post_noise))


def imagine_inputs(spec: RSSMSpec, w: Weights, prior_noise, actions, policy_noise):
    if actions is not None:
        return (prior_noise.transpose(0, 1), action_in(spec, w, actions).transpose(0, 1))
    return (prior_noise.transpose(0, 1),) + (() if policy_noise is None else (policy_noise.transpose(0, 1),))


def batch_major(states, ys) -> dict[str, torch.Tensor]:
    deter, stoch = states
    return {k: v.transpose(0, 1) for k, v in {"deter": deter, "stoch": stoch, **ys}.items()}


def join_observed(post: dict, prior: dict) -> dict[str, torch.Tensor]:
    """observe's (post, prior) as one flat dict ("post.deter", ...; a capture returns one dict)."""
    return {**{f"post.{k}": v for k, v in post.items()}, **{f"prior.{k}": v for k, v in prior.items()}}


def split_observed(out: dict) -> tuple[dict, dict]:
    """`join_observed`, undone."""
    return ({k[5:]: v for k, v in out.items() if k.startswith("post.")},
            {k[6:]: v for k, v in out.items() if k.startswith("prior.")})


def unrolled_observe(driver: Driver, spec, weights, deter, stoch, action, embed, is_first, post_noise, prior_noise,
                     *, cache=None, vendor: bool = False):
    xs = observe_inputs(spec, weights, action, embed, is_first, post_noise)
    _, states, ys = driver(obs_step_fn(spec, vendor), (deter, stoch), xs, with_initial(spec, weights))
    post = batch_major(states, ys)
    return post, prior(spec, weights, post["deter"], prior_noise)  # nothing in the loop reads the prior


def unrolled_imagine(driver: Driver, spec, weights, deter, stoch, prior_noise, *, actions=None, policy=None,
                     policy_params=None, policy_noise=None, cache=None, vendor: bool = False):
    xs = imagine_inputs(spec, weights, prior_noise, actions, policy_noise)
    step = img_step_fn(spec, vendor, None if actions is not None else policy)
    _, states, ys = driver(step, (deter, stoch), xs, (weights, policy_params or {}))
    out = batch_major(states, ys)
    if actions is not None:
        out["action"] = actions
    return out


observe = functools.partial(unrolled_observe, loop_unroll)
imagine = functools.partial(unrolled_imagine, loop_unroll)
