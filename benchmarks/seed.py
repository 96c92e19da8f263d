"""The seed-style peer: an RSSM written the classic way, one step of nn.Modules per Python loop
iteration (as in the original RSSM prior: GRUCell + Linear/ELU heads; for DreamerV3 shapes, the
same style with RMSNorm/SiLU and a block-diagonal GRU).

Nothing is hoisted out of the loop: every step projects cat(stoch, action) and cat(deter, embed)
and evaluates the prior head. `from_rssm` copies the weights of a `worldmodels.RSSM`, so with the
same inputs and noise the peer computes the same function as our backends and the bench asserts
it (outputs and input gradients) against our `loop` reference.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn


def _norm(norm: str, size: int) -> nn.Module:
    if norm == "rms":
        return nn.RMSNorm(size, eps=1e-4)
    if norm == "layer":
        return nn.LayerNorm(size, eps=1e-3)
    return nn.Identity()


def _act(act: str) -> nn.Module:
    return nn.ELU() if act == "elu" else nn.SiLU()


def _dense(in_size: int, out_size: int, norm: str, act: str) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_size, out_size, bias=norm == "none"), _norm(norm, out_size), _act(act))


class SeedRSSM(nn.Module):
    def __init__(self, *, action_dim: int, embed_dim: int, deter: int, stoch: int, hidden: int,
                 classes: int | None, cell: str, blocks: int, norm: str, act: str, min_std: float, unimix: float):
        super().__init__()
        self.stoch, self.classes, self.blocks, self.cell = stoch, classes, blocks, cell
        self.min_std, self.unimix = min_std, unimix
        stoch_dim = stoch * classes if classes else stoch
        stats = stoch_dim if classes else 2 * stoch
        if cell == "gru":
            self.img_in = _dense(stoch_dim + action_dim, hidden, norm, act)
            self.gru = nn.GRUCell(hidden, deter)
        else:
            self.in_deter = _dense(deter, hidden, norm, act)
            self.in_stoch = _dense(stoch_dim, hidden, norm, act)
            self.in_action = _dense(action_dim, hidden, norm, act)
            g, dg, hg = blocks, deter // blocks, hidden // blocks
            self.dyn_x = nn.Linear(3 * hidden, hidden, bias=norm == "none")
            self.dyn_h = nn.Parameter(torch.empty(g, dg, hg))
            self.dyn_norm, self.dyn_act = _norm(norm, hg), _act(act)
            self.gates_w = nn.Parameter(torch.empty(g, hg, 3 * dg))
            self.gates_b = nn.Parameter(torch.empty(g, 3 * dg))
        self.prior = nn.Sequential(_dense(deter, hidden, norm, act), nn.Linear(hidden, stats))
        self.post = nn.Sequential(*_dense(deter + embed_dim, hidden, norm, act), nn.Linear(hidden, stats))

    @classmethod
    def from_rssm(cls, rssm: nn.Module) -> SeedRSSM:
        """The same function as `rssm` (a `worldmodels.RSSM`), its weights copied."""
        norm = {nn.Identity: "none", nn.LayerNorm: "layer"}.get(type(rssm.post_head[0]), "rms")
        act = "elu" if isinstance(rssm.post_head[1], nn.ELU) else "silu"
        seed = cls(action_dim=rssm.action_dim, embed_dim=rssm.embed_dim, deter=rssm.deter_dim, stoch=rssm.stoch,
                   hidden=rssm.hidden, classes=rssm.classes, cell=rssm.cell, blocks=rssm.blocks, norm=norm, act=act,
                   min_std=rssm.min_std, unimix=rssm.unimix)
        p = lambda module: dict(module.named_parameters())  # noqa: E731
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        if rssm.cell == "gru":
            pairs.append((seed.img_in[0].weight, torch.cat([rssm.in_stoch.weight, rssm.in_action.weight], 1)))
            if rssm.in_stoch.bias is not None:
                pairs.append((seed.img_in[0].bias, rssm.in_stoch.bias))
            pairs += zip(p(seed.img_in[1]).values(), p(rssm.in_out[0]).values())
            pairs += [(p(seed.gru)[k], v) for k, v in p(rssm.gru).items()]
        else:
            for name in ("in_deter", "in_stoch", "in_action", "dyn_x"):
                pairs += zip(p(getattr(seed, name)).values(), p(getattr(rssm, name)).values())
            pairs += zip(p(seed.dyn_norm).values(), p(rssm.dyn_out[0]).values())
            pairs += [(seed.dyn_h, rssm.dyn_h), (seed.gates_w, rssm.gates_w), (seed.gates_b, rssm.gates_b)]
        pairs += zip(p(seed.prior).values(), p(rssm.prior_head).values())
        post_first = torch.cat([rssm.post_deter.weight, rssm.post_embed.weight], 1)
        pairs.append((seed.post[0].weight, post_first))
        if rssm.post_embed.bias is not None:
            pairs.append((seed.post[0].bias, rssm.post_embed.bias))
        pairs += zip(p(seed.post[1]).values(), p(rssm.post_head[0]).values())
        pairs += zip(p(seed.post[3]).values(), p(rssm.post_head[2]).values())
        mine = {id(t) for t, _ in pairs}
        missing = [n for n, t in seed.named_parameters() if id(t) not in mine]
        if missing:
            raise RuntimeError(f"seed weights not mapped from the RSSM: {missing}")
        with torch.no_grad():
            for target, source in pairs:
                if target.shape != source.shape:
                    raise RuntimeError(f"seed/RSSM weight shapes differ: {list(target.shape)} vs {list(source.shape)}")
                target.copy_(source)
        return seed.to(rssm.post_embed.weight.device)

    # ---------------------------------------------------------------- one step
    def _dist(self, stats: torch.Tensor, noise: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.classes:
            probs = torch.softmax(stats.unflatten(-1, (self.stoch, self.classes)), -1)
            logits = torch.log((1 - self.unimix) * probs + self.unimix / self.classes)
            probs = torch.softmax(logits, -1)
            onehot = F.one_hot((logits + noise).argmax(-1), self.classes).to(logits.dtype)
            return {"stoch": (onehot + probs - probs.detach()).flatten(-2), "logits": logits}
        mean, std = stats.chunk(2, -1)
        std = F.softplus(std) + self.min_std
        return {"stoch": mean + std * noise, "mean": mean, "std": std}

    def _block_gru(self, deter, stoch, action):
        x = torch.cat([self.in_deter(deter), self.in_stoch(stoch), self.in_action(action)], -1)
        blocks = deter.unflatten(-1, (self.blocks, -1))
        u = self.dyn_x(x).unflatten(-1, (self.blocks, -1)) + torch.einsum("bgd,gdh->bgh", blocks, self.dyn_h)
        gates = torch.einsum("bgh,gho->bgo", self.dyn_act(self.dyn_norm(u)), self.gates_w) + self.gates_b
        reset, cand, update = gates.chunk(3, -1)
        cand = torch.tanh(torch.sigmoid(reset) * cand)
        update = torch.sigmoid(update - 1)
        return (update * cand + (1 - update) * blocks).flatten(-2)

    def img_step(self, deter, stoch, action, noise):
        if self.cell == "gru":
            deter = self.gru(self.img_in(torch.cat([stoch, action], -1)), deter)
        else:
            deter = self._block_gru(deter, stoch, action)
        return {"deter": deter, **self._dist(self.prior(deter), noise)}

    def obs_step(self, deter, stoch, action, embed, prior_noise, post_noise):
        prior = self.img_step(deter, stoch, action, prior_noise)
        post = {"deter": prior["deter"], **self._dist(self.post(torch.cat([prior["deter"], embed], -1)), post_noise)}
        return post, prior

    # ---------------------------------------------------------------- the loops
    def observe(self, embed, action, is_first, state, noise) -> dict:
        deter, stoch = state["deter"], state["stoch"]
        posts, priors = [], []
        for t in range(embed.shape[1]):
            reset = is_first[:, t, None]
            deter = torch.where(reset, torch.zeros_like(deter), deter)
            stoch = torch.where(reset, torch.zeros_like(stoch), stoch)
            act = torch.where(reset, torch.zeros_like(action[:, t]), action[:, t])
            post, prior = self.obs_step(deter, stoch, act, embed[:, t], noise["prior"][:, t], noise["posterior"][:, t])
            deter, stoch = post["deter"], post["stoch"]
            posts.append(post)
            priors.append(prior)
        stack = lambda steps: {k: torch.stack([s[k] for s in steps], 1) for k in steps[0]}  # noqa: E731
        return {"post": stack(posts), "prior": stack(priors)}

    def imagine(self, start, horizon: int, actor, noise) -> dict:
        deter, stoch = start["deter"], start["stoch"]
        steps = []
        for h in range(horizon):
            action = actor(torch.cat([stoch, deter], -1), noise["policy"][:, h])
            prior = self.img_step(deter, stoch, action, noise["prior"][:, h])
            deter, stoch = prior["deter"], prior["stoch"]
            steps.append({**prior, "action": action})
        return {k: torch.stack([s[k] for s in steps], 1) for k in steps[0]}


def seed_actor(actor: nn.Module) -> nn.Module:
    """The policy the seed loop calls: a copy of ours (the MLP and its sampler are not what is compared)."""
    return copy.deepcopy(actor)
