"""Frames rendered again from the simulator state they were rendered from: what lets a pixel replay be
saved without its frames (`replay.save_frames=false`: 12x smaller for cheetah_run at 64 x 64, 23x for
walker_walk).

A pixel env whose frames are a function of its simulator state (dm_control: the MuJoCo physics state,
`physics.get_state()`, 18 float64 for cheetah_run against 12 KB of frame) adds that state to every
step it returns under `RENDER_STATE`: int64 [S], the float64 state's bits, so that torchrl's
`DoubleToFloat` leaves it exact and no model takes it for an observation (observations are float
vectors and uint8 images). The collector stores it with the step; the replay leaves it out of sampled
batches. `frame_checksums` gives the CRC-32 of each frame, which a frameless save keeps so that a
resume can tell whether the frames it renders again are the ones the run saw.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

RENDER_STATE = "render_state"


def state_bits(state: np.ndarray) -> np.ndarray:
    """float64 [..., S] -> int64 [..., S], the same bits."""
    return np.ascontiguousarray(state, dtype=np.float64).view(np.int64)


def state_values(bits: torch.Tensor | np.ndarray) -> np.ndarray:
    """int64 [..., S] (`state_bits`) -> the float64 states [..., S]."""
    bits = bits.cpu().numpy() if isinstance(bits, torch.Tensor) else np.asarray(bits)
    return np.ascontiguousarray(bits, dtype=np.int64).view(np.float64)


def frame_checksums(frames: torch.Tensor) -> torch.Tensor:
    """uint8 [n, ...] -> int64 [n]: the CRC-32 of each frame's bytes."""
    rows = frames.cpu().contiguous().reshape(frames.shape[0], -1).numpy()
    return torch.tensor([zlib.crc32(row) for row in rows], dtype=torch.long)


__all__ = ["RENDER_STATE", "frame_checksums", "state_bits", "state_values"]
