"""Encoders, decoders and prediction heads around the RSSM.

Every head maps features [..., F] to a distribution-like object with `.mean` and
`.log_prob(target)`, so losses read the same for every output type; `Head.predict(features)` is
that mean [...], the values a user reads (reward, return, P(continue)):
- `TwoHot`: DreamerV3's two-hot over 255 bins (reward, critic), spaced evenly in symlog space (the
  paper's: targets encoded as symlog(x), mean symexp(E[bin])) or symexp-spaced (danijar/dreamerv3's
  code, `symexp_twohot`, which made the published scores: targets encoded as they are between the
  two nearest bins, mean E[bin]). The two differ once the prediction is spread: symexp(E[symlog])
  sits below E[x] for positive targets (Jensen), so uncertain large rewards and values read low.
- `torch.distributions.Bernoulli`: the continue flag.
- `UnitNormal`: a Gaussian with unit variance (PlaNet/V1 reward and value, i.e. MSE regression).

Observations (`make_encoder` / `make_decoder` build for an `obs_shape`):
- one vector [..., O] (float): `VectorEncoder` / `VectorDecoder` (MLP, symlog inputs);
- one image [..., C, 64, 64] (uint8, C = 3 RGB or 1 grayscale): `PixelEncoder` / `PixelDecoder` (CNN);
- several keys (`obs_shape` a dict key -> shape; observations a TensorDict [...] of them), as in
  danijar's dreamerv3: `DictEncoder` concatenates every vector key into one MLP and every image
  key (channels stacked) into one CNN, and concatenates the two embeddings; `DictDecoder`
  reconstructs every key from the features (one MLP for the vectors, one CNN for the images).
A single observation is the one-key case and keeps the plain tensor interface.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from worldmodels.models.layers import activation, has_bias, mlp, norm_layer


def symlog(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.log1p(x.abs())


def symexp(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.expm1(x.abs())


TWOHOT_BINS = ("symlog", "symexp")
"""Two-hot bin spacings: evenly in symlog space (the paper) or symexp-spaced (the reference's code)."""


def twohot_bin_values(n: int, spacing: str) -> torch.Tensor:
    """[n] bins over +-20 in symlog space, mirrored about 0 (n odd: 0 is a bin; n even: the
    reference's construction, which holds 0 twice): "symlog" is linspace(-20, 20, n) itself, "symexp"
    its symexp, values in the targets' own space."""
    if spacing not in TWOHOT_BINS:
        raise ValueError(f"twohot bins {spacing!r} is not valid; expected one of {list(TWOHOT_BINS)}")
    if spacing == "symlog" and n % 2 == 0:  # no 0 bin: the plain linspace is already symmetric in float64
        return torch.linspace(-20.0, 20.0, n, dtype=torch.float64).float()
    half = torch.linspace(-20.0, 0.0, n // 2 + 1 if n % 2 else n // 2, dtype=torch.float64)
    half = symexp(half) if spacing == "symexp" else half
    return torch.cat([half, -half[:-1].flip(0) if n % 2 else -half.flip(0)]).float()


class TwoHot:
    """Categorical over `bins` [K]; targets two-hot encoded between their two nearest bins.

    `symlog_space`: bins live in symlog space (targets go through symlog, mean = symexp(E[bin])),
    else in the targets' space (mean = E[bin]). The mean sums the two halves of the bins from the
    middle out, so a uniform prediction over symmetric bins is exactly 0 (a zero-initialised head
    predicts 0, not the rounding error of adding +-4.9e8 left to right)."""

    def __init__(self, logits: torch.Tensor, bins: torch.Tensor, symlog_space: bool = True):
        self.logits, self.bins, self.symlog_space = logits, bins, symlog_space  # logits [..., K], bins [K]

    @property
    def mean(self) -> torch.Tensor:
        probs = torch.softmax(self.logits, -1, dtype=torch.promote_types(self.logits.dtype, torch.float32))
        weighted = probs * self.bins
        half = self.bins.shape[0] // 2
        middle = weighted[..., half:half + 1].sum(-1) if self.bins.shape[0] % 2 else 0.0
        outer = weighted[..., :half].flip(-1) + weighted[..., -half:]  # pairs (-b, +b), innermost first
        value = middle + outer.sum(-1)
        return symexp(value) if self.symlog_space else value

    def log_prob(self, target: torch.Tensor) -> torch.Tensor:
        """log p(target) under its two-hot encoding (of symlog(target) in symlog space); target [...]."""
        x = (symlog(target) if self.symlog_space else target).clamp(self.bins[0], self.bins[-1])
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

    `output`: "twohot" (255 bins, zero-initialised output layer as in DreamerV3),
    "binary" (Bernoulli logits) or "normal" (unit-variance Gaussian).

    Args:
        in_dim: feature size F.
        output: "twohot", "binary" or "normal" (see above).
        units: MLP width.
        layers: hidden layers of the MLP.
        norm: feature norm after each hidden layer ("none", "rms", "layer").
        act: activation ("elu", "silu", "relu").
        bins: number of two-hot bins (output="twohot").
        twohot_bins: their spacing, "symlog" or "symexp" (`twohot_bins`; output="twohot").
        linear_bias: "auto" (a hidden layer before a norm has no bias) or "always" (`layers.LINEAR_BIASES`).
    """

    OUTPUTS = ("twohot", "binary", "normal")

    def __init__(self, in_dim: int, *, output: str, units: int, layers: int, norm: str = "none",
                 act: str = "elu", bins: int = 255, twohot_bins: str = "symlog", linear_bias: str = "auto"):
        super().__init__()
        if output not in self.OUTPUTS:
            raise ValueError(f"output={output!r} is not valid; expected one of {list(self.OUTPUTS)}")
        self.in_dim, self.output = in_dim, output
        self.net = mlp(in_dim, bins if output == "twohot" else 1, units, layers, norm, act, linear_bias)
        if output == "twohot":
            nn.init.zeros_(self.net[-1].weight)
            nn.init.zeros_(self.net[-1].bias)
            self.register_buffer("bins", twohot_bin_values(bins, twohot_bins), persistent=False)
            self.symlog_space = twohot_bins == "symlog"

    def forward(self, features: torch.Tensor):
        """The prediction's distribution over the target [...] (`log_prob` for losses, `.mean`)."""
        if features.shape[-1] != self.in_dim:
            raise ValueError(f"features must be [..., {self.in_dim}], got {list(features.shape)}")
        out = self.net(features)
        if self.output == "twohot":
            return TwoHot(out, self.bins, self.symlog_space)
        if self.output == "binary":
            return torch.distributions.Bernoulli(logits=out.squeeze(-1), validate_args=False)
        return UnitNormal(out.squeeze(-1))

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        """The prediction as values [...]: the distribution's mean, in the target's units (the expected
        reward or return for "twohot" and "normal"; P(target = 1), e.g. P(continue), for "binary")."""
        return self(features).mean


class VectorEncoder(nn.Module):
    """obs [..., O] -> embed [..., units]; symlog squashes inputs of any scale (DreamerV3).

    Args:
        obs_dim: observation size O.
        units: MLP width (and embedding size).
        layers: hidden layers.
        norm: feature norm after each layer ("none", "rms", "layer").
        act: activation ("elu", "silu", "relu").
        symlog_inputs: apply symlog to the observation first.
        linear_bias: "auto" (a layer before a norm has no bias) or "always" (`layers.LINEAR_BIASES`).
    """

    def __init__(self, obs_dim: int, *, units: int, layers: int, norm: str, act: str, symlog_inputs: bool,
                 linear_bias: str = "auto"):
        super().__init__()
        self.symlog_inputs = symlog_inputs
        self.net = mlp(obs_dim, None, units, layers, norm, act, linear_bias)
        self.embed_dim = units

    def preprocess(self, obs: torch.Tensor) -> torch.Tensor:
        """Vectors are read as they are (symlog is part of the net)."""
        return obs

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(symlog(obs) if self.symlog_inputs else obs)


class VectorDecoder(nn.Module):
    """features [..., F] -> predicted obs; `log_prob(features, obs)` [...] is the unit-Gaussian
    log-likelihood (in symlog space when `symlog_inputs`), summed over the obs dims.

    Args:
        feat_dim: feature size F.
        obs_dim: observation size O.
        units: MLP width.
        layers: hidden layers.
        norm: feature norm after each layer ("none", "rms", "layer").
        act: activation ("elu", "silu", "relu").
        symlog_inputs: predict symlog(obs) (the prediction is symexp'd back).
        linear_bias: "auto" (a layer before a norm has no bias) or "always" (`layers.LINEAR_BIASES`).
    """

    def __init__(self, feat_dim: int, obs_dim: int, *, units: int, layers: int, norm: str, act: str,
                 symlog_inputs: bool, linear_bias: str = "auto"):
        super().__init__()
        self.symlog_inputs = symlog_inputs
        self.net = mlp(feat_dim, obs_dim, units, layers, norm, act, linear_bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        out = self.net(features)
        return symexp(out) if self.symlog_inputs else out

    def log_prob(self, features: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        target = symlog(obs) if self.symlog_inputs else obs
        return -0.5 * (self.net(features) - target).pow(2).sum(-1)


def pixels_to_float(pixels: torch.Tensor, bits: int | None = None) -> torch.Tensor:
    """uint8 [..., C, 64, 64] -> float in [-0.5, 0.5]: p / 255 - 0.5; with `bits` (PlaNet's `image_bits`,
    planet/tools/preprocess.py), the top `bits` bits of each value in 2**bits bins plus uniform noise
    within the bin: floor(p / 2**(8 - bits)) / 2**bits + U(0, 1 / 2**bits) - 0.5. Float input is taken
    as converted already (the world model's loss converts once, so its encoder and decoder see the
    same noise) and returned as it is."""
    if pixels.dtype.is_floating_point:
        return pixels
    if bits is None:
        return pixels.float() / 255.0 - 0.5
    bins = 2 ** bits
    image = torch.floor(pixels.float() / 2 ** (8 - bits)) / bins
    return image + torch.rand_like(image) / bins - 0.5


def float_to_pixels(image: torch.Tensor) -> torch.Tensor:
    return ((image + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)


class ChannelNorm(nn.Module):
    """A feature norm over the channel dim of [N, C, H, W] maps.

    The pixel nets keep their maps channels-last (`_channels_last`), so the NHWC view this norms
    is contiguous rows of C; on NCHW maps it is a strided view (correct, slower).

    The RMS norm is written out (statistics in at least fp32, the result in the input's dtype): the rows are
    C = 4-256 channels, about a million of them per update at size1m, where torch's fused
    row-norm kernel is slower than these few elementwise and reduction kernels (the
    `fused_norm` variant of `benchmarks/pixel_nets.py`, retired, last in f7d2ad1). The weight keeps `RMSNorm`'s
    name and checkpoint key."""

    def __init__(self, norm: str, channels: int):
        super().__init__()
        self.norm = norm_layer(norm, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.permute(0, 2, 3, 1)
        if isinstance(self.norm, nn.RMSNorm):
            h = rows.to(torch.promote_types(rows.dtype, torch.float32))  # half types up, float64 kept
            h = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + self.norm.eps) * self.norm.weight
            return h.to(x.dtype).permute(0, 3, 1, 2)
        return self.norm(rows).permute(0, 3, 1, 2)


def _channels_last(net: nn.Module) -> nn.Module:
    """`net` with its conv weights in channels-last memory: cuDNN then runs the convs NHWC (their
    outputs channels-last too) and every `ChannelNorm` reads contiguous rows, which cuts the pixel
    nets' GPU time (docs/kernels.md, "Measurements behind the code's choices")."""
    return net.to(memory_format=torch.channels_last)


def _flat_batch(x: torch.Tensor, event_dims: int) -> tuple[torch.Tensor, torch.Size]:
    batch = x.shape[: x.dim() - event_dims]
    return x.reshape(-1, *x.shape[x.dim() - event_dims:]), batch


class PixelEncoder(nn.Module):
    """uint8 [..., C, 64, 64] -> embed [..., 8 * depth * 4 * 4]: four stride-2 convs (64 -> 4).

    Args:
        depth: channels of the first conv; they double at each of the four convs.
        norm: feature norm after each conv ("none", "rms", "layer").
        act: activation ("elu", "silu", "relu").
        size: image height and width (only 64 is supported).
        channels: image channels C (3: RGB, 1: grayscale, more: stacked images).
        image_bits: None (p / 255 - 0.5), or the bits kept of each value, with noise within the
            bin (PlaNet's 5: `pixels_to_float`).
        linear_bias: "auto" (a conv before a norm has no bias) or "always" (`layers.LINEAR_BIASES`).
    """

    def __init__(self, *, depth: int, norm: str, act: str, size: int = 64, channels: int = 3,
                 image_bits: int | None = None, linear_bias: str = "auto"):
        super().__init__()
        if size != 64:
            raise ValueError(f"size={size!r} is not supported; pixel encoders read 64x64 images")
        if channels < 1:
            raise ValueError(f"channels={channels!r} must be >= 1")
        if image_bits is not None and not (isinstance(image_bits, int) and 1 <= image_bits <= 8):
            raise ValueError(f"image_bits={image_bits!r}: expected None or an integer in 1..8")
        self.image_bits = image_bits
        layers: list[nn.Module] = []
        for mult in (1, 2, 4, 8):
            layers += [nn.Conv2d(channels, depth * mult, 4, 2, 1, bias=has_bias(norm, linear_bias)),
                       ChannelNorm(norm, depth * mult), activation(act)]
            channels = depth * mult
        self.net = _channels_last(nn.Sequential(*layers))
        self.embed_dim = channels * 4 * 4

    def preprocess(self, pixels: torch.Tensor) -> torch.Tensor:
        """The float image this encoder reads (and the decoder's target): `pixels_to_float`."""
        return pixels_to_float(pixels, self.image_bits)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x, batch = _flat_batch(self.preprocess(pixels), 3)
        return self.net(x).reshape(*batch, self.embed_dim)


class PixelDecoder(nn.Module):
    """features [..., F] -> image mean [..., C, 64, 64] in [-0.5, 0.5] units (4 -> 64).

    Args:
        feat_dim: feature size F.
        depth: channels of the last transposed conv; they double towards the first.
        norm: feature norm after each transposed conv ("none", "rms", "layer").
        act: activation ("elu", "silu", "relu").
        channels: image channels C predicted.
        linear_bias: "auto" (a conv before a norm has no bias) or "always" (`layers.LINEAR_BIASES`).
    """

    def __init__(self, feat_dim: int, *, depth: int, norm: str, act: str, channels: int = 3,
                 linear_bias: str = "auto"):
        super().__init__()
        self.depth, self.channels = depth, channels
        self.project = nn.Linear(feat_dim, 8 * depth * 4 * 4)
        layers: list[nn.Module] = []
        channels = 8 * depth
        for mult in (4, 2, 1):
            layers += [nn.ConvTranspose2d(channels, depth * mult, 4, 2, 1, bias=has_bias(norm, linear_bias)),
                       ChannelNorm(norm, depth * mult), activation(act)]
            channels = depth * mult
        layers.append(nn.ConvTranspose2d(channels, self.channels, 4, 2, 1))
        self.net = _channels_last(nn.Sequential(*layers))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x, batch = _flat_batch(features, 1)
        x = self.project(x).reshape(-1, 8 * self.depth, 4, 4)
        return self.net(x).reshape(*batch, self.channels, 64, 64)

    def log_prob(self, features: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        """Unit-Gaussian log-likelihood of the image, summed over pixels -> [...]."""
        return -0.5 * (self(features) - pixels_to_float(pixels)).pow(2).sum((-3, -2, -1))


def _split_keys(shapes: Mapping) -> tuple[list, list]:
    """(vector keys, image keys) of `shapes` (key -> per-step shape), in their order; anything
    else is an error naming the key."""
    vectors, images = [], []
    for key, shape in shapes.items():
        if len(shape) == 1:
            vectors.append(key)
        elif len(shape) == 3 and tuple(shape[1:]) == (64, 64):
            images.append(key)
        else:
            raise ValueError(f"obs_shape[{key!r}]={tuple(shape)} is not supported; expected a vector (O,) or "
                             "an image (C, 64, 64)")
    return vectors, images


class DictEncoder(nn.Module):
    """TensorDict [...] of observations -> embed [..., E]: every vector key (concatenated, in
    key order) through one `VectorEncoder` MLP, every image key (channels stacked) through one
    `PixelEncoder` CNN; E = the MLP's units + the CNN's output size.

    Args:
        shapes: key -> per-step shape: (O,) float vectors and (C, 64, 64) uint8 images.
        cfg: the model config (units, encoder_layers, depth, norm, act, symlog_inputs).
    """

    def __init__(self, shapes: Mapping, cfg):
        super().__init__()
        self.vector_keys, self.image_keys = _split_keys(shapes)
        self.vector = self.image = None
        self.embed_dim = 0
        if self.vector_keys:
            size = sum(shapes[k][0] for k in self.vector_keys)
            self.vector = VectorEncoder(size, units=encoder_units(cfg), layers=cfg.encoder_layers, norm=cfg.norm,
                                        act=cfg.act, symlog_inputs=cfg.symlog_inputs, linear_bias=linear_bias(cfg))
            self.embed_dim += self.vector.embed_dim
        if self.image_keys:
            channels = sum(shapes[k][0] for k in self.image_keys)
            self.image = PixelEncoder(**pixel_net_args(cfg), channels=channels, image_bits=image_bits(cfg))
            self.embed_dim += self.image.embed_dim

    def preprocess(self, obs: TensorDictBase) -> TensorDictBase:
        """`obs` with each image key as the float image the encoder reads (`PixelEncoder.preprocess`)."""
        if self.image is None:
            return obs
        obs = obs.copy()
        for key in self.image_keys:
            obs[key] = self.image.preprocess(obs[key])
        return obs

    def forward(self, obs: TensorDictBase) -> torch.Tensor:
        embeds = []
        if self.vector is not None:
            embeds.append(self.vector(torch.cat([obs[k] for k in self.vector_keys], -1)))
        if self.image is not None:
            embeds.append(self.image(torch.cat([obs[k] for k in self.image_keys], -3)))
        return torch.cat(embeds, -1)


class DictDecoder(nn.Module):
    """features [..., F] -> TensorDict [...] with each observation key's prediction: vectors in
    their own units (as `VectorDecoder`), images in [-0.5, 0.5] units (as `PixelDecoder`).
    `log_prob(features, obs)` [...] sums every key's unit-Gaussian log-likelihood.

    Args:
        feat_dim: feature size F.
        shapes: key -> per-step shape: (O,) float vectors and (C, 64, 64) uint8 images.
        cfg: the model config (units, encoder_layers, depth, norm, act, symlog_inputs).
    """

    def __init__(self, feat_dim: int, shapes: Mapping, cfg):
        super().__init__()
        self.vector_keys, self.image_keys = _split_keys(shapes)
        self.vector_sizes = [shapes[k][0] for k in self.vector_keys]
        self.image_channels = [shapes[k][0] for k in self.image_keys]
        self.vector = self.image = None
        if self.vector_keys:
            self.vector = VectorDecoder(feat_dim, sum(self.vector_sizes), units=encoder_units(cfg),
                                        layers=cfg.encoder_layers, norm=cfg.norm, act=cfg.act,
                                        symlog_inputs=cfg.symlog_inputs, linear_bias=linear_bias(cfg))
        if self.image_keys:
            self.image = PixelDecoder(feat_dim, **pixel_net_args(cfg), channels=sum(self.image_channels))

    def forward(self, features: torch.Tensor) -> TensorDict:
        out = {}
        if self.vector is not None:
            out.update(zip(self.vector_keys, self.vector(features).split(self.vector_sizes, -1)))
        if self.image is not None:
            out.update(zip(self.image_keys, self.image(features).split(self.image_channels, -3)))
        return TensorDict(out, batch_size=features.shape[:-1])

    def log_prob(self, features: torch.Tensor, obs: TensorDictBase) -> torch.Tensor:
        total = 0
        if self.vector is not None:
            total = total + self.vector.log_prob(features, torch.cat([obs[k] for k in self.vector_keys], -1))
        if self.image is not None:
            total = total + self.image.log_prob(features, torch.cat([obs[k] for k in self.image_keys], -3))
        return total


def pixel_net_args(cfg) -> dict:
    """The CNNs' depth, norm and activation from the model config: `cnn_act` where given (Dreamer V1's
    relu convs beside elu MLPs), else `act`."""
    return {"depth": cfg.depth, "norm": cfg.norm, "act": getattr(cfg, "cnn_act", None) or cfg.act,
            "linear_bias": linear_bias(cfg)}


def linear_bias(cfg) -> str:
    """The model config's `linear_bias` (`layers.LINEAR_BIASES`); "auto" in configs without it."""
    return getattr(cfg, "linear_bias", None) or "auto"


def encoder_units(cfg) -> int:
    """The vector encoder's and decoder's width: `encoder_units` where set (the 2023 reference's DMC
    proprio model: 1024 there, 512 in its heads), else `units`."""
    return getattr(cfg, "encoder_units", None) or cfg.units


def image_bits(cfg) -> int | None:
    """The model config's `image_bits` (None: configs written before the field, and the default)."""
    return getattr(cfg, "image_bits", None)


def make_encoder(obs_shape, cfg) -> nn.Module:
    """The encoder for observations of `obs_shape`: (O,) vectors, (C, 64, 64) images, or a dict
    key -> shape of several (a `DictEncoder` reading a TensorDict). Each has `preprocess(obs)`: the
    observations as it reads them (floats for images; vectors unchanged)."""
    if isinstance(obs_shape, Mapping):
        return DictEncoder(obs_shape, cfg)
    if len(obs_shape) == 3:
        return PixelEncoder(**pixel_net_args(cfg), channels=obs_shape[0], image_bits=image_bits(cfg))
    return VectorEncoder(obs_shape[0], units=encoder_units(cfg), layers=cfg.encoder_layers, norm=cfg.norm,
                         act=cfg.act, symlog_inputs=cfg.symlog_inputs, linear_bias=linear_bias(cfg))


def make_decoder(obs_shape, feat_dim: int, cfg) -> nn.Module:
    """The decoder reconstructing observations of `obs_shape` (as `make_encoder`) from features."""
    if isinstance(obs_shape, Mapping):
        return DictDecoder(feat_dim, obs_shape, cfg)
    if len(obs_shape) == 3:
        return PixelDecoder(feat_dim, **pixel_net_args(cfg), channels=obs_shape[0])
    return VectorDecoder(feat_dim, obs_shape[0], units=encoder_units(cfg), layers=cfg.encoder_layers,
                         norm=cfg.norm, act=cfg.act, symlog_inputs=cfg.symlog_inputs, linear_bias=linear_bias(cfg))


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


__all__ = [
    "DictDecoder", "DictEncoder", "Head", "PixelDecoder", "PixelEncoder", "TWOHOT_BINS", "TwoHot", "UnitNormal",
    "VectorDecoder", "VectorEncoder", "count_parameters", "float_to_pixels", "make_decoder", "make_encoder",
    "pixels_to_float", "symexp", "symlog", "twohot_bin_values",
]
