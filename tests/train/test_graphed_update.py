"""`GraphedUpdate` (train/graphed_update.py): the whole update replayed from one CUDA graph.

On CPU a stand-in graph re-runs the captured step on every replay, so what the class composes
(static batch refreshed per call, metrics read from the static outputs, warm-up count, recapture
on a new signature or an optimiser load, the fallback when a capture fails, `prime`) is checked
against eager twins without a GPU. With WORLDMODELS_TEST_DEVICE=cuda the real capture runs and
every algorithm's graphed updates are compared with eager updates of a twin agent.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from tests._messages import labelled
from worldmodels.algos import ALGOS
from worldmodels.core import cuda_graphs
from worldmodels.train.config import update_autocast
from worldmodels.train.graphed_update import GraphedUpdate

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
DEVICE = torch.device(os.environ.get("WORLDMODELS_TEST_DEVICE", "cpu"))
GAUSSIAN = {"classes": None, "cell": "gru", "blocks": 1, "norm": "none", "act": "elu"}
V3_2023 = {"cell": "norm_gru", "blocks": 1, "norm": "layer", "initial_state": "learned"}  # dmc_proprio_2023's RSSM


def make_agent(algo: str = "dreamer_v3", seed: int = 0, backend: str = "loop", device=DEVICE):
    """`algo` may be "dreamer_v3_backprop": DreamerV3 whose actor learns through the dynamics,
    "dreamer_v3_2023": that, with the 2023 preset's dense GRU, learned initial state and bounded normal Actor,
    or "dreamer_v3_2023_update": that, in the 2023 update order, each sequence filtered as an episode's
    start (`algo.start_state=initial`)."""
    update_2023 = algo.endswith("_update")
    algo = algo.removesuffix("_update")
    v3_2023 = algo == "dreamer_v3_2023"
    algo, backprop = algo.removesuffix("_2023").removesuffix("_backprop"), algo.endswith(("_backprop", "_2023"))
    model = OmegaConf.load(CONFIGS / "model" / "tiny.yaml")
    if algo != "dreamer_v3":
        model = OmegaConf.merge(model, GAUSSIAN)
    if v3_2023:
        model = OmegaConf.merge(model, V3_2023)
    cfg = OmegaConf.load(CONFIGS / "algo" / f"{algo}.yaml")
    cfg = cfg.algo if "algo" in cfg else cfg  # the Dreamer V1 / PlaNet files are `_global_` packages
    if backprop:
        cfg.actor_grad = "backprop"
    if v3_2023:
        cfg.actor_dist = "bounded_normal"
    if update_2023:
        cfg.update_order, cfg.start_state = "world_model_first", "initial"
    if algo == "planet" and torch.device(device).type == "cpu":  # the paper's planner on CUDA; the same path, smaller
        cfg.cem = OmegaConf.create(dict(horizon=6, candidates=64, top=8, iterations=3))
    torch.manual_seed(seed)
    return ALGOS[algo]((5,), 2, False, model, cfg, backend=backend).to(device)


def make_batch(seed: int, batch: int = 3, steps: int = 6, device=DEVICE) -> TensorDict:
    gen = torch.Generator().manual_seed(seed)
    is_first = torch.zeros(batch, steps, dtype=torch.bool)
    is_first[:, 0] = True
    is_first[0, steps // 2] = True
    return TensorDict({
        "obs": torch.randn(batch, steps, 5, generator=gen),
        "action": torch.rand(batch, steps, 2, generator=gen) * 2 - 1,
        "reward": torch.randn(batch, steps, generator=gen),
        "is_first": is_first,
        "is_terminal": torch.zeros(batch, steps, dtype=torch.bool),
    }, batch_size=[batch, steps]).to(device)


class ReplayedOnCpu(GraphedUpdate):
    """The capture path on CPU: 'capturing' records the step, each replay runs it again."""

    def _on_cuda(self, batch):
        return True

    def _eager(self, batch):
        return self.agent.update(batch)

    def _record(self, step):
        return step


def assert_same_state(a, b):
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name


@pytest.mark.parametrize("algo", ["dreamer_v3", "dreamer_v1", "dreamer_v3_2023_update"])
def test_replays_equal_eager_updates_on_fresh_batches(algo):
    eager, graphed = make_agent(algo, device="cpu"), make_agent(algo, device="cpu")
    update = ReplayedOnCpu(graphed, warmup=2)
    for i in range(5):
        batch = make_batch(i, device="cpu")
        batch["is_first"][1:, 0] = algo != "dreamer_v3_2023_update"  # rows 1.. from the carried state there
        torch.manual_seed(100 + i)
        want = eager.update(batch)
        torch.manual_seed(100 + i)
        got = update(batch.clone())
        assert list(got) == list(want)
        for k in want:
            assert torch.equal(got[k], want[k].float()), (i, k)
    assert update.captures == 1 and update.replay is not None
    assert_same_state(eager, graphed)


def scale_losses(agent):
    for opt in agent.optimizers().values():
        opt.use_loss_scale()
    return agent


def loss_scales(agent) -> dict:
    return {name: opt.loss_scale.state_dict() for name, opt in agent.optimizers().items()}


def overflow_the_world_models_gradients(*agents):
    """An infinite scale: the gradients overflow, as float16's do, and this update is skipped."""
    for agent in agents:
        agent.optimizers()["model"].loss_scale.scale.fill_(float("inf"))


