"""GRU rows: `worldmodels.GRU` on each of our backends next to `torch.nn.GRU` (same weights).

Our rows: by default every registered backend that implements the "rnn" op and runs on the device
(`registry.available_backends`), `loop` first as the reference.

Full shape: B=256, T=64, input = hidden = 256, one layer, fp32, no resets (so nn.GRU computes the
same function and its first call is checked against our `loop` backend like ours are).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

import worldmodels as wm
from benchmarks.autodiff import Cotangents, forward_backward, forward_only
from benchmarks.runner import Candidate, Group, our_backends, require_backend


@dataclass(frozen=True)
class GRUShape:
    batch: int
    steps: int
    input: int
    hidden: int

    @property
    def label(self) -> str:
        return f"GRU B={self.batch} T={self.steps} H={self.hidden}"


FULL = GRUShape(batch=256, steps=64, input=256, hidden=256)
SMALL = GRUShape(batch=16, steps=16, input=32, hidden=32)


def groups(shape: GRUShape, device: torch.device, backends: Sequence[str] | None = None) -> list[Group]:
    """`backends`: ours to time (None: every one available for the "rnn" op on `device`)."""
    def setup() -> dict:
        gen = torch.Generator(device="cpu").manual_seed(0)
        torch.manual_seed(0)
        gru = wm.GRU(shape.input, shape.hidden).to(device)
        x = torch.randn(shape.batch, shape.steps, shape.input, generator=gen).to(device).requires_grad_()
        h0 = torch.randn(1, shape.batch, shape.hidden, generator=gen).to(device).requires_grad_()
        return {"gru": gru, "x": x, "h0": h0, "cot": Cotangents()}

    def inputs(s: dict) -> dict:
        return {"x": s["x"], "h0": s["h0"], **dict(s["gru"].named_parameters())}

    def call(module_forward, s: dict, mode: str, params: dict):
        if mode == "fwd":
            return forward_only(module_forward)
        return forward_backward(module_forward, {"x": s["x"], "h0": s["h0"], **params}, s["cot"])

    def ours(backend: str, mode: str) -> Candidate:
        def build(s: dict):
            require_backend(backend, device, "rnn")
            gru = s["gru"]
            return call(lambda: gru(s["x"], s["h0"], backend=backend), s, mode, dict(gru.named_parameters()))
        return Candidate(f"ours:{backend}", build, settings="worldmodels.GRU, fp32")

    def torch_gru(mode: str) -> Candidate:
        def build(s: dict):
            ref = torch.nn.GRU(shape.input, shape.hidden, batch_first=True).to(device)
            ref.load_state_dict(s["gru"].state_dict())
            return call(lambda: ref(s["x"], s["h0"]), s, mode, dict(ref.named_parameters()))
        vendor = "cuDNN" if device.type == "cuda" else "native CPU kernel"
        return Candidate("torch.nn.GRU", build, kind="peer", settings=f"{vendor}, same weights, fp32")

    return [Group("gru", shape.label, mode, setup, inputs,
                  [ours(b, mode) for b in our_backends(["rnn"], device, backends)] + [torch_gru(mode)],
                  work={"steps": shape.batch * shape.steps})
            for mode in ("fwd", "fwd+bwd")]
