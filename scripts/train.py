"""Placeholder main job until the trainer lands: a short demo of the recurrent core."""

import time

import torch

import worldmodels as wm

if __name__ == "__main__":
    torch.manual_seed(0)
    gru = wm.GRU(16, 32, num_layers=2)
    x = torch.randn(4, 20, 16)
    is_init = torch.rand(4, 20) < 0.1
    ref, _ = gru(x, is_init=is_init, backend="loop")
    for backend in ("loop", "scan", "cudnn"):
        start = time.perf_counter()
        y, _ = gru(x, is_init=is_init, backend=backend)
        print(f"{backend:6s} max |y - loop| = {(y - ref).abs().max():.2e}  ({time.perf_counter() - start:.3f} s)")