def assert_skipped_once(eager, graphed, updates: int, skipped: int):
    """The world model skipped update `skipped` (its run of finite updates restarted after it, its
    scale halved back under the cap); the other optimisers skipped none. Both agents alike."""
    scales = loss_scales(eager)
    assert scales.keys() == loss_scales(graphed).keys()
    for name, state in loss_scales(graphed).items():
        assert all(torch.equal(v, scales[name][k]) for k, v in state.items()), name
    assert scales["model"]["good"].item() == updates - 1 - skipped and scales["model"]["scale"].item() == 1e4
    assert all(s["good"].item() == updates for name, s in scales.items() if name != "model")


@pytest.mark.parametrize("algo", ["dreamer_v3_2023_update", "dreamer_v1", "planet"])
def test_replays_equal_eager_updates_with_loss_scales(algo):
    """precision=fp16's loss scale (each optimiser's, device tensors updated in place) composes with
    the replays: a skipped update (gradients that overflow) and the updates after it, as eager ones."""
    eager, graphed = (scale_losses(make_agent(algo, device="cpu")) for _ in range(2))
    update = ReplayedOnCpu(graphed, warmup=2)
    for i in range(5):
        batch = make_batch(i, device="cpu")
        if i == 3:
            overflow_the_world_models_gradients(eager, graphed)
        torch.manual_seed(100 + i)
        want = eager.update(batch)
        torch.manual_seed(100 + i)
        got = update(batch.clone())
        for k in want:
            torch.testing.assert_close(got[k], want[k].float(), equal_nan=True, msg=labelled(f"update {i}, {k}"))
    assert_same_state(eager, graphed)
    assert_skipped_once(eager, graphed, updates=5, skipped=3)


def test_returned_metrics_are_copies_the_next_replay_does_not_overwrite():
    update = ReplayedOnCpu(make_agent(device="cpu"), warmup=1)
    update(make_batch(0, device="cpu"))
    first = update(make_batch(1, device="cpu"))
    kept = {k: v.clone() for k, v in first.items()}
    update(make_batch(2, device="cpu"))
    assert all(torch.equal(first[k], kept[k]) for k in kept)


def test_a_new_signature_or_an_optimiser_load_captures_again():
    agent = make_agent(device="cpu")
    update = ReplayedOnCpu(agent, warmup=1)
    for _ in range(3):
        update(make_batch(0, device="cpu"))
    assert update.captures == 1
    for _ in range(2):  # another batch shape: warm-up again, then a second capture
        update(make_batch(0, batch=4, device="cpu"))
    assert update.captures == 2
    opt = agent.optimizers()["model"]
    opt.load_state_dict(opt.state_dict())  # new state tensors: the old graph would read stale ones
    for _ in range(2):
        update(make_batch(0, batch=4, device="cpu"))
    assert update.captures == 3


