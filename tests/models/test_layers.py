"""RMSNorm is torch.nn.RMSNorm: the same numbers as the formula it replaced, and the same
state_dict key (`scale`) as before, so checkpoints written before the switch still load."""

from __future__ import annotations

import torch
from torch import nn

from worldmodels.models.layers import RMSNorm, dense


def rmsnorm_formula(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """The hand-written RMSNorm this project used before torch's."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * scale


def test_rmsnorm_is_torch_and_matches_the_formula_values_and_gradients():
    torch.manual_seed(0)
    norm = RMSNorm(16)
    assert isinstance(norm, nn.RMSNorm) and norm.eps == 1e-4
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16))
    x = (torch.randn(4, 5, 16) * 3).requires_grad_()
    out, want = norm(x), rmsnorm_formula(x, norm.weight, 1e-4)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    g = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, (x, norm.weight), g),
                               torch.autograd.grad(want, (x, norm.weight), g), rtol=1e-5, atol=1e-5)


def test_rmsnorm_state_dict_keeps_the_scale_key_and_loads_both_names():
    block = dense(8, 6, norm="rms", act="silu")  # Linear, RMSNorm, SiLU
    assert list(block.state_dict()) == ["0.weight", "1.scale"]
    scale = torch.linspace(0.5, 2.0, 6)
    block.load_state_dict({"0.weight": torch.ones(6, 8), "1.scale": scale})  # a checkpoint from before
    assert torch.equal(block[1].weight.detach(), scale)
    block.load_state_dict({"0.weight": torch.ones(6, 8), "1.weight": 2 * scale})  # torch's name
    assert torch.equal(block[1].weight.detach(), 2 * scale)
    copy = dense(8, 6, norm="rms", act="silu")
    copy.load_state_dict(block.state_dict())  # round trip, strict
    x = torch.randn(3, 8)
    assert torch.equal(copy(x), block(x))


def test_rmsnorm_in_mixed_precision_runs_in_the_input_dtype_without_the_unfused_fallback(every_torch_warning):
    """Under bf16 autocast a norm after a Linear sees a bf16 input and its fp32 weight: it runs in
    bf16 on a cast of the weight (torch would fall back to its unfused path, pytorch#167308), with
    the fp32 formula's values to bf16 rounding and an fp32 weight gradient."""
    import warnings

    torch.manual_seed(0)
    linear, norm = nn.Linear(8, 16), RMSNorm(16)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(16) + 0.5)
    x = torch.randn(32, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "Cannot dispatch to fused implementation"
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = linear(x)
            out = norm(h)
    assert h.dtype == out.dtype == torch.bfloat16
    want = rmsnorm_formula(h.float(), norm.weight, 1e-4)
    torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=2e-2)
    g = torch.randn(32, 16)
    (grad,) = torch.autograd.grad(out.float(), norm.weight, g)
    (want_grad,) = torch.autograd.grad(want, norm.weight, g)
    assert grad.dtype == torch.float32
    torch.testing.assert_close(grad, want_grad, rtol=3e-2, atol=3e-2)


def test_channel_norm_normalises_each_pixel_over_its_channels_in_the_input_dtype():
    """The pixel nets' written-out RMS norm: the row formula over C at every pixel, float64 kept
    float64 (no silent fp32 round trip), bf16 computed in fp32 and returned in bf16."""
    from worldmodels.models.networks import ChannelNorm

    torch.manual_seed(0)
    norm = ChannelNorm("rms", 6).double()
    with torch.no_grad():
        norm.norm.weight.copy_(torch.rand(6) + 0.5)
    x = torch.randn(2, 6, 5, 3, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    want = rmsnorm_formula(x.permute(0, 2, 3, 1), norm.norm.weight, 1e-4).permute(0, 3, 1, 2)
    out = norm(x)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    half = ChannelNorm("rms", 6)
    out16 = half(x.float().bfloat16())
    assert out16.dtype == torch.bfloat16
    torch.testing.assert_close(out16.float(), rmsnorm_formula(x.float().bfloat16().float().permute(0, 2, 3, 1),
                                                              half.norm.weight, 1e-4).permute(0, 3, 1, 2),
                               rtol=1e-2, atol=1e-2)
