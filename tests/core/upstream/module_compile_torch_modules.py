"""`module.compile()` on a module whose `forward` is torch's own (`nn.Sequential` of torch layers), in
plain torch: does the backend ever see a graph? Prints one JSON line: "plain" (it does, with
`module.compile()`), "with_fix" (it does through `torch_fixes.compile_module`, and the output and
state_dict keys are those of the eager module).

pytorch#150915: `module.compile()` installs `torch.compile(module._call_impl)`; both `_call_impl` and
`Sequential.forward` live in files Dynamo skips, so no frame is traced and the module runs eager.
"""

import json

import torch
from torch import nn

from worldmodels.core.torch_fixes import compile_module


def graphs_seen(compile_with) -> tuple[int, bool, bool]:
    """(graphs the backend received, output equal to eager, state_dict keys unchanged)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.SiLU(), nn.Linear(16, 4))
    x = torch.randn(3, 8)
    want, keys = net(x), list(net.state_dict())
    torch._dynamo.reset()
    compile_with(net, backend)
    got = net(x)
    return len(graphs), torch.equal(got, want), list(net.state_dict()) == keys


plain, _, _ = graphs_seen(lambda net, backend: net.compile(backend=backend))
fixed, same, keys = graphs_seen(compile_module)
print(json.dumps({"plain": plain > 0, "with_fix": fixed > 0 and same and keys}))
