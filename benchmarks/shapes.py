"""The shape matrix: model sizes and unroll shapes, full (GPU) and small (CPU smoke runs)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    name: str
    deter: int
    stoch: int
    hidden: int
    embed: int
    action: int
    classes: int | None = None   # None: Gaussian latents (V1)
    blocks: int = 1
    actor_hidden: int = 400
    actor_layers: int = 4
    unimix: float = 0.01

    @property
    def v3(self) -> bool:
        return self.classes is not None

    @property
    def stoch_dim(self) -> int:
        return self.stoch * self.classes if self.classes else self.stoch

    def rssm_kwargs(self) -> dict:
        common = dict(deter=self.deter, stoch=self.stoch, hidden=self.hidden)
        if not self.v3:
            return dict(common, cell="gru", norm="none", act="elu")
        return dict(common, classes=self.classes, cell="block_gru", blocks=self.blocks, norm="rms", act="silu",
                    unimix=self.unimix)

    def actor_kwargs(self) -> dict:
        if not self.v3:
            return dict(hidden=self.actor_hidden, layers=self.actor_layers, dist="tanh_normal", act="elu")
        return dict(hidden=self.actor_hidden, layers=self.actor_layers, dist="onehot", act="silu", norm="rms",
                    unimix=self.unimix)

    def describe(self) -> str:
        latent = f"{self.stoch}x{self.classes} cat, {self.blocks} blocks" if self.v3 else f"stoch {self.stoch}"
        return f"deter {self.deter}, {latent}, hidden {self.hidden}, embed {self.embed}, act {self.action}"


@dataclass(frozen=True)
class UnrollShape:
    model: ModelConfig
    kind: str     # "observe" (B, T) or "imagine" (N starts, H steps, actor in the loop)
    batch: int
    steps: int

    @property
    def label(self) -> str:
        b, t = ("B", "T") if self.kind == "observe" else ("N", "H")
        return f"{self.model.name} {self.kind} {b}={self.batch} {t}={self.steps}"


# Dreamer V1 defaults (actor: 4 x 400 ELU, tanh-normal)
V1 = ModelConfig("V1", deter=200, stoch=30, hidden=200, embed=1024, action=6)
# DreamerV3 size presets (rssm deter/hidden/classes, MLP units); embed = the 64x64 CNN encoder's
# output for that preset's depth (4x4 x 8*depth), actor 3 x units RMSNorm/SiLU, one-hot actions.
V3_1M = ModelConfig("V3-1m", deter=512, stoch=32, hidden=64, embed=512, action=6, classes=4, blocks=8,
                    actor_hidden=64, actor_layers=3)
V3_12M = ModelConfig("V3-12m", deter=2048, stoch=32, hidden=256, embed=2048, action=6, classes=16, blocks=8,
                     actor_hidden=256, actor_layers=3)
# The RSSM issue's "DreamerV3-small" point: deter = hidden = 512, 32x16 categoricals
V3_SMALL_512 = ModelConfig("V3-s512", deter=512, stoch=32, hidden=512, embed=1024, action=6, classes=16, blocks=8,
                           actor_hidden=512, actor_layers=3)

FULL = [
    UnrollShape(V1, "observe", 50, 50),
    UnrollShape(V3_1M, "observe", 16, 64),
    UnrollShape(V3_SMALL_512, "observe", 16, 64),
    UnrollShape(V3_12M, "observe", 16, 64),
    UnrollShape(V1, "imagine", 1024, 15),
    UnrollShape(V3_1M, "imagine", 1024, 15),
    UnrollShape(V3_12M, "imagine", 1024, 15),
]

V1_SMALL = ModelConfig("V1-small", deter=32, stoch=8, hidden=32, embed=64, action=3, actor_hidden=32, actor_layers=2)
V3_SMALL = ModelConfig("V3-small", deter=64, stoch=4, hidden=16, embed=64, action=3, classes=4, blocks=8,
                       actor_hidden=16, actor_layers=2)
SMALL = [
    UnrollShape(V1_SMALL, "observe", 4, 8),
    UnrollShape(V3_SMALL, "observe", 4, 8),
    UnrollShape(V1_SMALL, "imagine", 8, 5),
    UnrollShape(V3_SMALL, "imagine", 8, 5),
]
