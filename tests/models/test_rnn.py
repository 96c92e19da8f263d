"""`worldmodels.GRU` / `worldmodels.LSTM` on every backend against torch's `nn.GRU` / `nn.LSTM`.

Values and gradients (w.r.t. inputs, initial hidden state and every parameter) must match torch's
modules loaded with the same weights; with resets, a step-by-step loop of torch's module that
zeroes the hidden state where `is_init` is set. Shapes are tiny: an eager `scan` call re-traces
its body each time, so scan cases are chosen to cover one thing each.
"""

from __future__ import annotations

import copy
import threading
import warnings

import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap
from torch.utils import _pytree as pytree

import worldmodels
from worldmodels.core import is_canonical, recurrent_backend, recurrent_mode, set_recurrent_backend
from worldmodels.core import backends, registry
from worldmodels.core.backends import IMPLEMENTED_BACKENDS
from worldmodels.core.precision import USER_MODES
from worldmodels.core.torch_fixes import eager_scan_needs_grad_carry, scan_compiles_correctly
from worldmodels.core.triton_support import triton_unavailable

BACKENDS = registry.available_backends("cpu", "rnn")  # every backend that runs here
KINDS = {"gru": (worldmodels.GRU, nn.GRU), "lstm": (worldmodels.LSTM, nn.LSTM)}
# One odd shape for most cases: an eager scan call traces its body again for each new batch or
# feature size (seconds on this CPU) and reuses the trace for a size it has seen.
B, F, H = 3, 3, 5  # batch, input features, hidden


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ------------------------------------------------------------------------------ helpers
def make(kind, input_size, hidden_size, num_layers=1, bias=True, dtype=torch.float32, **kwargs):
    """A worldmodels module and the torch module it must equal, holding the same weights."""
    ours, theirs = KINDS[kind]
    reference = theirs(input_size, hidden_size, num_layers, bias=bias, batch_first=True, dtype=dtype)
    module = ours(input_size, hidden_size, num_layers, bias=bias, dtype=dtype, **kwargs)
    module.load_state_dict(reference.state_dict())
    return module, reference


def initial_states(kind, shape, dtype=torch.float32) -> list[torch.Tensor]:
    """Leaf tensors for the initial hidden state: [h] for a GRU, [h, c] for an LSTM."""
    return [torch.randn(shape, dtype=dtype, requires_grad=True) for _ in range(1 if kind == "gru" else 2)]


def as_hx(states):
    """`hx` as the modules take it: h for a GRU, (h, c) for an LSTM, None for no states."""
    if not states:
        return None
    return states[0] if len(states) == 1 else tuple(states)


def parameters_like(module, reference):
    """The reference's parameters in the order of `module.parameters()`, matched by name."""
    named = dict(reference.named_parameters())
    return [named[name] for name, _ in module.named_parameters()]


def values_and_grads(outputs, wrt):
    """The output leaves, then the gradients w.r.t. `wrt` of a fixed random projection of them."""
    outputs = pytree.tree_leaves(outputs)
    generator = torch.Generator().manual_seed(1234)
    cotangents = [torch.randn(o.shape, generator=generator, dtype=o.dtype).to(o.device) for o in outputs]
    grads = torch.autograd.grad(outputs, wrt, cotangents)
    return [o.detach() for o in outputs] + list(grads)


def assert_all_close(actual, expected, **tolerance):
    assert len(actual) == len(expected)
    for index, (a, e) in enumerate(zip(actual, expected)):
        torch.testing.assert_close(a, e, **tolerance, msg=lambda m: f"tensor {index}: {m}")


def random_resets(batch, steps):
    """is_init [B, T] with resets at random steps, at t=0 (row 0) and at the last step (last row);
    row 1 keeps its initial state at t=0 so the initial hidden state matters."""
    is_init = torch.rand(batch, steps) < 0.3
    is_init[0, 0] = True
    is_init[1, 0] = False
    is_init[-1, -1] = True
    return is_init


