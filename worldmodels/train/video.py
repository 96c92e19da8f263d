"""Open-loop prediction videos: real frames vs. the model's (a few filtered context frames,
then imagination on the real actions), and their difference, saved as GIFs."""

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
    """uint8 frames [T, 3, H, W] -> an animated GIF at `path`."""
    import imageio.v3 as iio

    path.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(path, frames.permute(0, 2, 3, 1).cpu().numpy(), duration=1000 / fps, loop=0)
    return path
