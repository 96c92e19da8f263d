"""The triton GRU / LSTM op (`worldmodels/ops/rnn/fused/`) against the reference op: values and
every gradient (x, h0, c0, all weights), on tiny odd shapes, with resets at t=0 and mid-sequence.

On a CPU machine the kernels run under Triton's interpreter: TRITON_INTERPRET=1 must be set when the
op module is imported (triton decides interpreter mode when a kernel is decorated) and while its
kernels run; this file sets it for the import and for each of its tests only, then restores it, so
no other test sees it. With WORLDMODELS_TEST_DEVICE=cuda the same
tests run the compiled kernels on the GPU (tf32 tolerances where the precision mode asks for it),
plus the column-split launches, which the interpreter cannot run (it runs programs one by one).
"""

from __future__ import annotations


import pytest
import torch

pytest.importorskip("triton", reason="the triton package is not installed: the triton backend cannot run")

from tests._triton import DEVICE, import_op  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numpy, inside triton's interpreter
triton_rnn = import_op("worldmodels.ops.rnn.fused", "worldmodels.ops.rnn.fused.forward_kernels",
                       "worldmodels.ops.rnn.fused.backward_kernels")
from worldmodels.ops import triton_utils  # noqa: E402  (imported above, under the interpreter)
from worldmodels.ops.rnn.fused import autograd as rnn_autograd  # noqa: E402
from worldmodels.ops.rnn.reference import rnn as reference_rnn  # noqa: E402
from worldmodels.ops.triton_utils import launch_overrides  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    if DEVICE.type == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")

GATES = {"gru": 3, "lstm": 4}


def make_inputs(cell, batch, steps, features, hidden, layers, bias, dtype, resets, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype).to(DEVICE)

    x = randn(batch, steps, features)
    states = tuple(randn(layers, batch, hidden) for _ in range(1 if cell == "gru" else 2))
    weights = []
    scale = min(0.6, 2.0 / hidden ** 0.5)  # larger recurrent weights make the unroll chaotic
    for layer in range(layers):
        width = features if layer == 0 else hidden
        g = GATES[cell] * hidden
        weights += [randn(g, width, scale=scale), randn(g, hidden, scale=scale)]
        if bias:
            weights += [randn(g, scale=0.5), randn(g, scale=0.5)]
    is_init = None
    if resets:
        is_init = torch.zeros(batch, steps, dtype=torch.bool)
        is_init[0, 0] = True  # reset at t=0
        if steps > 2:
            is_init[batch - 1, steps // 2] = True  # and mid-sequence
            is_init[0, steps - 1] = True
        is_init = is_init.to(DEVICE)
    return x, states, weights, is_init


def run_op(op, cell, x, states, weights, is_init, layers, bias, precision, grads=True):
    """Outputs of `op` and the gradients of all inputs for one fixed random cotangent."""
    leaves = [t.detach().requires_grad_(grads) for t in (x, *states, *weights)]
    n = len(states)
    y, finals = op(cell, leaves[0], tuple(leaves[1:1 + n]), leaves[1 + n:], is_init,
                   num_layers=layers, bias=bias, precision=precision)
    outs = (y, *finals)
    if not grads:
        return outs, ()
    gen = torch.Generator().manual_seed(1)
    cotangents = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o) for o in outs]
    return outs, torch.autograd.grad(outs, leaves, cotangents)


def run_both(*args, **kwargs):
    return run_op(triton_rnn.rnn, *args, **kwargs), run_op(reference_rnn, *args, **kwargs)


def assert_relative_error(triton_result, reference_result, tol):
    """||a - b|| / ||b|| per output and gradient: the measure for float32 sums in another order."""
    got, want = [*triton_result[0], *triton_result[1]], [*reference_result[0], *reference_result[1]]
    for i, (a, b) in enumerate(zip(got, want)):
        error = ((a.double() - b.double()).norm() / b.double().norm()).item()
        assert error < tol, f"output/gradient {i}: relative error {error:.2e}"


