"""`core/cuda_graphs.GraphedUnroll`'s no-grad replays: outputs handed out without a copy are never
overwritten while anything still references them (a view, a tensor saved by autograd).

On CPU the graph is an eager stand-in with a graph's semantics (`FakeGraph`: each replay
recomputes into the capture's own static buffers, overwriting them, and an output that is a
static input stays that input), so the bookkeeping runs without a GPU; on CUDA the same checks
run on real captures.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from worldmodels.core import cuda_graphs

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CUDA graphs)")


class FakeGraph:
    def __init__(self, fn, leaves, static_inputs):
        self.fn, self.leaves, self.static_inputs = fn, leaves, static_inputs
        self.replays = 0

    def capture(self):
        out = self.fn(self.leaves, *self.static_inputs)
        self.outputs = tuple(o if any(o is x for x in self.static_inputs) else o.clone() for o in out)
        return self.outputs

    def replay(self):
        self.replays += 1
        for static, new in zip(self.outputs, self.fn(self.leaves, *self.static_inputs)):
            if static is not new:
                static.copy_(new)


class CpuGraphedUnroll(cuda_graphs.GraphedUnroll):
    def _warm(self, inputs, runs):
        pass

    def _capture(self, inputs):
        static_inputs = [x.detach().clone() for x in inputs]
        graph = FakeGraph(self.fn, self.leaves, static_inputs)
        return cuda_graphs._ForwardCapture(graph, static_inputs, graph.capture())


def make_graphed(cls, device):
    weight = torch.tensor(3.0, device=device)

    def scaled(leaves, x):
        """Two outputs, one of them the input itself (as imagine's open loop returns its actions)."""
        return (x * weight, x)

    with torch.no_grad():
        return cls(scaled, [weight], [torch.zeros(5, device=device)])


def call(graphed, value, device):
    with torch.no_grad():
        return graphed(torch.full((5,), float(value), device=device))


def storages(graphed):
    return {o.untyped_storage().data_ptr() for c in graphed.captures for o in c.static_outputs}


def check_outputs_are_never_overwritten(graphed, device):
    first = call(graphed, 1, device)
    assert len(graphed.captures) == 1 and {o.untyped_storage().data_ptr() for o in first} <= storages(graphed)
    second = call(graphed, 2, device)                    # the first still held: a second capture
    assert len(graphed.captures) == 2
    assert first[0].tolist() == [3.0] * 5 and first[1].tolist() == [1.0] * 5
    assert second[0].tolist() == [6.0] * 5 and second[1].tolist() == [2.0] * 5
    view = first[0][1:3]                                 # a view keeps the first capture in use
    del first
    third = call(graphed, 3, device)                     # both held: the copying capture
    assert graphed.copying is not None and len(graphed.captures) == 2
    assert not {o.untyped_storage().data_ptr() for o in third} & storages(graphed)
    assert third[0].tolist() == [9.0] * 5 and view.tolist() == [3.0] * 2 and second[0].tolist() == [6.0] * 5
    del view, third
    fourth = call(graphed, 4, device)                    # the first capture is free again: no copy
    assert fourth[0].untyped_storage().data_ptr() in storages(graphed) and fourth[0].tolist() == [12.0] * 5
    assert second[1].tolist() == [2.0] * 5               # the input the second call returned, kept
    del second, fourth
    for value in range(5, 9):                            # nothing held: the captures are reused
        out = call(graphed, value, device)
        assert out[0].untyped_storage().data_ptr() in storages(graphed) and out[0].tolist() == [3.0 * value] * 5
        del out
    assert len(graphed.captures) == 2


def test_no_grad_replays_hand_out_outputs_never_overwritten():
    check_outputs_are_never_overwritten(make_graphed(CpuGraphedUnroll, "cpu"), "cpu")


def test_an_output_saved_by_autograd_keeps_its_capture_in_use():
    graphed = make_graphed(CpuGraphedUnroll, "cpu")
    scale = torch.ones(5, requires_grad=True)
    loss = (call(graphed, 1, "cpu")[0] * scale).sum()  # the output itself dropped, saved by the product
    for value in (2, 3):
        call(graphed, value, "cpu")
    loss.backward()
    assert scale.grad.tolist() == [3.0] * 5


def test_without_use_counts_every_replay_copies(monkeypatch):
    monkeypatch.setattr(cuda_graphs, "hands_out_outputs", lambda: False)
    graphed = make_graphed(CpuGraphedUnroll, "cpu")
    assert graphed.captures == [] and graphed.copying is not None
    outs = [call(graphed, value, "cpu") for value in (1, 2)]
    static = {o.untyped_storage().data_ptr() for o in graphed.copying.static_outputs}
    assert all(not {o.untyped_storage().data_ptr() for o in out} & static for out in outs)
    assert [out[0][0].item() for out in outs] == [3.0, 6.0]


def test_torch_still_has_storage_use_counts():
    """The hand-out needs torch's private `torch._C._storage_Use_Count` (torch.compile's CUDA graph
    trees use it too). If a torch release drops it, replays fall back to copying their outputs,
    correct but slower: this test says so, so that a replacement is found."""
    assert cuda_graphs.hands_out_outputs()
    x = torch.zeros(3)
    storage = x.untyped_storage()
    idle = cuda_graphs._storage_users(storage)
    alias = x.detach()[1:]
    assert cuda_graphs._storage_users(storage) > idle
    del alias
    assert cuda_graphs._storage_users(storage) == idle


@CUDA
def test_cuda_replays_hand_out_outputs_never_overwritten():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_outputs_are_never_overwritten(make_graphed(cuda_graphs.GraphedUnroll, "cuda"), "cuda")


def test_a_warm_up_leaves_the_callers_random_stream():
    """`random_state_kept`: what a capture's eager warm-up draws does not advance the caller's stream."""
    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    with cuda_graphs.random_state_kept([torch.zeros(1)]):
        torch.rand(7)
    assert torch.equal(torch.rand(3), want)


@CUDA
def test_a_capture_made_mid_stream_samples_what_the_eager_call_does():
    """A call that captures (the first, and a second capture made while the first one's outputs are
    held) samples the noise the same call draws eagerly from the same seed."""
    def noisy(leaves, x):
        return (x + torch.randn_like(x),)

    x = torch.zeros(4, device="cuda")
    with torch.no_grad():
        want = []
        for seed in range(3):
            torch.manual_seed(seed)
            want.append(noisy([], x)[0])
        graphed, got = None, []
        for seed in range(3):          # each output held: call 1 captures again, call 2 copies
            torch.manual_seed(seed)
            graphed = graphed or cuda_graphs.GraphedUnroll(noisy, [], [x])
            got.append(graphed(x)[0])
    assert len(graphed.captures) == 2 and graphed.copying is not None
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
