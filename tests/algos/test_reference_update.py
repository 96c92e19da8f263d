"""One update and a few policy steps of the `dmc_proprio_2023` agent against the 2023 DreamerV3
reference's own code.

`reference/dreamerv3_2023_update.npz` holds an update made by danijar/dreamerv3 at 423291a
(`reference/make_dreamerv3_2023_update.py` wrote it, with jax): its weights before, the batch, each
optimizer's loss and gradients, its weights after, and its policy's actions through a few env steps.
Here our agent, built from the preset at the same tiny sizes (nothing else overridden), takes those
weights and that batch with the same deterministic samples (each latent's mode, the actor's mean +
NOISE * std), and must compute the same losses, every gradient, the same weights after the update,
and then the same actions; with any of the preset's 2023 choices undone (update order, continuation
flags, sequence start), it must not.

The reference's layout, mapped here: Dense kernels are [in, out] (ours [out, in]); heads read
[deter, stoch] (ours [stoch, deter]); `img_in` reads [stoch, action] (ours: `in_stoch`, `in_action`);
`obs_out` reads [deter, embed] (ours: `post_deter`, `post_embed`); the actor's `dist_out` has `out`
(the mean) and `std` layers (ours: one layer, mean then std); and a batch's action[t] is the action
taken at observation t (ours: the one taken before it).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from tensordict import TensorDict

from tests._messages import labelled
from worldmodels.algos import ALGOS
from worldmodels.core import registry
from worldmodels.models import RSSM
from worldmodels.models.actor import Actor

FIXTURE = Path(__file__).parent / "reference" / "dreamerv3_2023_update.npz"
CONFIGS = str(Path(__file__).resolve().parents[2] / "configs")
BACKENDS = registry.available_backends("cpu", "rssm_observe")


@pytest.fixture(scope="module")
def reference() -> dict[str, dict[str, np.ndarray]]:
    return load_fixture(FIXTURE)


def load_fixture(path: Path) -> dict:
    """A reference fixture as {group: {name: array}} ("before", "after", "batch", "grad", "loss", "sizes" as
    ints, and "noise")."""
    z = np.load(path)
    out = {}
    for key in z.files:
        group, _, name = key.partition("/")
        if name:
            out.setdefault(group, {})[name] = z[key]
        else:
            out[key] = z[key]
    out["sizes"] = {k: int(v) for k, v in out["sizes"].items()}
    return out


def return_range(state: dict[str, np.ndarray], scope: str) -> torch.Tensor:
    """The reference's return normaliser `scope` in a fixture's state: its EMA of the 95th percentile less
    its EMA of the 5th (ours keeps the EMA of that range: the same number)."""
    ema = {k.rsplit("/", 2)[-2]: v for k, v in state.items() if f"/{scope}/" in k}
    return torch.as_tensor(ema["high"] - ema["low"])


def preset_agent(preset: str, sizes: dict[str, int], overrides: list[str], backend: str):
    """DreamerV3 from `+experiment=<preset>` with `overrides` (the fixture's sizes), on `backend`."""
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        cfg = compose("config", overrides=[f"+experiment={preset}", "logger=none",
                                           f"run_dir={tempfile.mkdtemp()}/run", *overrides])
    return ALGOS["dreamer_v3"]((sizes["obs"],), sizes["actions"], False, cfg.model, cfg.algo, backend=backend)


def our_agent(sizes: dict[str, int], *overrides: str, backend: str = "loop"):
    s = sizes
    return preset_agent("dmc_proprio_2023", s, [
        f"model.deter={s['deter']}", f"model.hidden={s['units']}", f"model.stoch={s['stoch']}",
        f"model.classes={s['classes']}", f"model.units={s['units']}", f"model.encoder_units={s['mlp_units']}",
        f"model.encoder_layers={s['mlp_layers']}", f"model.head_layers={s['layers']}",
        f"model.actor_layers={s['layers']}", f"algo.horizon={s['horizon']}",
        *overrides], backend)


def to_ours(ref: dict[str, np.ndarray], sizes: dict[str, int]) -> dict[str, np.ndarray]:
    """Our state_dict names -> the reference's arrays (weights, or gradients) in our layout."""
    deter, stoch = sizes["deter"], sizes["stoch"] * sizes["classes"]
    features = lambda k: np.concatenate([k[deter:], k[:deter]], 0)  # noqa: E731 ([deter, stoch] -> [stoch, deter])
    out = {}

    def mlp(theirs, ours, layers, out_kernel, out_bias, first=lambda k: k):
        for i in range(layers):
            out[f"{ours}.{i}.0.weight"] = (first if i == 0 else (lambda k: k))(ref[f"{theirs}/h{i}/kernel"]).T
            out[f"{ours}.{i}.1.weight"] = ref[f"{theirs}/h{i}/norm/scale"]
            out[f"{ours}.{i}.1.bias"] = ref[f"{theirs}/h{i}/norm/bias"]
        if out_kernel is not None:
            out[f"{ours}.{layers}.weight"], out[f"{ours}.{layers}.bias"] = out_kernel.T, out_bias

    layers, enc_layers = sizes["layers"], sizes["mlp_layers"]
    mlp("agent/wm/enc/mlp", "world_model.encoder.net", enc_layers, None, None)
    dec = "agent/wm/dec/mlp"
    mlp(dec, "world_model.decoder.net", enc_layers, ref[f"{dec}/dist_state/out/kernel"],
        ref[f"{dec}/dist_state/out/bias"], features)
    for theirs, ours in [("agent/wm/rew", "world_model.reward.net"), ("agent/wm/cont", "world_model.cont.net"),
                         ("agent/task_behavior/critic/net", "critic.net"),
                         ("agent/task_behavior/critic/slow", "slow_critic.net")]:
        mlp(theirs, ours, layers, ref[f"{theirs}/dist_out/out/kernel"], ref[f"{theirs}/dist_out/out/bias"], features)
    actor = "agent/task_behavior/ac/actor"
    mlp(actor, "actor.net", layers,
        np.concatenate([ref[f"{actor}/dist_out/out/kernel"], ref[f"{actor}/dist_out/std/kernel"]], 1),
        np.concatenate([ref[f"{actor}/dist_out/out/bias"], ref[f"{actor}/dist_out/std/bias"]], 0), features)

    r, o = "agent/wm/rssm", "world_model.rssm"
    norm = lambda theirs, ours: out.update({f"{ours}.weight": ref[f"{r}/{theirs}/norm/scale"],  # noqa: E731
                                            f"{ours}.bias": ref[f"{r}/{theirs}/norm/bias"]})
    out[f"{o}.initial_deter"] = ref[f"{r}/initial"]
    k = ref[f"{r}/img_in/kernel"]
    out[f"{o}.in_stoch.weight"], out[f"{o}.in_action.weight"] = k[:stoch].T, k[stoch:].T
    norm("img_in", f"{o}.in_out.0")
    out[f"{o}.gates.weight"] = ref[f"{r}/gru/kernel"].T  # both read [deter, x]
    norm("gru", f"{o}.gates_norm")
    out[f"{o}.prior_head.0.0.weight"] = ref[f"{r}/img_out/kernel"].T
    norm("img_out", f"{o}.prior_head.0.1")
    out[f"{o}.prior_head.1.weight"] = ref[f"{r}/img_stats/kernel"].T
    out[f"{o}.prior_head.1.bias"] = ref[f"{r}/img_stats/bias"]
    k = ref[f"{r}/obs_out/kernel"]
    out[f"{o}.post_deter.weight"], out[f"{o}.post_embed.weight"] = k[:deter].T, k[deter:].T
    norm("obs_out", f"{o}.post_head.0")
    out[f"{o}.post_head.2.weight"] = ref[f"{r}/obs_stats/kernel"].T
    out[f"{o}.post_head.2.bias"] = ref[f"{r}/obs_stats/bias"]
    return out


def our_batch(ref_batch: dict[str, np.ndarray], obs: torch.Tensor | None = None) -> TensorDict:
    """The reference's batch as our replay holds it, where no row starts an episode: the reference's
    replay marked every sequence's first step is_first (embodied/replay/generic.py `_sample`); ours
    does not, and holds the action taken before that step (here 0.5, where the reference's is reset).
    `obs`: the observations in our layout (default: the batch's "state" vectors)."""
    action = torch.as_tensor(ref_batch["action"])
    before = torch.cat([torch.full_like(action[:, :1], 0.5), action[:, :-1]], 1)  # the action taken before obs t
    obs = torch.as_tensor(ref_batch["state"]) if obs is None else obs
    keys = ("reward", "is_first", "is_terminal", "is_last")
    batch = TensorDict({"obs": obs, "action": before,
                        **{k: torch.tensor(ref_batch[k]) for k in keys}}, batch_size=action.shape[:2])
    assert batch["is_first"][:, 0].all()  # the reference's mark: undone
    batch["is_first"][:, 0] = False
    return batch


def load_reference(agent, ref: dict[str, np.ndarray], sizes: dict[str, int]) -> None:
    load_weights(agent, to_ours(ref, sizes))


def load_weights(agent, weights: dict[str, np.ndarray]) -> None:
    """`weights` in our names and layout into `agent`: every parameter, each of its own shape."""
    state = agent.state_dict()
    assert set(weights) == {n for n, _ in agent.named_parameters()}
    for name, value in weights.items():
        assert tuple(state[name].shape) == value.shape, name
        state[name] = torch.as_tensor(np.ascontiguousarray(value))
    agent.load_state_dict(state)


def sample_as_the_reference(monkeypatch, reference: dict) -> None:
    """Our pre-drawn noise for the reference's deterministic samples: zero Gumbel noise (each latent
    takes its mode) and the actor's standard-normal draw fixed at `noise`."""

    def rssm_noise(self, shape, *, generator=None):  # zero Gumbel noise: every latent takes its mode
        zeros = torch.zeros(*shape, self.stoch, self.classes)
        return TensorDict({"prior": zeros, "posterior": zeros.clone()}, batch_size=torch.Size(shape))

    noise = torch.as_tensor(reference["noise"])
    monkeypatch.setattr(RSSM, "noise", rssm_noise)
    monkeypatch.setattr(Actor, "noise", lambda self, shape, *, generator=None: noise.expand(*shape, -1).clone())


def update_as_the_reference(monkeypatch, reference, *overrides: str, backend: str = "loop"):
    """Our agent on the reference's weights, batch and samples: (agent, {optimizer: (loss, {name: grad})})."""
    agent = our_agent(reference["sizes"], *overrides, backend=backend)
    load_reference(agent, reference["before"], reference["sizes"])
    sample_as_the_reference(monkeypatch, reference)
    seen = record_optimizers(monkeypatch, agent)
    agent.update(our_batch(reference["batch"]))
    return agent, seen


def assert_grads(agent, ours: str, grads: dict[str, torch.Tensor], want: dict[str, np.ndarray]) -> None:
    """The optimiser `ours` stepped on gradients of exactly its parameters, each equal to `want`'s (in our
    names and layout) to 1e-4 of its largest entry."""
    opt = getattr(agent, ours)
    assert set(grads) == {n for n, p in agent.named_parameters() if any(p is q for q in opt.params)}, ours
    for name, grad in grads.items():
        expected = torch.as_tensor(np.ascontiguousarray(want[name]))
        scale = expected.abs().max().item()
        torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-4 * scale, msg=labelled(f"{ours}: {name}"))


