"""RSSM unrolls: every backend equals the Python loop of single steps (values and gradients)."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from torch.func import functional_call, stack_module_state, vmap

from tests._graphs import EagerGraph
import worldmodels as wm
from worldmodels.core import registry, torch_fixes

CPU_BACKENDS = registry.available_backends("cpu", "rssm_observe")
CONFIGS = {
    "v1": dict(deter=8, stoch=3, hidden=6),
    "v3": dict(deter=8, stoch=3, classes=4, hidden=6, cell="block_gru", blocks=2, norm="rms", act="silu"),
    "block_gauss": dict(deter=6, stoch=2, hidden=4, cell="block_gru", blocks=2, norm="layer", act="elu"),
    "v3_2023": dict(deter=8, stoch=3, classes=4, hidden=6, cell="norm_gru", norm="layer", act="silu",
                    initial="learned"),
}
A, E, B, T = 2, 5, 3, 5
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CUDA graphs)")


def make(cfg: str, dtype=torch.float32, device="cpu", seed=0) -> wm.RSSM:
    torch.manual_seed(seed)
    return wm.RSSM(A, E, **CONFIGS[cfg]).to(device=device, dtype=dtype)


def inputs(batch=B, steps=T, dtype=torch.float32, device="cpu", seed=1):
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(batch, steps, E, generator=g, dtype=dtype)
    action = torch.rand(batch, steps, A, generator=g, dtype=dtype) * 2.4 - 1.2  # some |a| > 1
    is_first = torch.rand(batch, steps, generator=g) < 0.3
    is_first[0, 0] = True
    is_first[-1, -1] = True
    return [t.to(device).requires_grad_(t.is_floating_point()) for t in (embed, action)] + [is_first.to(device)]


def observe_by_steps(rssm, embed, action, is_first, noise, state=None):
    state = rssm.initial(embed.shape[0]) if state is None else state
    posts, priors = [], []
    for t in range(embed.shape[1]):
        post, prior = rssm.obs_step(state, action[:, t], embed[:, t], is_first[:, t], noise=noise[:, t])
        posts.append(post)
        priors.append(prior)
        state = post.select("deter", "stoch")
    return torch.stack(posts, 1), torch.stack(priors, 1)


def imagine_by_steps(rssm, start, policy, noise):
    state, outs = start, []
    for h in range(noise.shape[1]):
        action = policy(rssm.features(state), noise["policy"][:, h])
        state, prior = rssm.img_step(state, action, noise[:, h])
        prior["action"] = action
        outs.append(prior)
    return torch.stack(outs, 1)


def assert_tds_close(got: TensorDict, want: TensorDict, atol=1e-5):
    assert set(got.keys()) == set(want.keys())
    assert got.batch_size == want.batch_size
    for key in want.keys():
        torch.testing.assert_close(got[key], want[key], atol=atol, rtol=1e-4, msg=lambda m: f"{key}: {m}")


def grads(loss, tensors):
    return torch.autograd.grad(loss, tensors, allow_unused=True, retain_graph=True)


def assert_grads_close(got, want, atol=1e-5):
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None:
            assert g is None or g.abs().max() == 0, f"grad {i}"
        else:
            torch.testing.assert_close(g, w, atol=atol, rtol=1e-4, msg=lambda m: f"grad {i}: {m}")


def loss_of(td: TensorDict) -> torch.Tensor:
    """A loss touching every output (distribution parameters too), with fixed random weights."""
    g = torch.Generator().manual_seed(7)
    total = 0
    for key in sorted(td.keys()):
        v = td[key]
        total = total + (v * torch.randn(v.shape, generator=g, dtype=v.dtype).to(v.device)).sum()
    return total


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("cfg", ["v1", "v3", "block_gauss", "v3_2023"])
def test_observe_equals_loop_of_obs_step(cfg, backend):
    check_observe_equals_loop(make(cfg), backend)


def check_observe_equals_loop(rssm, backend: str) -> TensorDict:
    """`rssm.observe` on `backend` equals the loop of `obs_step` (values and gradients); returns the posterior."""
    embed, action, is_first = inputs()
    noise = rssm.noise((B, T))
    params = list(rssm.parameters())
    post_ref, prior_ref = observe_by_steps(rssm, embed, action, is_first, noise)
    want = grads(loss_of(post_ref) + loss_of(prior_ref), [embed, action, *params])
    post, prior = rssm.observe(embed, action, is_first, noise=noise, backend=backend)
    assert_tds_close(post, post_ref)
    assert_tds_close(prior, prior_ref)
    assert_grads_close(grads(loss_of(post) + loss_of(prior), [embed, action, *params]), want)
    return post


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("cfg,batch,steps", [("v3", 1, 4), ("v1", B, 1)], ids=["v3-B1T4", "v1-T1"])
def test_observe_without_resets_carries_the_start_state(cfg, batch, steps, backend):
    """No reset in the sequence (B=1 over four steps, and one step alone) from a random start state
    that every output reads: equal to the loop of obs_step, values and gradients (the start state's too)."""
    rssm = make(cfg)
    embed, action, is_first = inputs(batch=batch, steps=steps)
    is_first = torch.zeros_like(is_first)
    g = torch.Generator().manual_seed(2)
    deter = torch.randn(batch, rssm.deter_dim, generator=g).requires_grad_()
    stoch = torch.randn(batch, rssm.stoch_dim, generator=g).requires_grad_()
    start = TensorDict({"deter": deter, "stoch": stoch}, [batch])
    noise = rssm.noise((batch, steps))
    wrt = [embed, action, deter, stoch, *rssm.parameters()]
    post_ref, prior_ref = observe_by_steps(rssm, embed, action, is_first, noise, state=start)
    want = grads(loss_of(post_ref) + loss_of(prior_ref), wrt)
    assert want[2].abs().min() > 0 and want[3].abs().sum() > 0  # the start state reaches the outputs
    post, prior = rssm.observe(embed, action, is_first, state=start, noise=noise, backend=backend)
    assert_tds_close(post, post_ref)
    assert_tds_close(prior, prior_ref)
    assert_grads_close(grads(loss_of(post) + loss_of(prior), wrt), want)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("cfg,dist", [("v1", "tanh_normal"), ("v3", "onehot"), ("v3_2023", "bounded_normal")])
def test_imagine_with_actor_equals_loop(cfg, dist, backend):
    rssm = make(cfg)
    actor = wm.Actor(rssm.stoch_dim + rssm.deter_dim, A, hidden=8, layers=2, dist=dist)
    embed, action, is_first = inputs()
    post, _ = rssm.observe(embed, action, is_first, backend="loop")
    start = post[:, -1].select("deter", "stoch")  # differentiable start: gradients flow into observe
    noise = rssm.noise((B, 4))
    noise["policy"] = actor.noise((B, 4))
    params = list(rssm.parameters()) + list(actor.parameters())
    ref = imagine_by_steps(rssm, start, actor, noise)
    want = grads(loss_of(ref), [embed, *params])
    out = rssm.imagine(start, 4, policy=actor, noise=noise, backend=backend)
    assert_tds_close(out, ref)
    assert_grads_close(grads(loss_of(out), [embed, *params]), want)


def test_the_compiled_2023_step_equals_the_loop_of_steps(monkeypatch):
    """cudnn's compiled step (WORLDMODELS_CUDNN_STEP=compiled, CUDA only) takes the 2023 dense GRU
    with its learned initial state: here its driver runs on CPU with torch.compile's aot_eager
    backend (dynamo's trace and AOTAutograd's joint graph); observe with resets and imagination
    with the Actor in the loop equal the loop of steps, values and gradients."""
    import functools

    from worldmodels.core.unroll import compiled_loop_unroll, loop_unroll
    from worldmodels.ops.rssm import cudnn

    spec = make("v3_2023").op_spec()
    with cudnn.cudnn_step.use("compiled"):
        assert cudnn.driver(spec, torch.zeros(2, 8)) is loop_unroll  # CPU tensors: the plain loop
        if torch.cuda.is_available():
            assert cudnn.driver(spec, torch.zeros(2, 8, device="cuda")) is compiled_loop_unroll
    torch._dynamo.reset()
    compiled = functools.partial(compiled_loop_unroll, backend="aot_eager")
    monkeypatch.setattr(cudnn, "driver", lambda spec, deter: compiled)
    with torch._dynamo.config.patch(error_on_recompile=False):
        check_observe_equals_loop(make("v3_2023"), "cudnn")
        test_imagine_with_actor_equals_loop("v3_2023", "bounded_normal", "cudnn")
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 2  # the observe and imagination steps


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_imagine_open_loop_equals_loop(backend):
    rssm = make("v1")
    start = TensorDict({"deter": torch.randn(B, 8), "stoch": torch.randn(B, 3)}, [B]).requires_grad_()
    actions = torch.randn(B, 4, A, requires_grad=True)
    noise = rssm.noise((B, 4))
    state, ref = start, []
    for h in range(4):
        state, prior = rssm.img_step(state, actions[:, h], noise[:, h])
        prior["action"] = actions[:, h]
        ref.append(prior)
    ref = torch.stack(ref, 1)
    want = grads(loss_of(ref), [actions, start["deter"]])
    out = rssm.imagine(start, 4, actions=actions, noise=noise, backend=backend)
    assert_tds_close(out, ref)
    assert_grads_close(grads(loss_of(out), [actions, start["deter"]]), want)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_no_grad_imagine_matches_grad_path(backend):
    rssm = make("v3")
    actor = wm.Actor(rssm.stoch_dim + rssm.deter_dim, A, hidden=8, layers=1, dist="onehot")
    start = rssm.initial(B)
    noise = rssm.noise((B, 3))
    noise["policy"] = actor.noise((B, 3))
    with_grad = rssm.imagine(start, 3, policy=actor, noise=noise, backend=backend)
    with torch.no_grad():
        without = rssm.imagine(start, 3, policy=actor, noise=noise, backend=backend)
    assert not without["deter"].requires_grad
    assert_tds_close(without, with_grad.detach())



@pytest.mark.parametrize("cfg,backend", [("v1", "loop"), ("v1", "cudnn"), ("block_gauss", "loop"),
                                         ("block_gauss", "cudnn")])
def test_gradcheck_float64(cfg, backend):
    """Gradients against finite differences. Not on scan: `test_observe_equals_loop_of_obs_step` holds
    its gradients (every parameter's too) to the loop's for these configs, and the loop's are checked here."""
    rssm = make(cfg, dtype=torch.float64)
    embed, action, is_first = inputs(batch=1, steps=3, dtype=torch.float64)
    embed, action = embed[..., :E].detach(), action.detach()
    embed = embed.requires_grad_()
    action = action.requires_grad_()
    noise = rssm.noise((1, 3))

    def fn(embed, action):
        post, prior = rssm.observe(embed, action, is_first, noise=noise, backend=backend)
        return post["stoch"], prior["mean"], prior["std"]

    assert torch.autograd.gradcheck(fn, (embed, action), eps=1e-6, atol=1e-5)


def test_noise_none_is_reproducible_under_manual_seed():
    rssm = make("v3")
    embed, action, is_first = inputs()
    torch.manual_seed(3)
    first, _ = rssm.observe(embed, action, is_first, backend="loop")
    torch.manual_seed(3)
    second, _ = rssm.observe(embed, action, is_first, backend="cudnn")
    torch.manual_seed(3)
    explicit, _ = rssm.observe(embed, action, is_first, noise=rssm.noise((B, T)), backend="loop")
    assert_tds_close(second, first)
    assert_tds_close(explicit, first)
    other, _ = rssm.observe(embed, action, is_first, backend="loop")
    assert not torch.equal(other["stoch"], first["stoch"])


@pytest.mark.parametrize("backend", ["scan", "cudnn"])
def test_non_canonical_inputs(backend):
    rssm = make("v1")
    embed, action, is_first = (t.detach() for t in inputs(batch=1))
    noise = rssm.noise((1, T))
    want, _ = rssm.observe(embed, action, is_first, noise=noise, backend="loop")
    odd_embed = embed.clone().as_strided(embed.shape, (7, E, 1))  # [1, T, E] contiguous, not canonical
    assert odd_embed.is_contiguous() and odd_embed.stride() != embed.stride()
    t_action = action.transpose(1, 2).contiguous().transpose(1, 2)  # a transposed view
    wide = torch.zeros(1, T, 2).bool()
    wide[..., 0] = is_first
    state = TensorDict({"deter": torch.zeros(8, 1).t(), "stoch": torch.zeros(1, 3)}, [1])  # non-canonical
    got, _ = rssm.observe(odd_embed, t_action, wide[..., 0], state=state, noise=noise, backend=backend)
    assert_tds_close(got, want)
    expanded_noise = TensorDict({k: v[:1].expand(3, *v.shape[1:]) for k, v in noise.items()}, [3, T])
    batch3, _ = rssm.observe(embed.expand(3, T, E), action.expand(3, T, A), is_first.expand(3, T),
                             noise=expanded_noise, backend=backend)
    for i in range(3):
        assert_tds_close(batch3[i : i + 1], want)


@pytest.mark.parametrize("backend", ["loop", "scan"])
def test_ensemble_vmap_equals_members(backend):
    members = [make("v3", seed=s) for s in range(3)]
    params, buffers = stack_module_state(members)
    base = copy.deepcopy(members[0]).to("meta")
    embed, action, is_first = (t.detach() for t in inputs())
    noise = members[0].noise((B, T))

    def run(p, b):
        post, prior = functional_call(base, (p, b), (embed, action, is_first), {"noise": noise, "backend": backend})
        return post["deter"], prior["logits"]

    deter, logits = vmap(run)(params, buffers)
    for i, member in enumerate(members):
        post, prior = member.observe(embed, action, is_first, noise=noise, backend="loop")
        torch.testing.assert_close(deter[i], post["deter"], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(logits[i], prior["logits"], atol=1e-5, rtol=1e-4)


class _Imagination(torch.nn.Module):
    """functional_call runs `forward`: an imagination rollout of an RSSM + actor pair."""

    def __init__(self, rssm, actor):
        super().__init__()
        self.rssm, self.actor = rssm, actor

    def forward(self, start, noise, backend):
        return self.rssm.imagine(start, noise.shape[1], policy=self.actor, noise=noise, backend=backend)["deter"]


@pytest.mark.parametrize("backend", ["loop", "scan"])
def test_ensemble_vmap_imagine(backend):
    members = []
    for s in range(2):
        rssm = make("v1", seed=s)
        members.append(_Imagination(rssm, wm.Actor(11, A, hidden=6, layers=1)))
    params, buffers = stack_module_state(members)
    base = copy.deepcopy(members[0]).to("meta")
    # each member starts from its own state (its own posterior, as in training)
    starts = TensorDict({"deter": torch.randn(2, B, 8), "stoch": torch.randn(2, B, 3)}, [2, B])
    noise = members[0].rssm.noise((B, 3))
    noise["policy"] = members[0].actor.noise((B, 3))
    out = vmap(lambda p, b, s: functional_call(base, (p, b), (s, noise, backend)))(params, buffers, starts)
    for i, member in enumerate(members):
        torch.testing.assert_close(out[i], member(starts[i], noise, "loop"), atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not torch_fixes.scan_compiles_correctly(),
                    reason=f"torch {torch.__version__}: scan under compile is refused (core/torch_fixes.py)")
def test_compiled_scan_has_no_graph_break_and_matches_eager():
    """fullgraph=True through observe + imagine on scan; values and gradients equal eager.

    The backend is aot_eager (Dynamo + AOTAutograd, the graph a compiled training step gets).
    With inductor on CPU, torch 2.13 gives wrong weight gradients for the posterior head of
    this scan body (values are right); see docs/recurrent-core.md."""
    rssm = make("v1")
    actor = wm.Actor(11, A, hidden=6, layers=1)
    embed, action, is_first = (t.detach() for t in inputs(batch=2, steps=3))
    noise = rssm.noise((2, 3))
    img_noise = rssm.noise((2, 2))
    img_noise["policy"] = actor.noise((2, 2))

    def step(embed, action, is_first, noise, img_noise):
        post, prior = rssm.observe(embed, action, is_first, noise=noise, backend="scan")
        start = post[:, -1].select("deter", "stoch")
        dream = rssm.imagine(start, 2, policy=actor, noise=img_noise, backend="scan")
        return (post["stoch"] ** 2).sum() + prior["std"].sum() + dream["deter"].pow(2).sum()

    params = list(rssm.parameters()) + list(actor.parameters())
    want = step(embed, action, is_first, noise, img_noise)
    want_grads = torch.autograd.grad(want, params)
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(embed, action, is_first, noise, img_noise)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert_grads_close(torch.autograd.grad(got, params), want_grads)


def test_compiles_with_dynamic_shapes():
    """A recompile marks batch and time dynamic: the input checks must trace with symbolic sizes."""
    rssm = make("v1")
    embed, action, is_first = (t.detach() for t in inputs(batch=3, steps=4))
    noise = rssm.noise((3, 4))
    observe = torch.compile(lambda *a: rssm.observe(*a, noise=noise, backend="loop")[0]["deter"],
                            fullgraph=True, dynamic=True, backend="aot_eager")
    torch.testing.assert_close(observe(embed, action, is_first),
                               rssm.observe(embed, action, is_first, noise=noise, backend="loop")[0]["deter"])


def test_resets_restart_from_initial_state():
    rssm = make("v1")
    embed, action, _ = (t.detach() for t in inputs(batch=2))
    is_first = torch.zeros(2, T, dtype=torch.bool)
    is_first[:, 2] = True
    noise = rssm.noise((2, T))
    full, _ = rssm.observe(embed, action, is_first, noise=noise, backend="loop")
    tail, _ = rssm.observe(embed[:, 2:], action[:, 2:], is_first[:, 2:], noise=noise[:, 2:], backend="loop")
    assert_tds_close(full[:, 2:], tail)


def test_bad_inputs_name_the_argument():
    rssm = make("v1")
    embed, action, is_first = (t.detach() for t in inputs())
    with pytest.raises(ValueError, match="embed"):
        rssm.observe(embed[0], action, is_first)
    with pytest.raises(ValueError, match="embed"):
        rssm.observe(embed[..., :2], action, is_first)
    with pytest.raises(ValueError, match="action"):
        rssm.observe(embed, action[:, :-1], is_first)
    with pytest.raises(ValueError, match="action"):
        rssm.observe(embed, action[:1], is_first)
    with pytest.raises(ValueError, match="action"):
        rssm.observe(embed, torch.randn(B, T, A + 1), is_first)
    with pytest.raises(TypeError, match="action"):
        rssm.observe(embed, action.long(), is_first)
    with pytest.raises(TypeError, match="is_first"):
        rssm.observe(embed, action, is_first.float())
    with pytest.raises(ValueError, match="is_first"):
        rssm.observe(embed, action, is_first[:, 1:])
    with pytest.raises(ValueError, match="noise"):
        rssm.observe(embed, action, is_first, noise=rssm.noise((B, T - 1)))
    with pytest.raises(ValueError, match="state"):
        rssm.observe(embed, action, is_first, state=rssm.initial(B + 1))
    start = rssm.initial(B)
    with pytest.raises(ValueError, match="exactly one of policy"):
        rssm.imagine(start, 3)
    with pytest.raises(ValueError, match="exactly one of policy"):
        rssm.imagine(start, 3, policy=lambda f, n: f[..., :A], actions=torch.zeros(B, 3, A))
    with pytest.raises(ValueError, match="actions"):
        rssm.imagine(start, 3, actions=torch.zeros(B, 2, A))
    with pytest.raises(ValueError, match="horizon"):
        rssm.imagine(start, 0, actions=torch.zeros(B, 0, A))
    with pytest.raises(ValueError, match="backend"):
        rssm.observe(embed, action, is_first, backend="fused")
    for kwargs, name in ((dict(cell="lstm"), "cell"), (dict(norm="batch"), "norm"), (dict(act="tanh"), "act"),
                         (dict(classes=1), "classes"), (dict(cell="block_gru", blocks=3), "blocks"),
                         (dict(deter=0), "deter"), (dict(backend="cuda"), "backend")):
        args = {**CONFIGS["v1"], **kwargs}
        with pytest.raises(ValueError, match=name):
            wm.RSSM(A, E, **args)


def test_plain_callable_policy_runs_with_its_noise():
    rssm = make("v1")
    weight = torch.randn(11, A)

    def policy(features, noise):
        return torch.tanh(features @ weight + 0.1 * noise)

    start = rssm.initial(B)
    noise = rssm.noise((B, 3))
    noise["policy"] = torch.randn(B, 3, A)
    outs = [rssm.imagine(start, 3, policy=policy, noise=noise, backend=b) for b in CPU_BACKENDS]
    for out in outs[1:]:
        assert_tds_close(out, outs[0])


# ---------------------------------------------------------------------------------- CUDA graphs
def check_captured_matches_loop(rssm, device, backend="cudnn"):
    """observe and imagine (grad and no-grad) on a capturing backend (cudnn; triton with grad)
    equal loop, values and gradients; each call twice with new inputs, so the second replays
    the cached capture."""
    params = list(rssm.parameters())
    for seed in (1, 2):
        embed, action, is_first = inputs(device=device, seed=seed)
        noise = rssm.noise((B, T))
        post_ref, prior_ref = rssm.observe(embed, action, is_first, noise=noise, backend="loop")
        want = grads(loss_of(post_ref) + loss_of(prior_ref), [embed, action, *params])
        post, prior = rssm.observe(embed, action, is_first, noise=noise, backend=backend)
        assert_tds_close(post, post_ref, atol=1e-4)
        assert_tds_close(prior, prior_ref, atol=1e-4)
        assert_grads_close(grads(loss_of(post) + loss_of(prior), [embed, action, *params]), want, atol=1e-4)
    actor = wm.Actor(rssm.stoch_dim + rssm.deter_dim, A, hidden=8, layers=2).to(device)
    start = post_ref[:, -1].select("deter", "stoch").detach()
    for _ in range(2):
        noise = rssm.noise((B, 4))
        noise["policy"] = actor.noise((B, 4))
        ref = rssm.imagine(start, 4, policy=actor, noise=noise, backend="loop")
        want = grads(loss_of(ref), list(actor.parameters()))
        out = rssm.imagine(start, 4, policy=actor, noise=noise, backend=backend)
        assert_tds_close(out, ref, atol=1e-4)
        assert_grads_close(grads(loss_of(out), list(actor.parameters())), want, atol=1e-4)
        with torch.no_grad():
            fast = rssm.imagine(start, 4, policy=actor, noise=noise, backend=backend)
        assert_tds_close(fast, ref.detach(), atol=1e-4)


@CUDA
@pytest.mark.parametrize("backend", ["cudnn", "triton"])
@pytest.mark.parametrize("cfg", ["v1", "v3"])
def test_graphs_match_loop_on_cuda(cfg, backend):
    check_captured_matches_loop(make(cfg, device="cuda"), "cuda", backend)


CAPTURING = ["cudnn"] + (["triton"] if "triton" in CPU_BACKENDS else [])


@pytest.mark.parametrize("backend", CAPTURING)
@pytest.mark.parametrize("cfg", ["v1", "v3"])
def test_capture_path_matches_loop_on_cpu(cfg, backend, graphs_on_cpu):
    rssm = make(cfg)
    check_captured_matches_loop(rssm, "cpu", backend)
    # one capture per signature: observe (grad), imagine (grad) and imagine (no-grad; triton too,
    # no-grad calls too)
    assert EagerGraph.made == 3 and len(rssm.unroll_cache) == 3


def test_graph_cache_drops_least_recently_used(graphs_on_cpu):
    rssm = make("v1")
    rssm.unroll_cache.max_entries = 2
    with torch.no_grad():
        def observe(batch):
            embed, action, is_first = inputs(batch=batch)
            return rssm.observe(embed, action, is_first, backend="cudnn")

        observe(1), observe(2), observe(1)     # two signatures, batch 1 used last
        observe(3)                             # evicts batch 2, the least recently used
        assert EagerGraph.made == 3 and len(rssm.unroll_cache) == 2
        observe(1)                             # still cached
        assert EagerGraph.made == 3
        observe(2)                             # captured again
        assert EagerGraph.made == 4 and len(rssm.unroll_cache) == 2


@CUDA
@pytest.mark.parametrize("backend", ["cudnn", "triton"])
def test_graph_replays_under_autocast_read_the_weights_of_their_call(backend, monkeypatch):
    """Under autocast a capture casts the weights itself (`cuda_graphs.no_autocast_cache`): a cast
    autocast cached before the capture would be read by every later replay, with the weights of
    that moment, from memory freed when its autocast region ended."""
    from worldmodels.core import cuda_graphs
    rssm = make("v1", device="cuda")
    embed, action, is_first = inputs(device="cuda")
    noise = rssm.noise((B, T))
    bf16 = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    with bf16():
        rssm.observe(embed, action, is_first, noise=noise, backend=backend)  # warm-up and capture
    with torch.no_grad():  # an optimiser step
        for p in rssm.parameters():
            p.mul_(1.1)
    with bf16():
        post, prior = rssm.observe(embed, action, is_first, noise=noise, backend=backend)  # a replay
    monkeypatch.setattr(cuda_graphs, "captures_graphs", lambda tensor: False)
    with bf16():
        want_post, want_prior = rssm.observe(embed, action, is_first, noise=noise, backend=backend)
    assert_tds_close(post.detach(), want_post.detach(), atol=1e-3)
    assert_tds_close(prior.detach(), want_prior.detach(), atol=1e-3)


@CUDA
def test_cudnn_graph_refuses_stale_backward():
    rssm = make("v1", device="cuda")
    embed, action, is_first = inputs(device="cuda")
    first, _ = rssm.observe(embed, action, is_first, backend="cudnn")
    rssm.observe(embed, action, is_first, backend="cudnn")  # replays the same graph again
    with pytest.raises(RuntimeError, match="replayed again before its backward"):
        first["deter"].sum().backward()


@pytest.mark.skipif("triton" not in CPU_BACKENDS,
                    reason="needs triton's interpreter on CPU tensors (the triton package, TRITON_INTERPRET=1, as "
                           "conftest sets on a CPU run); the capture path itself is covered for cudnn by "
                           "test_capture_path_matches_loop_on_cpu, and on CUDA by the tests above")
def test_triton_no_grad_capture_matches_loop_on_cpu(graphs_on_cpu, monkeypatch):
    """No-grad observe and imagine on the triton backend, replayed from a capture, equal
    loop, and each signature is captured once."""
    rssm = make("v3")
    actor = wm.Actor(rssm.stoch_dim + rssm.deter_dim, A, hidden=8, layers=2)
    with torch.no_grad():
        for seed in (1, 2):
            embed, action, is_first = inputs(seed=seed)
            noise = rssm.noise((B, T))
            want = rssm.observe(embed, action, is_first, noise=noise, backend="loop")
            got = rssm.observe(embed, action, is_first, noise=noise, backend="triton")
            for g, w in zip(got, want):
                assert_tds_close(g, w, atol=1e-4)
            start = want[0][:, -1].select("deter", "stoch")
            noise = rssm.noise((B, 4))
            noise["policy"] = actor.noise((B, 4))
            assert_tds_close(rssm.imagine(start, 4, policy=actor, noise=noise, backend="triton"),
                             rssm.imagine(start, 4, policy=actor, noise=noise, backend="loop"), atol=1e-4)
    assert EagerGraph.made == 2 and len(rssm.unroll_cache) == 2


@pytest.mark.skipif("triton" not in CPU_BACKENDS,
                    reason="needs triton's interpreter on CPU tensors (the triton package, TRITON_INTERPRET=1, as "
                           "conftest sets on a CPU run)")
def test_triton_capture_follows_an_actor_edited_in_place(graphs_on_cpu, monkeypatch):
    """A capture bakes the Actor's structure in, and an activation swapped in place changes no
    parameter: the capture key holds the Actor's description, so the next call captures again and
    computes the new activation. Hidden blocks that differ from each other (the kernel runs one
    structure for all) run on the reference, with a warning."""
    from worldmodels.ops import triton_utils
    monkeypatch.setattr(triton_utils, "_warned", set())
    rssm = make("v3")
    actor = wm.Actor(rssm.stoch_dim + rssm.deter_dim, A, hidden=8, layers=2, act="elu")
    with torch.no_grad():
        embed, action, is_first = inputs(seed=1)
        start = rssm.observe(embed, action, is_first, backend="loop")[0][:, -1].select("deter", "stoch")
        noise = rssm.noise((B, 4))
        noise["policy"] = actor.noise((B, 4))

        def check():
            assert_tds_close(rssm.imagine(start, 4, policy=actor, noise=noise, backend="triton"),
                             rssm.imagine(start, 4, policy=actor, noise=noise, backend="loop"), atol=1e-4)

        check()
        for block in actor.net[:-1]:
            block[2] = torch.nn.SiLU()
        check()
        assert EagerGraph.made == 2
        actor.net[1][2] = torch.nn.ELU()
        with pytest.warns(UserWarning, match="hidden blocks differ"):
            check()
        assert EagerGraph.made == 2


def test_the_2023_dense_gru_step_is_the_references():
    """`cell="norm_gru"`, written out as danijar/dreamerv3 423291a nets.RSSM computes a prior step:
    x = act(norm(W_in [stoch, action / max(1, |action|)])); gates = norm(W [deter, x]);
    deter' = u * tanh(sigmoid(r) * c) + (1 - u) * deter with u = sigmoid(update - 1)."""
    rssm = make("v3_2023")
    g = torch.Generator().manual_seed(3)
    deter, stoch = torch.randn(B, 8, generator=g), torch.randn(B, 12, generator=g)
    action = torch.rand(B, A, generator=g) * 3 - 1.5
    state = TensorDict({"deter": deter, "stoch": stoch}, batch_size=[B])
    got, _ = rssm.img_step(state, action)
    a = action / action.abs().clamp(min=1)
    x = torch.nn.functional.silu(rssm.in_out[0](rssm.in_stoch(stoch) + rssm.in_action(a)))
    gates = rssm.gates_norm(rssm.gates(torch.cat([deter, x], -1)))
    reset, cand, update = gates.chunk(3, -1)
    update = torch.sigmoid(update - 1)
    want = update * torch.tanh(torch.sigmoid(reset) * cand) + (1 - update) * deter
    torch.testing.assert_close(got["deter"], want)
    assert isinstance(rssm.gates_norm, torch.nn.LayerNorm) and rssm.gates.out_features == 3 * 8


def test_a_learned_initial_state_starts_every_episode_and_learns():
    """`initial="learned"` (the 2023 reference's `rssm.initial: learned`): at `is_first` the filter
    starts from deter0 = tanh(w), stoch0 = the prior's mode at deter0, with a zero action, whatever
    state it carried; the parameter gets gradients from the steps that start there."""
    rssm = make("v3_2023")
    with torch.no_grad():
        rssm.initial_deter.normal_()
    g = torch.Generator().manual_seed(4)
    embed, action = torch.randn(B, E, generator=g), torch.rand(B, A, generator=g) * 2 - 1
    first = torch.ones(B, dtype=torch.bool)
    noise = rssm.noise((B,))
    carried = [TensorDict({"deter": torch.randn(B, 8, generator=g), "stoch": torch.randn(B, 12, generator=g)},
                          batch_size=[B]) for _ in range(2)]
    a, _ = rssm.obs_step(carried[0], action, embed, first, noise=noise)
    b, _ = rssm.obs_step(carried[1], action, embed, first, noise=noise)
    deter0 = torch.tanh(rssm.initial_deter).expand(B, 8)
    logits = rssm.prior_head(deter0).unflatten(-1, (3, 4))
    stoch0 = torch.nn.functional.one_hot(logits.argmax(-1), 4).flatten(-2).float()
    start = TensorDict({"deter": deter0, "stoch": stoch0}, batch_size=[B])
    c, _ = rssm.obs_step(start, torch.zeros(B, A), embed, ~first, noise=noise)
    for key in ("deter", "stoch"):
        torch.testing.assert_close(a[key], b[key])
        torch.testing.assert_close(a[key], c[key])
    (grad,) = torch.autograd.grad(a["deter"].sum(), [rssm.initial_deter])
    assert grad.abs().sum() > 0
    assert not torch.equal(a["deter"], rssm.obs_step(carried[0], action, embed, ~first, noise=noise)[0]["deter"])
