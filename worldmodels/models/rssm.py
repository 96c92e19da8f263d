"""`RSSM`: the recurrent state-space model of PlaNet / Dreamer V1 and DreamerV3, and its unrolls.

State: `deter` [B, D] (the recurrent carry) and `stoch` [B, S] (Gaussian sample, or `stoch`
one-hot categoricals of `classes` each, flattened to S = stoch * classes).

One prior step:      x = in(stoch, action); deter = cell(x, deter); prior = prior_head(deter)
One filtering step:  the prior step's deter, then post = post_head(deter, embed), stoch ~ post.

Distribution parameters in the outputs: Gaussian "mean", "std" (softplus + min_std); categorical
"logits" [..., stoch, classes], already mixed with `unimix` uniform (log of the mixed probs), so
KLs and samples computed from them are those of the distribution the model samples from.

`observe` and `imagine` unroll these steps on a backend (core/unroll.py): `loop`, `scan`, or
`cudnn` (vendor GRU-cell kernel; on CUDA the whole unroll and its backward replayed from CUDA
graphs). Work that does not depend on the carry is done once for the whole sequence, outside
the recurrent chain: the action's share of the cell input, the embedding's share of the
posterior's first layer, and in `observe` the prior head.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict

import torch
from tensordict import TensorDict
from torch import nn
from torch.func import functional_call

from worldmodels.core.backends import is_batched, resolve_backend, validate_backend
from worldmodels.core.cuda_graphs import GraphedUnroll
from worldmodels.core.precision import linear
from worldmodels.core.strides import canonical
from worldmodels.core.unroll import DRIVERS, loop_unroll
from worldmodels.models.dists import gaussian_params, gumbel_noise, sample_gaussian, sample_onehot, unimix_logits
from worldmodels.models.layers import activation, check_choice, dense, norm_layer
from worldmodels.models.rnn import gru_cell

CELLS = ("gru", "block_gru")


class RSSM(nn.Module):
    graph_cache_size = 16  # captured CUDA graph pairs kept per RSSM (cudnn backend), least recently used dropped

    def __init__(self, action_dim: int, embed_dim: int, *, deter: int, stoch: int, hidden: int,
                 classes: int | None = None, cell: str = "gru", blocks: int = 1, norm: str = "none",
                 act: str = "elu", min_std: float = 0.1, unimix: float = 0.01, backend: str | None = "auto"):
        super().__init__()
        for name, value in (("action_dim", action_dim), ("embed_dim", embed_dim), ("deter", deter),
                            ("stoch", stoch), ("hidden", hidden), ("blocks", blocks)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if classes is not None and (not isinstance(classes, int) or classes < 2):
            raise ValueError(f"classes must be None (Gaussian latents) or an int >= 2, got {classes!r}")
        check_choice("cell", cell, CELLS)
        if cell == "block_gru" and (deter % blocks or hidden % blocks):
            raise ValueError(f"blocks={blocks} must divide deter={deter} and hidden={hidden}")
        self.action_dim, self.embed_dim, self.deter_dim, self.hidden = action_dim, embed_dim, deter, hidden
        self.stoch, self.classes, self.cell, self.blocks = stoch, classes, cell, blocks
        self.min_std, self.unimix = min_std, unimix
        self.backend = validate_backend(backend)
        self.stoch_dim = stoch * classes if classes else stoch
        stats = self.stoch_dim if classes else 2 * stoch
        bias = norm == "none"

        if cell == "gru":  # PlaNet / V1: x = act(norm(W [stoch, action])); deter = GRUCell(x, deter)
            self.in_stoch = nn.Linear(self.stoch_dim, hidden, bias=bias)
            self.in_action = nn.Linear(action_dim, hidden, bias=False)
            self.in_out = nn.Sequential(norm_layer(norm, hidden), activation(act))
            self.gru = nn.GRUCell(hidden, deter)
        else:  # DreamerV3: normalised projections of deter, stoch, action; block-diagonal GRU
            self.in_deter = dense(deter, hidden, norm, act)
            self.in_stoch = dense(self.stoch_dim, hidden, norm, act)
            self.in_action = dense(action_dim, hidden, norm, act)
            g, dg, hg = blocks, deter // blocks, hidden // blocks
            self.dyn_x = nn.Linear(3 * hidden, hidden, bias=bias)  # the input's share, same for every block
            self.dyn_h = nn.Parameter(torch.randn(g, dg, hg) / dg**0.5)  # each block's own deter slice
            self.dyn_out = nn.Sequential(norm_layer(norm, hg), activation(act))
            self.gates_w = nn.Parameter(torch.randn(g, hg, 3 * dg) / hg**0.5)
            self.gates_b = nn.Parameter(torch.zeros(g, 3 * dg))
        self.prior_head = nn.Sequential(dense(deter, hidden, norm, act), nn.Linear(hidden, stats))
        self.post_deter = nn.Linear(deter, hidden, bias=False)
        self.post_embed = nn.Linear(embed_dim, hidden, bias=bias)
        self.post_head = nn.Sequential(norm_layer(norm, hidden), activation(act), nn.Linear(hidden, stats))

    # ------------------------------------------------------------------ state and noise
    def _factory(self) -> dict:
        p = self.post_embed.weight
        return {"dtype": p.dtype, "device": p.device}

    def initial(self, batch_size: int) -> TensorDict:
        f = self._factory()
        return TensorDict({"deter": torch.zeros(batch_size, self.deter_dim, **f),
                           "stoch": torch.zeros(batch_size, self.stoch_dim, **f)}, batch_size=[batch_size])

    def noise(self, batch_shape, *, generator: torch.Generator | None = None) -> TensorDict:
        """The noise an unroll of `batch_shape` ([B, T] or [N, H]) consumes: Gaussian eps [*, S]
        or Gumbel noise [*, stoch, classes] for the prior and the posterior samples."""
        batch_shape = torch.Size(batch_shape)
        f = self._factory()
        if self.classes:
            draw = lambda: gumbel_noise((*batch_shape, self.stoch, self.classes), generator=generator, **f)  # noqa: E731
        else:
            draw = lambda: torch.randn((*batch_shape, self.stoch), generator=generator, **f)  # noqa: E731
        return TensorDict({"prior": draw(), "posterior": draw()}, batch_size=batch_shape)

    def features(self, state) -> torch.Tensor:
        """concat(stoch, deter): what heads and the actor read."""
        return torch.cat([state["stoch"], state["deter"]], -1)

    # ------------------------------------------------------------------ pieces of one step
    def _action_in(self, action: torch.Tensor) -> torch.Tensor:
        """The action's share of the cell input (independent of the carry). Actions are scaled
        by max(1, |a|) so that out-of-range actions cannot blow up the state."""
        action = action / torch.clamp(action.abs(), min=1).detach()
        return self.in_action(action)

    def _cell(self, deter, stoch, action_in, vendor: bool) -> torch.Tensor:
        if self.cell == "gru":
            x = self.in_out(self.in_stoch(stoch) + action_in)
            g = self.gru
            if vendor:
                return torch.gru_cell(x, deter, g.weight_ih, g.weight_hh, g.bias_ih, g.bias_hh)
            return gru_cell(deter, linear(x, g.weight_ih, g.bias_ih, "ieee"), g.weight_hh, g.bias_hh, "ieee")
        # block GRU, [..., G, D/G] per block
        x = torch.cat([self.in_deter(deter), self.in_stoch(stoch), action_in], -1)
        blocks = deter.unflatten(-1, (self.blocks, -1))
        u = self.dyn_x(x).unflatten(-1, (self.blocks, -1)) + torch.einsum("...gd,gdh->...gh", blocks, self.dyn_h)
        gates = torch.einsum("...gh,gho->...go", self.dyn_out(u), self.gates_w) + self.gates_b
        reset, cand, update = gates.chunk(3, -1)
        cand = torch.tanh(torch.sigmoid(reset) * cand)
        update = torch.sigmoid(update - 1)  # bias -1: start out keeping the old state
        return (update * cand + (1 - update) * blocks).flatten(-2)

    def _dist(self, stats: torch.Tensor, noise: torch.Tensor) -> dict[str, torch.Tensor]:
        """Distribution parameters and a sample from a head's output."""
        if self.classes:
            logits = unimix_logits(stats.unflatten(-1, (self.stoch, self.classes)), self.unimix)
            return {"stoch": sample_onehot(logits, noise).flatten(-2), "logits": logits}
        mean, std = gaussian_params(stats, self.min_std)
        return {"stoch": sample_gaussian(mean, std, noise), "mean": mean, "std": std}

    def _prior(self, deter, noise) -> dict[str, torch.Tensor]:
        return {"deter": deter, **self._dist(self.prior_head(deter), noise)}

    def _post(self, deter, embed_in, noise) -> dict[str, torch.Tensor]:
        return {"deter": deter, **self._dist(self.post_head(self.post_deter(deter) + embed_in), noise)}

    # ------------------------------------------------------------------ step functions (carry, x, params)
    def _obs_step_fn(self, vendor: bool):
        def step(carry, x, params):
            deter, stoch = carry
            action_in, embed_in, reset, noise = x
            deter = torch.where(reset, torch.zeros_like(deter), deter)  # initial state is zeros
            stoch = torch.where(reset, torch.zeros_like(stoch), stoch)
            post = self._post(self._cell(deter, stoch, action_in, vendor), embed_in, noise)
            return (post.pop("deter"), post.pop("stoch")), post
        return step

    def _img_step_fn(self, vendor: bool, policy=None):
        """x = (noise, action_in) open loop, or (noise[, policy_noise]) with the policy in the loop."""
        def step(carry, x, params):
            deter, stoch = carry
            noise, *rest = x
            if policy is None:
                action_in, out = rest[0], {}
            else:
                action = policy(torch.cat([stoch, deter], -1), *rest)
                action_in, out = self._action_in(action), {"action": action}
            prior = self._prior(self._cell(deter, stoch, action_in, vendor), noise)
            return (prior.pop("deter"), prior.pop("stoch")), {**prior, **out}
        return step

    # ------------------------------------------------------------------ single steps
    def img_step(self, state, action: torch.Tensor, noise=None) -> tuple[TensorDict, TensorDict]:
        """One prior step: (state[B], action[B, A]) -> (next state, prior)."""
        batch = self._check_state(state, None)
        self._check_tensor("action", action, (batch, self.action_dim))
        noise = self.noise((batch,)) if noise is None else noise
        (deter, stoch), prior = self._img_step_fn(False)((state["deter"], state["stoch"]), (noise["prior"], self._action_in(action)), ())
        prior = TensorDict({"deter": deter, "stoch": stoch, **prior}, batch_size=[batch])
        return prior.select("deter", "stoch"), prior

    def obs_step(self, state, action, embed, is_first, noise=None) -> tuple[TensorDict, TensorDict]:
        """One filtering step. Where `is_first` is set, state and action are reset first."""
        batch = self._check_state(state, None)
        self._check_tensor("action", action, (batch, self.action_dim))
        self._check_tensor("embed", embed, (batch, self.embed_dim))
        self._check_is_first(is_first, (batch,))
        noise = self.noise((batch,)) if noise is None else noise
        reset = is_first.unsqueeze(-1)
        action_in = self._action_in(torch.where(reset, torch.zeros_like(action), action))
        x = (action_in, self.post_embed(embed), reset, noise["posterior"])
        (deter, stoch), post = self._obs_step_fn(False)((state["deter"], state["stoch"]), x, ())
        post = {"deter": deter, "stoch": stoch, **post}
        prior = self._prior(deter, noise["prior"])
        return TensorDict(post, batch_size=[batch]), TensorDict(prior, batch_size=[batch])

    # ------------------------------------------------------------------ unrolls
    def forward(self, embed, action, is_first, state=None, noise=None, backend=None):
        """Same as `observe` (so `torch.func.functional_call` runs ensembles of RSSMs)."""
        return self.observe(embed, action, is_first, state, noise, backend)

    def observe(self, embed, action, is_first, state=None, noise=None, backend=None) -> tuple[TensorDict, TensorDict]:
        """Filter a sequence: embed [B, T, E], action [B, T, A] (the action before observation t),
        is_first [B, T] -> (post, prior), TensorDicts of batch [B, T]."""
        self._check_tensor("embed", embed, (None, None, self.embed_dim))
        batch, steps = embed.shape[:2]
        self._check_tensor("action", action, (batch, steps, self.action_dim))
        self._check_is_first(is_first, (batch, steps))
        state = self.initial(batch) if state is None else state
        self._check_state(state, batch)
        noise = self._check_noise(noise, (batch, steps), ("prior", "posterior"))
        name = self._backend(backend, embed)
        reset = is_first.unsqueeze(-1)
        # off the recurrent chain: one matmul each over all B*T steps, then time-major
        action_in = self._action_in(torch.where(reset, torch.zeros_like(action), action))
        xs = tuple(v.transpose(0, 1) for v in (action_in, self.post_embed(embed), reset, noise["posterior"]))
        carry = (state["deter"], state["stoch"])
        post = self._unroll(name, self._obs_step_fn, carry, xs, None)
        post = {k: v.transpose(0, 1) for k, v in post.items()}
        prior = self._prior(post["deter"], noise["prior"])  # nothing in the loop reads it
        return TensorDict(post, batch_size=[batch, steps]), TensorDict(prior, batch_size=[batch, steps])

    def imagine(self, start, horizon: int, policy=None, actions=None, noise=None, backend=None) -> TensorDict:
        """Roll the prior forward from `start` [N]: with `policy(features, noise)` in the loop, or
        open loop on `actions` [N, H, A]. Returns [N, H]: the action chosen at step h and the state
        it leads to, with the prior's distribution parameters."""
        if (policy is None) == (actions is None):
            raise ValueError("imagine needs exactly one of policy= (actor in the loop) and actions= (open loop)")
        if not isinstance(horizon, int) or horizon < 1:
            raise ValueError(f"horizon must be a positive int, got {horizon!r}")
        n = self._check_state(start, None)
        noise = self._check_noise(noise, (n, horizon), ("prior",))
        name = self._backend(backend, start["deter"])
        carry = (start["deter"], start["stoch"])
        if actions is not None:
            self._check_tensor("actions", actions, (n, horizon, self.action_dim))
            xs = (noise["prior"].transpose(0, 1), self._action_in(actions).transpose(0, 1))
            out = self._unroll(name, self._img_step_fn, carry, xs, None)
            out["action"] = actions.transpose(0, 1)
        else:
            if not callable(policy):
                raise TypeError(f"policy must be callable as policy(features, noise), got {type(policy).__name__}")
            # the policy's own draws, pre-drawn when it can say what they are (RNG contract)
            policy_noise = noise.get("policy", None)
            if policy_noise is None and hasattr(policy, "noise"):
                policy_noise = policy.noise((n, horizon))
            if name == "cudnn" and start["deter"].is_cuda and not isinstance(policy, nn.Module):
                _warn_once("cudnn backend captures nn.Module policies only (their parameters must be visible "
                           "to the CUDA graph); this policy runs on 'loop' instead (not 'scan': docs/recurrent-core.md)")
                name = "loop"
            xs = (noise["prior"].transpose(0, 1),) + (() if policy_noise is None else (policy_noise.transpose(0, 1),))
            out = self._unroll(name, lambda vendor: self._img_step_fn(vendor, policy), carry, xs, policy)
        return TensorDict({k: v.transpose(0, 1) for k, v in out.items()}, batch_size=[n, horizon])

    def _unroll(self, name, make_step, carry, xs, policy) -> dict[str, torch.Tensor]:
        """States and outputs (time-major dict) of the unroll on backend `name`."""
        if name == "cudnn" and _captures_graphs(carry[0]):
            return self._graphed(make_step, carry, xs, policy)
        step = make_step(name == "cudnn")
        _, (deter, stoch), ys = (loop_unroll if name == "cudnn" else DRIVERS[name])(step, carry, xs)
        return {"deter": deter, "stoch": stoch, **ys}

    def _graphed(self, make_step, carry, xs, policy) -> dict[str, torch.Tensor]:
        """cudnn on CUDA: the loop of vendor steps, captured once per static signature."""
        inputs = [canonical(t) for t in (*carry, *xs)]
        key = (make_step.__name__ if hasattr(make_step, "__name__") else "policy", id(policy),
               tuple((t.shape, t.dtype, t.requires_grad) for t in inputs), torch.is_grad_enabled(),
               torch.is_autocast_enabled("cuda"), tuple(p.data_ptr() for p in self._graph_params(policy)))
        cache = self.__dict__.setdefault("_graph_cache", OrderedDict())
        if key in cache:
            cache.move_to_end(key)
        else:
            step = make_step(True)
            names: list[str] = []

            def unroll(*tensors):
                _, (deter, stoch), ys = loop_unroll(step, tuple(tensors[:2]), tuple(tensors[2:]))
                ys = {"deter": deter, "stoch": stoch, **ys}
                names[:] = list(ys)
                return tuple(ys.values())

            body = _GraphBody(self, policy, unroll)
            trained = [(n, p) for n, p in body.named_parameters() if p.requires_grad]

            def run(leaves, *tensors):  # the unroll on the graph's own parameter leaves
                return functional_call(body, {n: leaf for (n, _), leaf in zip(trained, leaves)}, tensors)

            cache[key] = (GraphedUnroll(run, [p for _, p in trained], inputs), names)
            while len(cache) > self.graph_cache_size:  # least recently used first; a pending backward keeps its own
                cache.popitem(last=False)
        graphed, names = cache[key]
        return dict(zip(names, graphed(*inputs)))

    def _graph_params(self, policy) -> list[torch.Tensor]:
        params = list(self.parameters())
        return params + (list(policy.parameters()) if isinstance(policy, nn.Module) else [])

    def _backend(self, backend, tensor) -> str:
        return resolve_backend(backend, self.backend, device=tensor.device, vmapped=is_batched(tensor))

    # ------------------------------------------------------------------ input checks
    def _check_tensor(self, name, value, shape) -> None:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(value).__name__}")
        if not value.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {value.dtype}")
        if value.dim() != len(shape) or any(s is not None and s != v for s, v in zip(shape, value.shape)):
            # built only on failure: under torch.compile with dynamic shapes, str() of a SymInt can't be traced
            expected = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{name} must have shape {expected}, got {list(value.shape)}")

    @staticmethod
    def _check_is_first(is_first, shape) -> None:
        if not isinstance(is_first, torch.Tensor) or is_first.dtype != torch.bool:
            raise TypeError(f"is_first must be a bool tensor of shape {list(shape)}, got {getattr(is_first, 'dtype', type(is_first).__name__)}")
        if tuple(is_first.shape) != tuple(shape):
            raise ValueError(f"is_first must have shape {list(shape)}, got {list(is_first.shape)}")

    def _check_state(self, state, batch) -> int:
        if not hasattr(state, "keys") or "deter" not in state.keys() or "stoch" not in state.keys():
            raise TypeError("state must be a TensorDict (or mapping) with 'deter' and 'stoch'")
        self._check_tensor("state['deter']", state["deter"], (batch, self.deter_dim))
        batch = state["deter"].shape[0]
        self._check_tensor("state['stoch']", state["stoch"], (batch, self.stoch_dim))
        return batch

    def _check_noise(self, noise, batch_shape, keys) -> TensorDict:
        if noise is None:
            return self.noise(batch_shape)
        sample = (self.stoch, self.classes) if self.classes else (self.stoch,)
        for key in keys:
            if key not in noise.keys():
                raise ValueError(f"noise must hold {key!r} (see RSSM.noise), got keys {list(noise.keys())}")
            self._check_tensor(f"noise[{key!r}]", noise[key], (*batch_shape, *sample))
        return noise


class _GraphBody(nn.Module):
    """The modules a captured unroll reads (so `functional_call` can swap their parameters)."""

    def __init__(self, rssm: RSSM, policy, unroll):
        super().__init__()
        self.rssm = rssm
        self.policy = policy if isinstance(policy, nn.Module) else None
        self.unroll = unroll

    def forward(self, *tensors):
        return self.unroll(*tensors)


def _captures_graphs(tensor: torch.Tensor) -> bool:
    """Whether the cudnn backend captures this unroll in CUDA graphs (tests patch it to run the
    capture path's composition on CPU)."""
    return tensor.is_cuda


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, stacklevel=3)