def assert_close(triton_result, reference_result, tol):
    (outs, grads), (ref_outs, ref_grads) = triton_result, reference_result
    names = ["y", "h_n", "c_n"][:len(outs)]
    for name, a, b in zip(names, outs, ref_outs):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        torch.testing.assert_close(a, b, atol=tol, rtol=tol, msg=lambda m: f"{name}: {m}")
    for i, (a, b) in enumerate(zip(grads, ref_grads)):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol, msg=lambda m: f"gradient of input {i}: {m}")


TOL = {torch.float64: 1e-10, torch.float32: 2e-5 if DEVICE.type == "cpu" else 1e-4}
# Error against a float64 reference, as ||out - ref|| / ||ref|| over every output and gradient.
PRECISION_TOL = {"ieee": 1e-5, "tf32": 5e-3, "tf32x3": 1e-5, "bf16": 3e-2}

# (batch, steps, features, hidden, layers, bias, resets): odd sizes; B=17, H=20 span two batch,
# column and K tiles of the interpreter's 16-wide blocks.
SHAPES = [
    (1, 1, 3, 5, 1, True, False),
    (2, 1, 3, 5, 1, True, True),  # one step: row 0 resets, row 1 carries its start state
    (3, 6, 3, 7, 2, False, True),
    (17, 3, 3, 20, 1, True, True),
]
@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}F{}H{}L{}{}{}".format(
    *s[:5], "-bias" if s[5] else "", "-resets" if s[6] else ""))
def test_matches_reference_float64(cell, shape):
    batch, steps, features, hidden, layers, bias, resets = shape
    inputs = make_inputs(cell, batch, steps, features, hidden, layers, bias, torch.float64, resets)
    tri, ref = run_both(cell, *inputs, layers, bias, "ieee")
    assert_close(tri, ref, TOL[torch.float64])


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_matches_reference_float32(cell):
    inputs = make_inputs(cell, 3, 5, 3, 7, 1, True, torch.float32, True, seed=2)
    tri, ref = run_both(cell, *inputs, 1, True, "ieee")
    assert_close(tri, ref, TOL[torch.float32])


@pytest.mark.parametrize("cell", ["gru"] + (["lstm"] if DEVICE.type == "cuda" else []))
@pytest.mark.parametrize("precision", ["bf16", "tf32"] + (["ieee", "tf32x3"] if DEVICE.type == "cuda" else []))
def test_precision_error_against_float64(cell, precision):
    """float32 inputs in each precision mode vs the float64 reference, next to the reference op's own
    error in that mode (the interpreter emulates bf16 by rounding the dot operands, and tf32 by the
    kernels' own rounding of the operands to tf32; tf32x3 is checked on the GPU)."""
    x, states, weights, is_init = make_inputs(cell, 4, 5, 6, 20, 1, True, torch.float64, True, seed=7)
    exact = run_op(reference_rnn, cell, x, states, weights, is_init, 1, True, "ieee")
    to32 = lambda ts: [t.float() for t in ts]  # noqa: E731
    args = (cell, x.float(), tuple(to32(states)), to32(weights), is_init, 1, True, precision)
    errors = {}
    for name, op in (("triton", triton_rnn.rnn), ("reference", reference_rnn)):
        outs, grads = run_op(op, *args)
        errors[name] = [((a.double() - b).norm() / b.norm()).item()
                        for a, b in zip([*outs, *grads], [*exact[0], *exact[1]])]
    for i, (ours, theirs) in enumerate(zip(errors["triton"], errors["reference"])):
        assert ours < max(PRECISION_TOL[precision], 2 * theirs), \
            f"{precision}: output/gradient {i} relative error {ours:.2e} (reference op: {theirs:.2e})"


def nearest_tf32(x: torch.Tensor) -> torch.Tensor:
    """The tf32 value (10 mantissa bits) nearest to each fp32 of x, ties away from zero, found by
    comparing the two tf32 neighbours in float64 (not by the kernel's bit trick)."""
    bits = x.view(torch.int32)
    down = (bits & ~0x1FFF).view(torch.float32).double()  # truncated towards zero
    up = ((bits & ~0x1FFF) + 0x2000).view(torch.float32).double()  # the next tf32 away from zero
    x64 = x.double()
    nearer_up = (up - x64).abs() <= (x64 - down).abs()
    return torch.where(nearer_up, up, down).float()


