"""Writes `dreamerv3_2023_update.npz`: one update of the 2023 DreamerV3 reference's own code, which
`tests/algos/test_reference_update.py` repeats with our agent and compares.

The reference is danijar/dreamerv3 at 423291a (the code that made the DMC proprio score file),
imported from a checkout, not copied. Its `dmc_proprio` config, at tiny sizes, trains on one batch
of a finger_spin-shaped task (9 state features, 2 actions) on the CPU, with jit off. Its samples
are made deterministic, as ours are with pre-drawn noise: each categorical latent takes its mode
(its straight-through gradient kept) and the actor's Normal takes mean + NOISE * std.

The file holds every weight before the update (the reference's init, perturbed by N(0, 0.1) so that
zero-initialised outputs and unit norms do not hide a misplaced weight), the batch, each optimizer's
loss and gradients, every weight after the update, the other state the update leaves (the return
normaliser's 5th / 95th percentile EMAs), the actions its policy then takes (with the updated
weights) through 6 steps of 2 envs, one of which starts a new episode midway, and then a second
update on another batch: its losses, and the weights and state after it (`batch2/`, `loss2/`,
`after2/`, `state2/`).

Run it where jax is installed (not a dependency of this project):
    python -m venv /tmp/jv && . /tmp/jv/bin/activate
    pip install jax optax tfp-nightly ruamel.yaml cloudpickle rich 'numpy<2.3'
    git clone https://github.com/danijar/dreamerv3 /tmp/dreamerv3 && git -C /tmp/dreamerv3 checkout 423291a
    cd tests/algos/reference && python make_dreamerv3_2023_update.py /tmp/dreamerv3 dreamerv3_2023_update.npz
(jax 0.10 and tfp-nightly 0.26.0.dev20261027 wrote the stored file, in about two minutes.)
"""

from __future__ import annotations

import numpy as np
from patches import import_reference, patch, perturb_weights, write_fixture

# The sizes, shared with the test (which reads them from the file).
SIZES = dict(deter=16, units=12, stoch=4, classes=5, mlp_units=10, mlp_layers=2, layers=2, horizon=4,
             batch=2, length=6, obs=9, actions=2)
NOISE = np.array([0.4, -0.7], np.float32)  # the actor's standard-normal draw, per action dimension


def make_batch(seed: int = 1) -> dict[str, np.ndarray]:
    """A replayed batch as the reference stores it: action[t] is the action taken at observation t."""
    s = SIZES
    rng = np.random.default_rng(seed)
    B, T = s["batch"], s["length"]
    state = rng.normal(size=(B, T, s["obs"])).astype(np.float32)
    state[..., 4:7] *= 12.0  # finger_spin's velocities reach tens: the encoder's symlog matters
    action = rng.uniform(-1.4, 1.4, size=(B, T, s["actions"])).astype(np.float32)  # beyond +-1: the RSSM's clip
    reward = rng.integers(0, 3, size=(B, T)).astype(np.float32)  # 0, 1 or 2: a binary reward, action repeat 2
    is_first = np.zeros((B, T), bool)
    is_first[:, 0] = is_first[0, T // 2] = True  # resets: the learned initial state
    is_terminal = np.zeros((B, T), bool)
    is_terminal[1, T - 2] = True  # a terminal state: the continue loss, and a start imagination must not weigh
    return dict(state=state, action=action, reward=reward, is_first=is_first, is_last=is_terminal.copy(),
                is_terminal=is_terminal)


def make_acting(seed: int = 2) -> dict[str, np.ndarray]:
    """Observations the policy steps through: [envs 2, steps 6]."""
    rng = np.random.default_rng(seed)
    n, steps = 2, 6
    state = rng.normal(size=(n, steps, SIZES["obs"])).astype(np.float32)
    state[..., 4:7] *= 12.0
    is_first = np.zeros((n, steps), bool)
    is_first[:, 0] = is_first[0, 3] = True
    zeros = np.zeros((n, steps), bool)
    return dict(state=state, reward=rng.integers(0, 3, size=(n, steps)).astype(np.float32), is_first=is_first,
                is_last=zeros, is_terminal=zeros.copy())


def main() -> None:
    args, ref = import_reference(__doc__.split("\n\n")[0])
    dreamerv3, embodied, jnp = ref.dreamerv3, ref.embodied, ref.jnp
    grads = patch(ref.jaxagent, ref.jaxutils, ref.nj, NOISE)  # deterministic samples; each optimizer's gradients

    s = SIZES
    config = embodied.Config(dreamerv3.configs["defaults"]).update(dreamerv3.configs["dmc_proprio"]).update({
        "jax.platform": "cpu", "jax.jit": False, "jax.precision": "float32", "jax.prealloc": False,
        "batch_size": s["batch"], "batch_length": s["length"], "imag_horizon": s["horizon"],
        "rssm.deter": s["deter"], "rssm.units": s["units"], "rssm.stoch": s["stoch"], "rssm.classes": s["classes"],
        "encoder.mlp_units": s["mlp_units"], "encoder.mlp_layers": s["mlp_layers"],
        "decoder.mlp_units": s["mlp_units"], "decoder.mlp_layers": s["mlp_layers"],
        **{f"{net}.units": s["units"] for net in ("reward_head", "cont_head", "actor", "critic")},
    })
    obs_space = {"state": embodied.Space(np.float32, (s["obs"],)), "reward": embodied.Space(np.float32),
                 **{k: embodied.Space(bool) for k in ("is_first", "is_last", "is_terminal")}}
    act_space = {"action": embodied.Space(np.float32, (s["actions"],), -1, 1), "reset": embodied.Space(bool)}
    agent = dreamerv3.Agent(obs_space, act_space, embodied.Counter(), config)

    before = perturb_weights(agent, jnp)
    batch = make_batch()
    agent.train({k: jnp.asarray(v) for k, v in batch.items()})

    # then the policy, with the updated weights, through 6 steps of 2 envs: env 0 starts a new episode
    # at step 3; the carried state is the reference's (latent, the sampled action)
    acting = make_acting()
    state, actions = None, []
    for t in range(acting["state"].shape[1]):
        obs = {k: v[:, t] for k, v in acting.items()}
        outs, state = agent.policy(obs, state, mode="train")
        actions.append(np.asarray(outs["action"]))

    extra = {f"acting/{k}": v for k, v in acting.items()}
    # the state beside the weights after the update: the return normaliser's EMAs, the slow critic's counter
    extra.update({f"state/{n}": np.asarray(v) for n, v in agent.varibs.items() if n.endswith("/value")})
    extra["acting/action"] = np.stack(actions, 1)  # [envs, steps, A]: the policy's samples
    after, first = {n: np.asarray(agent.varibs[n]) for n in before}, dict(grads)

    # a second update on another batch: each optimizer's second step, the slow critic's first EMA step and
    # the return normaliser's from where the first update left them
    batch2 = make_batch(seed=3)
    agent.train({k: jnp.asarray(v) for k, v in batch2.items()})
    extra.update({f"batch2/{k}": v for k, v in batch2.items()})
    extra.update({f"loss2/{name}": loss for name, (loss, _) in grads.items()})
    extra.update({f"after2/{n}": np.asarray(agent.varibs[n]) for n in before})
    extra.update({f"state2/{n}": np.asarray(v) for n, v in agent.varibs.items() if n.endswith("/value")})
    write_fixture(args.out, before=before, after=after, batch=batch, grads=first, sizes=SIZES, noise=NOISE,
                  extra=extra)

if __name__ == "__main__":
    main()