def assert_weights(agent, weights: dict[str, np.ndarray], atol: float, when: str) -> None:
    """Every one of `weights` (our names and layout) equals the agent's to `atol`."""
    state = agent.state_dict()
    for name, value in weights.items():
        torch.testing.assert_close(state[name], torch.as_tensor(np.ascontiguousarray(value)), rtol=0, atol=atol,
                                   msg=f"{name} {when}")


def record_optimizers(monkeypatch, agent) -> dict:
    """{optimizer: (loss, {name: grad})}, filled by the agent's next update: each optimiser's loss and the
    gradients it steps on."""
    seen, names = {}, {id(p): n for n, p in agent.named_parameters()}
    for name in ("wm_opt", "actor_opt", "critic_opt"):
        opt = getattr(agent, name)

        def step(loss, name=name, step=opt.step):
            seen[name] = (loss.detach(), {})
            return step(loss)

        def apply(opt=opt, name=name, apply=opt.apply):
            grads = seen.setdefault(name, (None, {}))[1]  # same_weights: one backward, no step() of its own
            grads.update({names[id(p)]: p.grad.clone() for p in opt.params if p.grad is not None})
            return apply()

        monkeypatch.setattr(opt, "step", step)
        monkeypatch.setattr(opt, "apply", apply)
    return seen


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_update_is_the_2023_references(monkeypatch, reference, backend):
    """Losses, every gradient and every weight after the update, of all three optimizers, on every
    backend this machine runs (`triton`: the fused kernels, under Triton's interpreter on CPU). Fails
    where one piece differs: so it found the learned initial state's stoch passing a straight-through
    gradient to the prior head and `initial` (the reference's is the prior's mode, no gradient)."""
    agent, seen = update_as_the_reference(monkeypatch, reference, backend=backend)
    sizes = reference["sizes"]
    for ours, theirs in [("wm_opt", "model_opt"), ("actor_opt", "actor_opt"), ("critic_opt", "critic_opt")]:
        loss, grads = seen[ours]
        torch.testing.assert_close(loss, torch.as_tensor(reference["loss"][theirs]), rtol=1e-5, atol=1e-6,
                                   msg=f"{ours} loss")
        ref_grads = {k.removeprefix(f"{theirs}/"): v for k, v in reference["grad"].items()
                     if k.startswith(f"{theirs}/")}
        want = to_ours({**{k: np.zeros_like(v) for k, v in reference["before"].items()}, **ref_grads}, sizes)
        assert_grads(agent, ours, grads, want)
    # the return normaliser's EMA of the 5-95 percentile range (the reference's: of each percentile),
    # compared as it is: max(1, it) divided the advantages, so the gradients alone would not see it
    torch.testing.assert_close(agent.return_scale, return_range(reference["state"], "retnorm_extr"), rtol=1e-4,
                               atol=1e-9)
    assert_weights(agent, to_ours(reference["after"], sizes), atol=2e-6, when="after the update")