@triton.jit
def _round_tf32_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, triton_utils.round_tf32(tl.load(x_ptr + i, mask=i < n)), mask=i < n)


def test_tf32_operands_round_to_nearest_not_towards_zero():
    """`triton_utils.round_tf32` (what the kernels feed the tensor cores in tf32) is round-to-nearest: equal to the
    nearest tf32 on random and edge values, with an unbiased error where truncation's is one-signed."""
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(4000, generator=gen) * 10.0 ** torch.randint(-6, 6, (4000,), generator=gen),
                   torch.tensor([0.0, -0.0, 1.0, -1.0, 1 + 2 ** -11, -(1 + 2 ** -11), 1 + 3 * 2 ** -12,
                                 3.4e38, float("inf"), -float("inf"), 1e-40])])
    y = torch.empty_like(x, device=DEVICE)
    _round_tf32_kernel[(triton.cdiv(x.numel(), 256),)](x.to(DEVICE), y, x.numel(), BLOCK=256)
    want = nearest_tf32(x)
    assert torch.equal(y.cpu(), want)
    assert (y.cpu().view(torch.int32) & 0x1FFF).eq(0).all()  # tf32: the low 13 mantissa bits clear
    body = torch.randn(20000, generator=gen).abs() + 1.0
    rounded_bias = ((nearest_tf32(body).double() - body.double()) / body.double()).mean()
    truncated_bias = (((body.view(torch.int32) & ~0x1FFF).view(torch.float32).double() - body.double())
                      / body.double()).mean()
    assert abs(rounded_bias) < 2e-5 < -truncated_bias  # half an ulp of tf32 is 2^-11 ~ 4.9e-4


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_no_grad_forward_and_partial_grads(cell):
    x, states, weights, is_init = make_inputs(cell, 3, 5, 4, 6, 1, True, torch.float64, True, seed=3)
    with torch.no_grad():
        (outs, _), (ref_outs, _) = run_both(cell, x, states, weights, is_init, 1, True, "ieee", grads=False)
    for a, b in zip(outs, ref_outs):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    # only x requires grad, and only y is used: the unused outputs' gradients arrive as None / zeros
    xs = [x.detach().requires_grad_(), x.detach().requires_grad_()]
    grads = []
    for op, xi in zip((triton_rnn.rnn, reference_rnn), xs):
        y, _ = op(cell, xi, states, weights, is_init, num_layers=1, bias=True, precision="ieee")
        grads.append(torch.autograd.grad(y.square().sum(), xi)[0])
    torch.testing.assert_close(grads[0], grads[1], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_resident_weights_match_reference(cell):
    """W_RESIDENT: each program keeps its W_hh slice in registers across steps (one column tile)."""
    inputs = make_inputs(cell, 17, 4, 3, 20, 2, True, torch.float64, True, seed=8)
    with launch_overrides("rnn", BLOCK_B=16, BLOCK_H=32, BLOCK_K=16, SPLIT=1, W_RESIDENT=True):
        tri, ref = run_both(cell, *inputs, 2, True, "ieee")
    assert_close(tri, ref, TOL[torch.float64])


def test_backward_launches_as_its_forward_did_on_another_thread(monkeypatch):
    """The backward launches with the keys overridden at its forward's call, wherever it runs: autograd runs
    a CUDA backward on its device thread, which does not see the caller's `launch_overrides` (without the
    pinning the column-split tests' backward ran the default launch on the GPU). Here on a fresh thread."""
    import threading

    from worldmodels.ops.rnn.fused import launch

    configs = []
    config = launch._config
    monkeypatch.setattr(launch, "_config", lambda *a: configs.append(config(*a)) or configs[-1])
    cell, (x, states, weights, is_init) = "gru", make_inputs("gru", 5, 3, 4, 20, 1, True, torch.float64, True)
    leaves = [t.detach().requires_grad_(True) for t in (x, *states, *weights)]
    with launch_overrides("rnn", BLOCK_H=32, BLOCK_K=32):
        y, _ = triton_rnn.rnn(cell, leaves[0], tuple(leaves[1:2]), leaves[2:], is_init, num_layers=1, bias=True,
                              precision="ieee")
    result = {}
    worker = threading.Thread(target=lambda: result.update(grads=torch.autograd.grad(y.square().sum(), leaves)))
    worker.start()
    worker.join()
    assert "grads" in result and len(configs) == 2  # the forward's launch, then the backward's
    assert all((c["BLOCK_H"], c["BLOCK_K"]) == (32, 32) for c in configs), configs
    ref_leaves = [t.detach().requires_grad_(True) for t in (x, *states, *weights)]
    y_ref, _ = reference_rnn(cell, ref_leaves[0], tuple(ref_leaves[1:2]), ref_leaves[2:], is_init, num_layers=1,
                             bias=True, precision="ieee")
    want = torch.autograd.grad(y_ref.square().sum(), ref_leaves)
    for got, ref in zip(result["grads"], want):
        torch.testing.assert_close(got, ref, atol=1e-10, rtol=1e-10)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="column-split launches need concurrently resident programs (GPU)")
