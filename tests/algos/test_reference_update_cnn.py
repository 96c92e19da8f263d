"""One update of the `atari100k` agent, from pixels, against the 2023 DreamerV3 reference's own code.

`reference/dreamerv3_2023_cnn_update.npz` holds an update made by danijar/dreamerv3 at 423291a
(`reference/make_dreamerv3_2023_cnn_update.py` wrote it, with jax) on 64x64 RGB frames and 3 discrete
actions: its weights before, the batch, each optimizer's loss and gradients and its weights after.
Here our agent, built from the preset at the same tiny sizes (nothing else overridden), takes those
weights and that batch with the same deterministic samples (every categorical's mode), and must compute
the same losses, every gradient (the CNN encoder's and decoder's among them) and the same weights after
the update; with a preset choice undone, it must not. `test_reference_update.py` checks the rest of the
2023 update (the policy's actions, a second update, every recurrent backend) on vector observations.

The reference's layout, mapped here beside `test_reference_update.py`'s: conv kernels are [kh, kw, in,
out] (ours [out, in, kh, kw]); its transposed convs (jax.lax.conv_transpose, 'SAME') are [kh, kw, out,
in] and not flipped (ours [in, out, kh, kw], the flipped kernel); its images and maps are channels-last,
so the encoder's flattened embedding and the decoder's first layer's output run [h, w, c] (ours [c, h, w]).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from tests.algos.test_reference_update import (assert_grads, assert_weights, load_fixture, load_weights, our_batch,
                                              record_optimizers, return_range, sample_as_the_reference)
from worldmodels.algos import ALGOS

FIXTURE = Path(__file__).parent / "reference" / "dreamerv3_2023_cnn_update.npz"
CONFIGS = str(Path(__file__).resolve().parents[2] / "configs")
OPTIMIZERS = [("wm_opt", "model_opt"), ("actor_opt", "actor_opt"), ("critic_opt", "critic_opt")]
MINRES = 4  # the reference's minres: the CNNs' smallest map, 4 x 4


@pytest.fixture(scope="module")
def reference() -> dict:
    return load_fixture(FIXTURE)


def our_agent(sizes: dict[str, int], *overrides: str):
    """DreamerV3 from `+experiment=atari100k` at the fixture's sizes, with `overrides`."""
    s = sizes
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        cfg = compose("config", overrides=[
            "+experiment=atari100k", "logger=none", f"run_dir={tempfile.mkdtemp()}/run",
            f"model.deter={s['deter']}", f"model.hidden={s['units']}", f"model.stoch={s['stoch']}",
            f"model.classes={s['classes']}", f"model.units={s['units']}", f"model.depth={s['depth']}",
            f"model.head_layers={s['layers']}", f"model.actor_layers={s['layers']}", f"algo.horizon={s['horizon']}",
            *overrides])
    shape = (s["channels"], s["image"], s["image"])
    return ALGOS["dreamer_v3"](shape, s["actions"], True, cfg.model, cfg.algo, backend="loop")


def hwc_to_chw(x: np.ndarray, axis: int) -> np.ndarray:
    """`x` with its `axis` (a flattened [4, 4, c] map, the reference's) reordered as [c, 4, 4] (ours)."""
    x = np.moveaxis(x, axis, 0)
    c = x.shape[0] // MINRES ** 2
    x = x.reshape(MINRES, MINRES, c, *x.shape[1:]).transpose(2, 0, 1, *range(3, x.ndim + 2)).reshape(x.shape)
    return np.moveaxis(x, 0, axis)


