"""Upstream torch bugs behind `scan`, reproduced in plain torch and checked against our gates.

Each reproducer runs in a fresh process (inductor's state and our import-time fix stay out of
the rest of the suite) and reports whether torch alone gets the gradients right and whether our
workaround does. The gate in `core/torch_fixes.py` must say "needs the fix" exactly when torch
alone is wrong: the day an upgrade fixes a bug, these tests fail and name the gate to move.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from worldmodels.core import torch_fixes

HERE = Path(__file__).parent / "upstream"
ROOT = Path(__file__).resolve().parents[2]


def run(script: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(HERE / script)], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_gate(script: str, gate: str, bug: str, upstream: str, with_fix: str) -> None:
    """Run `script` in a fresh process: the gate `torch_fixes.<gate>()` must say "needs the fix" exactly
    when torch alone gets it wrong (`bug`: what torch alone does then), and the fix must still work."""
    result = run(script)
    needs_fix = getattr(torch_fixes, gate)()
    assert result["plain"] != needs_fix, (
        f"torch {torch.__version__}: {'no longer ' if result['plain'] else ''}{bug} here, but `{gate}` says "
        f"{needs_fix} ({upstream}): move the gate")
    assert result["with_fix"], with_fix


def test_inductor_scan_gradients_pytorch_153679():
    if not torch_fixes.scan_compiles_correctly():  # torch < 2.13: scan under compile is refused outright
        assert not run("scan_inductor_grads.py")["plain"], (
            f"torch {torch.__version__}: inductor scan gradients are right here, but `scan_compiles_correctly` "
            "refuses scan under compile on this version: move that gate")
        return
    check_gate("scan_inductor_grads.py", "inductor_subgraph_donation_needs_fix",
               "inductor scan gradients are wrong without our backport", "pytorch#153679 / #193960",
               "the backported fix no longer gives the loop's gradients")


def test_eager_scan_carry_gradients_pytorch_184528():
    check_gate("scan_eager_carry_grads.py", "eager_scan_needs_grad_carry",
               "eager scan gradients with a no-grad carry are wrong", "pytorch#184528 / #185332",
               "carry_requiring_grad no longer gives the loop's gradients")


def test_eager_scan_with_shapes_that_change():
    """Two widths in one process: the second recompiles scan's trace with dynamic sizes, which its
    autograd partitioner refuses (no upstream issue found; the script is the reproducer)."""
    check_gate("scan_dynamic_shapes.py", "scan_needs_static_shapes",
               "eager scan over two widths in one process fails (Invalid HopPartitionedGraph)",
               "no upstream issue found",
               "static_scan_shapes no longer lets scan run (and differentiate) a second width")


def test_module_compile_of_torch_modules_pytorch_150915():
    """Plain torch's nn.Sequential.compile() compiles nothing; `compile_module` does, whatever torch does
    (it also keeps one code object per module), so nothing switches on this: the day it fails, say in
    docs/recurrent-core.md and core/torch_fixes.py which torch fixed it."""
    result = run("module_compile_torch_modules.py")
    assert not result["plain"], (f"torch {torch.__version__}: nn.Sequential.compile() reaches its backend now "
                                 "(pytorch#150915 fixed): update the notes on it")
    assert result["with_fix"], "compile_module no longer compiles an nn.Sequential to the same output and state_dict"


def test_compile_module_gives_every_module_its_own_compiled_variants():
    """Dynamo keeps at most `cache_size_limit` (8) compiled variants per code object: twelve modules
    compiled by `compile_module` all reach the backend, none left eager by the others' variants."""
    from torch._dynamo.testing import CompileCounter

    backend = CompileCounter()
    torch._dynamo.reset()
    nets = [torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.SiLU()) for _ in range(12)]
    for net in nets:
        torch_fixes.compile_module(net, backend)
    x = torch.randn(2, 4)
    for net in nets:
        torch.testing.assert_close(net(x), net._call_impl(x))
    assert backend.frame_count == len(nets)
    torch._dynamo.reset()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (run on the H200)")
def test_failed_capture_rng_pytorch_171263():
    check_gate("failed_capture_rng.py", "failed_capture_leaves_rng_capturing",
               "a failed capture leaves the CUDA generator in capture mode", "pytorch#171263 / #176752",
               "heal_generator no longer takes the generator out of capture mode")


def test_carry_requiring_grad_keeps_the_value_and_joins_the_graph():
    w = torch.tensor([[float("inf"), 1.0]], requires_grad=True)  # no 0 * inf = nan
    carry = torch.randn(3, 2)
    out = torch_fixes.carry_requiring_grad(carry, [w])
    assert out.requires_grad and torch.equal(out, carry)
    assert torch_fixes.carry_requiring_grad(carry, [w.detach()]) is carry  # nothing to join


