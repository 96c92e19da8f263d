"""Videos of a run, as uint8 frames [T, C, H, W] (C = 1 or 3) that `Logger.video` saves as GIFs
and sends to the logger backend:
- `openloop_frames`: real frames vs. the model's (a few filtered context frames, then
  imagination on the real actions), and their difference;
- `EpisodeFrames`: the frames of one eval env's episode (a policy video), gathered through
  `evaluate`'s `on_step`;
- `image_key`: which observation key of an env holds images (None: nothing to film).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tensordict import TensorDict

from worldmodels.models.networks import float_to_pixels


@torch.no_grad()
def openloop_frames(world_model, batch: TensorDict, context: int = 5, count: int = 4) -> torch.Tensor:
    """batch [B, T] of pixel steps -> uint8 frames [T, 3, 3*64, n*64] (rows: real, model, error)."""
    rssm, steps = world_model.rssm, batch.shape[1]
    if not 0 < context < steps:
        raise ValueError(f"context={context} must be in [1, {steps - 1}] for sequences of length {steps}")
    batch = batch[:count]
    obs, action = batch["obs"], batch["action"]
    post, _ = rssm.observe(world_model.encoder(obs[:, :context]), action[:, :context], batch["is_first"][:, :context])
    traj = rssm.imagine(post[:, -1].select("deter", "stoch"), steps - context, actions=action[:, context:])
    feat = torch.cat([rssm.features(post), rssm.features(traj)], 1)  # [n, T, F]
    model = float_to_pixels(world_model.decoder(feat))  # [n, T, 3, 64, 64]
    error = ((model.float() - obs.float()) / 2 + 127.5).round().to(torch.uint8)
    rows = torch.cat([obs, model, error], dim=-2)  # [n, T, 3, 192, 64]
    return torch.cat(list(rows), dim=-1)  # [T, 3, 192, n*64]


def save_gif(frames: torch.Tensor, path: Path, fps: int = 10) -> Path:
    """uint8 frames [T, C, H, W] (C = 1 or 3) -> an animated GIF at `path`, each frame shown 1 / fps s
    (Pillow stores identical consecutive frames once, with their durations summed).

    Colour frames get a palette of their own from Pillow's fast octree quantizer: its default, median
    cut, is about ten times slower, and the training loop waits for the eval videos."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    images = frames.permute(0, 2, 3, 1).cpu().numpy()  # [T, H, W, C]
    if images.shape[-1] == 1:  # grayscale: GIF's 8-bit palette holds every level
        pictures = [Image.fromarray(image[..., 0]) for image in images]
    else:
        pictures = [Image.fromarray(image).quantize(method=Image.Quantize.FASTOCTREE) for image in images]
    pictures[0].save(path, save_all=True, append_images=pictures[1:], duration=round(1000 / fps), loop=0)
    return path


def image_key(info: dict):
    """The first observation key of an env (`env_info`) whose observations are images [C, H, W]; None if none is."""
    keys, shapes = info["obs_key"], info["obs_shape"]
    if not isinstance(keys, list):
        return keys if len(shapes) == 3 else None
    return next((key for key in keys if len(shapes[key]) == 3), None)


class EpisodeFrames:
    """An `on_step(td, running)` callback for `evaluate` that keeps the frames of env `index`'s
    episode; `frames()` stacks them to uint8 [T, C, H, W].

    Args:
        key: the image observation key (`image_key`).
        index: which of the eval envs to film.
    """

    def __init__(self, key, index: int = 0):
        self.key, self.index = key, index
        self._frames: list[torch.Tensor] = []

    def __call__(self, td: TensorDict, running: torch.Tensor) -> None:
        if running[self.index]:
            self._frames.append(td[self.key][self.index].cpu())

    def frames(self) -> torch.Tensor:
        if not self._frames:
            raise ValueError("no frames were recorded: pass this object to evaluate(..., on_step=...) first")
        return torch.stack(self._frames)
