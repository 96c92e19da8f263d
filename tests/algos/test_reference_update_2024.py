"""One update of the `dmc_proprio` agent (the 2024 protocol) against the 2024 DreamerV3 reference's own code.

`reference/dreamerv3_2024_update.npz` holds an update made by danijar/dreamerv3 at 2411f7d
(`reference/make_dreamerv3_2024_update.py` wrote it, with jax): REINFORCE, LaProp with AGC, the block
GRU in the reference's layout, replay context and the replay-critic loss, every layer with its bias
(`model.linear_bias=always`). Here the preset's agent at the same tiny sizes takes those weights, the
batch (its first step is the context the sequence is filtered from; an episode ends in a terminal state
midway) and the same deterministic samples, and must compute every gradient and the weights after
LaProp's first step. The continuation is the reference's as configured: its contdisc (the continue head
learns 1 - 1/horizon, `algo.continue_label=discounted`) and its start weights from the data
(`algo.start_continue=data`), both the preset's, at horizon 333 (`algo.gamma` = 1 - 1/333).

Mapped here besides what the 2023 test maps: the reference's BlockLinear kernel [g, deter/g + 3 hidden,
deter/g] is our `dyn_h` (the deter rows) and `dyn_x` (the input rows, block by block), its `dyncore` our
`gates_w` / `gates_b`; its two-hot layers have 256 outputs of which the last is cut off (255 bins); one
optimizer there (the same gradients as our three: each weight's gradient comes from the same losses).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tests._messages import labelled
from tests.algos.test_reference_update import (BACKENDS, assert_weights, load_fixture, preset_agent, return_range,
                                               sample_as_the_reference)

FIXTURE = Path(__file__).parent / "reference" / "dreamerv3_2024_update.npz"
LAYOUT_BACKENDS = [b for b in BACKENDS if b != "triton"]  # triton names why it does not take this layout
GAMMA = 1 - 1 / 333  # the reference's horizon 333


@pytest.fixture(scope="module")
def reference() -> dict:
    return load_fixture(FIXTURE)


def our_agent(s: dict[str, int], backend: str):
    agent = preset_agent("dmc_proprio", s, [
        f"model.deter={s['deter']}", f"model.hidden={s['hidden']}", f"model.stoch={s['stoch']}",
        f"model.classes={s['classes']}", f"model.blocks={s['blocks']}", f"model.units={s['units']}",
        f"+model.encoder_units={s['mlp_units']}", f"model.encoder_layers={s['mlp_layers']}",
        f"algo.horizon={s['horizon']}", f"algo.gamma={GAMMA!r}", "algo.optim.warmup=0"], backend)
    # the preset's
    assert agent.world_model.rssm.in_deter[0].bias is not None and agent.cfg.replay_context
    assert (agent.continue_label, agent.start_continue) == ("discounted", "data")
    return agent


def to_ours(ref: dict[str, np.ndarray], s: dict[str, int]) -> dict[str, np.ndarray]:
    """Our state_dict names -> the reference's arrays (weights or gradients) in our layout."""
    deter, blocks = s["deter"], s["blocks"]
    features = lambda k: np.concatenate([k[deter:], k[:deter]], 0)  # noqa: E731 ([deter, stoch] -> [stoch, deter])
    same = lambda k: k  # noqa: E731
    out = {}

    def dense(theirs, ours, first=same):
        out[f"{ours}.0.weight"] = first(ref[f"{theirs}/kernel"]).T
        out[f"{ours}.0.bias"] = ref[f"{theirs}/bias"]
        out[f"{ours}.1.scale"] = ref[f"{theirs}/norm/scale"]

    def linear(theirs, ours, outputs=None):
        out[f"{ours}.weight"] = ref[f"{theirs}/kernel"][:, :outputs].T
        out[f"{ours}.bias"] = ref[f"{theirs}/bias"][:outputs]

    for i in range(s["mlp_layers"]):
        dense(f"agent/enc/mlp{i}", f"world_model.encoder.net.{i}")
        dense(f"agent/dec/mlp{i}", f"world_model.decoder.net.{i}", features if i == 0 else same)
    linear("agent/dec/out_state/out", f"world_model.decoder.net.{s['mlp_layers']}")
    for theirs, ours, layers, outputs in [("rew", "world_model.reward", 1, 255), ("con", "world_model.cont", 1, None),
                                          ("critic", "critic", 3, 255), ("slowcritic", "slow_critic", 3, 255)]:
        for i in range(layers):
            dense(f"agent/{theirs}/h{i}", f"{ours}.net.{i}", features if i == 0 else same)
        linear(f"agent/{theirs}/dist/out", f"{ours}.net.{layers}", outputs)
    for i in range(3):
        dense(f"agent/actor/h{i}", f"actor.net.{i}", features if i == 0 else same)
    actor = "agent/actor/action"
    out["actor.net.3.weight"] = np.concatenate([ref[f"{actor}/out/kernel"], ref[f"{actor}/std/kernel"]], 1).T
    out["actor.net.3.bias"] = np.concatenate([ref[f"{actor}/out/bias"], ref[f"{actor}/std/bias"]], 0)

    r, o = "agent/dyn", "world_model.rssm"
    for i, name in enumerate(("in_deter", "in_stoch", "in_action")):
        dense(f"{r}/dynin{i}", f"{o}.{name}")
    kernel, per_block = ref[f"{r}/dyn0/kernel"], deter // blocks  # [g, deter/g + 3 hidden, deter/g]
    out[f"{o}.dyn_h"] = kernel[:, :per_block]
    out[f"{o}.dyn_x.weight"] = np.concatenate([kernel[g, per_block:].T for g in range(blocks)], 0)
    out[f"{o}.dyn_x.bias"] = ref[f"{r}/dyn0/bias"]
    out[f"{o}.dyn_out.0.scale"] = ref[f"{r}/dyn0/norm/scale"]
    out[f"{o}.gates_w"] = ref[f"{r}/dyncore/kernel"]
    out[f"{o}.gates_b"] = ref[f"{r}/dyncore/bias"].reshape(blocks, -1)
    dense(f"{r}/img0", f"{o}.prior_head.0")
    dense(f"{r}/img1", f"{o}.prior_head.1")
    linear(f"{r}/imglogit", f"{o}.prior_head.2")
    kernel = ref[f"{r}/obs0/kernel"]  # over [deter, embed]
    out[f"{o}.post_deter.weight"], out[f"{o}.post_embed.weight"] = kernel[:deter].T, kernel[deter:].T
    out[f"{o}.post_embed.bias"] = ref[f"{r}/obs0/bias"]
    out[f"{o}.post_head.0.scale"] = ref[f"{r}/obs0/norm/scale"]
    linear(f"{r}/obslogit", f"{o}.post_head.2")
    return out


