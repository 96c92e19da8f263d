"""Writes `dreamerv3_2023_cnn_update.npz`: one update of the 2023 DreamerV3 reference's own code on
pixel observations, which `tests/algos/test_reference_update_cnn.py` repeats with our agent and compares.

The reference is danijar/dreamerv3 at 423291a (the code that made the Atari 100K score file), imported
from a checkout, not copied. Its `atari100k` config (less `actor_eval_sample`, a key its `defaults`
lack: `Config.update` raises KeyError on it), at tiny sizes, trains on one batch of 64x64 RGB frames
and 3 discrete actions on the CPU, with jit off: the CNN encoder and decoder (cnn_depth 2: 4 stride-2
convs and 4 transposed ones) around the RSSM. Its samples are made deterministic as
`make_dreamerv3_2023_update.py` makes them (`patches.py`): every categorical, the latents and the
discrete actor, takes its mode.

The file holds every weight before the update (the reference's init perturbed by N(0, 0.1)), the batch,
each optimizer's loss and gradients, and every weight after the update.

Run it where jax is installed, as `make_dreamerv3_2023_update.py` says:
    cd tests/algos/reference && python make_dreamerv3_2023_cnn_update.py /tmp/dreamerv3 dreamerv3_2023_cnn_update.npz
(jax 0.10.2 and tfp-nightly 0.26.0.dev20261027 wrote the stored file.)
"""

from __future__ import annotations

import numpy as np
from patches import import_reference, patch, perturb_weights, write_fixture

# The sizes, shared with the test (which reads them from the file). 64x64 frames: our CNNs read only those.
SIZES = dict(deter=16, units=12, stoch=4, classes=5, depth=2, layers=2, horizon=4, batch=2, length=5, image=64,
             channels=3, actions=3)
NOISE = np.zeros(SIZES["actions"], np.float32)  # unused: the discrete actor's sample is its mode


def make_batch(seed: int = 1) -> dict[str, np.ndarray]:
    """A replayed batch as the reference stores it: action[t] is the one-hot action taken at observation t."""
    s = SIZES
    rng = np.random.default_rng(seed)
    B, T = s["batch"], s["length"]
    image = rng.integers(0, 256, size=(B, T, s["image"], s["image"], s["channels"]), dtype=np.uint8)
    action = np.eye(s["actions"], dtype=np.float32)[rng.integers(0, s["actions"], size=(B, T))]
    reward = rng.choice(np.array([0.0, 1.0, -1.0, 3.0], np.float32), size=(B, T))  # Atari's game points
    is_first = np.zeros((B, T), bool)
    is_first[:, 0] = is_first[0, T // 2] = True  # resets: the learned initial state
    is_terminal = np.zeros((B, T), bool)
    is_terminal[1, T - 2] = True  # a game over: the continue loss, and a start imagination must not weigh
    return dict(image=image, action=action, reward=reward, is_first=is_first, is_last=is_terminal.copy(),
                is_terminal=is_terminal)


def main() -> None:
    args, ref = import_reference(__doc__.split("\n\n")[0])
    dreamerv3, embodied, jnp = ref.dreamerv3, ref.embodied, ref.jnp
    grads = patch(ref.jaxagent, ref.jaxutils, ref.nj, NOISE)  # deterministic samples; each optimizer's gradients

    s = SIZES
    atari100k = {k: v for k, v in dreamerv3.configs["atari100k"].items() if k != "actor_eval_sample"}
    config = embodied.Config(dreamerv3.configs["defaults"]).update(atari100k).update({
        "jax.platform": "cpu", "jax.jit": False, "jax.precision": "float32", "jax.prealloc": False,
        "batch_size": s["batch"], "batch_length": s["length"], "imag_horizon": s["horizon"],
        "rssm.deter": s["deter"], "rssm.units": s["units"], "rssm.stoch": s["stoch"], "rssm.classes": s["classes"],
        "encoder.cnn_depth": s["depth"], "decoder.cnn_depth": s["depth"],
        **{f"{net}.units": s["units"] for net in ("reward_head", "cont_head", "actor", "critic")},
        **{f"{net}.layers": s["layers"] for net in ("reward_head", "cont_head", "actor", "critic")},
    })
    obs_space = {"image": embodied.Space(np.uint8, (s["image"], s["image"], s["channels"])),
                 "reward": embodied.Space(np.float32),
                 **{k: embodied.Space(bool) for k in ("is_first", "is_last", "is_terminal")}}
    action_space = embodied.Space(np.float32, (s["actions"],), 0, 1)
    action_space._discrete = True  # as embodied's OneHotAction wrapper marks it
    act_space = {"action": action_space, "reset": embodied.Space(bool)}
    agent = dreamerv3.Agent(obs_space, act_space, embodied.Counter(), config)

    before = perturb_weights(agent, jnp)
    batch = make_batch()
    agent.train({k: jnp.asarray(v) for k, v in batch.items()})
    after = {n: np.asarray(agent.varibs[n]) for n in before}
    state = {f"state/{n}": np.asarray(v) for n, v in agent.varibs.items() if n.endswith("/value")}
    write_fixture(args.out, before=before, after=after, batch=batch, grads=dict(grads), sizes=SIZES, noise=NOISE,
                  extra=state)


if __name__ == "__main__":
    main()
