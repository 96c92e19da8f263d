"""Writes `dreamerv3_2024_update.npz`: one update of the 2024 DreamerV3 reference's own code, which
`tests/algos/test_reference_update.py` repeats with our `dmc_proprio` preset and compares.

The reference is danijar/dreamerv3 at 2411f7d (the 2024 code, whose protocol `+experiment=dmc_proprio`
follows), imported from a checkout, not copied. Its `dmc_proprio` config at tiny sizes trains on one batch
of a finger_spin-shaped task (9 state features, 2 actions) with replay context (the batch's first step is
the stored context; an episode that ends in a terminal state midway), on the CPU with jit off. Samples are
deterministic as in the 2023 fixture (latents take their mode with the straight-through gradient kept; the
actor mean + NOISE * std). Its continuation as configured (contdisc, horizon 333: our
`algo.continue_label=discounted algo.start_continue=data`). Warmup 0: the weights after the update are
LaProp's first step.

The file holds every weight before the update (the reference's init plus N(0, 0.1)), the batch (with
its `deter` / `stoch` context entries), the optimizer's loss and gradients (one optimizer there),
every weight after the update, and the state it leaves beside them (the return normaliser's EMAs).

Run it where jax is installed (see make_dreamerv3_2023_update.py), with pyzmq too:
    git -C /tmp/dreamerv3 checkout 2411f7d && pip install pyzmq einops chex
    cd tests/algos/reference && python make_dreamerv3_2024_update.py /tmp/dreamerv3 dreamerv3_2024_update.npz
jax 0.10 takes `jax.jit`'s shardings as keywords only: the script passes the reference's positional ones on.
(jax 0.10 and tfp-nightly 0.26.0.dev20261027 wrote the stored file, in about two minutes.)
"""

from __future__ import annotations

import argparse
import sys
import warnings

import numpy as np

SIZES = dict(deter=16, hidden=8, stoch=4, classes=5, blocks=2, units=12, mlp_units=10, mlp_layers=2, horizon=4,
             batch=2, length=7, obs=9, actions=2)
NOISE = np.array([0.4, -0.7], np.float32)  # the actor's standard-normal draw, per action dimension


def make_batch(seed: int = 1) -> dict[str, np.ndarray]:
    """A replayed batch as the reference stores it: step 0 is the context (its `deter` / `stoch` entries
    are what the sequence is filtered from), action[t] the action taken at observation t."""
    s = SIZES
    rng = np.random.default_rng(seed)
    B, T = s["batch"], s["length"]
    state = rng.normal(size=(B, T, s["obs"])).astype(np.float32)
    state[..., 4:7] *= 12.0
    action = rng.uniform(-1.4, 1.4, size=(B, T, s["actions"])).astype(np.float32)
    action[:, 0] = 0.0  # the context step's: 2411f7d takes the previous batch's (here zeros) in its place
    reward = rng.integers(0, 3, size=(B, T)).astype(np.float32)
    is_first = np.zeros((B, T), bool)
    is_first[1, 1] = is_first[0, 4] = True
    is_terminal = np.zeros((B, T), bool)
    is_terminal[0, 3] = True  # the episode before is_first[0, 4] ends in a terminal state
    return dict(state=state, action=action, reward=reward, is_first=is_first, is_last=is_terminal.copy(),
                is_terminal=is_terminal,
                deter=rng.normal(size=(B, T, s["deter"])).astype(np.float32),
                stoch=rng.integers(0, s["classes"], size=(B, T, s["stoch"])).astype(np.int32),
                stepid=np.zeros((B, T, 20), np.uint8))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reference", help="a checkout of danijar/dreamerv3 at 2411f7d")
    parser.add_argument("out", help="the .npz to write")
    args = parser.parse_args()
    sys.path[:0] = [args.reference, f"{args.reference}/dreamerv3"]
    warnings.filterwarnings("ignore")
    import jax
    import jax.numpy as jnp

    jit = jax.jit

    def jit_with_positional_shardings(fun, *shardings, **kwargs):
        return jit(fun, **dict(zip(["in_shardings", "out_shardings"], shardings)), **kwargs)

    jax.jit = jit_with_positional_shardings
    import embodied
    from patches import patch, write_fixture

    import dreamerv3
    from dreamerv3 import jaxagent, jaxutils
    from dreamerv3 import ninjax as nj

    grads = patch(jaxagent, jaxutils, nj, NOISE)  # deterministic samples; each optimizer's gradients

    s = SIZES
    configs = dreamerv3.Agent.configs
    config = embodied.Config(configs["defaults"]).update(configs["dmc_proprio"]).update({
        "jax.platform": "cpu", "jax.jit": False, "jax.compute_dtype": "float32", "jax.prealloc": False,
        "jax.transfer_guard": False, "logdir": "/tmp/dreamerv3_2024_update", "run.num_envs": 2,
        "batch_size": s["batch"], "batch_length": s["length"], "imag_length": s["horizon"],
        "opt.warmup": 0,
        **{f"dyn.rssm.{k}": s[k] for k in ("deter", "hidden", "stoch", "classes", "blocks")},
        "enc.simple.units": s["mlp_units"], "enc.simple.layers": s["mlp_layers"],
        "dec.simple.units": s["mlp_units"], "dec.simple.layers": s["mlp_layers"],
        **{f"{net}.units": s["units"] for net in ("rewhead", "conhead", "actor", "critic")},
    })
    obs_space = {"state": embodied.Space(np.float32, (s["obs"],)), "reward": embodied.Space(np.float32),
                 **{k: embodied.Space(bool) for k in ("is_first", "is_last", "is_terminal")}}
    act_space = {"action": embodied.Space(np.float32, (s["actions"],), -1, 1), "reset": embodied.Space(bool)}
    agent = dreamerv3.Agent(obs_space, act_space, config)

    rng = np.random.default_rng(0)
    before = {}
    for name, value in agent.params.items():
        if "/opt/" in name or name.endswith("/value") or not hasattr(value, "shape"):
            continue
        before[name] = (np.asarray(value) + 0.1 * rng.normal(size=value.shape)).astype(np.float32)
    params = {**agent.params, **{n: jnp.asarray(v) for n, v in before.items()}}
    batch = make_batch()
    seed = jnp.asarray(np.array([0, 0], np.uint32))
    with jax.disable_jit():
        _, carry = nj.pure(agent.agent.init_train)(params, s["batch"], seed=seed)
        after, _ = nj.pure(agent.agent.train)(params, {k: jnp.asarray(v) for k, v in batch.items()}, carry, seed=seed)

    # the state beside the weights after the update: the return normaliser's (and the others') EMAs, counters
    state = {f"state/{n}": np.asarray(v) for n, v in after.items() if n.endswith("/value") and "/opt/" not in n}
    write_fixture(args.out, before=before, after=after, batch=batch, grads=grads, sizes=SIZES, noise=NOISE,
                  extra=state)

if __name__ == "__main__":
    main()