def test_version_gates():
    assert not torch_fixes.scan_compiles_correctly((2, 11)) and torch_fixes.scan_compiles_correctly((2, 13))
    assert torch_fixes.eager_scan_needs_grad_carry((2, 11)) and not torch_fixes.eager_scan_needs_grad_carry((2, 13))
    assert torch_fixes.inductor_subgraph_donation_needs_fix((2, 13))
    assert not torch_fixes.inductor_subgraph_donation_needs_fix((2, 11))  # there scan under compile is refused
    assert torch_fixes.failed_capture_leaves_rng_capturing((2, 11))
    assert not torch_fixes.failed_capture_leaves_rng_capturing((2, 12))
    assert torch_fixes.scan_needs_static_shapes((2, 13))


def _plain_rms_norm_mixed(device: str):
    """(warned that it cannot fuse, the output's grad_fn name) for plain torch's rms_norm of a
    bf16 input with an fp32 weight."""
    import warnings

    x = torch.randn(64, 32, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(32, device=device, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.nn.functional.rms_norm(x, (32,), w, 1e-4)
    return any("Cannot dispatch to fused" in str(c.message) for c in caught), type(out.grad_fn).__name__


def test_rms_norm_mixed_dtypes_pytorch_167308(every_torch_warning):
    warned, _ = _plain_rms_norm_mixed("cpu")
    assert warned != torch_fixes.rms_norm_fuses_mixed_dtypes(), (
        f"torch {torch.__version__}: rms_norm of a bf16 input with an fp32 weight "
        f"{'still warns that it cannot fuse' if warned else 'no longer warns'}, but "
        "`rms_norm_fuses_mixed_dtypes` says the opposite (pytorch#167308 / #195638): move the gate")


def test_rssm_reference_prior_head_keeps_the_norms_cast_under_autocast(every_torch_warning):
    """The RSSM ops' reference layers, which `loop` and `cudnn` run and the triton backend runs for
    observe's prior head over all steps, cast the norm's weight as `models/layers.RMSNorm` does: no
    unfused fallback under bf16 autocast (it warned in every DreamerV3 update on the H200), the
    module's values, an fp32 weight gradient."""
    import warnings

    import worldmodels as wm
    from worldmodels.ops.rssm import reference

    torch.manual_seed(0)
    rssm = wm.RSSM(3, 16, deter=24, stoch=5, hidden=20, classes=3, cell="block_gru", blocks=4, norm="rms", act="silu")
    spec, weights = rssm.op_spec(), rssm.op_weights()
    deter = torch.randn(6, 24)
    noise = rssm.noise((6,), generator=torch.Generator().manual_seed(1))["prior"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "Cannot dispatch to fused implementation"
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = reference.prior(spec, weights, deter, noise)["logits"]
            hidden = reference.linear(weights, "prior", deter)
            want = torch.nn.functional.silu(rssm_norm(hidden, weights["prior.norm_w"]))
            assert torch.equal(reference.dense(spec, weights, "prior", deter), want)
    assert got.dtype == torch.bfloat16
    (grad,) = torch.autograd.grad(got.float().sum(), weights["prior.norm_w"])
    assert grad.dtype == torch.float32 and grad.abs().sum() > 0


def rssm_norm(x, weight):
    from worldmodels.models.layers import RMSNorm

    norm = RMSNorm(x.shape[-1])
    norm.weight = torch.nn.Parameter(weight)
    return norm(x)


@pytest.mark.skipif(os.environ.get("WORLDMODELS_TEST_DEVICE", "cpu") != "cuda",
                    reason="the fused rms_norm kernel is CUDA's: set WORLDMODELS_TEST_DEVICE=cuda on a GPU machine")
def test_rms_norm_mixed_dtypes_fuse_on_cuda_only_with_our_cast():
    from worldmodels.models.layers import RMSNorm

    _, plain = _plain_rms_norm_mixed("cuda")
    assert ("Fused" in plain) == torch_fixes.rms_norm_fuses_mixed_dtypes(), (
        f"torch {torch.__version__}: plain rms_norm with mixed dtypes gives {plain}: move the gate")
    norm = RMSNorm(32).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = norm(torch.nn.Linear(16, 32).cuda()(torch.randn(8, 16, device="cuda")))
    assert out.dtype == torch.bfloat16 and "Fused" in type(out.grad_fn).__name__, type(out.grad_fn).__name__