def stepwise_reference(reference, x, states, is_init):
    """torch's module one step at a time, with the hidden state zeroed where `is_init` is set."""
    ys = []
    for t in range(x.shape[1]):
        reset = is_init[:, t].view(1, -1, 1)
        states = [torch.where(reset, torch.zeros_like(s), s) for s in states]
        y, hx = reference(x[:, t : t + 1], as_hx(states))
        states = pytree.tree_leaves(hx)
        ys.append(y)
    return torch.cat(ys, 1), as_hx(states)


@pytest.fixture
def ran_backends(monkeypatch):
    """Records which backend's `rnn` op each call ran. The scan op is replaced by the loop op
    (same math, same numbers) so these tests stay fast; cudnn's is wrapped, not replaced."""
    ran = []

    def recorder(name, op):
        def run(*args, **kwargs):
            ran.append(name)
            return op(*args, **kwargs)
        return run

    ops = {name: registry.get("loop" if name == "scan" else name).op("rnn") for name in ("loop", "scan", "cudnn")}
    for name, op in ops.items():
        monkeypatch.setitem(registry._resolved, (name, "rnn", registry.get(name).ops["rnn"]), recorder(name, op))
    return ran


# ------------------------------------------------------------------------------ parity with torch
PARITY_CASES = {
    "single_layer_odd_sizes": dict(batch=B, steps=7, num_layers=1),
    "two_layers_batch1_no_bias": dict(batch=1, steps=5, num_layers=2, bias=False),
    "unbatched_no_hx": dict(batch=None, steps=6, num_layers=1, with_hx=False),
}