def test_two_updates_are_the_2023_references(monkeypatch, reference):
    """A second update on another batch, from where the first left every optimizer, the slow critic and
    the return normaliser: each optimizer's loss, every weight after it and the normaliser's EMA range."""
    agent, seen = update_as_the_reference(monkeypatch, reference)
    agent.update(our_batch(reference["batch2"]))
    for ours, theirs in [("wm_opt", "model_opt"), ("actor_opt", "actor_opt"), ("critic_opt", "critic_opt")]:
        torch.testing.assert_close(seen[ours][0], torch.as_tensor(reference["loss2"][theirs]), rtol=1e-5, atol=1e-6,
                                   msg=f"{ours} loss of the second update")
    torch.testing.assert_close(agent.return_scale, return_range(reference["state2"], "retnorm_extr"), rtol=1e-4,
                               atol=1e-9)
    assert_weights(agent, to_ours(reference["after2"], reference["sizes"]), atol=4e-6, when="after the second update")


def test_a_sequence_filtered_from_zeros_is_not_the_2023_update(monkeypatch, reference):
    """`algo.start_state=zeros` (a zero state and the replayed action before the first step, where the
    sequence does not start an episode) makes another world-model loss on the same batch: the 2023
    replay's start is `initial`, the preset's."""
    _, seen = update_as_the_reference(monkeypatch, reference, "algo.start_state=zeros")
    assert not torch.isclose(seen["wm_opt"][0], torch.as_tensor(reference["loss"]["model_opt"]), rtol=1e-3)


