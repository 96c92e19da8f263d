"""pytorch#184528 in plain torch: eager scan, a weight closed over by the body, an initial carry
that does not require grad (fixed by pytorch#185332 in 2.13). Prints one JSON line: whether the
weight's gradient matches the Python loop, without and with `carry_requiring_grad`."""

import json

import torch
from torch._higher_order_ops.scan import scan


def weight_gradient_matches(make_carry) -> bool:
    torch.manual_seed(0)
    w = torch.randn(4, 4, requires_grad=True)
    xs = torch.randn(5, 2, 4)

    def body(h, x):
        new = torch.tanh(x + h @ w)
        return new.clone(), new.clone()

    h = torch.zeros(2, 4)
    ys = []
    for t in range(5):
        h, y = body(h, xs[t])
        ys.append(y)
    (expected,) = torch.autograd.grad(torch.stack(ys).square().sum(), [w])
    _, ys = scan(body, make_carry(torch.zeros(2, 4), w), xs)
    (got,) = torch.autograd.grad(ys.square().sum(), [w])
    return torch.allclose(got, expected, atol=1e-5)


if __name__ == "__main__":
    from worldmodels.core.torch_fixes import carry_requiring_grad

    print(json.dumps({"plain": weight_gradient_matches(lambda carry, w: carry),
                      "with_fix": weight_gradient_matches(lambda carry, w: carry_requiring_grad(carry, [w]))}))
