"""torchrl 0.14 peers built at the bench shapes and fed the bench's tensors.

- V1 observe: `RSSMRollout(RSSMPrior, RSSMPosterior)`; the prior/posterior noise is passed through
  extra in_keys, so it consumes the same pre-drawn noise as our rows.
- V3 observe: `RSSMRolloutV3` with `RSSMPriorV3(recurrent_model="block_gru")` and an RMS-normed
  `RSSMPosteriorV3` (its tensor fast path; it draws its own uniforms).
- imagination: `DreamerEnv.rollout` with an actor in the loop, the path `DreamerV3ActorLoss` takes.

Settings: eager everywhere; with `compile=True` (the default on CUDA) the compiled variants too:
`RSSMRollout(compile_step=True)` and `RSSMRolloutV3.compile_rollout("step")` /
`compile_rollout("scan", unroll=8)`. Their first call is checked against the eager module on the
same seed. torchrl parameterises the models its own way (e.g. std = max(softplus, 0.1), the
reference DreamerV3 block-GRU layout), so its rows are timed on the same shapes and inputs, not
checked against our outputs.
"""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.runner import Unavailable


def require_torchrl():
    try:
        import tensordict  # noqa: F401
        import torchrl
    except Exception as exc:  # ImportError, or a wheel built against another torch
        raise Unavailable(f"torchrl not importable: {type(exc).__name__}: {exc}") from None
    if not torchrl.__version__.startswith("0.14"):
        raise Unavailable(f"torchrl {torchrl.__version__} installed; these peers are written for 0.14")
    return torchrl


def allow_recompiles(limit: int = 64) -> None:
    """Every compiled peer row builds a fresh module; dynamo's default limit (8 recompiles per code
    object) would otherwise drop later rows to eager silently, mislabelling them as compiled."""
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(limit, getattr(torch._dynamo.config, name)))


def v1_rollout(cfg, device: torch.device, *, compile_step: bool = False):
    require_torchrl()
    from tensordict.nn import TensorDictModule
    from torchrl.data import Unbounded
    from torchrl.modules.models.model_based import RSSMPosterior, RSSMPrior, RSSMRollout

    prior = RSSMPrior(Unbounded(cfg.action), hidden_dim=cfg.hidden, rnn_hidden_dim=cfg.deter, state_dim=cfg.stoch,
                      action_dim=cfg.action, device=device)
    posterior = RSSMPosterior(hidden_dim=cfg.hidden, state_dim=cfg.stoch, rnn_hidden_dim=cfg.deter,
                              obs_embed_dim=cfg.embed, device=device)
    return RSSMRollout(
        TensorDictModule(prior, in_keys=["state", "belief", "action", "prior_noise"],
                         out_keys=[("next", "prior_mean"), ("next", "prior_std"), "_", ("next", "belief")]),
        TensorDictModule(posterior, in_keys=[("next", "belief"), ("next", "encoded_latents"), ("next", "post_noise")],
                         out_keys=[("next", "posterior_mean"), ("next", "posterior_std"), ("next", "state")]),
        compile_step=compile_step,
    )


def v3_rollout(cfg, device: torch.device, *, compile_scope: str | None = None, unroll: int = 8):
    require_torchrl()
    from tensordict.nn import TensorDictModule
    from torchrl.modules.models.model_based import RSSMPosteriorV3, RSSMPriorV3, RSSMRolloutV3

    prior = RSSMPriorV3(action_shape=(cfg.action,), hidden_dim=cfg.hidden, rnn_hidden_dim=cfg.deter,
                        num_categoricals=cfg.stoch, num_classes=cfg.classes, action_dim=cfg.action, device=device,
                        recurrent_model="block_gru", num_blocks=cfg.blocks, num_layers=1, prior_num_layers=1,
                        unimix=cfg.unimix)
    posterior = RSSMPosteriorV3(hidden_dim=cfg.hidden, num_categoricals=cfg.stoch, num_classes=cfg.classes,
                                rnn_hidden_dim=cfg.deter, obs_embed_dim=cfg.embed, device=device, use_rms_norm=True,
                                num_layers=1, unimix=cfg.unimix)
    rollout = RSSMRolloutV3(
        TensorDictModule(prior, in_keys=["state", "belief", "action"],
                         out_keys=[("next", "prior_logits"), ("next", "state"), ("next", "belief")]),
        TensorDictModule(posterior, in_keys=[("next", "belief"), ("next", "encoded_latents")],
                         out_keys=[("next", "posterior_logits"), ("next", "state")]),
        reset_key="is_init",
    )
    if compile_scope == "step":
        rollout.compile_rollout("step")
    elif compile_scope == "scan":
        rollout.compile_rollout("scan", unroll=unroll)
    return rollout


def observe_input(cfg, s: dict) -> Any:
    """The bench's observe tensors in the layout the rollouts read ([B, T] TensorDict)."""
    from tensordict import TensorDict

    batch, steps = s["embed"].shape[:2]
    expand = lambda v: v.unsqueeze(1).expand(batch, steps, v.shape[-1])  # noqa: E731  start state at every t
    data = {"state": expand(s["state"]["stoch"]), "belief": expand(s["state"]["deter"]), "action": s["action"],
            "next": {"encoded_latents": s["embed"]}}
    if cfg.classes:
        data["is_init"] = s["is_first"].unsqueeze(-1)
    else:  # RSSMRollout has no reset handling; the noise rides along as inputs
        data["prior_noise"] = s["noise"]["prior"]
        data["next"]["post_noise"] = s["noise"]["posterior"]
    return TensorDict(data, batch_size=[batch, steps])