@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("config", [dict(SPLIT=2), dict(SPLIT=8), dict(SPLIT=8, W_RESIDENT=True)],
                         ids=["split2", "split8", "split8-resident"])
def test_column_split_matches_reference(cell, config):
    inputs = make_inputs(cell, 40, 9, 24, 72, 2, True, torch.float32, True, seed=4)
    with launch_overrides("rnn", BLOCK_B=16, BLOCK_H=16, BLOCK_K=32, **config):
        tri, ref = run_both(cell, *inputs, 2, True, "ieee")
    assert_relative_error(tri, ref, 1e-5)


def test_compile_fullgraph_goes_through_the_custom_op():
    cell, layers = "gru", 1
    x, states, weights, is_init = make_inputs(cell, 3, 4, 3, 5, layers, True, torch.float64, True, seed=5)

    def loss(x, h, weights):
        y, (h_n,) = triton_rnn.rnn(cell, x, (h,), weights, is_init, num_layers=layers, bias=True, precision="ieee")
        return y.square().sum() + h_n.sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    grads = []
    for fn in (loss, compiled):
        leaves = [x.detach().requires_grad_(), states[0].detach().requires_grad_(),
                  [w.detach().requires_grad_() for w in weights]]
        value = fn(*leaves)
        grads.append((value, torch.autograd.grad(value, [leaves[0], leaves[1], *leaves[2]])))
    torch.testing.assert_close(grads[1][0], grads[0][0], atol=1e-12, rtol=1e-12)
    for a, b in zip(grads[1][1], grads[0][1]):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_fake_implementations_pass_opcheck():
    x, states, weights, is_init = make_inputs("lstm", 2, 3, 3, 5, 1, True, torch.float64, True, seed=6)
    weights = [w.requires_grad_() for w in weights]
    args = ("lstm", x.requires_grad_(), states[0], states[1], weights, is_init, 1, True, "ieee", True)
    torch.library.opcheck(rnn_autograd.forward_op, args,
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_unsupported_shapes_and_arguments_raise_clearly():
    assert triton_rnn.supports("gru", 256) and triton_rnn.supports("lstm", 1024)
    assert not triton_rnn.supports("gru", 4096)
    assert "L2" in triton_rnn.unsupported_reason("lstm", 4096)
    assert triton_rnn.available(DEVICE)
    x, states, weights, _ = make_inputs("gru", 1, 2, 3, 5, 1, True, torch.float32, False)
    with pytest.raises(ValueError, match="precision"):
        triton_rnn.rnn("gru", x, states, weights, None, num_layers=1, bias=True, precision="fp8")
    big = torch.zeros(1, 1, 4096, device=DEVICE)
    with pytest.raises(ValueError, match="hidden_size=4096"):
        triton_rnn.rnn("gru", x, (big,), weights, None, num_layers=1, bias=True, precision="ieee")