def test_a_failed_capture_warns_retries_once_then_keeps_updating_eagerly():
    class Fails(ReplayedOnCpu):
        records = 0

        def _record(self, step):
            Fails.records += 1
            raise RuntimeError("operation not permitted when stream is capturing")

    eager, graphed = make_agent(device="cpu"), make_agent(device="cpu")
    update = Fails(graphed, warmup=1)
    with pytest.warns(UserWarning, match="could not be captured.*not permitted") as caught:
        for i in range(5):
            batch = make_batch(i, device="cpu")
            torch.manual_seed(i)
            eager.update(batch)
            torch.manual_seed(i)
            update(batch)
    assert Fails.records == cuda_graphs.CAPTURE_ATTEMPTS == update.failures and update.captures == 0
    assert "tries again" in str(caught[0].message) and "from now on" in str(caught[-1].message)
    assert_same_state(eager, graphed)  # every call did its update, the failed captures' too
    fresh, primed = make_agent(device="cpu"), make_agent(device="cpu")
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match="could not be captured.*not permitted"):
        Fails(primed, warmup=1).prime(make_batch(0, device="cpu"))
    assert_same_state(fresh, primed)  # rewound before it raised


def test_a_capture_that_fails_once_is_made_on_the_next_call():
    class FailsOnce(ReplayedOnCpu):
        def _record(self, step):
            if not self.failures:
                raise RuntimeError("Triton Error [CUDA]: operation failed due to a previous error during capture")
            return super()._record(step)

    update = FailsOnce(make_agent(device="cpu"), warmup=1)
    with pytest.warns(UserWarning, match="tries again"):
        for i in range(4):
            update(make_batch(i, device="cpu"))
    assert update.failures == 1 and update.captures == 1 and update.replay is not None


def test_prime_captures_and_rewinds_to_a_first_update():
    fresh, primed = make_agent(device="cpu"), make_agent(device="cpu")
    update = ReplayedOnCpu(primed, warmup=2)
    batch = make_batch(0, device="cpu")
    update.prime(batch)
    assert update.captures == 1
    assert_same_state(fresh, primed)
    torch.manual_seed(7)
    want = fresh.update(batch)
    torch.manual_seed(7)
    got = update(batch)
    assert all(torch.equal(got[k], want[k].float()) for k in want)
    assert_same_state(fresh, primed)


def test_the_capture_starts_without_gradients():
    """The warm-up's gradients are dropped before the capture, so whatever a captured backward adds
    into is allocated by the capture (in its graph's pool on CUDA), never a tensor from before it."""
    agent = make_agent("dreamer_v3_backprop", device="cpu")
    seen = {}

    class Recording(ReplayedOnCpu):
        def _record(self, step):
            seen["grads"] = [p.grad for p in self.agent.parameters()]
            return super()._record(step)

    update = Recording(agent, warmup=1)
    update(make_batch(0, device="cpu"))  # the warm-up leaves gradients behind
    assert any(p.grad is not None for p in agent.parameters())
    update(make_batch(1, device="cpu"))
    assert update.captures == 1 and all(g is None for g in seen["grads"])


def test_compiled_nets_are_not_compiled_again_inside_the_capture():
    """The warm-ups run in the capture's global state (autocast's weight cache off, which torch.compile
    guards on): the nets `compile_nets` compiled for them run inside the capture as they are. A compile
    inside a CUDA-graph capture copies host memory to the device, which invalidates the capture."""
    from torch._dynamo.testing import CompileCounter

    class CapturedOnCpu(ReplayedOnCpu):
        """'Capturing' runs the step once, in the capture's context, as a capture traces it; the first
        replay is that run, and later ones run it in that context again (a graph holds its state)."""

        def _record(self, step):
            step()
            pending = [True]

            def replay():
                if pending:
                    return pending.pop()
                with self._as_captured():
                    step()
            return replay

    counter = CompileCounter()
    eager, agent = make_agent(device="cpu"), make_agent(device="cpu")
    agent.compile_nets(backend=counter)
    update = CapturedOnCpu(agent, warmup=2)
    compiled = []
    for i in range(4):  # two warm-ups, the capture, a replay
        batch = make_batch(i, device="cpu")
        torch.manual_seed(i)
        want = eager.update(batch)
        torch.manual_seed(i)
        got = update(batch)
        assert all(torch.allclose(got[k], want[k].float()) for k in want), i
        compiled.append(counter.frame_count)
    assert update.captures == 1 and compiled[0] > 0
    assert compiled[1:] == [compiled[0]] * 3, compiled