@pytest.mark.parametrize("case", PARITY_CASES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_matches_torch_module(kind, backend, case):
    c = {"bias": True, "with_hx": True, **PARITY_CASES[case]}
    module, reference = make(kind, F, H, c["num_layers"], c["bias"], backend=backend)
    batch = () if c["batch"] is None else (c["batch"],)
    x = torch.randn(*batch, c["steps"], F, requires_grad=True)
    states = initial_states(kind, (c["num_layers"], *batch, H)) if c["with_hx"] else []
    ours = values_and_grads(module(x, as_hx(states)), [x, *states, *module.parameters()])
    theirs = values_and_grads(reference(x, as_hx(states)), [x, *states, *parameters_like(module, reference)])
    assert_all_close(ours, theirs)


@pytest.mark.parametrize("case", ["batched", "unbatched", "one_step"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_resets_match_stepwise_torch_reference(kind, backend, case):
    """`one_step`: T=1, rows 0 and 2 reset at their only step, row 1 runs from its start state."""
    layers, steps = {"batched": (2, 6), "unbatched": (1, 5), "one_step": (1, 1)}[case]
    batched = case != "unbatched"
    module, reference = make(kind, F, H, layers, backend=backend)
    x = torch.randn(B, steps, F, requires_grad=True)
    states = initial_states(kind, (layers, B, H))
    is_init = random_resets(B, steps)
    expected = stepwise_reference(reference, x, states, is_init)
    assert not torch.allclose(expected[0], reference(x, as_hx(states))[0])  # the resets matter
    if batched:
        outputs = module(x, as_hx(states), is_init)
    else:  # one sequence, row 1: x [T, F], hx [L, H], is_init [T]
        outputs = module(x[1], as_hx([s[:, 1] for s in states]), is_init[1])
        expected = (expected[0][1], pytree.tree_map(lambda s: s[:, 1], expected[1]))
    assert_all_close(values_and_grads(outputs, [x, *states, *module.parameters()]),
                     values_and_grads(expected, [x, *states, *parameters_like(module, reference)]))


@pytest.mark.parametrize("kind, backend", [("gru", "loop"), ("gru", "scan"), ("gru", "cudnn"),
                                           ("lstm", "loop"), ("lstm", "cudnn")])
def test_gradcheck_float64_with_resets(kind, backend):
    """Inputs, initial state and weights are views of one flat float64 vector (so `scan` also sees
    weights aliasing one buffer). Scan runs GRU only, in fast mode: each eager scan call re-traces
    its body (seconds here), and the LSTM's scan gradients are checked against torch's above."""
    module = KINDS[kind][0](2, 3, backend=backend, dtype=torch.float64)
    shapes = {"x": (2, 3, 2), **{f"state{i}": (1, 2, 3) for i in range(1 if kind == "gru" else 2)},
              **{name: tuple(p.shape) for name, p in module.named_parameters()}}
    sizes = [torch.Size(s).numel() for s in shapes.values()]
    flat = torch.randn(sum(sizes), dtype=torch.float64, requires_grad=True)
    is_init = torch.tensor([[True, False, True], [False, True, False]])

    def run(flat):
        parts = {name: chunk.view(shape) for (name, shape), chunk in zip(shapes.items(), flat.split(sizes))}
        x = parts.pop("x")
        states = [parts.pop(name) for name in list(parts) if name.startswith("state")]
        return tuple(pytree.tree_leaves(functional_call(module, parts, (x, as_hx(states)), {"is_init": is_init})))

    on_scan = backend == "scan"  # fast mode; undefined-output-grad handling is torch's scan autograd
    assert torch.autograd.gradcheck(run, (flat,), fast_mode=on_scan, check_undefined_grad=not on_scan)


# ------------------------------------------------------------------------------ layouts
def _x_odd_strides(leaf):  # [1, T, F], contiguous by is_contiguous() but not canonical
    return leaf.as_strided((1, 4, F), (7, F, 1))


LAYOUTS = {  # name -> (leaf shapes (x source, h source), build x [B, 4, F], build h [1, B, H])
    "x_transposed": ([(4, B, F), (1, B, H)], lambda v: v.transpose(0, 1), lambda h: h),
    "x_expanded": ([(1, 4, F), (1, B, H)], lambda v: v.expand(B, 4, F), lambda h: h),
    "x_feature_slice": ([(B, 4, 2 * F), (1, B, H)], lambda v: v[..., ::2], lambda h: h),
    "x_odd_strides_batch1": ([(4 * F,), (1, 1, H)], _x_odd_strides, lambda h: h),
    "h_transposed": ([(B, 4, F), (H, B)], lambda v: v, lambda h: h.t().unsqueeze(0)),
    "h_odd_strides": ([(B, 4, F), (B, 1, H)], lambda v: v, lambda h: h.transpose(0, 1)),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_non_canonical_inputs_match_contiguous(backend, layout):
    shapes, build_x, build_h = LAYOUTS[layout]
    module, reference = make("gru", F, H, backend=backend)
    leaves = [torch.randn(shape, requires_grad=True) for shape in shapes]
    x, h = build_x(leaves[0]), build_h(leaves[1])
    assert not (is_canonical(x) and is_canonical(h))
    ours = values_and_grads(module(x, h), [*leaves, *module.parameters()])
    theirs = values_and_grads(reference(x.contiguous(), h.contiguous()),
                              [*leaves, *parameters_like(module, reference)])
    assert_all_close(ours, theirs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lstm_non_canonical_state_pair_from_one_buffer(backend):
    """h and c are non-contiguous views into one buffer; x is a transposed view."""
    module, reference = make("lstm", F, H, backend=backend)
    buffer = torch.randn(H, B, 2, requires_grad=True)  # [H, B, (h, c)]
    h, c = (buffer[..., i].t().unsqueeze(0) for i in range(2))  # [1, B, H]
    x_source = torch.randn(B, F, 5, requires_grad=True)
    x = x_source.transpose(1, 2)  # [B, 5, F]
    assert not is_canonical(h) and not is_canonical(c) and not is_canonical(x)
    ours = values_and_grads(module(x, (h, c)), [buffer, x_source, *module.parameters()])
    theirs = values_and_grads(reference(x.contiguous(), (h.contiguous(), c.contiguous())),
                              [buffer, x_source, *parameters_like(module, reference)])
    assert_all_close(ours, theirs)


# ------------------------------------------------------------------------------ torch.compile
# The compile tests use the aot_eager backend: fullgraph=True already proves there is no graph
# break, and AOT autograd traces scan's forward and backward; Inductor would only add minutes of
# C++ compilation on this CPU.
SCAN_COMPILES = pytest.mark.skipif(not scan_compiles_correctly(), reason=(
    f"torch {torch.__version__} < 2.13: scan under torch.compile is refused (core/torch_fixes.py; "
    "test_torch_upstream checks the gate)"))


def compile_fullgraph(fn):
    return torch.compile(fn, fullgraph=True, backend="aot_eager")


@SCAN_COMPILES
def test_compiled_scan_matches_eager_values_and_grads():
    module, _ = make("gru", F, H, backend="scan")
    x = torch.randn(B, 5, F, requires_grad=True)
    (h,) = initial_states("gru", (1, B, H))
    is_init = random_resets(B, 5)
    wrt = [x, h, *module.parameters()]
    compiled = values_and_grads(compile_fullgraph(module)(x, h, is_init), wrt)
    eager = values_and_grads(module(x, h, is_init), wrt)
    assert_all_close(compiled, eager)
    reference = values_and_grads(module(x, h, is_init, backend="loop"), wrt)
    assert_all_close(compiled, reference)


def flat_views(module, flat):
    """Each parameter as a view into one flat buffer, the way cuDNN lays out RNN weights."""
    views, offset = {}, 0
    for name, p in module.named_parameters():
        views[name] = flat[offset : offset + p.numel()].view(p.shape)
        offset += p.numel()
    return views


@SCAN_COMPILES
def test_scan_with_weights_as_views_of_one_flat_buffer():
    module, _ = make("gru", F, H, backend="scan")
    flat = torch.cat([p.detach().flatten() for p in module.parameters()]).requires_grad_()
    x = torch.randn(B, 4, F, requires_grad=True)
    is_init = random_resets(B, 4)

    def run(flat, x):
        return functional_call(module, flat_views(module, flat), (x,), {"is_init": is_init})

    expected = values_and_grads(module(x, is_init=is_init, backend="loop"), [x, *module.parameters()])
    expected = expected[:3] + [torch.cat([g.flatten() for g in expected[3:]])]  # y, h, dx, dflat
    assert_all_close(values_and_grads(run(flat, x), [x, flat]), expected)
    assert_all_close(values_and_grads(compile_fullgraph(run)(flat, x), [x, flat]), expected)


@SCAN_COMPILES
def test_scan_with_parameters_sharing_one_storage():
    """cuDNN's flatten_parameters `set_`s every parameter into one flat buffer: they share storage
    without being views (no `_base`)."""
    module, _ = make("gru", F, H, backend="scan")
    x = torch.randn(B, 4, F, requires_grad=True)
    expected = values_and_grads(module(x, backend="loop"), [x, *module.parameters()])
    flat = torch.cat([p.detach().flatten() for p in module.parameters()])
    with torch.no_grad():
        offset = 0
        for p in module.parameters():
            p.set_(flat.untyped_storage(), offset, p.shape, p.stride())
            offset += p.numel()
    assert len({p.untyped_storage().data_ptr() for p in module.parameters()}) == 1
    assert all(p._base is None for p in module.parameters())
    wrt = [x, *module.parameters()]
    assert_all_close(values_and_grads(module(x), wrt), expected)
    assert_all_close(values_and_grads(compile_fullgraph(module)(x), wrt), expected)


# ------------------------------------------------------------------------------ vmap ensembles
@pytest.mark.parametrize("shared_input", [False, True], ids=["input_per_member", "shared_input"])
@pytest.mark.parametrize("backend", ["loop", "scan"])
def test_vmap_ensemble_equals_loop_over_members(backend, shared_input):
    if backend == "scan" and not shared_input and eager_scan_needs_grad_carry():
        pytest.skip(f"torch {torch.__version__} < 2.13: eager scan's gradients under vmap with a per-member input "
                    "are wrong (seen on 2.11, the H200's torch); the project pins 2.13")
    members = [worldmodels.GRU(3, 4) for _ in range(3)]
    params, buffers = stack_module_state(members)
    base = copy.deepcopy(members[0]).to("meta")
    x = torch.randn(2, 4, 3) if shared_input else torch.randn(3, 2, 4, 3)
    is_init = random_resets(2, 4)

    def member(p, x):
        return functional_call(base, (p, buffers), (x,), {"is_init": is_init, "backend": backend})

    ys, h = vmap(member, in_dims=(0, None if shared_input else 0))(params, x)
    for i, m in enumerate(members):
        y_i, h_i = m(x if shared_input else x[i], is_init=is_init, backend="loop")
        torch.testing.assert_close(ys[i], y_i)
        torch.testing.assert_close(h[i], h_i)
    # gradients reach every member's weights as in the loop
    (grad,) = torch.autograd.grad(ys.square().sum(), params["weight_hh_l0"])
    for i, m in enumerate(members):
        (expected,) = torch.autograd.grad(m(x if shared_input else x[i], is_init=is_init, backend="loop")[0]
                                          .square().sum(), m.weight_hh_l0)
        torch.testing.assert_close(grad[i], expected)


def test_vmap_auto_picks_loop_and_explicit_cudnn_is_a_clear_error(ran_backends):
    members = [worldmodels.GRU(3, 4) for _ in range(2)]
    params, buffers = stack_module_state(members)
    base = copy.deepcopy(members[0]).to("meta")
    x = torch.randn(2, 4, 3)

    def member(p, backend):
        return functional_call(base, (p, buffers), (x,), {"backend": backend})[0]

    ys = vmap(lambda p: member(p, "auto"))(params)  # only the weights carry the vmapped dim
    assert ran_backends == ["loop"]
    torch.testing.assert_close(ys, torch.stack([m(x)[0] for m in members]))
    with pytest.raises(ValueError, match="cudnn.*vmap"):
        vmap(lambda p: member(p, "cudnn"))(params)


@pytest.mark.skipif(triton_unavailable(torch.device("cpu")) is not None,
                    reason="the triton backend runs on CPU tensors only under TRITON_INTERPRET=1 (this run compiles)")
def test_vmap_explicit_triton_falls_back_to_auto_with_one_warning(ran_backends, monkeypatch):
    # triton has no batching rule: asked for by name under vmap it runs on auto's vmappable choice
    monkeypatch.setattr(backends, "_warned", set())
    members = [worldmodels.GRU(3, 4) for _ in range(2)]
    params, buffers = stack_module_state(members)
    base = copy.deepcopy(members[0]).to("meta")
    x = torch.randn(2, 4, 3)

    def member(p):
        return functional_call(base, (p, buffers), (x,), {"backend": "triton"})[0]

    with pytest.warns(UserWarning, match="'triton' has no torch.func.vmap batching rule.*run on 'loop'"):
        ys = vmap(member)(params)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vmap(member)(params)  # warned once
    assert ran_backends == ["loop", "loop"]
    torch.testing.assert_close(ys, torch.stack([m(x)[0] for m in members]))


# ------------------------------------------------------------------------------ step mode
@pytest.mark.parametrize("kind, backend", [("gru", "loop"), ("gru", "cudnn"), ("gru", "scan"),
                                           ("lstm", "loop"), ("lstm", "cudnn")])
def test_step_mode_equals_sequence(kind, backend):
    steps, layers = (3, 1) if backend == "scan" else (6, 2)  # on scan, one eager scan call per step
    module, _ = make(kind, F, H, num_layers=layers, backend=backend)
    x = torch.randn(B, steps, F, requires_grad=True)
    states = initial_states(kind, (layers, B, H))
    is_init = random_resets(B, steps)
    wrt = [x, *states, *module.parameters()]
    expected = values_and_grads(module(x, as_hx(states), is_init, backend="loop"), wrt)
    hx, ys = as_hx(states), []
    with recurrent_mode("step"):
        for t in range(steps):
            y, hx = module(x[:, t], hx, is_init[:, t])
            assert y.shape == (B, H)
            ys.append(y)
    assert_all_close(values_and_grads((torch.stack(ys, 1), hx), wrt), expected)


def test_step_method_and_step_mode_without_initial_state():
    module, reference = make("lstm", 3, 4)
    x = torch.randn(2, 3)
    with recurrent_mode("step"):
        y, (h, c) = module(x)
        y_unbatched, _ = module(x[0])
    y_method, (h_method, c_method) = module.step(x)
    y_ref, (h_ref, c_ref) = reference(x[:, None])
    for a, b in ((y, y_ref[:, 0]), (h, h_ref), (c, c_ref), (y_method, y), (h_method, h), (c_method, c),
                 (y_unbatched, y[0])):
        torch.testing.assert_close(a, b)


# ------------------------------------------------------------------------------ backend selection
def test_backend_resolution_most_specific_wins(ran_backends):
    x = torch.randn(2, 3, 3)
    plain, pinned = worldmodels.GRU(3, 4), worldmodels.GRU(3, 4, backend="scan")
    set_recurrent_backend("auto")
    plain(x)  # auto, eager on CPU: the vendor op
    set_recurrent_backend("loop")
    plain(x)  # the context's setting
    pinned(x)  # the module's backend beats the context
    pinned(x, backend="cudnn")  # the call's beats the module's
    with recurrent_backend("cudnn"):
        plain(x)
        pinned(x)
        plain(x, backend="scan")
    plain(x)
    assert ran_backends == ["cudnn", "loop", "scan", "cudnn", "cudnn", "scan", "scan", "loop"]


def test_auto_backend_under_compile_is_scan_where_its_gradients_are_right(ran_backends):
    module = worldmodels.GRU(3, 4)
    x = torch.randn(2, 3, 3)
    with recurrent_backend("auto"):
        compiled = compile_fullgraph(module)(x)[0]
    assert ran_backends == ["scan" if scan_compiles_correctly() else "loop"]
    torch.testing.assert_close(compiled, module(x, backend="loop")[0])


def test_worker_thread_runs_the_default_backend(ran_backends):
    module = worldmodels.GRU(3, 4)
    x = torch.randn(2, 3, 3)
    with recurrent_backend("scan"):
        worker = threading.Thread(target=module, args=(x,), kwargs={"backend": None})
        worker.start()
        worker.join()
        module(x)
    default = worldmodels.get_recurrent_backend()
    assert ran_backends == [("cudnn" if default == "auto" else default), "scan"]


# ------------------------------------------------------------------------------ precision
@pytest.mark.parametrize("kind, backend", [("gru", "loop"), ("gru", "scan"), ("gru", "cudnn"),
                                           ("lstm", "loop"), ("lstm", "cudnn")])
def test_bf16_precision_is_close_to_fp32_but_not_identical(kind, backend):
    """loop and scan share the step function (and its bf16 matmuls); the LSTM runs on both others."""
    module, _ = make(kind, F, H, backend=backend)
    x = torch.randn(B, 5, F)
    ieee = pytree.tree_leaves(module(x))
    bf16_module = KINDS[kind][0](F, H, backend=backend, precision="bf16")
    bf16_module.load_state_dict(module.state_dict())
    bf16 = pytree.tree_leaves(bf16_module(x))
    assert all(t.dtype == torch.float32 for t in bf16)
    assert_all_close(bf16, ieee, rtol=0, atol=5e-2)
    assert any(not torch.equal(a, b) for a, b in zip(bf16, ieee))
    if backend == "loop":  # the process-global setting reaches modules without their own
        worldmodels.set_recurrent_matmul_precision("bf16")
        assert_all_close(pytree.tree_leaves(module(x)), bf16, rtol=0, atol=0)
        assert_all_close(pytree.tree_leaves(bf16_module(x)), bf16, rtol=0, atol=0)
        ieee_module = KINDS[kind][0](F, H, backend=backend, precision="ieee")
        ieee_module.load_state_dict(module.state_dict())
        assert_all_close(pytree.tree_leaves(ieee_module(x)), ieee, rtol=0, atol=0)  # module wins


def test_precision_never_flips_global_matmul_flags(monkeypatch):
    """No call touches torch.backends.cuda.matmul (allow_tf32 / fp32_precision) or torch's
    float32 matmul precision, for any mode, on any backend."""
    touched = []
    matmul_type = type(torch.backends.cuda.matmul)
    original_setattr = matmul_type.__setattr__

    def spy_setattr(self, name, value):
        touched.append(name)
        original_setattr(self, name, value)

    monkeypatch.setattr(matmul_type, "__setattr__", spy_setattr)
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda *a: touched.append("fp32 precision"))
    monkeypatch.setattr(torch._C, "_set_cublas_allow_tf32", lambda *a: touched.append("cublas tf32"))
    allow_tf32, torch_precision = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    x = torch.randn(2, 3, 3)
    is_init = random_resets(2, 3)
    for mode in ("ieee", "tf32", "tf32x3", "bf16", "fast", "high-prec"):
        for backend in ("loop", "cudnn"):
            worldmodels.GRU(3, 4, backend=backend, precision=mode)(x, is_init=is_init)
            worldmodels.LSTM(3, 4, backend=backend, precision=mode)(x, is_init=is_init)
    assert touched == []
    assert torch.backends.cuda.matmul.allow_tf32 == allow_tf32
    assert torch.get_float32_matmul_precision() == torch_precision


# ------------------------------------------------------------------------------ bad inputs
def _bad_inputs(kind):
    def hx(*shape, dtype=torch.float32):
        h = torch.randn(shape, dtype=dtype)
        return (h, h.clone()) if kind == "lstm" else h

    x, h = torch.randn(2, 5, 3), torch.randn(1, 2, 4)
    return {  # name -> (x, hx, is_init, error type, words the message must contain)
        "x_rank_1": (torch.randn(3), None, None, ValueError, ["x", "[B, T, 3]"]),
        "x_rank_4": (torch.randn(1, 2, 3, 3), None, None, ValueError, ["x", "[B, T, 3]"]),
        "x_feature_size": (torch.randn(2, 5, 4), None, None, ValueError, ["x", "[2, 5, 4]"]),
        "x_integer": (torch.ones(2, 5, 3, dtype=torch.long), None, None, TypeError, ["x", "floating"]),
        "x_not_a_tensor": ([[0.0] * 3] * 5, None, None, TypeError, ["x"]),
        "hx_batch": (x, hx(1, 3, 4), None, ValueError, ["hx", "[1, 2, 4]"]),
        "hx_layers": (x, hx(2, 2, 4), None, ValueError, ["hx", "num_layers"]),
        "hx_unbatched_for_batched_x": (x, hx(1, 4), None, ValueError, ["hx", "[1, 2, 4]"]),
        "hx_dtype": (x, hx(1, 2, 4, dtype=torch.float64), None, TypeError, ["hx", "dtype"]),
        "hx_arity": (x, (h, h, h) if kind == "lstm" else (h, h), None, ValueError, ["hx"]),
        "is_init_shape": (x, hx(1, 2, 4), torch.zeros(2, 4, dtype=torch.bool), ValueError, ["is_init", "[2, 5]"]),
        "is_init_dtype": (x, hx(1, 2, 4), torch.zeros(2, 5), TypeError, ["is_init", "bool"]),
        "is_init_not_a_tensor": (x, None, [[True] * 5] * 2, ValueError, ["is_init"]),
    }


@pytest.mark.parametrize("case", list(_bad_inputs("gru")))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_bad_inputs_raise_clear_errors(kind, backend, case):
    x, hx, is_init, error, words = _bad_inputs(kind)[case]
    module = KINDS[kind][0](3, 4, backend=backend)
    with pytest.raises(error) as info:
        module(x, hx, is_init)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("kind", KINDS)
def test_bad_inputs_in_step_mode(kind):
    module = KINDS[kind][0](3, 4)
    with recurrent_mode("step"), pytest.raises(ValueError, match="is_init"):
        module(torch.randn(2, 3), None, torch.zeros(3, dtype=torch.bool))
    with recurrent_mode("step"), pytest.raises(ValueError, match="x"):
        module(torch.randn(2, 5))


def test_invalid_backend_names():
    x = torch.randn(2, 3, 3)
    with pytest.raises(ValueError, match="backend") as info:
        worldmodels.GRU(3, 4, backend="fastest")
    assert "'scan'" in str(info.value)
    with pytest.raises(ValueError, match="backend"):
        worldmodels.LSTM(3, 4)(x, backend="gpu")


def _triton_in_context(x):
    with recurrent_backend("triton"):
        return worldmodels.GRU(3, 4)(x)


@pytest.mark.parametrize("call", [
    lambda x: worldmodels.GRU(3, 4, backend="triton")(x),
    lambda x: worldmodels.LSTM(3, 4)(x, backend="triton"),
    _triton_in_context,
], ids=["module", "call", "context"])
def test_unavailable_triton_backend_names_the_available_ones(call, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # on CPU triton runs only under the interpreter
    with pytest.raises(ValueError, match="triton") as info:
        call(torch.randn(2, 3, 3))
    for name in IMPLEMENTED_BACKENDS:
        assert repr(name) in str(info.value)


@pytest.mark.parametrize("kwargs, argument, error", [
    ({"bidirectional": True}, "bidirectional", ValueError),
    ({"batch_first": False}, "batch_first", ValueError),
    ({"dropout": 0.1}, "dropout", ValueError),
    ({"hidden_size": 0}, "hidden_size", ValueError),
    ({"num_layers": 1.5}, "num_layers", ValueError),
    ({"precision": "fp8"}, "precision", ValueError),
    ({"backend": 3}, "backend", ValueError),
])
@pytest.mark.parametrize("kind", KINDS)
def test_constructor_errors_name_the_argument(kind, kwargs, argument, error):
    arguments = {"input_size": 3, "hidden_size": 4, **kwargs}
    with pytest.raises(error, match=argument):
        KINDS[kind][0](**arguments)


@pytest.mark.parametrize("kind", KINDS)
def test_invalid_precision_argument_lists_the_valid_modes(kind):
    with pytest.raises(ValueError, match="precision") as info:
        KINDS[kind][0](3, 4, precision="fp16")
    for mode in USER_MODES:
        assert repr(mode) in str(info.value)


def test_drop_in_defaults_and_state_dict_round_trip():
    module, reference = make("gru", 3, 5, num_layers=2)
    assert module.batch_first is True
    assert [n for n, _ in module.named_parameters()] == [n for n, _ in reference.named_parameters()]
    back = nn.GRU(3, 5, 2, batch_first=True)
    back.load_state_dict(module.state_dict())
    x = torch.randn(2, 3, 3)
    torch.testing.assert_close(back(x)[0], reference(x)[0], rtol=0, atol=0)


# ------------------------------------------------------------------------------ CUDA (run on the GPU machine)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (cuDNN RNN, flat weights)")
@pytest.mark.parametrize("kind", KINDS)
def test_cudnn_on_cuda_keeps_flat_weights_and_matches_loop(kind, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # cuDNN RNNs default to TF32 on Ampere+
    module, _ = make(kind, F, H, num_layers=2)
    module = module.cuda()
    weights = module.flat_weights()
    storage = weights[0].untyped_storage().data_ptr()
    assert all(w.untyped_storage().data_ptr() == storage for w in weights)  # one flat buffer, as nn.GRU
    x = torch.randn(B, 7, F, device="cuda", requires_grad=True)
    is_init = random_resets(B, 7).cuda()
    wrt = [x, *module.parameters()]
    expected = values_and_grads(module(x, is_init=is_init, backend="loop"), wrt)
    actual = values_and_grads(module(x, is_init=is_init, backend="cudnn"), wrt)
    assert_all_close(actual, expected, rtol=1e-4, atol=1e-5)
    module.load_state_dict({k: v.clone() for k, v in module.state_dict().items()})
    assert module.flat_weights()[0].untyped_storage().data_ptr() == storage  # loading copies in place
