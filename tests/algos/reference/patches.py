"""What the fixture scripts change in the reference they import (a checkout of danijar/dreamerv3, 2023
or 2024 code; both keep `jaxagent`, `jaxutils` and `ninjax` under `dreamerv3/`): deterministic samples,
host-to-device transfers allowed (jit off), and each optimizer's loss and gradients kept as values.
Needs jax and tensorflow_probability, which this project does not depend on: only the scripts import it."""

from __future__ import annotations

import argparse
import sys
import warnings
from types import SimpleNamespace

import numpy as np


def import_reference(description: str) -> tuple[argparse.Namespace, SimpleNamespace]:
    """A fixture script's command line (the reference checkout, the .npz to write) and the reference's
    modules imported from that checkout: `dreamerv3`, `embodied`, `jaxagent`, `jaxutils`, `nj` (ninjax), `jnp`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("reference", help="a checkout of danijar/dreamerv3 at 423291a")
    parser.add_argument("out", help="the .npz to write")
    args = parser.parse_args()
    sys.path.insert(0, args.reference)
    warnings.filterwarnings("ignore")
    import jax.numpy as jnp

    import dreamerv3
    from dreamerv3 import embodied, jaxagent, jaxutils
    from dreamerv3 import ninjax as nj

    return args, SimpleNamespace(dreamerv3=dreamerv3, embodied=embodied, jaxagent=jaxagent, jaxutils=jaxutils, nj=nj,
                                 jnp=jnp)


def perturb_weights(agent, jnp, seed: int = 0, scale: float = 0.1) -> dict[str, np.ndarray]:
    """Add N(0, scale) noise to every weight of the reference's `agent` (not its optimizers' state or EMA
    values), in place: each fixture's weights before its update; returns them."""
    rng = np.random.default_rng(seed)
    before = {n: (np.asarray(v) + scale * rng.normal(size=v.shape)).astype(np.float32)
              for n, v in agent.varibs.items()
              if hasattr(v, "shape") and "_opt/" not in n and not n.endswith("/value")}
    agent.varibs = {**agent.varibs, **{n: jnp.asarray(v) for n, v in before.items()}}
    return before


def patch(jaxagent, jaxutils, nj, noise: np.ndarray) -> dict:
    """Patch the reference's modules in place; returns the dict each optimizer's call fills with
    name -> (loss, {parameter name: gradient}).

    Samples: each categorical latent takes its mode (its straight-through gradient kept, as
    `OneHotDist.sample` adds it), the actor's Normal (its only one) mean + `noise` * std."""
    import jax
    import jax.numpy as jnp
    from tensorflow_probability.substrates import jax as tfp

    sg = lambda x: jax.tree_util.tree_map(jax.lax.stop_gradient, x)  # noqa: E731

    def lead(sample_shape, x):  # what tfp's sample(sample_shape) puts in front
        return jnp.broadcast_to(x, tuple(int(n) for n in np.reshape(np.asarray(sample_shape), -1)) + x.shape)

    def mode_sample(self, sample_shape=(), seed=None):
        logits = self.logits_parameter()
        onehot = jax.nn.one_hot(jnp.argmax(logits, -1), logits.shape[-1], dtype=jnp.float32)
        probs = self.probs_parameter()
        return lead(sample_shape, sg(onehot) + (probs - sg(probs)))

    def normal_sample(self, sample_shape=(), seed=None):
        return lead(sample_shape, self.loc + jnp.asarray(noise) * self.scale)

    jaxutils.OneHotDist.sample = mode_sample
    tfp.distributions.Normal.sample = normal_sample

    setup = jaxagent.JAXAgent._setup

    def setup_allowing_transfers(self):  # jit off: every op would be a disallowed host-to-device transfer
        setup(self)
        jax.config.update("jax_transfer_guard", "allow")

    jaxagent.JAXAgent._setup = setup_allowing_transfers

    grads: dict = {}
    call = jaxutils.Optimizer.__call__

    def keep_grads(self, modules, lossfn, *args, has_aux=False, **kwargs):
        grad = nj.grad

        def keeping(fn, mods, has_aux=False):
            run = grad(fn, mods, has_aux=has_aux)

            def wrapped(*a, **k):
                loss, params, g, aux = run(*a, **k)
                name = self.name

                def keep(value, gs):  # a callback: under a transform the loss and gradients are traced
                    grads[name] = (np.asarray(value), {n: np.asarray(v) for n, v in gs.items()})

                jax.debug.callback(keep, loss, g)
                return loss, params, g, aux
            return wrapped

        nj.grad = keeping
        try:
            return call(self, modules, lossfn, *args, has_aux=has_aux, **kwargs)
        finally:
            nj.grad = grad

    jaxutils.Optimizer.__call__ = keep_grads
    return grads


def write_fixture(path: str, *, before: dict, after: dict, batch: dict, grads: dict, sizes: dict, noise: np.ndarray,
                  extra: dict | None = None) -> None:
    """The .npz the tests read: before/ and after/ (weights by the reference's names), batch/, loss/ and
    grad/<optimizer>/ (from `patch`'s dict), sizes/, noise, and `extra` (name -> array) as they are."""
    out = {f"before/{n}": v for n, v in before.items()}
    out.update(extra or {})
    out.update({f"after/{n}": np.asarray(after[n]) for n in before})
    out.update({f"batch/{k}": v for k, v in batch.items()})
    for name, (loss, g) in grads.items():
        out[f"loss/{name}"] = loss
        out.update({f"grad/{name}/{n}": v for n, v in g.items()})
    out.update({f"sizes/{k}": np.asarray(v) for k, v in sizes.items()})
    out["noise"] = noise
    np.savez_compressed(path, **out)
    print({k: float(v) for k, v in out.items() if k.startswith("loss/")})
