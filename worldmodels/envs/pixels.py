"""`PixelsCHW`: uint8 images of any size -> CHW uint8 at size x size, in torch only
(torchrl's `Resize` needs torchvision, which does not import beside the CPU torch wheel).

Input frames are HWC (`[..., H, W, C]`, what gymnasium and torchrl's `from_pixels` return) or
already CHW (`[..., C, H, W]`), with C = 1 (grayscale) or 3 (RGB); `image_layout` tells which.
Output: `[..., C', size, size]` uint8, C' = 1 with `grayscale=True` (ITU-R 601 luma), else C.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from torchrl.data import Bounded
from torchrl.envs.transforms import ObservationTransform
from torchrl.envs.transforms.utils import _set_missing_tolerance

LAYOUTS = ("hwc", "chw")
_LUMA = (0.299, 0.587, 0.114)


def image_layout(shape, dtype) -> str | None:
    """"hwc" or "chw" for a uint8 image of per-env `shape` with 1 or 3 channels, else None."""
    if dtype != torch.uint8 or len(shape) != 3:
        return None
    if shape[-1] in (1, 3):
        return "hwc"
    if shape[0] in (1, 3):
        return "chw"
    return None


class PixelsCHW(ObservationTransform):
    """uint8 [..., H, W, C] (or [..., C, H, W]) -> [..., C', size, size] uint8, area-averaged
    when shrinking, bilinear when growing.

    Args:
        size: output height and width.
        in_key: the image key read.
        out_key: the key written (the input key is removed when they differ).
        layout: "hwc" (default) or "chw", the layout of the input frames.
        grayscale: convert RGB to one luma channel (after resizing).
    """

    def __init__(self, size: int = 64, in_key="pixels", out_key="pixels", *, layout: str = "hwc",
                 grayscale: bool = False):
        if layout not in LAYOUTS:
            raise ValueError(f"layout={layout!r} is not valid; expected one of {list(LAYOUTS)}")
        super().__init__(in_keys=[in_key], out_keys=[out_key])
        self.size, self.layout, self.grayscale = size, layout, grayscale

    def _apply_transform(self, frame: torch.Tensor) -> torch.Tensor:
        chw = frame.movedim(-1, -3) if self.layout == "hwc" else frame
        if chw.shape[-2:] == (self.size, self.size) and not self.grayscale:
            return chw.contiguous()
        batch, channels = chw.shape[:-3], chw.shape[-3]
        flat = chw.reshape(-1, *chw.shape[-3:]).float()
        if flat.shape[-2:] != (self.size, self.size):
            mode = "area" if min(flat.shape[-2:]) >= self.size else "bilinear"
            flat = F.interpolate(flat, size=(self.size, self.size), mode=mode)
        if self.grayscale and channels == 3:
            flat = (flat * flat.new_tensor(_LUMA)[:, None, None]).sum(-3, keepdim=True)
            channels = 1
        return flat.round().clamp(0, 255).to(torch.uint8).reshape(*batch, channels, self.size, self.size)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        with _set_missing_tolerance(self, True):
            return self._call(tensordict_reset)

    def transform_observation_spec(self, observation_spec):
        in_key, out_key = self.in_keys[0], self.out_keys[0]
        spec = observation_spec[in_key]
        channels = 1 if self.grayscale else spec.shape[-1 if self.layout == "hwc" else -3]
        shape = (*spec.shape[:-3], channels, self.size, self.size)
        if in_key != out_key:
            del observation_spec[in_key]
        observation_spec[out_key] = Bounded(0, 255, shape=shape, dtype=torch.uint8, device=spec.device)
        return observation_spec