def our_batch(ref: dict[str, np.ndarray], s: dict[str, int]) -> TensorDict:
    """Steps 1.. of the reference's batch; its step 0 is the context our batch stores at its first step.
    Our action[t] is the one taken before obs t: the reference's action[:, t] (step 0's is zeros there)."""
    B, T = ref["state"].shape[0], ref["state"].shape[1] - 1
    context = TensorDict({"deter": torch.zeros(B, T, s["deter"]),
                          "stoch": torch.zeros(B, T, s["stoch"], dtype=torch.int16)}, batch_size=[B, T])
    context["deter"][:, 0] = torch.as_tensor(ref["deter"][:, 0])
    context["stoch"][:, 0] = torch.as_tensor(ref["stoch"][:, 0]).to(torch.int16)
    steps = {k: torch.as_tensor(ref[k][:, 1:]) for k in ("reward", "is_first", "is_terminal", "is_last")}
    return TensorDict({"obs": torch.as_tensor(ref["state"][:, 1:]), "action": torch.as_tensor(ref["action"][:, :-1]),
                       "context": context, **steps}, batch_size=[B, T])


@pytest.mark.parametrize("backend", LAYOUT_BACKENDS)
def test_one_update_is_the_2024_references(monkeypatch, reference, backend):
    """Every gradient (the world model's, the actor's, the critic's with the replay-critic loss) and every
    weight after LaProp's step with AGC, on every backend that takes the reference's RSSM layout."""
    s = reference["sizes"]
    agent = our_agent(s, backend)
    state = agent.state_dict()
    weights = to_ours(reference["before"], s)
    assert set(weights) == set(state) - {"updates", "return_scale"}
    state.update({n: torch.as_tensor(np.ascontiguousarray(v)) for n, v in weights.items()})
    agent.load_state_dict(state)
    sample_as_the_reference(monkeypatch, reference)
    names = {id(p): n for n, p in agent.named_parameters()}
    grads = {}
    for opt in agent.optimizers().values():
        def apply(opt=opt, apply=opt.apply):
            grads.update({names[id(p)]: p.grad.clone() for p in opt.params if p.grad is not None})
            return apply()

        monkeypatch.setattr(opt, "apply", apply)
    agent.update(our_batch(reference["batch"], s))

    zeros = {k: np.zeros_like(v) for k, v in reference["before"].items()}
    theirs = {k.removeprefix("opt/"): v for k, v in reference["grad"].items()}
    want = {n.replace(".scale", ".weight"): v for n, v in to_ours({**zeros, **theirs}, s).items()}  # RMSNorm's name
    assert set(grads) == {n for n in want if not n.startswith("slow_critic.")}
    for name, grad in grads.items():
        expected = torch.as_tensor(np.ascontiguousarray(want[name]))
        scale = expected.abs().max().item()
        torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-4 * scale, msg=labelled(name))
    torch.testing.assert_close(agent.return_scale, return_range(reference["state"], "retnorm"), rtol=1e-4, atol=0,
                               msg="the return normaliser's EMA of the 5-95 percentile range")
    assert_weights(agent, to_ours(reference["after"], s), atol=2e-6, when="after the update")
