"""pytorch#153679 in plain torch: two chained scans under inductor give wrong gradients for the
weights the bodies close over (fixed upstream by pytorch#193960). Prints one JSON line: which
gradients match the Python loop, without and then with our backport (core/torch_fixes.py)."""

import json

import torch
from torch._higher_order_ops.scan import scan

T, B, D = 6, 2, 4


def layer(xs, gain, bias, use_scan):
    def body(h, x):
        new = torch.tanh(gain * h + x) + bias
        return new.clone(), new.clone()

    h0 = torch.zeros(B, D)
    if use_scan:
        return scan(body, h0, xs)[1]
    ys, h = [], h0
    for t in range(T):
        h, y = body(h, xs[t])
        ys.append(y)
    return torch.stack(ys)


def loss(params, xs, use_scan):
    ys = layer(xs, params["a_gain"], params["a_bias"], use_scan)
    return layer(ys, params["b_gain"], params["b_bias"], use_scan).square().sum()


def gradients_match() -> bool:
    torch.manual_seed(0)
    params = {n: torch.randn(D, requires_grad=True) for n in ("a_gain", "a_bias", "b_gain", "b_bias")}
    xs = torch.randn(T, B, D)
    expected = torch.autograd.grad(loss(params, xs, False), list(params.values()))
    compiled = torch.compile(lambda p: loss(p, xs, True), fullgraph=True)
    got = torch.autograd.grad(compiled(params), list(params.values()))
    return all(torch.allclose(g, e, atol=1e-5) for g, e in zip(got, expected))


if __name__ == "__main__":
    plain = gradients_match()
    from worldmodels.core import torch_fixes

    torch._dynamo.reset()
    torch_fixes.apply()
    print(json.dumps({"plain": plain, "with_fix": gradients_match()}))
