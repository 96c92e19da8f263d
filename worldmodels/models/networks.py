"""Encoders, decoders and prediction heads around the RSSM.

Every head maps features [..., F] to a distribution-like object with `.mean` and
`.log_prob(target)`, so losses read the same for every output type:
- `TwoHot`: DreamerV3's symexp two-hot over 255 bins spaced evenly in symlog space (reward, critic).
- `torch.distributions.Bernoulli`: the continue flag.
- `UnitNormal`: a Gaussian with unit variance (PlaNet/V1 reward and value, i.e. MSE regression).

Observations are either vectors [..., O] (float) or 64x64 RGB images [..., 3, 64, 64] (uint8).
"""

from __future__ import annotations

import torch
from torch import nn

from worldmodels.models.layers import activation, mlp, norm_layer


def symlog(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.log1p(x.abs())


def symexp(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.expm1(x.abs())


class TwoHot:
    """Categorical over `bins` (symlog space); mean = symexp(E[bin]), targets two-hot encoded."""

    def __init__(self, logits: torch.Tensor, bins: torch.Tensor):
        self.logits, self.bins = logits, bins  # logits [..., K], bins [K]

    @property
    def mean(self) -> torch.Tensor:
        return symexp((torch.softmax(self.logits, -1) * self.bins).sum(-1))

    def log_prob(self, target: torch.Tensor) -> torch.Tensor:
        """log p(target) under the two-hot encoding of symlog(target); target [...]."""
        x = symlog(target).clamp(self.bins[0], self.bins[-1])
        above = torch.searchsorted(self.bins, x.detach().unsqueeze(-1)).squeeze(-1).clamp(1, len(self.bins) - 1)
        below = above - 1
        low, high = self.bins[below], self.bins[above]
        w_above = ((x - low) / (high - low)).clamp(0, 1)
        logp = torch.log_softmax(self.logits, -1)
        take = lambda index: logp.gather(-1, index.unsqueeze(-1)).squeeze(-1)  # noqa: E731
        return (1 - w_above) * take(below) + w_above * take(above)


class UnitNormal(torch.distributions.Normal):
    """Normal(mean, 1): log_prob is -MSE/2 up to a constant."""

    def __init__(self, mean: torch.Tensor):
        super().__init__(mean, torch.ones_like(mean), validate_args=False)


class Head(nn.Module):
    """features [..., F] -> a distribution over a scalar target [...].

    `output`: "twohot" (255 symlog bins, zero-initialised output layer as in DreamerV3),
    "binary" (Bernoulli logits) or "normal" (unit-variance Gaussian)."""

    OUTPUTS = ("twohot", "binary", "normal")

    def __init__(self, in_dim: int, *, output: str, units: int, layers: int, norm: str = "none",
                 act: str = "elu", bins: int = 255):
        super().__init__()
        if output not in self.OUTPUTS:
            raise ValueError(f"output={output!r} is not valid; expected one of {list(self.OUTPUTS)}")
        self.output = output
        self.net = mlp(in_dim, bins if output == "twohot" else 1, units, layers, norm, act)
        if output == "twohot":
            nn.init.zeros_(self.net[-1].weight)
            nn.init.zeros_(self.net[-1].bias)
            self.register_buffer("bins", torch.linspace(-20.0, 20.0, bins), persistent=False)

    def forward(self, features: torch.Tensor):
        out = self.net(features)
        if self.output == "twohot":
            return TwoHot(out, self.bins)
        if self.output == "binary":
            return torch.distributions.Bernoulli(logits=out.squeeze(-1), validate_args=False)
        return UnitNormal(out.squeeze(-1))


class VectorEncoder(nn.Module):
    """obs [..., O] -> embed [..., units]; symlog squashes inputs of any scale (DreamerV3)."""

    def __init__(self, obs_dim: int, *, units: int, layers: int, norm: str, act: str, symlog_inputs: bool):
        super().__init__()
        self.symlog_inputs = symlog_inputs
        self.net = mlp(obs_dim, None, units, layers, norm, act)
        self.embed_dim = units

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(symlog(obs) if self.symlog_inputs else obs)


class VectorDecoder(nn.Module):
    """features [..., F] -> predicted obs; `log_prob(features, obs)` [...] is the unit-Gaussian
    log-likelihood (in symlog space when `symlog_inputs`), summed over the obs dims."""

    def __init__(self, feat_dim: int, obs_dim: int, *, units: int, layers: int, norm: str, act: str,
                 symlog_inputs: bool):
        super().__init__()
        self.symlog_inputs = symlog_inputs
        self.net = mlp(feat_dim, obs_dim, units, layers, norm, act)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        out = self.net(features)
        return symexp(out) if self.symlog_inputs else out

    def log_prob(self, features: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        target = symlog(obs) if self.symlog_inputs else obs
        return -0.5 * (self.net(features) - target).pow(2).sum(-1)


def pixels_to_float(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 3, 64, 64] -> float in [-0.5, 0.5]."""
    return pixels.float() / 255.0 - 0.5


def float_to_pixels(image: torch.Tensor) -> torch.Tensor:
    return ((image + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)


class ChannelNorm(nn.Module):
    """A feature norm over the channel dim of [N, C, H, W] maps."""

    def __init__(self, norm: str, channels: int):
        super().__init__()
        self.norm = norm_layer(norm, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _flat_batch(x: torch.Tensor, event_dims: int) -> tuple[torch.Tensor, torch.Size]:
    batch = x.shape[: x.dim() - event_dims]
    return x.reshape(-1, *x.shape[x.dim() - event_dims:]), batch


class PixelEncoder(nn.Module):
    """uint8 [..., 3, 64, 64] -> embed [..., 8 * depth * 4 * 4]: four stride-2 convs (64 -> 4)."""

    def __init__(self, *, depth: int, norm: str, act: str, size: int = 64):
        super().__init__()
        if size != 64:
            raise ValueError(f"size={size!r} is not supported; pixel encoders read 64x64 images")
        layers: list[nn.Module] = []
        channels = 3
        for mult in (1, 2, 4, 8):
            layers += [nn.Conv2d(channels, depth * mult, 4, 2, 1, bias=norm == "none"),
                       ChannelNorm(norm, depth * mult), activation(act)]
            channels = depth * mult
        self.net = nn.Sequential(*layers)
        self.embed_dim = channels * 4 * 4

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x, batch = _flat_batch(pixels_to_float(pixels), 3)
        return self.net(x).reshape(*batch, self.embed_dim)


class PixelDecoder(nn.Module):
    """features [..., F] -> image mean [..., 3, 64, 64] in [-0.5, 0.5] units (4 -> 64)."""

    def __init__(self, feat_dim: int, *, depth: int, norm: str, act: str):
        super().__init__()
        self.depth = depth
        self.project = nn.Linear(feat_dim, 8 * depth * 4 * 4)
        layers: list[nn.Module] = []
        channels = 8 * depth
        for mult in (4, 2, 1):
            layers += [nn.ConvTranspose2d(channels, depth * mult, 4, 2, 1, bias=norm == "none"),
                       ChannelNorm(norm, depth * mult), activation(act)]
            channels = depth * mult
        layers.append(nn.ConvTranspose2d(channels, 3, 4, 2, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x, batch = _flat_batch(features, 1)
        x = self.project(x).reshape(-1, 8 * self.depth, 4, 4)
        return self.net(x).reshape(*batch, 3, 64, 64)

    def log_prob(self, features: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        """Unit-Gaussian log-likelihood of the image, summed over pixels -> [...]."""
        return -0.5 * (self(features) - pixels_to_float(pixels)).pow(2).sum((-3, -2, -1))


def make_encoder(obs_shape: tuple[int, ...], cfg) -> nn.Module:
    """The encoder for an observation of `obs_shape`: (O,) vectors or (3, 64, 64) images."""
    if len(obs_shape) == 3:
        return PixelEncoder(depth=cfg.depth, norm=cfg.norm, act=cfg.act)
    return VectorEncoder(obs_shape[0], units=cfg.units, layers=cfg.encoder_layers, norm=cfg.norm,
                         act=cfg.act, symlog_inputs=cfg.symlog_inputs)


def make_decoder(obs_shape: tuple[int, ...], feat_dim: int, cfg) -> nn.Module:
    if len(obs_shape) == 3:
        return PixelDecoder(feat_dim, depth=cfg.depth, norm=cfg.norm, act=cfg.act)
    return VectorDecoder(feat_dim, obs_shape[0], units=cfg.units, layers=cfg.encoder_layers,
                         norm=cfg.norm, act=cfg.act, symlog_inputs=cfg.symlog_inputs)


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


__all__ = [
    "Head", "PixelDecoder", "PixelEncoder", "TwoHot", "UnitNormal", "VectorDecoder", "VectorEncoder",
    "count_parameters", "float_to_pixels", "make_decoder", "make_encoder", "pixels_to_float", "symexp",
    "symlog",
]