def observe_outputs(out) -> dict[str, torch.Tensor]:
    keys = ["state", "belief", "prior_logits", "posterior_logits", "prior_mean", "prior_std", "posterior_mean",
            "posterior_std"]
    nxt = out.get("next")
    return {k: nxt.get(k) for k in keys if k in nxt.keys()}


def imagination(cfg, device: torch.device):
    """(env, actor, parameters) for `imagine`: a DreamerEnv around the prior and a reward head."""
    require_torchrl()
    from tensordict.nn import (
        InteractionType,
        ProbabilisticTensorDictModule,
        ProbabilisticTensorDictSequential,
        TensorDictModule,
    )
    from torchrl.data import Bounded, Composite, OneHot, Unbounded
    from torchrl.envs.model_based.dreamer import DreamerEnv
    from torchrl.modules import MLP, OneHotCategorical, TanhNormal, WorldModelWrapper
    from torchrl.modules.models.model_based import DreamerActor, RSSMPrior, RSSMPriorV3

    stoch_dim = cfg.stoch * cfg.classes if cfg.classes else cfg.stoch
    if cfg.classes:
        prior = RSSMPriorV3(action_shape=(cfg.action,), hidden_dim=cfg.hidden, rnn_hidden_dim=cfg.deter,
                            num_categoricals=cfg.stoch, num_classes=cfg.classes, action_dim=cfg.action, device=device,
                            recurrent_model="block_gru", num_blocks=cfg.blocks, prior_num_layers=1, unimix=cfg.unimix)
        transition = TensorDictModule(prior, in_keys=["state", "belief", "action"], out_keys=["_", "state", "belief"])
        action_spec = OneHot(cfg.action, device=device)
        net = MLP(in_features=stoch_dim + cfg.deter, out_features=cfg.action, depth=cfg.actor_layers,
                  num_cells=cfg.actor_hidden, activation_class=torch.nn.SiLU, device=device)
        actor = ProbabilisticTensorDictSequential(
            TensorDictModule(net, in_keys=["state", "belief"], out_keys=["logits"]),
            ProbabilisticTensorDictModule(in_keys=["logits"], out_keys=["action"], distribution_class=OneHotCategorical,
                                          default_interaction_type=InteractionType.RANDOM))
    else:
        prior = RSSMPrior(Unbounded(cfg.action), hidden_dim=cfg.hidden, rnn_hidden_dim=cfg.deter, state_dim=cfg.stoch,
                          action_dim=cfg.action, device=device)
        transition = TensorDictModule(prior, in_keys=["state", "belief", "action"],
                                      out_keys=["_mean", "_std", "state", "belief"])
        action_spec = Bounded(-1, 1, (cfg.action,), device=device)
        net = DreamerActor(out_features=cfg.action, depth=cfg.actor_layers, num_cells=cfg.actor_hidden, device=device)
        # materialise lazy layers
        net(torch.zeros(1, stoch_dim, device=device), torch.zeros(1, cfg.deter, device=device))
        actor = ProbabilisticTensorDictSequential(
            TensorDictModule(net, in_keys=["state", "belief"], out_keys=["loc", "scale"]),
            ProbabilisticTensorDictModule(in_keys=["loc", "scale"], out_keys=["action"], distribution_class=TanhNormal,
                                          default_interaction_type=InteractionType.RANDOM))
    # a linear reward head on concat(state, belief): DreamerEnv needs one; it is the cheapest
    reward = TensorDictModule(MLP(in_features=stoch_dim + cfg.deter, out_features=1, depth=0, device=device),
                              in_keys=["state", "belief"], out_keys=["reward"])
    env = DreamerEnv(WorldModelWrapper(transition, reward),
                     prior_shape=torch.Size([stoch_dim]), belief_shape=torch.Size([cfg.deter]), device=device)
    env.observation_spec = Composite(state=Unbounded(stoch_dim, device=device),
                                     belief=Unbounded(cfg.deter, device=device), device=device)
    env.state_spec = env.observation_spec.clone()
    env.action_spec = action_spec
    env.reward_spec = Unbounded((1,), device=device)
    return env, actor, [*prior.parameters(), *actor.parameters(), *reward.parameters()]


def imagine(env, actor, start: dict, horizon: int):
    from tensordict import TensorDict
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    td = TensorDict({"state": start["stoch"], "belief": start["deter"]}, batch_size=[start["deter"].shape[0]])
    with set_exploration_type(ExplorationType.RANDOM):
        td = env.reset(td)
        out = env.rollout(max_steps=horizon, policy=actor, auto_reset=False, tensordict=td,
                          break_when_any_done=False)
    nxt = out.get("next")
    return {"state": nxt.get("state"), "belief": nxt.get("belief"), "action": out.get("action"),
            "reward": nxt.get("reward")}
