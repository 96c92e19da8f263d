"""`RSSM`: the recurrent state-space model of PlaNet / Dreamer V1 and DreamerV3, and its unrolls.

State: `deter` [B, D] (the recurrent carry) and `stoch` [B, S] (Gaussian sample, or `stoch`
one-hot categoricals of `classes` each, flattened to S = stoch * classes). Features: `features(state)`
= concat(stoch, deter) [B, F], F = S + D = `feature_dim`, what the actor and the heads read.

One prior step:      x = in(stoch, action); deter = cell(x, deter); prior = prior_head(deter)
One filtering step:  the prior step's deter, then post = post_head(deter, embed), stoch ~ post.

Distribution parameters in the outputs: Gaussian "mean", "std" (softplus + min_std); categorical
"logits" [..., stoch, classes], already mixed with `unimix` uniform (log of the mixed probs), so
KLs and samples computed from them are those of the distribution the model samples from.

The module owns the parameters, checks its inputs and speaks TensorDict; the math is the RSSM
ops' (`worldmodels/ops/rssm/`), called on the backend the registry resolves (`loop`, `scan`,
`cudnn`, ...) with the weights by role (`op_weights`) and the static shape (`op_spec`).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torch import nn

from worldmodels.core.backends import backend_op, is_batched, resolve_backend, validate_backend
from worldmodels.core.cuda_graphs import UnrollCache
from worldmodels.core.precision import resolve_precision
from worldmodels.models.actor import Actor, is_stopped_actor
from worldmodels.models.dists import gumbel_noise
from worldmodels.models.layers import RMSNorm, activation, check_choice, dense, has_bias, norm_layer
from worldmodels.ops.rssm import reference as rssm_ops
from worldmodels.ops.rssm.reference import RSSMSpec

CELLS = ("gru", "norm_gru", "block_gru")
DYN_NORMS = ("block", "all")
INITIALS = ("zeros", "learned")


class RSSM(nn.Module):
    """The RSSM of PlaNet / Dreamer V1 (Gaussian latents, GRU cell) and DreamerV3 (categorical
    latents with unimix, block GRU with norms), by arguments.

    Args:
        action_dim: size of the action vector (one-hot for discrete actions).
        embed_dim: size of the observation embedding the posterior reads.
        deter: size of the deterministic (recurrent) state.
        stoch: Gaussian latent size, or the number of categorical latents when `classes` is set.
        hidden: width of the input, prior and posterior layers.
        classes: None for Gaussian latents, else classes per categorical latent (>= 2).
        cell: "gru" (dense GRUCell), "norm_gru" (the 2023 DreamerV3's dense GRU, gates from one
            normalised Linear over [deter, input]) or "block_gru" (DreamerV3's block-diagonal GRU).
        blocks: block count of the block GRU (divides `deter` and `hidden`).
        norm: "none", "rms" or "layer"; act: "elu" or "silu".
        min_std: Gaussian std floor; unimix: uniform share mixed into categorical probabilities.
        dyn_hidden: width of the block GRU's hidden layer, all blocks together (None: `hidden`;
            DreamerV3's reference uses `deter`); divisible by `blocks`.
        dyn_norm: that layer's norm per block ("block") or over the whole layer at once ("all": the
            reference's, `block_norm: False`).
        prior_layers: hidden layers of the prior head (DreamerV3's reference: 2, `imglayers`).
        initial: an episode's first step is filtered from "zeros" or a "learned" state (the 2023
            reference's `initial: learned`: deter = tanh(a parameter), stoch the prior's mode there).
        linear_bias: "auto" (a layer before a norm has no bias) or "always" (the 2024 reference's:
            every layer has one), `layers.LINEAR_BIASES`.
        backend: the recurrent backend for this module's unrolls (None / "auto": resolved per call).
    """

    graph_cache_size = 16  # per-shape captures (cudnn's CUDA graphs) kept per RSSM, least recently used dropped

    def __init__(self, action_dim: int, embed_dim: int, *, deter: int, stoch: int, hidden: int,
                 classes: int | None = None, cell: str = "gru", blocks: int = 1, norm: str = "none",
                 act: str = "elu", min_std: float = 0.1, unimix: float = 0.01, dyn_hidden: int | None = None,
                 dyn_norm: str = "block", prior_layers: int = 1, initial: str = "zeros",
                 linear_bias: str = "auto", backend: str | None = "auto"):
        super().__init__()
        dyn_hidden = hidden if dyn_hidden is None else dyn_hidden
        for name, value in (("action_dim", action_dim), ("embed_dim", embed_dim), ("deter", deter),
                            ("stoch", stoch), ("hidden", hidden), ("blocks", blocks), ("dyn_hidden", dyn_hidden),
                            ("prior_layers", prior_layers)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if classes is not None and (not isinstance(classes, int) or classes < 2):
            raise ValueError(f"classes must be None (Gaussian latents) or an int >= 2, got {classes!r}")
        check_choice("cell", cell, CELLS)
        check_choice("dyn_norm", dyn_norm, DYN_NORMS)
        check_choice("initial", initial, INITIALS)
        if cell == "block_gru" and (deter % blocks or dyn_hidden % blocks):
            raise ValueError(f"blocks={blocks} must divide deter={deter} and dyn_hidden={dyn_hidden}")
        self.dyn_hidden, self.dyn_norm, self.prior_layers = dyn_hidden, dyn_norm, prior_layers
        self.initial_state = initial
        self.action_dim, self.embed_dim, self.deter_dim, self.hidden = action_dim, embed_dim, deter, hidden
        self.stoch, self.classes, self.cell, self.blocks = stoch, classes, cell, blocks
        self.min_std, self.unimix, self.norm, self.act = min_std, unimix, norm, act
        self.backend = validate_backend(backend)
        self.unroll_cache = UnrollCache(self.graph_cache_size)
        self.stoch_dim = stoch * classes if classes else stoch
        stats = self.stoch_dim if classes else 2 * stoch
        bias = has_bias(norm, linear_bias)

        if cell in ("gru", "norm_gru"):  # x = act(norm(W [stoch, action]))
            self.in_stoch = nn.Linear(self.stoch_dim, hidden, bias=bias)
            self.in_action = nn.Linear(action_dim, hidden, bias=False)
            self.in_out = nn.Sequential(norm_layer(norm, hidden), activation(act))
            if cell == "gru":  # PlaNet / V1: deter = GRUCell(x, deter)
                self.gru = nn.GRUCell(hidden, deter)
            else:  # 2023 DreamerV3 (and DreamerV2): gates = norm(W [deter, x]), reset inside the tanh
                self.gates = nn.Linear(deter + hidden, 3 * deter, bias=bias)
                self.gates_norm = norm_layer(norm, 3 * deter)
        else:  # DreamerV3: normalised projections of deter, stoch, action; block-diagonal GRU
            self.in_deter = dense(deter, hidden, norm, act, linear_bias)
            self.in_stoch = dense(self.stoch_dim, hidden, norm, act, linear_bias)
            self.in_action = dense(action_dim, hidden, norm, act, linear_bias)
            g, dg, hg = blocks, deter // blocks, dyn_hidden // blocks
            self.dyn_x = nn.Linear(3 * hidden, dyn_hidden, bias=bias)  # the input's share, same for every block
            self.dyn_h = nn.Parameter(torch.randn(g, dg, hg) / dg**0.5)  # each block's own deter slice
            self.dyn_out = nn.Sequential(norm_layer(norm, hg if dyn_norm == "block" else dyn_hidden), activation(act))
            self.gates_w = nn.Parameter(torch.randn(g, hg, 3 * dg) / hg**0.5)
            self.gates_b = nn.Parameter(torch.zeros(g, 3 * dg))
        prior = [dense(deter if i == 0 else hidden, hidden, norm, act, linear_bias) for i in range(prior_layers)]
        self.prior_head = nn.Sequential(*prior, nn.Linear(hidden, stats))
        self.post_deter = nn.Linear(deter, hidden, bias=False)
        self.post_embed = nn.Linear(embed_dim, hidden, bias=bias)
        self.post_head = nn.Sequential(norm_layer(norm, hidden), activation(act), nn.Linear(hidden, stats))
        if initial == "learned":  # deter = tanh(this) at an episode's start; zeros at first, as the reference's
            self.initial_deter = nn.Parameter(torch.zeros(deter))
        self._op_spec = self._build_spec()

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

    @property
    def feature_dim(self) -> int:
        """F = S + D, the size of `features(state)`: the `feat_dim` of an `Actor` or a head on this RSSM."""
        return self.stoch_dim + self.deter_dim

    def features(self, state) -> torch.Tensor:
        """concat(stoch, deter) [..., F] of a state [...] (F = `feature_dim`): what heads and the actor read."""
        return torch.cat([state["stoch"], state["deter"]], -1)

    # ------------------------------------------------------------------ the op's view of this module
    def op_spec(self) -> RSSMSpec:
        """The static shape of this RSSM's math (built once, at construction)."""
        return self._op_spec

    def _build_spec(self) -> RSSMSpec:
        norm = next((m for m in self.modules() if isinstance(m, (nn.LayerNorm, RMSNorm, nn.RMSNorm))), None)
        eps = 0.0 if norm is None else float(norm.eps)
        return RSSMSpec(cell=self.cell, deter=self.deter_dim, stoch=self.stoch, hidden=self.hidden,
                        classes=self.classes, blocks=self.blocks, norm=self.norm, norm_eps=eps, act=self.act,
                        min_std=self.min_std, unimix=self.unimix, dyn_hidden=self.dyn_hidden,
                        dyn_norm=self.dyn_norm, prior_layers=self.prior_layers, initial=self.initial_state)

    def op_weights(self) -> dict[str, torch.Tensor]:
        """The parameters by role, as the RSSM ops read them (ops/rssm/reference.py). Built on every
        unroll: the Sequentials are unpacked, not indexed by int (each index walks their modules)."""
        w: dict[str, torch.Tensor] = {}

        def add(name, linear=None, norm=None):
            if linear is not None:
                w[f"{name}.w"] = linear.weight
                if linear.bias is not None:
                    w[f"{name}.b"] = linear.bias
            if norm is not None and not isinstance(norm, nn.Identity):
                w[f"{name}.norm_w"] = norm.weight if hasattr(norm, "weight") else norm.scale
                if getattr(norm, "bias", None) is not None:
                    w[f"{name}.norm_b"] = norm.bias

        if self.cell in ("gru", "norm_gru"):
            add("in_stoch", self.in_stoch)
            add("in_action", self.in_action)
            in_norm, _ = self.in_out
            add("in", norm=in_norm)
            if self.cell == "gru":
                g = self.gru
                w.update({"gru.w_ih": g.weight_ih, "gru.w_hh": g.weight_hh, "gru.b_ih": g.bias_ih,
                          "gru.b_hh": g.bias_hh})
            else:
                add("gates", self.gates, self.gates_norm)
        else:
            for name in ("in_deter", "in_stoch", "in_action"):
                linear, norm, _ = getattr(self, name)
                add(name, linear, norm)
            add("dyn_x", self.dyn_x)
            dyn_norm, _ = self.dyn_out
            add("dyn_out", norm=dyn_norm)
            w.update({"dyn_h": self.dyn_h, "gates.w": self.gates_w, "gates.b": self.gates_b})
        *prior_layers, prior_out = self.prior_head
        for i, (prior_linear, prior_norm, _) in enumerate(prior_layers):
            add(f"prior{i or ''}", prior_linear, prior_norm)
        add("prior_out", prior_out)
        add("post_deter", self.post_deter)
        add("post_embed", self.post_embed)
        post_norm, _, post_out = self.post_head
        add("post", norm=post_norm)
        add("post_out", post_out)
        if self.initial_state == "learned":
            w["initial"] = self.initial_deter
        return w

    # ------------------------------------------------------------------ single steps
    def img_step(self, state, action: torch.Tensor, noise=None) -> tuple[TensorDict, TensorDict]:
        """One prior step: (state[B], action[B, A]) -> (next state, prior)."""
        batch = self._check_state(state, None)
        self._check_tensor("action", action, (batch, self.action_dim))
        noise = self._check_noise(noise, (batch,), ("prior",))
        spec, w = self.op_spec(), self.op_weights()
        deter = rssm_ops.cell(spec, w, state["deter"], state["stoch"], rssm_ops.action_in(spec, w, action))
        prior = TensorDict(rssm_ops.prior(spec, w, deter, noise["prior"]), batch_size=[batch])
        return prior.select("deter", "stoch"), prior

    def obs_step(self, state, action, embed, is_first, noise=None) -> tuple[TensorDict, TensorDict]:
        """One filtering step. Where `is_first` is set, state and action are reset first."""
        batch = self._check_state(state, None)
        self._check_tensor("action", action, (batch, self.action_dim))
        self._check_tensor("embed", embed, (batch, self.embed_dim))
        self._check_is_first(is_first, (batch,))
        noise = self._check_noise(noise, (batch,), ("prior", "posterior"))
        spec, w = self.op_spec(), self.op_weights()
        x = [v[0] for v in rssm_ops.observe_inputs(spec, w, action[:, None], embed[:, None], is_first[:, None],
                                                   noise["posterior"][:, None])]
        (deter, stoch), post = rssm_ops.obs_step_fn(spec)((state["deter"], state["stoch"]), x,
                                                          rssm_ops.with_initial(spec, w))
        post = {"deter": deter, "stoch": stoch, **post}
        prior = rssm_ops.prior(spec, w, deter, noise["prior"])
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
        if steps == 0:
            raise ValueError(f"embed must hold at least one step, got shape {list(embed.shape)} (T = 0)")
        self._check_tensor("action", action, (batch, steps, self.action_dim))
        self._check_is_first(is_first, (batch, steps))
        state = self.initial(batch) if state is None else state
        self._check_state(state, batch)
        noise = self._check_noise(noise, (batch, steps), ("prior", "posterior"))
        name = self._backend(backend, embed, "rssm_observe", (embed, action, state["deter"], state["stoch"]),
                             kind="observe", batch=batch, steps=steps)
        post, prior = backend_op(name, "rssm_observe")(
            self.op_spec(), self.op_weights(), state["deter"], state["stoch"], action, embed, is_first,
            noise["posterior"], noise["prior"], cache=self.unroll_cache)
        return TensorDict(post, batch_size=[batch, steps]), TensorDict(prior, batch_size=[batch, steps])

    def imagine(self, start, horizon: int | None = None, policy=None, actions=None, noise=None,
                backend=None) -> TensorDict:
        """Roll the prior forward from `start` [N]: with `policy(features, noise)` in the loop for
        `horizon` steps, or open loop on `actions` [N, H, A] (H = `horizon`, which may be left out:
        it is then the actions' length). Returns [N, H]: the action chosen at step h and the state
        it leads to, with the prior's distribution parameters."""
        if (policy is None) == (actions is None):
            raise ValueError("imagine needs exactly one of policy= (actor in the loop) and actions= (open loop)")
        if horizon is None and actions is not None:
            self._check_tensor("actions", actions, (None, None, self.action_dim))
            horizon = actions.shape[1]
            if horizon < 1:
                raise ValueError(f"actions must hold at least one step (their length is the horizon), "
                                 f"got shape {list(actions.shape)}")
        elif isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
            raise ValueError(f"horizon must be a positive int (left out only with actions=, whose length it then "
                             f"is), got {horizon!r}")
        n = self._check_state(start, None)
        noise = self._check_noise(noise, (n, horizon), ("prior",))
        params = dict(policy.named_parameters()) if isinstance(policy, nn.Module) else {}  # walked once
        inputs = (start["deter"], start["stoch"], *((actions,) if actions is not None else ()), *params.values())
        stopped = is_stopped_actor(policy)
        kind = "open" if actions is not None else "actor" if isinstance(policy, Actor) or stopped else "policy"
        name = self._backend(backend, start["deter"], "rssm_imagine", inputs, kind=kind, stop_features=stopped,
                             policy_dist=getattr(policy, "dist_type", None), batch=n, steps=horizon)
        op = backend_op(name, "rssm_imagine")
        args = (self.op_spec(), self.op_weights(), start["deter"], start["stoch"], noise["prior"])
        if actions is not None:
            self._check_tensor("actions", actions, (n, horizon, self.action_dim))
            out = op(*args, actions=actions, cache=self.unroll_cache)
        else:
            if not callable(policy):
                raise TypeError(f"policy must be callable as policy(features, noise), got {type(policy).__name__}")
            policy_noise = self._policy_noise(policy, noise, (n, horizon))
            out = op(*args, policy=policy, policy_params=params, policy_noise=policy_noise, cache=self.unroll_cache)
        return TensorDict(out, batch_size=[n, horizon])

    def _backend(self, backend, tensor, family: str, inputs, **shape) -> str:
        """The backend for one unroll; `auto` sees the problem (spec, dtype, precision, whether a
        backward is needed, and the unroll's kind and shape)."""
        def problem() -> dict:  # built only when `auto` chooses
            grad = torch.is_grad_enabled() and any(t.requires_grad for t in (*inputs, *self.parameters()))
            return {"spec": self.op_spec(), "dtype": tensor.dtype, "precision": resolve_precision(None, tensor.device),
                    "grad": grad, **shape}
        return resolve_backend(backend, self.backend, device=tensor.device, vmapped=is_batched(tensor), family=family,
                               problem=problem)

    # ------------------------------------------------------------------ input checks
    def _check_tensor(self, name, value, shape) -> None:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(value).__name__}")
        if not value.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {value.dtype}")
        dtype = self.post_embed.weight.dtype
        if value.dtype != dtype and not torch.is_autocast_enabled(value.device.type):
            raise TypeError(f"{name} has dtype {value.dtype} but the RSSM's parameters are {dtype}; "
                            f"convert it with .to({dtype}) (or the module with .to({value.dtype}))")
        if value.dim() != len(shape) or any(s is not None and s != v for s, v in zip(shape, value.shape)):
            # built only on failure: under torch.compile with dynamic shapes, str() of a SymInt can't be traced
            expected = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{name} must have shape {expected}, got {list(value.shape)}")

    @staticmethod
    def _check_is_first(is_first, shape) -> None:
        if not isinstance(is_first, torch.Tensor) or is_first.dtype != torch.bool:
            got = getattr(is_first, "dtype", type(is_first).__name__)
            raise TypeError(f"is_first must be a bool tensor of shape {list(shape)}, got {got}")
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

    def _policy_noise(self, policy, noise, batch_shape):
        """The policy's own draws (RNG contract): `noise["policy"]` when given, else drawn by the
        policy when it can say what they are (`policy.noise`), else None."""
        policy_noise = noise.get("policy", None) if hasattr(noise, "get") else None
        if policy_noise is None:
            return policy.noise(batch_shape) if hasattr(policy, "noise") else None
        if not isinstance(policy_noise, torch.Tensor) or tuple(policy_noise.shape[:2]) != tuple(batch_shape):
            raise ValueError(f"noise['policy'] must be [{batch_shape[0]}, {batch_shape[1]}, ...] (one draw per "
                             f"imagined step), got {list(getattr(policy_noise, 'shape', []))}")
        if isinstance(policy, Actor) and tuple(policy_noise.shape) != (*batch_shape, policy.action_dim):
            raise ValueError(f"noise['policy'] must be {[*batch_shape, policy.action_dim]} (Actor.noise), "
                             f"got {list(policy_noise.shape)}")
        return policy_noise
