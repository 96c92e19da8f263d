"""torchrl 0.14's DreamerV3 learner at our learner shapes: `DreamerV3Loss` (model, actor, value
losses) stepped by `DreamerV3OptimizationStepper` with `DreamerV3Optimizer`.

Built from torchrl's public DreamerV3 modules at the same widths as our config (`deter`, `hidden`,
`stoch x classes`, `blocks`, `units`, conv `depth`, layers): `DreamerV3ImageEncoder/Decoder`
(channels depth x (1, 2, 4, 8), 5x5 kernels: torchrl's convs need odd kernels),
`RSSMRolloutV3` (block GRU, RMS-normed posterior), two-hot reward and value `DreamerV3MLP`s, a
continue head, `DreamerV3DiscreteActor` with REINFORCE, slow critic via `SoftUpdate`, horizon 15.
The stepper runs eagerly; on CUDA with the compiled peers on (the default there) also at its CUDA
defaults (torch.compile of the whole forward/backward + CUDA-graph capture, RSSM scan unrolled
by 8), after its own `warmup`.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from benchmarks.runner import Candidate, Unavailable
from benchmarks.shapes import ModelConfig
from benchmarks.torchrl_peers import require_torchrl, v3_rollout

SEED = 0


def candidates(shape, precision: str, device: torch.device, compile_: bool, configs) -> list[Candidate]:
    """`configs()` -> (model, algo) configs: the widths and hyper-parameters of our rows."""
    variants = [("eager", False)] + ([("compile + CUDA graph", True)] if compile_ and device.type == "cuda" else [])
    out = []
    for label, compiled in variants:
        settings = (f"DreamerV3Loss + DreamerV3OptimizationStepper ({label}), one DreamerV3Optimizer, "
                    f"{'bf16 autocast' if precision == 'bf16' else 'fp32'}")
        out.append(Candidate(f"torchrl DreamerV3Loss [{label}]", _builder(shape, precision, device, compiled, configs),
                             kind="peer", parity="not comparable (own model and losses)", settings=settings))
    return out


def _builder(shape, precision: str, device: torch.device, compiled: bool, configs):
    def build(s: dict):
        require_torchrl()
        model_cfg, algo_cfg = configs()
        torch.manual_seed(SEED)
        loss, optimizer, target_updater = build_stack(model_cfg, algo_cfg, shape, device)
        from torchrl.trainers.algorithms import DreamerV3OptimizationStepper

        stepper = DreamerV3OptimizationStepper(
            loss, optimizer, target_updater, compile_train_step=compiled, cudagraph=compiled,
            mixed_precision=precision == "bf16", warmup_steps=3)
        sample = replay_sample(s["batch"], model_cfg)
        if compiled:
            stepper.warmup(sample)

        def call() -> dict:
            with torch.autocast(device.type, dtype=torch.bfloat16,
                                enabled=precision == "bf16" and device.type != "cuda"):  # the stepper's own on CUDA
                metrics = stepper.step(None, sample)
            return {k: v for k, v in metrics.items() if k.startswith("loss_")}
        return call
    return build


def replay_sample(batch: TensorDict, model_cfg) -> TensorDict:
    """Our replay batch in torchrl's layout: pixels/reward/done under "next", the RSSM's start
    state and belief at the root (zeros, as a sequence start), is_init."""
    b, t = batch.batch_size
    stoch = model_cfg.stoch * model_cfg.classes
    device = batch.device
    done = batch["is_terminal"].unsqueeze(-1)
    return TensorDict({
        "state": torch.zeros(b, t, stoch, device=device),
        "belief": torch.zeros(b, t, model_cfg.deter, device=device),
        "action": batch["action"],
        "is_init": batch["is_first"].unsqueeze(-1),
        "next": {"pixels": batch["obs"], "reward": batch["reward"].unsqueeze(-1), "done": done,
                 "terminated": done},
    }, batch_size=[b, t])


def build_stack(model_cfg, algo_cfg, shape, device: torch.device):
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.data import Composite, OneHot, Unbounded
    from torchrl.envs.model_based.dreamer import DreamerEnv
    from torchrl.modules import (
        DreamerV3DiscreteActor,
        DreamerV3ImageDecoder,
        DreamerV3ImageEncoder,
        DreamerV3MLP,
        SymExpTwoHot,
        WorldModelWrapper,
    )
    from torchrl.objectives import DreamerV3ActorLoss, DreamerV3Loss, DreamerV3ModelLoss, DreamerV3ValueLoss, SoftUpdate
    from torchrl.objectives.utils import ValueEstimators
    from torchrl.trainers.algorithms import DreamerV3Optimizer

    if model_cfg.classes is None or model_cfg.cell != "block_gru":
        raise Unavailable("the torchrl DreamerV3 stack needs categorical latents and a block GRU")
    units, depth, mults = model_cfg.units, model_cfg.depth, (1, 2, 4, 8)
    stoch, deter = model_cfg.stoch * model_cfg.classes, model_cfg.deter
    feat = stoch + deter
    encoder = DreamerV3ImageEncoder(depth=depth, mults=mults, device=device)
    embed = encoder.output_features((3, shape.image, shape.image))
    rssm_cfg = ModelConfig(shape.model, deter=deter, stoch=model_cfg.stoch, hidden=model_cfg.hidden, embed=embed,
                           action=shape.action, classes=model_cfg.classes, blocks=model_cfg.blocks,
                           unimix=model_cfg.unimix)
    rollout = v3_rollout(rssm_cfg, device)
    next_feat = [("next", "state"), ("next", "belief")]
    reward_net = DreamerV3MLP(feat, 255, depth=model_cfg.head_layers, num_cells=units, outscale=0.0, device=device)
    cont_net = DreamerV3MLP(feat, 1, depth=model_cfg.head_layers, num_cells=units, device=device)
    world_model = TensorDictSequential(
        TensorDictModule(encoder, in_keys=[("next", "pixels")], out_keys=[("next", "encoded_latents")]),
        rollout,
        TensorDictModule(DreamerV3ImageDecoder(feat, depth=depth, mults=mults, num_blocks=model_cfg.blocks,
                                               device=device), in_keys=next_feat, out_keys=[("next", "reco_pixels")]),
        TensorDictModule(reward_net, in_keys=next_feat, out_keys=[("next", "reward_logits")]),
        TensorDictModule(cont_net, in_keys=next_feat, out_keys=[("next", "continue_pred")]),
    )
    kl = algo_cfg.kl
    model_loss = DreamerV3ModelLoss(world_model, lambda_continue=1.0, kl_mode="separate", lambda_dynamic=kl.dyn,
                                    lambda_representation=kl.rep, free_bits=kl.free, unimix=model_cfg.unimix,
                                    reco_symlog=False, detach_output=False)

    two_hot = lambda logits_key, out_key: TensorDictModule(SymExpTwoHot(255).to(device), in_keys=[logits_key],  # noqa: E731
                                                           out_keys=[out_key])
    imagination = WorldModelWrapper(
        TensorDictModule(rollout.rssm_prior.module, in_keys=["state", "belief", "action"],
                         out_keys=["_", "state", "belief"]),
        TensorDictSequential(TensorDictModule(reward_net, in_keys=["state", "belief"], out_keys=["reward_logits"]),
                             two_hot("reward_logits", "reward")),
    )
    env = DreamerEnv(imagination, prior_shape=torch.Size([stoch]), belief_shape=torch.Size([deter]), device=device)
    env.observation_spec = Composite(state=Unbounded(stoch, device=device), belief=Unbounded(deter, device=device),
                                     device=device)
    env.state_spec = env.observation_spec.clone()
    env.action_spec = OneHot(shape.action, device=device)
    env.reward_spec = Unbounded((1,), device=device)
    continuation = TensorDictSequential(
        TensorDictModule(cont_net, in_keys=["state", "belief"], out_keys=["continue_logit"]),
        TensorDictModule(torch.nn.Sigmoid(), in_keys=["continue_logit"], out_keys=["continuation"]),
    )
    actor = DreamerV3DiscreteActor(feat, shape.action, depth=model_cfg.actor_layers, num_cells=units,
                                   unimix=model_cfg.unimix, device=device)
    value = TensorDictSequential(
        TensorDictModule(DreamerV3MLP(feat, 255, depth=model_cfg.actor_layers, num_cells=units, outscale=0.0,
                                      device=device), in_keys=["state", "belief"], out_keys=["state_value_logits"]),
        two_hot("state_value_logits", "state_value"),
    )
    actor_loss = DreamerV3ActorLoss(actor, value, env, continuation_model=continuation,
                                    imagination_horizon=algo_cfg.horizon, use_reinforce=True,
                                    entropy_bonus=algo_cfg.entropy)
    actor_loss.make_value_estimator(ValueEstimators.TDLambda, gamma=algo_cfg.gamma, lmbda=algo_cfg.lam)
    value_loss = DreamerV3ValueLoss(value, value_loss="two_hot", actor_loss=actor_loss,
                                    slow_critic_regularization=algo_cfg.slow_reg)
    target_updater = SoftUpdate(value_loss, tau=algo_cfg.slow_rate)
    loss = DreamerV3Loss(model_loss, actor_loss, value_loss)
    optimizer = DreamerV3Optimizer(loss.parameters(), warmup_steps=0)
    return loss, optimizer, target_updater
