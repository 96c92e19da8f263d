"""pytorch#171263 in plain torch (CUDA only): a capture invalidated by an illegal call (a host sync
inside it) fails at its end; afterwards, can the CUDA generator still draw? Prints one JSON line:
whether plain torch can ("plain"), and whether it can after `core/cuda_graphs.heal_generator`
("with_fix"), each in a fresh failed capture."""

import json

import torch


def fail_a_capture() -> None:
    x = torch.zeros(4, device="cuda")
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    try:
        with torch.cuda.graph(graph, stream=stream):
            torch.rand(4, device="cuda")  # the generator registers and enters capture mode
            x.sum().item()  # a host sync: illegal during capture, the capture is invalidated
    except Exception:
        pass


def draws() -> bool:
    try:
        torch.rand(4, device="cuda")
        torch.cuda.synchronize()
        return True
    except Exception:
        return False


fail_a_capture()
plain = draws()
fail_a_capture()
from worldmodels.core.cuda_graphs import heal_generator  # noqa: E402

heal_generator(torch.device("cuda", torch.cuda.current_device()))
print(json.dumps({"plain": plain, "with_fix": draws()}))
