"""`WorldModel`: encoder -> RSSM -> decoder, reward and continue heads, and its loss.

The same module serves all three algorithms; their configs choose latents (Gaussian or
categorical), the reward head ("normal" = MSE for PlaNet/V1, "twohot" = symexp two-hot for
DreamerV3), whether a continue head exists, and the KL terms:
    kl = dyn * max(free, KL(sg(post) || prior)) + rep * max(free, KL(post || sg(prior)))
per step (`kl.free_on: step`: DreamerV3 and PlaNet clamp each step's KL) or on the batch mean
(`kl.free_on: mean`: Dreamer V1's code, max(mean KL, free)).
DreamerV3: free = 1 nat, dyn/rep = 1.0/0.1 (the current reference's scales; the paper's are 0.5/0.1).
PlaNet / V1: free = 3 nats, dyn = rep = 1.0 (the plain KL's gradient, with free nats).
Reconstruction: `rec_scale` x the decoder's unit-variance Gaussian negative log-likelihood
(0.5 x the squared error summed over features, as PlaNet's and V1's code score it); DreamerV3's
reference scores the plain sum of squares (jaxutils.MSEDist / SymlogDist), hence its rec_scale 2.
Reward: `reward_scale` x the reward head's negative log-likelihood (PlaNet's code weighs it 10:
planet/scripts/configs.py, `defaults = {'reward': 10.0}`; 1 elsewhere).

Observations: `obs_shape` (O,) or (C, 64, 64) -> `batch["obs"]` is a tensor [B, T, *obs_shape];
a dict key -> shape (several observation keys) -> `batch["obs"]` is a TensorDict [B, T] of them,
encoded together and each reconstructed (`networks.DictEncoder` / `DictDecoder`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from tensordict import TensorDict
from torch import nn

from worldmodels.models import RSSM
from worldmodels.models.dists import kl_categorical, kl_gaussian
from worldmodels.models.networks import Head, linear_bias, make_decoder, make_encoder


def kl_terms(post: TensorDict, prior: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
    """(KL(sg(post) || prior), KL(post || sg(prior))), each [B, T], summed over latents."""
    if "logits" in post.keys():
        p, q = post["logits"], prior["logits"]
        return kl_categorical(p.detach(), q), kl_categorical(p, q.detach())
    pm, ps, qm, qs = post["mean"], post["std"], prior["mean"], prior["std"]
    return kl_gaussian(pm.detach(), ps.detach(), qm, qs), kl_gaussian(pm, ps, qm.detach(), qs.detach())


class WorldModel(nn.Module):
    """Encoder, RSSM, decoder, reward head and (DreamerV3) continue head, and their loss.

    Args:
        obs_shape: per-step observation shape, (O,) or (C, 64, 64), or a dict key -> shape.
        action_dim: action size A (one-hot size for discrete actions).
        model: the model config (configs/model/*.yaml).
        algo: the algorithm config (reward_head, twohot_bins, continue_head, continue_label, gamma, kl).
        backend: the RSSM's recurrent backend.
    """

    def __init__(self, obs_shape, action_dim: int, model, algo, backend: str = "auto"):
        super().__init__()
        self.obs_shape = dict(obs_shape) if isinstance(obs_shape, Mapping) else tuple(obs_shape)
        self.action_dim = action_dim
        self.encoder = make_encoder(self.obs_shape, model)
        self.rssm = RSSM(action_dim, self.encoder.embed_dim, deter=model.deter, stoch=model.stoch,
                         hidden=model.hidden, classes=model.classes, cell=model.cell, blocks=model.blocks,
                         norm=model.norm, act=model.act, min_std=model.min_std, unimix=model.unimix,
                         dyn_hidden=model.get("dyn_hidden"), dyn_norm=model.get("dyn_norm", "block"),
                         prior_layers=model.get("prior_layers", 1), initial=model.get("initial_state", "zeros"),
                         linear_bias=linear_bias(model), backend=backend)
        self.feat_dim = self.rssm.stoch_dim + self.rssm.deter_dim
        self.decoder = make_decoder(self.obs_shape, self.feat_dim, model)
        head = {"units": model.units, "layers": model.head_layers, "norm": model.norm, "act": model.act,
                "linear_bias": linear_bias(model)}
        twohot = {"twohot_bins": algo.get("twohot_bins", "symlog")} if algo.reward_head == "twohot" else {}
        self.reward = Head(self.feat_dim, output=algo.reward_head, **head, **twohot)
        self.cont = Head(self.feat_dim, output="binary", **head) if algo.continue_head else None
        # continue_label discounted (the 2024 reference's contdisc): the head learns gamma * (1 - is_terminal),
        # the discount itself, and imagination multiplies by nothing more (`ActorAgent.dream`)
        self.cont_label = float(algo.gamma) if algo.get("continue_label", "hard") == "discounted" else 1.0
        self.kl_free, self.kl_dyn, self.kl_rep = algo.kl.free, algo.kl.dyn, algo.kl.rep
        self.kl_free_on = algo.kl.get("free_on", "step")
        self.rec_scale = float(algo.get("rec_scale", 1.0))  # configs written before the field: 1
        self.reward_scale = float(algo.get("reward_scale", 1.0))

    def loss(self, batch: TensorDict, start: TensorDict | None = None
             ) -> tuple[torch.Tensor, TensorDict, dict[str, torch.Tensor]]:
        """batch [B, T] (obs, action, reward, is_first, is_terminal) -> (loss, post [B, T], metrics).
        `start` [B] (deter, stoch): the filter state the sequence's first step is observed from (replay
        context, `Agent.context_start`); None: zeros."""
        obs = self.encoder.preprocess(batch["obs"])  # images as floats once: the encoder's input and the target
        embed = self.encoder(obs)  # [B, T, E]; obs a tensor, or a TensorDict of keys
        post, prior = self.rssm.observe(embed, batch["action"], batch["is_first"], state=start)
        feat = self.rssm.features(post)  # [B, T, F]
        rec = -self.rec_scale * self.decoder.log_prob(feat, obs)
        rew = -self.reward_scale * self.reward(feat).log_prob(batch["reward"])
        dyn, rep = kl_terms(post, prior)
        if self.kl_free_on == "mean":  # Dreamer V1's code: max(batch-mean KL, free), no gradient below it
            dyn, rep = dyn.mean(), rep.mean()
        kl = self.kl_dyn * dyn.clamp(min=self.kl_free) + self.kl_rep * rep.clamp(min=self.kl_free)
        total = rec + rew + kl
        metrics = {"wm/rec": rec.mean().detach(), "wm/reward": rew.mean().detach(), "wm/kl": rep.mean().detach()}
        if self.cont is not None:
            con = -self.cont(feat).log_prob(self.cont_label * (~batch["is_terminal"]).float())
            total = total + con
            metrics["wm/cont"] = con.mean().detach()
        loss = total.mean()
        metrics["wm/loss"] = loss.detach()
        return loss, post, metrics

    def continues(self, feat: torch.Tensor) -> torch.Tensor:
        """P(episode continues) at imagined features [..., F] (times gamma, with `continue_label:
        discounted`); 1 without a continue head."""
        if self.cont is None:
            return torch.ones(feat.shape[:-1], dtype=feat.dtype, device=feat.device)
        return self.cont(feat).mean