def test_every_loss_from_the_starting_weights_is_not_the_2023_update(monkeypatch, reference):
    """`algo.update_order=same_weights` (the later references: imagination with the weights the world-model
    loss saw) makes another actor loss: the 2023 Agent.train steps the world model first."""
    _, seen = update_as_the_reference(monkeypatch, reference, "algo.update_order=same_weights")
    ref_grads = {k.removeprefix("actor_opt/"): v for k, v in reference["grad"].items() if k.startswith("actor_opt/")}
    want = to_ours({**{k: np.zeros_like(v) for k, v in reference["before"].items()}, **ref_grads}, reference["sizes"])
    grads = seen["actor_opt"][1]
    want = {n: g for n, g in want.items() if n in grads}
    assert want and not all(torch.allclose(grads[n], torch.as_tensor(np.ascontiguousarray(g)), rtol=1e-4,
                                  atol=1e-4 * float(np.abs(g).max())) for n, g in want.items())


def test_the_continue_heads_probability_is_not_the_2023_update(monkeypatch, reference):
    """The later references' continuation flags (the head's probability after the start state) make another
    actor loss on the same update: the 2023 flags are `imagined_continue=mode`."""
    _, seen = update_as_the_reference(monkeypatch, reference, "algo.imagined_continue=probability")
    assert not torch.isclose(seen["actor_opt"][0], torch.as_tensor(reference["loss"]["actor_opt"]), rtol=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_policy_acts_as_the_2023_references(monkeypatch, reference, backend):
    """The collector's policy (filter step, then the actor's sample; the carried state is the posterior
    and the sampled action, which the next step clips) takes the reference policy's actions, with the
    updated weights, through 6 steps of 2 envs, one of them reset midway to the learned initial state."""
    agent = our_agent(reference["sizes"], backend=backend)
    load_reference(agent, reference["after"], reference["sizes"])
    sample_as_the_reference(monkeypatch, reference)
    acting = reference["acting"]
    policy, carry, actions = agent.policy("explore"), None, []
    for t in range(acting["state"].shape[1]):
        obs, is_first = torch.as_tensor(acting["state"][:, t]), torch.as_tensor(acting["is_first"][:, t])
        action, carry = policy(obs, is_first, carry)
        actions.append(action)
    assert (np.abs(acting["action"]) > 1).any()  # samples beyond the box: the next step's clip matters
    torch.testing.assert_close(torch.stack(actions, 1), torch.as_tensor(acting["action"]), rtol=1e-5, atol=1e-5)