def test_off_cuda_or_disabled_it_is_the_eager_update():
    agent = make_agent(device="cpu")
    for update in (GraphedUpdate(agent), GraphedUpdate(agent, enabled=False)):
        update(make_batch(0, device="cpu"))
        assert update.captures == 0 and update.eager_calls == 0
    with pytest.raises(ValueError, match="warmup=0"):
        GraphedUpdate(agent, warmup=0)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="captures a CUDA graph: set WORLDMODELS_TEST_DEVICE=cuda on a GPU "
                                                  "machine (the composition is covered on CPU above)")
@pytest.mark.parametrize("algo", ["dreamer_v3", "dreamer_v3_backprop", "dreamer_v3_2023", "dreamer_v3_2023_update",
                                  "dreamer_v1", "planet"])
@pytest.mark.parametrize("backend", ["triton", "cudnn", "loop"])
def test_cuda_graph_replays_equal_eager_updates(algo, backend):
    """Also after `torch.cuda.empty_cache()` between calls (every capture elsewhere, such as the first
    eval's policy graph, calls it): a graph that wrote into memory it does not own faults there."""
    eager, graphed = make_agent(algo, backend=backend), make_agent(algo, backend=backend)
    update = GraphedUpdate(graphed, warmup=2)
    for i in range(6):
        batch = make_batch(i)
        batch["is_first"][1:, 0] = algo != "dreamer_v3_2023_update"  # rows 1.. from the carried state there
        torch.manual_seed(100 + i)
        want = eager.update(batch)
        torch.manual_seed(100 + i)
        got = update(batch)
        gc.collect()
        torch.cuda.empty_cache()
        for k in want:
            torch.testing.assert_close(got[k], want[k].float(), rtol=1e-4, atol=1e-5, msg=labelled(f"update {i}, {k}"))
    assert update.failed is None and update.captures == 1
    for (name, x), y in zip(eager.state_dict().items(), graphed.state_dict().values()):
        torch.testing.assert_close(y, x, rtol=1e-4, atol=1e-5, msg=labelled(name))


@pytest.mark.skipif(DEVICE.type != "cuda", reason="captures a CUDA graph: set WORLDMODELS_TEST_DEVICE=cuda on a GPU "
                                                  "machine (the loss scale's composition is covered on CPU above)")
@pytest.mark.parametrize("algo", ["dreamer_v3_2023_update", "dreamer_v1", "planet"])
@pytest.mark.parametrize("backend", ["cudnn", "loop"])
def test_cuda_graph_replays_equal_eager_updates_in_fp16(algo, backend):
    """precision=fp16: float16 autocast and every optimiser's loss scale inside the captured update,
    a skipped update (non-finite gradients) among them, against eager updates of a twin."""
    eager, graphed = (scale_losses(make_agent(algo, backend=backend)) for _ in range(2))
    update = GraphedUpdate(graphed, warmup=2)
    for i in range(6):
        batch = make_batch(i)
        if i == 4:
            overflow_the_world_models_gradients(eager, graphed)
        # the trainer's autocast region: its cache of cast weights off, as in the capture (with it on, the
        # gradients of a weight's uses add up in float16 first: other roundings, which Adam's first steps
        # turn into +-lr)
        with update_autocast("cuda", torch.float16):
            torch.manual_seed(100 + i)
            want = eager.update(batch)
            torch.manual_seed(100 + i)
            got = update(batch)
        for k in want:
            torch.testing.assert_close(got[k].float(), want[k].float(), rtol=1e-3, atol=1e-4, equal_nan=True,
                                       msg=labelled(f"update {i}, {k}"))
    assert update.failed is None and update.captures == 1
    for (name, x), y in zip(eager.state_dict().items(), graphed.state_dict().values()):
        torch.testing.assert_close(y, x, rtol=1e-3, atol=1e-4, msg=labelled(name))
    assert_skipped_once(eager, graphed, updates=6, skipped=4)
