"""A CUDA-graph capture that fails never poisons the run (`core/cuda_graphs.capturing`,
`replay_captured`): the stream's capture is ended, the CUDA generator healed where torch leaves it
in capture mode (pytorch#171263), the op named in one warning, and the call run eagerly; the next
call tries once more, then the signature stays eager.

On CPU the capture is a stand-in that fails as a real one would, so the restore logic and the
fallback are checked without a GPU; on CUDA a real capture is made to fail (a host sync inside it),
and a fresh process with empty Triton and inductor caches captures every RSSM unroll kind.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from worldmodels.core import cuda_graphs, torch_fixes
from worldmodels.core.cuda_graphs import CaptureFailed, UnrollCache

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CUDA graphs; run on the H200)")
INVALIDATED = "Triton Error [CUDA]: operation failed due to a previous error during capture"


class FakeStream:
    device = torch.device("cuda", 0)


@pytest.fixture
def restore_calls(monkeypatch):
    """What `capturing` does on a failure, recorded: the capture ended, the generator healed."""
    calls = []

    @contextlib.contextmanager
    def graph(graph, pool=None, stream=None, capture_error_mode="global"):
        calls.append(("mode", capture_error_mode))
        yield

    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(cuda_graphs, "_end_capture", lambda graph, stream: calls.append(("ended", stream)))
    monkeypatch.setattr(cuda_graphs, "heal_generator", lambda device: calls.append(("healed", device)))
    return calls


@pytest.mark.parametrize("torch_leaves_rng_capturing", [True, False])
def test_a_failed_capture_ends_it_heals_the_generator_and_names_the_op(restore_calls, monkeypatch,
                                                                       torch_leaves_rng_capturing):
    monkeypatch.setattr(torch_fixes, "failed_capture_leaves_rng_capturing", lambda: torch_leaves_rng_capturing)
    stream = FakeStream()
    with pytest.raises(CaptureFailed, match=r"triton observe: the CUDA-graph capture failed \(RuntimeError: Triton"):
        with cuda_graphs.capturing(object(), "triton observe", stream=stream):
            raise RuntimeError(INVALIDATED)
    healed = [("healed", stream.device)] if torch_leaves_rng_capturing else []
    assert restore_calls == [("mode", "thread_local"), ("ended", stream), *healed]


def test_a_capture_that_succeeds_restores_nothing(restore_calls):
    with cuda_graphs.capturing(object(), "update", stream=FakeStream()):
        pass
    assert restore_calls == [("mode", "thread_local")]


class FailingGraph:
    """Stands in for GraphedUnroll: its first `fails` constructions raise as a failed capture does."""
    fails, made = 0, 0

    def __init__(self, fn, params, inputs, indirect=(), what="unroll"):
        FailingGraph.made += 1
        if FailingGraph.made <= FailingGraph.fails:
            raise CaptureFailed(f"{what}: the CUDA-graph capture failed (AcceleratorError: {INVALIDATED})")
        self.fn, self.params = fn, params

    def __call__(self, *inputs):
        return self.fn(self.params, *inputs)


def _call(cache, x, weight):
    def unroll(groups, inputs):
        (w,) = groups
        return {"y": inputs[0] * w["weight"], "z": inputs[0] + 1}

    return cuda_graphs.replay_captured(cache, ("triton", "imagine"), unroll, [{"weight": weight}], [x],
                                       what="triton imagine")


@pytest.mark.parametrize("fails", [1, 2, 5])
def test_replay_captured_runs_eagerly_after_a_failure_and_retries_once(monkeypatch, fails):
    monkeypatch.setattr(cuda_graphs, "GraphedUnroll", FailingGraph)
    monkeypatch.setattr(cuda_graphs, "_warned_failures", set())
    FailingGraph.fails, FailingGraph.made = fails, 0
    cache, weight = UnrollCache(), torch.tensor(3.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            x = torch.full((2,), float(i))
            out = _call(cache, x, weight)
            assert torch.equal(out["y"], x * 3) and torch.equal(out["z"], x + 1)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "triton imagine: the CUDA-graph capture failed" in messages[0]
    assert "runs eagerly" in messages[0]
    # one retry after the first failure; after CAPTURE_ATTEMPTS failures no more captures are tried
    assert FailingGraph.made == min(fails + 1, cuda_graphs.CAPTURE_ATTEMPTS)


def test_an_rssm_unroll_whose_capture_fails_equals_the_loop(monkeypatch):
    """The fallback through a real op (cudnn's observe on CPU): the eager call gets the weights and
    the inputs the capture would have, and returns what the loop returns."""
    from worldmodels import RSSM

    monkeypatch.setattr(cuda_graphs, "captures_graphs", lambda tensor: True)
    monkeypatch.setattr(cuda_graphs, "GraphedUnroll", FailingGraph)
    monkeypatch.setattr(cuda_graphs, "_warned_failures", set())
    FailingGraph.fails, FailingGraph.made = 1, 0
    torch.manual_seed(0)
    rssm = RSSM(2, 6, deter=8, stoch=4, hidden=8, classes=3, cell="block_gru", blocks=2, norm="rms", act="silu")
    embed, action = torch.randn(2, 5, 6), torch.randn(2, 5, 2)
    is_first = torch.zeros(2, 5, dtype=torch.bool)
    is_first[:, 0] = True
    noise = rssm.noise((2, 5))
    want, _ = rssm.observe(embed, action, is_first, noise=noise, backend="loop")
    with pytest.warns(UserWarning, match="cudnn observe: the CUDA-graph capture failed"):
        got, _ = rssm.observe(embed, action, is_first, noise=noise, backend="cudnn")
    for key in want.keys():
        torch.testing.assert_close(got[key], want[key])


@CUDA
def test_a_real_failed_capture_falls_back_and_the_generator_still_draws():
    """A host sync inside the capture invalidates it: the call runs eagerly, and sampling works after."""
    x = torch.randn(8, device="cuda")

    def unroll(groups, inputs):
        (y,) = inputs
        if torch.cuda.is_current_stream_capturing():
            y.sum().item()  # illegal during a capture
        return {"y": y * 2 + torch.rand_like(y) * 0}

    with pytest.warns(UserWarning, match="sync test: the CUDA-graph capture failed"):
        out = cuda_graphs.replay_captured(UnrollCache(), ("sync",), unroll, [], [x], what="sync test")
    torch.testing.assert_close(out["y"], x * 2)
    torch.rand(4, device="cuda")
    torch.cuda.synchronize()


COLD_CACHE_SCRIPT = Path(__file__).parent / "scripts" / "cold_cache_captures.py"


@CUDA
def test_captures_from_an_empty_triton_cache(tmp_path):
    """A fresh process with empty Triton and inductor caches: every RSSM unroll kind on `triton`,
    no grad and fwd+bwd, is captured (no CaptureFailed warning) and equals `loop`."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, str(COLD_CACHE_SCRIPT)], capture_output=True, text=True, env=env,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["capture_warnings"] == [], result
    assert all(result["close"].values()), result