def to_ours(ref: dict[str, np.ndarray], sizes: dict[str, int]) -> dict[str, np.ndarray]:
    """Our state_dict names -> the reference's arrays (weights, or gradients) in our layout."""
    deter, stoch = sizes["deter"], sizes["stoch"] * sizes["classes"]
    features = lambda k: np.concatenate([k[deter:], k[:deter]], 0)  # noqa: E731 ([deter, stoch] -> [stoch, deter])
    out = {}

    def norm(theirs, ours):
        out[f"{ours}.weight"], out[f"{ours}.bias"] = ref[f"{theirs}/norm/scale"], ref[f"{theirs}/norm/bias"]

    for i in range(4):  # the stages 64 -> 4: Sequential(conv, norm, act) x 4, then the decoder's last conv
        enc, dec = f"agent/wm/enc/cnn/s{i}res", f"agent/wm/dec/cnn/s{i}res"
        out[f"world_model.encoder.net.{3 * i}.weight"] = ref[f"{enc}/kernel"].transpose(3, 2, 0, 1)
        norm(enc, f"world_model.encoder.net.{3 * i + 1}.norm")
        out[f"world_model.decoder.net.{3 * i}.weight"] = ref[f"{dec}/kernel"][::-1, ::-1].transpose(3, 2, 0, 1)
        if i < 3:
            norm(dec, f"world_model.decoder.net.{3 * i + 1}.norm")
    out["world_model.decoder.net.9.bias"] = ref["agent/wm/dec/cnn/s3res/bias"]
    out["world_model.decoder.project.weight"] = hwc_to_chw(features(ref["agent/wm/dec/cnn/in/kernel"]), 1).T
    out["world_model.decoder.project.bias"] = hwc_to_chw(ref["agent/wm/dec/cnn/in/bias"], 0)

    def mlp(theirs, ours):
        layers = sizes["layers"]
        for i in range(layers):
            kernel = ref[f"{theirs}/h{i}/kernel"]
            out[f"{ours}.{i}.0.weight"] = (features(kernel) if i == 0 else kernel).T
            out[f"{ours}.{i}.1.weight"] = ref[f"{theirs}/h{i}/norm/scale"]
            out[f"{ours}.{i}.1.bias"] = ref[f"{theirs}/h{i}/norm/bias"]
        out[f"{ours}.{layers}.weight"] = ref[f"{theirs}/dist_out/out/kernel"].T
        out[f"{ours}.{layers}.bias"] = ref[f"{theirs}/dist_out/out/bias"]

    for theirs, ours in [("agent/wm/rew", "world_model.reward.net"), ("agent/wm/cont", "world_model.cont.net"),
                         ("agent/task_behavior/ac/actor", "actor.net"),
                         ("agent/task_behavior/critic/net", "critic.net"),
                         ("agent/task_behavior/critic/slow", "slow_critic.net")]:
        mlp(theirs, ours)

    r, o = "agent/wm/rssm", "world_model.rssm"
    out[f"{o}.initial_deter"] = ref[f"{r}/initial"]
    k = ref[f"{r}/img_in/kernel"]
    out[f"{o}.in_stoch.weight"], out[f"{o}.in_action.weight"] = k[:stoch].T, k[stoch:].T
    norm(f"{r}/img_in", f"{o}.in_out.0")
    out[f"{o}.gates.weight"] = ref[f"{r}/gru/kernel"].T
    norm(f"{r}/gru", f"{o}.gates_norm")
    out[f"{o}.prior_head.0.0.weight"] = ref[f"{r}/img_out/kernel"].T
    norm(f"{r}/img_out", f"{o}.prior_head.0.1")
    out[f"{o}.prior_head.1.weight"], out[f"{o}.prior_head.1.bias"] = ref[f"{r}/img_stats/kernel"].T, ref[
        f"{r}/img_stats/bias"]
    k = ref[f"{r}/obs_out/kernel"]
    out[f"{o}.post_deter.weight"], out[f"{o}.post_embed.weight"] = k[:deter].T, hwc_to_chw(k[deter:], 0).T
    norm(f"{r}/obs_out", f"{o}.post_head.0")
    out[f"{o}.post_head.2.weight"], out[f"{o}.post_head.2.bias"] = ref[f"{r}/obs_stats/kernel"].T, ref[
        f"{r}/obs_stats/bias"]
    return out


def images(ref_batch: dict[str, np.ndarray]) -> torch.Tensor:
    """The reference's frames [B, T, H, W, C] as our replay holds them, [B, T, C, H, W]."""
    return torch.as_tensor(ref_batch["image"]).permute(0, 1, 4, 2, 3)


def update_as_the_reference(monkeypatch, reference, *overrides: str):
    """Our agent on the reference's weights, batch and samples: (agent, {optimizer: (loss, {name: grad})})."""
    agent = our_agent(reference["sizes"], *overrides)
    load_weights(agent, to_ours(reference["before"], reference["sizes"]))
    sample_as_the_reference(monkeypatch, reference)
    seen = record_optimizers(monkeypatch, agent)
    agent.update(our_batch(reference["batch"], images(reference["batch"])))
    return agent, seen


def reference_grads(reference: dict, theirs: str) -> dict[str, np.ndarray]:
    """The reference optimizer `theirs`'s gradients in our names and layout (zeros where it has none)."""
    grads = {k.removeprefix(f"{theirs}/"): v for k, v in reference["grad"].items() if k.startswith(f"{theirs}/")}
    return to_ours({**{k: np.zeros_like(v) for k, v in reference["before"].items()}, **grads}, reference["sizes"])


def test_one_update_from_pixels_is_the_2023_references(monkeypatch, reference):
    """Losses, every gradient (the CNN encoder's and decoder's with the world model's) and every weight
    after the update, of all three optimizers, and the return normaliser's EMA range."""
    agent, seen = update_as_the_reference(monkeypatch, reference)
    for ours, theirs in OPTIMIZERS:
        loss, grads = seen[ours]
        torch.testing.assert_close(loss, torch.as_tensor(reference["loss"][theirs]), rtol=1e-5, atol=1e-6,
                                   msg=f"{ours} loss")
        want = reference_grads(reference, theirs)
        assert_grads(agent, ours, grads, want)
    torch.testing.assert_close(agent.return_scale, return_range(reference["state"], "retnorm_extr"), rtol=1e-4,
                               atol=1e-9)
    assert_weights(agent, to_ours(reference["after"], reference["sizes"]), atol=2e-6, when="after the update")


def test_the_2024_kl_scale_is_not_the_2023_update(monkeypatch, reference):
    """`algo.kl.dyn=1.0` (the later references' dynamics loss scale; the 2023 one is 0.5) makes another
    world-model loss on the same batch."""
    _, seen = update_as_the_reference(monkeypatch, reference, "algo.kl.dyn=1.0")
    assert not torch.isclose(seen["wm_opt"][0], torch.as_tensor(reference["loss"]["model_opt"]), rtol=1e-4)


def test_every_loss_from_the_starting_weights_is_not_the_2023_update(monkeypatch, reference):
    """`algo.update_order=same_weights` (imagination with the weights the world-model loss saw) makes
    other actor gradients: the 2023 Agent.train steps the world model first."""
    _, seen = update_as_the_reference(monkeypatch, reference, "algo.update_order=same_weights")
    want, grads = reference_grads(reference, "actor_opt"), seen["actor_opt"][1]
    assert grads and not all(torch.allclose(g, torch.as_tensor(np.ascontiguousarray(want[n])), rtol=1e-4,
                                            atol=1e-4 * float(np.abs(want[n]).max())) for n, g in grads.items())
