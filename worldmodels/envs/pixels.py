"""`PixelsCHW`: HWC uint8 frames of any size -> CHW uint8 at size x size, in torch only
(torchrl's `Resize` needs torchvision, which does not import beside the CPU torch wheel)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from torchrl.data import Bounded
from torchrl.envs.transforms import ObservationTransform
from torchrl.envs.transforms.utils import _set_missing_tolerance


class PixelsCHW(ObservationTransform):
    """[..., H, W, 3] uint8 -> [..., 3, size, size] uint8 (area-averaged when shrinking)."""

    def __init__(self, size: int = 64, in_key: str = "pixels", out_key: str = "pixels"):
        super().__init__(in_keys=[in_key], out_keys=[out_key])
        self.size = size

    def _apply_transform(self, frame: torch.Tensor) -> torch.Tensor:
        chw = frame.movedim(-1, -3)
        if chw.shape[-2:] == (self.size, self.size):
            return chw.contiguous()
        batch = chw.shape[:-3]
        flat = chw.reshape(-1, *chw.shape[-3:]).float()
        mode = "area" if min(flat.shape[-2:]) >= self.size else "bilinear"
        small = F.interpolate(flat, size=(self.size, self.size), mode=mode)
        return small.round().clamp(0, 255).to(torch.uint8).reshape(*batch, 3, self.size, self.size)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        with _set_missing_tolerance(self, True):
            return self._call(tensordict_reset)

    def transform_observation_spec(self, observation_spec):
        in_key, out_key = self.in_keys[0], self.out_keys[0]
        spec = observation_spec[in_key]
        shape = (*spec.shape[:-3], 3, self.size, self.size)
        if in_key != out_key:
            del observation_spec[in_key]
        observation_spec[out_key] = Bounded(0, 255, shape=shape, dtype=torch.uint8, device=spec.device)
        return observation_spec
