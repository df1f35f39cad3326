"""Heads that work together (METHODS §18): each effect of `edge_sums` equals a direct hooked
forward of the real model (its eager twin) that patches only that channel of that receiver.

The reference is built here, independently of `model.layer_cache`, `model.channels` and the
study: the sender's slice of the output projection's input is replaced and the projection run
again (its change, through Gemma's norm on the attention output where the family has one, and
for post-norm families through the layer's own norms frozen at their clean scale, named below);
the receiver's channel projection (a module of its own, or the features of a fused one) is then
fed the changed input in a second forward, and the model's own `output_attentions` and the
receiver's slice of its output projection are read.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_architectures import CASES, FALCON_LEGACY, FIELDS, build, stack_batch
from test_capture import SENTENCES

from headprobe.core.errors import UsageError
from headprobe.model.discovery import attention_sites
from headprobe.model.gates import query_mask
from headprobe.model.layer_cache import clean_cache
from headprobe.model.projections import features_last
from headprobe.studies.composition.intervention import check_receivers, edge_sums, role_targets
from headprobe.studies.induction.analysis import NAME as INDUCTION
from headprobe.studies.previous_token.analysis import NAME as PREVIOUS_TOKEN

# Falcon is on the interface path from transformers 5.25 (FALCON_LEGACY empty), but its fused
# query_key_value beside ALiBi and its parallel blocks are not in this file's reference yet
LEGACY = {"deberta-v2", "mpnet", "bloom-alibi", "falcon-alibi", "squeezebert"}
INTERFACE = [(n, s) for n, s in CASES if n not in LEGACY and s != "cross"]
BERT_POST = ["encoder.layer.0.attention.output.LayerNorm", "encoder.layer.0.output.LayerNorm"]
ALBERT = "encoder.albert_layer_groups.0.albert_layers.0."
# the norms a write of layer 0 passes before layer 1 reads it, in order (post-norm families)
POST_NORMS = {
    ("bert", "encoder"): BERT_POST,
    ("roberta", "encoder"): BERT_POST,
    ("electra", "encoder"): BERT_POST,
    ("xlm-roberta", "encoder"): BERT_POST,
    ("distilbert", "encoder"): [
        "transformer.layer.0.sa_layer_norm",
        "transformer.layer.0.output_layer_norm",
    ],
    ("albert", "encoder"): [ALBERT + "attention.LayerNorm", ALBERT + "full_layer_layer_norm"],
    ("bart", "encoder"): [
        "encoder.layers.0.self_attn_layer_norm",
        "encoder.layers.0.final_layer_norm",
    ],
    ("bart", "decoder"): [
        "decoder.layers.0.self_attn_layer_norm",
        "decoder.layers.0.encoder_attn_layer_norm",
        "decoder.layers.0.final_layer_norm",
    ],
}
WRITE_NORMS = {
    "gemma2-softcap": "layers.0.post_attention_layernorm",
    "gemma3": "layers.0.post_attention_layernorm",
}
SEPARATE = {
    "q": ("q_proj", "query", "q_lin", "q"),
    "k": ("k_proj", "key", "k_lin", "k"),
    "v": ("v_proj", "value", "v_lin", "v"),
}
CHANNELS = ("q", "k", "v")
TOL = 1e-5
kept_slices: dict = {}  # the last reference's receiver layer slices (path patching)


def channel_projection(module, channel: str, heads: int, kv_heads: int, d_head: int):
    """(projection, output features of the channel or None for all) inside attention `module`."""
    for name in SEPARATE[channel]:
        found = getattr(module, name, None)
        if isinstance(found, torch.nn.Module):
            return found, None
    i = CHANNELS.index(channel)
    if hasattr(module, "c_attn"):  # GPT-2: q | k | v
        width = heads * d_head
        return module.c_attn, torch.arange(i * width, (i + 1) * width)
    if hasattr(module, "Wqkv"):  # ModernBERT: [3, head, d_head]
        width = heads * d_head
        return module.Wqkv, torch.arange(i * width, (i + 1) * width)
    if hasattr(module, "query_key_value"):  # GPT-NeoX: [head, 3, d_head]
        idx = torch.arange(heads * 3 * d_head).view(heads, 3, d_head)[:, i]
        return module.query_key_value, idx.flatten()
    if hasattr(module, "qkv_proj"):  # Phi-3: q | k | v with key/value heads
        sizes = [heads * d_head, kv_heads * d_head, kv_heads * d_head]
        start = sum(sizes[:i])
        return module.qkv_proj, torch.arange(start, start + sizes[i])
    raise AssertionError(f"no {channel} projection in {type(module).__name__}")


class Calls:
    """Hooks that act on one call of a (possibly shared) module only."""

    def __init__(self):
        self.handles = []

    def pre(self, module, call: int, fn, with_kwargs=False):
        count = [0]

        def hook(m, *a):
            count[0] += 1
            return fn(m, *a) if count[0] - 1 == call else None

        self.handles.append(module.register_forward_pre_hook(hook, with_kwargs=with_kwargs))

    def post(self, module, call: int, fn):
        count = [0]

        def hook(m, args, out):
            count[0] += 1
            return fn(m, args, out) if count[0] - 1 == call else None

        self.handles.append(module.register_forward_hook(hook))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


def probs_of(out, model, stack: str, layer: int) -> torch.Tensor:
    field = FIELDS[stack] if attention_sites(model).encoder_decoder else "attentions"
    return getattr(out, field)[layer].float()  # [batch, head, query, key]


def call_index(sites, module, layer: int) -> int:
    """Which call of `module` in a pass is `layer`'s (ALBERT's module serves every layer)."""
    return [s.layer for s in sites if s.module is module or s.output is module].index(layer)


@torch.no_grad()
def reference(built, inputs, stack, sender, receiver, channel, baseline):
    """([batch, query] total variation, [batch, query] relative write change, [batch, query]
    drop of the attention to the previous key) of receiver head r when channel `channel` of
    its layer reads the residual stream with sender s's slice replaced by `baseline` [d_head]."""
    model, name = built.eager, built.name
    sites = attention_sites(model).of(stack)
    (l, hs), (layer, r) = sender, receiver
    s_site, r_site = sites[l], sites[layer]
    kept: dict = {}
    with Calls() as c:
        c.pre(s_site.output, call_index(sites, s_site.output, l), lambda m, a: kept.update(z=a[0]))
        c.post(s_site.output, call_index(sites, s_site.output, l), lambda m, a, o: kept.update(a=o))
        c.pre(
            r_site.output,
            call_index(sites, r_site.output, layer),
            lambda m, a: kept.update(zr=a[0]),
        )
        if r_site.norm_in is not None:
            c.pre(r_site.norm_in, 0, lambda m, a: kept.update(x=a[0]))
        else:
            c.pre(
                r_site.module,
                call_index(sites, r_site.module, layer),
                lambda m, a, k: kept.update(x=a[0] if a else k["hidden_states"]),
                with_kwargs=True,
            )
        for norm in POST_NORMS.get((name, stack), []):
            c.pre(model.get_submodule(norm), 0, lambda m, a, n=norm: kept.update({n: a[0]}))
        out = model(**inputs, output_attentions=True)
    probs0 = probs_of(out, model, stack, layer)[:, r]
    z = features_last(s_site.output, kept["z"]).clone()  # [batch, piece, head * d_head]
    d = s_site.d_head
    z[..., hs * d : (hs + 1) * d] = baseline
    change = (
        features_last(s_site.output, s_site.output(features_last(s_site.output, z))) - kept["a"]
    )
    if name in WRITE_NORMS:
        norm = model.get_submodule(WRITE_NORMS[name])
        change = norm(kept["a"] + change) - norm(kept["a"])
    for norm_name in POST_NORMS.get((name, stack), []):
        norm, x = model.get_submodule(norm_name), kept[norm_name]
        change = change - change.mean(-1, keepdim=True)
        change = (
            change * norm.weight / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps)
        )
    tv, rel, drop = receiver_effects(built, inputs, stack, receiver, channel, kept, probs0, change)
    kept_slices[0] = kept["zp"]
    return tv, rel, drop


def receiver_effects(built, inputs, stack, receiver, channel, kept, probs0, change):
    """The receiver's ([batch, query] total variation, relative write change, drop of the
    attention to the previous key) when only its channel projection reads kept["x"] + change
    (kept: the clean stream "x" and the receiver's slice "zr"; the patched slice put in "zp")."""
    model = built.eager
    sites = attention_sites(model).of(stack)
    layer, r = receiver
    r_site = sites[layer]
    x = kept["x"] + change
    hidden = r_site.norm_in(x) if r_site.norm_in is not None else x
    proj, feats = channel_projection(
        r_site.module, channel, r_site.heads, r_site.kv_heads, r_site.d_head
    )

    def patch(m, a, o):
        new = m(hidden)
        if feats is None:
            return new
        o = o.clone()
        o[..., feats] = new[..., feats]
        return o

    with Calls() as c:
        c.post(proj, call_index(sites, r_site.module, layer), patch)
        c.pre(
            r_site.output,
            call_index(sites, r_site.output, layer),
            lambda m, a: kept.update(zp=a[0]),
        )
        out = model(**inputs, output_attentions=True)
    probs = probs_of(out, model, stack, layer)[:, r]  # [batch, query, key]
    tv = 0.5 * (probs - probs0).abs().sum(-1)
    write = lambda zz: head_write(r_site.output, zz, r, r_site.d_head)
    o0, o1 = write(kept["zr"]), write(kept["zp"])
    size = o0.norm(dim=-1)  # a row whose write is 0 (a zero embedding, e.g. a padding BOS) counts 0
    rel = torch.where(size > 0, (o1 - o0).norm(dim=-1) / size, 0.0)
    prev = torch.arange(probs.shape[1]).clamp_min(1) - 1
    drop = (probs0 - probs)[:, torch.arange(probs.shape[1]), prev]
    drop[:, 0] = 0.0
    return tv, rel, drop


def head_write(output, z, r: int, d: int) -> torch.Tensor:
    """[batch, piece, hidden]: head r's slice through the real output projection, bias removed."""
    z = features_last(output, z)
    only = torch.zeros_like(z)
    only[..., r * d : (r + 1) * d] = z[..., r * d : (r + 1) * d]
    run = lambda t: features_last(output, output(features_last(output, t)))
    return run(only) - run(torch.zeros_like(z))


@pytest.mark.parametrize("name,stack", INTERFACE)
def test_effects_equal_hooked_forward(name, stack):
    built = build(name)
    batch, inputs = stack_batch(built, SENTENCES, stack)
    sites = attention_sites(built.model).of(stack)
    rows = query_mask(inputs, stack).float()  # [batch, piece]
    cache = clean_cache(built.model, inputs, stack)
    rng = random.Random(f"composition:{name}:{stack}")
    gen = torch.Generator().manual_seed(0)
    means = torch.randn(len(sites), sites[0].heads, sites[0].d_head, generator=gen)
    for k in range(5):
        l, layer = 0, rng.randrange(1, len(sites))
        hs, r, channel = (
            rng.randrange(sites[0].heads),
            rng.randrange(sites[0].heads),
            rng.choice(CHANNELS),
        )
        baseline = means if k % 2 else None
        ids = inputs.get("decoder_input_ids") if stack == "decoder" else None
        targets = role_targets(PREVIOUS_TOKEN, inputs["input_ids"] if ids is None else ids)
        got = edge_sums(
            built.model, cache, layer, [(l, hs)], baseline, rows, {"prev": targets}, heads=[r]
        )
        tv, rel, drop = reference(
            built,
            inputs,
            stack,
            (l, hs),
            (layer, r),
            channel,
            0.0 if baseline is None else means[l, hs],
        )
        c = CHANNELS.index(channel)
        real = lambda t: torch.where(rows > 0, t, 0.0).sum(-1)  # padding rows left out
        triple = f"{name} {stack}: {l}-{hs} -> {layer}-{r} {channel}"
        torch.testing.assert_close(
            got.pattern[:, 0, 0, c], real(tv), atol=TOL, rtol=TOL, msg=triple
        )
        torch.testing.assert_close(
            got.output[:, 0, 0, c], real(rel), atol=TOL, rtol=TOL, msg=triple
        )
        torch.testing.assert_close(
            got.role["prev"][:, 0, 0, c], real(drop), atol=TOL, rtol=TOL, msg=triple
        )


@pytest.mark.parametrize("name", sorted(LEGACY - ({"falcon-alibi"} - FALCON_LEGACY)))
def test_legacy_family_refused_in_one_line(name):
    built = build(name)
    _, inputs = stack_batch(built, SENTENCES[:1], "decoder" if "alibi" in name else "encoder")
    with pytest.raises(UsageError, match="legacy path") as err:
        clean_cache(built.model, inputs)
    assert "\n" not in str(err.value) and type(built.model).__name__ in str(err.value)


@pytest.mark.parametrize(
    "receiver,message",
    [((0, 1), "first layer has no senders"), ((5, 0), "has 2 layers"), ((1, 9), "of 4 heads")],
)
def test_bad_receiver_refused_in_one_line(receiver, message):
    built = build("llama-gqa")
    _, inputs = stack_batch(built, SENTENCES[:1], "decoder")
    cache = clean_cache(built.model, inputs)
    with pytest.raises(UsageError, match=message) as err:
        check_receivers(cache, [receiver])
    assert "\n" not in str(err.value)


def test_cross_attention_refused():
    built = build("t5")
    _, inputs = stack_batch(built, SENTENCES[:1], "cross")
    with pytest.raises(UsageError, match="cross-attention"):
        clean_cache(built.model, inputs, "cross")


def test_weights_only_scores_equal_a_hand_computation():
    from headprobe.studies.composition.weights import composition_weights

    built = build("llama-gqa")
    model = built.model
    table = composition_weights(model, token_id=5)
    layers = model.layers
    d, heads, kv = 8, 4, 2

    def parts(i):
        a = layers[i].self_attn
        g = layers[i].input_layernorm.weight.double()[:, None]
        q = (g * a.q_proj.weight.double().T).unflatten(1, (heads, d)).transpose(0, 1)
        k = (g * a.k_proj.weight.double().T).unflatten(1, (kv, d)).transpose(0, 1)
        v = (g * a.v_proj.weight.double().T).unflatten(1, (kv, d)).transpose(0, 1)
        o = a.o_proj.weight.double().T.unflatten(0, (heads, d))  # [head, d_head, hidden]
        return q, k.repeat_interleave(2, 0), v.repeat_interleave(2, 0), o

    q1, k1, v1, o1 = parts(1)
    _, _, v0, o0 = parts(0)
    ratio = lambda a, b: float(
        torch.linalg.norm(a @ b) / (torch.linalg.norm(a) * torch.linalg.norm(b))
    )
    for row in table.itertuples():
        ov_s = v0[row.sender_head] @ o0[row.sender_head]  # [hidden, hidden]
        qk_r = q1[row.head] @ k1[row.head].T
        ov_r = v1[row.head] @ o1[row.head]
        pair = {"q": (ov_s, qk_r), "k": (qk_r, ov_s.T), "v": (ov_s, ov_r)}[row.channel]
        assert abs(row.score - ratio(*pair)) < 1e-6, row
    assert len(table) == 3 * 16 and (table["null_sd"] > 0).all()
    assert table["null_mean"].between(0, 1).all()


def test_weights_only_refuses_q_k_norms():
    from headprobe.studies.composition.weights import composition_weights

    with pytest.raises(UsageError, match="q/k norms"):
        composition_weights(build("qwen3").model, token_id=5)


@pytest.mark.parametrize(
    "name,stack", [("llama-gqa", "decoder"), ("bert", "encoder"), ("t5-encoder", "encoder")]
)
def test_exact_path_patching_equals_hooked_forward(name, stack):
    """Pre-norm with grouped-query attention, post-norm (frozen-norm reference) and T5's
    relative position bias."""
    from headprobe.model.objectives import Objective
    from headprobe.studies.composition.path_patching import exact_rows

    built = build(name)
    batch, inputs = stack_batch(built, SENTENCES, stack)
    model = built.model
    cache = clean_cache(model, inputs, stack)
    objective = Objective.for_model(model, kind="representation", stack=stack)
    targets = objective.targets(model, batch)
    edges = [((0, 3), (1, 1), "k"), ((0, 0), (1, 2), "q"), ((0, 1), (1, 0), "v")]
    got, tokens = exact_rows(model, cache, objective, targets, edges)
    site = attention_sites(built.eager).of(stack)[1]
    rows = query_mask(inputs, stack).float()
    with torch.no_grad():
        h0 = built.eager(**inputs).last_hidden_state
    for e, (sender, receiver, channel) in enumerate(edges):
        reference(built, inputs, stack, sender, receiver, channel, 0.0)
        want = patched_representation(built, inputs, site, kept_slices[0], receiver[1], rows, h0)
        torch.testing.assert_close(got[:, e], want, atol=TOL, rtol=1e-4, msg=f"{name} {e}")
        assert float(want.abs().sum()) > 0


def patched_representation(built, inputs, site, zp, r, rows, h0) -> torch.Tensor:
    """[batch] the representation objective's change (1 - cosine of the last hidden state, over
    the scored rows) when only head r's slice at `site` is `zp`'s (a hooked forward)."""
    d = site.d_head

    def put(m, a):
        z = features_last(m, a[0]).clone()
        z[..., r * d : (r + 1) * d] = features_last(m, zp)[..., r * d : (r + 1) * d]
        return (features_last(m, z),)

    handle = site.output.register_forward_pre_hook(put)
    try:
        with torch.no_grad():
            h1 = built.eager(**inputs).last_hidden_state
    finally:
        handle.remove()
    change = 1 - torch.nn.functional.cosine_similarity(h1, h0, dim=-1)
    live = rows * (h0.norm(dim=-1) > 0)  # a zero hidden state (a padding BOS) has no angle
    return (change * live).sum(-1)


class Readout:
    """A test objective with a gradient at the clean state: a fixed random readout of the last
    hidden state, summed over each row's real pieces (`per_row` as `Objective.per_row`)."""

    def __init__(self, hidden: int):
        self.v = torch.randn(hidden, generator=torch.Generator().manual_seed(3))

    def targets(self, model, batch):
        from types import SimpleNamespace

        from headprobe.model.gates import model_inputs

        return SimpleNamespace(inputs=model_inputs(batch, None, model))

    def pieces(self, targets):
        return query_mask(targets.inputs, "encoder").float().sum(-1)

    def per_row(self, model, targets):
        h = model(**targets.inputs).last_hidden_state.float()  # [batch, piece, hidden]
        mask = query_mask(targets.inputs, "encoder").float()  # [batch, piece]
        return ((h @ self.v) * mask).sum(-1), mask.sum(-1)


def hand_first_order(built, inputs, sender, receiver, channel, readout) -> torch.Tensor:
    """[batch]: d readout_b / dt at t = 0 when only head r's channel reads x + t * d_s (d_s: the
    sender's zero-ablation change of the residual), by autograd through the eager model."""
    from types import SimpleNamespace

    model = built.eager
    sites = attention_sites(model).of("decoder")
    (l, hs), (layer, r) = sender, receiver
    s_site, r_site = sites[l], sites[layer]
    kept: dict = {}
    with torch.no_grad(), Calls() as c:
        c.pre(s_site.output, 0, lambda m, a: kept.update(z=a[0]))
        c.post(s_site.output, 0, lambda m, a, o: kept.update(a=o))
        c.pre(r_site.norm_in, 0, lambda m, a: kept.update(x=a[0]))
        model(**inputs)
        d = s_site.d_head
        z = kept["z"].clone()
        z[..., hs * d : (hs + 1) * d] = 0.0
        change = s_site.output(z) - kept["a"]  # [batch, piece, hidden]
    proj, feats = channel_projection(
        r_site.module, channel, r_site.heads, r_site.kv_heads, r_site.d_head
    )
    k = r if channel == "q" else r // (r_site.heads // r_site.kv_heads)  # its key/value group
    own = torch.arange(k * d, (k + 1) * d)
    own = own if feats is None else feats[own]
    t = torch.zeros((), requires_grad=True)

    def patch(m, a, o):
        new = m(r_site.norm_in(kept["x"] + t * change))
        o = o.clone()
        o[..., own] = new[..., own]
        return o

    with torch.enable_grad(), Calls() as c:
        c.post(proj, 0, patch)
        values, _ = readout.per_row(model, SimpleNamespace(inputs=inputs))
        return torch.stack(
            [torch.autograd.grad(v, t, retain_graph=True)[0] for v in values]
        ).detach()


@pytest.mark.parametrize(
    "name,channels", [("llama-gqa", "q"), ("gpt-neox", "qkv"), ("llama-gqa", "kv")]
)
def test_first_order_estimate_equals_autograd(name, channels):
    """The estimate of each edge is the objective's derivative along the sender's change of
    the receiver's channel input. Separate or fused projections; a grouped-query key or value
    is its group's, so there the hand computation gives the sum over the group's heads."""
    from types import SimpleNamespace

    from headprobe.studies.composition.first_order import input_gradients, slice_gradients

    built = build(name)
    _, inputs = stack_batch(built, SENTENCES, "decoder")
    model = built.model
    site = attention_sites(model).of("decoder")[1]
    readout = Readout(model.config.hidden_size)
    cache = clean_cache(model, inputs, "decoder")
    grad_z = slice_gradients(model, cache, readout, SimpleNamespace(inputs=inputs), rows=2)
    grads = input_gradients(model, cache, 1, grad_z)  # [channel, head, batch, piece, hidden]
    groups = site.heads // site.kv_heads
    rows = query_mask(inputs, "decoder").float()
    for sender, r in [((0, 1), 2), ((0, 3), 0)]:
        got = edge_sums(model, cache, 1, [sender], None, rows, grads=grads).estimate
        for channel in channels:
            c = CHANNELS.index(channel)
            want = hand_first_order(built, inputs, sender, (1, r), channel, readout)
            shared = channel != "q" and groups > 1
            if shared:  # the hand patch moves the group's key (value) for all of its heads
                group = range(r // groups * groups, (r // groups + 1) * groups)
                mine = got[:, 0, list(group), c].sum(-1)
            else:
                mine = got[:, 0, r, c]
            torch.testing.assert_close(mine, want, atol=1e-4, rtol=1e-4, msg=f"{sender} {r}")
            assert float(want.abs().sum()) > 1e-3


def test_streamed_sums_add_up_per_unit_and_make_tables():
    """Two batches stream into the same per unit sums as one; the tables come out with their
    intervals, p_holm and the check of the estimate against exact path patching."""
    from headprobe.model.gates import head_means
    from headprobe.studies.composition.sweep import composition_sums
    from headprobe.studies.composition.tables import composition, edges_frame

    built = build("llama-gqa")
    model = built.model
    whole, _ = stack_batch(built, SENTENCES, "decoder")
    halves = [stack_batch(built, SENTENCES[:2], "decoder")[0]]
    halves.append(stack_batch(built, SENTENCES[2:], "decoder")[0])
    for i, e in enumerate(halves[1].examples):  # the same unit ids as in `whole`
        e.unit = f"s{i + 2}"
    readout = Readout(model.config.hidden_size)
    means = head_means(model, [whole])
    one = composition_sums(model, [whole], baseline=means, objective=readout)
    two = composition_sums(model, halves, baseline=means, objective=readout)
    assert one.units == two.units and one.edges == two.edges
    for key in ("pattern", "output", "estimate", "rows", "tokens"):
        np.testing.assert_allclose(getattr(one, key), getattr(two, key), rtol=1e-4, atol=1e-5)
    assert len(one.edges) == 4 * 4 * 3 and one.pattern.shape == (len(SENTENCES), 48)
    table = edges_frame(one, "mean", roles={(1, 0): PREVIOUS_TOKEN})
    for effect in ("pattern_effect", "output_effect", "role_effect"):
        assert {f"{effect}_low", f"{effect}_high"} <= set(table.columns)
    assert table["pattern_effect"].notna().all() and table["p_holm"].between(0, 1).all()
    want = one.pattern.sum(0) / one.rows.sum()
    np.testing.assert_allclose(table["pattern_effect"], want, rtol=1e-6)
    assert (table["pattern_effect_low"] <= table["pattern_effect_high"]).all()
    assert table.loc[table["head"] == 0, "role_effect"].notna().all()
    assert table.loc[table["head"] != 0, "role_effect"].isna().all()
    frames = composition(model, [whole], baseline=means, objective=readout, token_id=5)
    check, corr = frames["composition_check"], frames["composition_check_correlation"]
    assert len(check) == 30 and set(check["sample"]) == {"top", "random"}
    assert len(corr) == 1 and -1 <= corr["spearman"].iloc[0] <= 1
    assert len(frames["composition_weights"]) == 48


def test_the_representation_change_has_no_first_order_estimate(monkeypatch):
    """The representation change 1 - cos(h', h) is at its minimum at the intact model: its
    gradient at every head's slice is 0 (autograd, against a readout's that is not), so the
    sweep takes no backward pass for it; the edges' estimate is NaN and the check lists the
    exact values alone, its correlation row saying why."""
    from types import SimpleNamespace

    from headprobe.model.gates import head_means
    from headprobe.model.objectives import Objective
    from headprobe.studies.composition import first_order, sweep
    from headprobe.studies.composition.tables import composition

    built = build("bert")
    model = built.model
    batch, inputs = stack_batch(built, SENTENCES, "encoder")
    cache = clean_cache(model, inputs, "encoder")
    objective = Objective.for_model(model, kind="representation", stack="encoder")
    assert not first_order.has_estimate(objective)
    assert first_order.has_estimate(Readout(model.config.hidden_size))
    targets = objective.targets(model, batch)
    zero = first_order.slice_gradients(model, cache, objective, targets)
    readout = Readout(model.config.hidden_size)
    other = first_order.slice_gradients(model, cache, readout, SimpleNamespace(inputs=inputs))
    assert float(other.abs().max()) > 1e-3
    assert float(zero.abs().max()) < 1e-6 * float(other.abs().max())

    def no_backward(*args, **kwargs):
        raise AssertionError("a backward pass for the representation change")

    monkeypatch.setattr(sweep, "slice_gradients", no_backward)
    monkeypatch.setattr(sweep, "input_gradients", no_backward)
    means = head_means(model, [batch])
    frames = composition(model, [batch], "mean", means, objective=objective, stack="encoder")
    edges = frames["composition_edges"]
    assert len(edges) == 4 * 4 * 3 and edges["estimate"].isna().all()
    assert edges["output_effect"].notna().all() and (edges["output_effect"] > 0).any()
    check, corr = frames["composition_check"], frames["composition_check_correlation"]
    assert len(check) == 30 and check["estimate"].isna().all()
    assert check["exact"].notna().all() and (check["exact"].abs() > 0).any()
    assert len(corr) == 1 and np.isnan(corr["spearman"].iloc[0])
    assert corr["warning"].iloc[0] == first_order.NO_ESTIMATE


def test_a_batch_in_blocks_of_rows_gives_the_same_sums(monkeypatch):
    """A batch longer than `ROW_PIECES` pieces in all is swept (and patched exactly) in blocks
    of rows; its per unit sums are those of the batch swept whole."""
    from headprobe.model.gates import head_means
    from headprobe.studies.composition import sweep

    built = build("llama-gqa")
    model = built.model
    whole, _ = stack_batch(built, SENTENCES, "decoder")
    readout = Readout(model.config.hidden_size)
    means = head_means(model, [whole])
    one = sweep.composition_sums(model, [whole], baseline=means, objective=readout)
    edges = one.edges[:5]
    exact = sweep.exact_sums(model, [whole], edges, means, readout)
    seen = []
    monkeypatch.setattr(sweep, "ROW_PIECES", whole.input_ids.shape[1])  # a row a block
    real = sweep.batch_sums
    monkeypatch.setattr(
        sweep, "batch_sums", lambda m, b, *a, **k: seen.append(len(b)) or real(m, b, *a, **k)
    )
    blocks = sweep.composition_sums(model, [whole], baseline=means, objective=readout)
    assert seen == [1] * len(SENTENCES)  # swept a row at a time
    assert one.units == blocks.units and one.edges == blocks.edges
    for key in ("pattern", "output", "estimate", "rows", "tokens"):
        np.testing.assert_allclose(getattr(one, key), getattr(blocks, key), rtol=1e-4, atol=1e-5)
    in_blocks = sweep.exact_sums(model, [whole], edges, means, readout)
    assert exact[0] == in_blocks[0]
    np.testing.assert_allclose(exact[1], in_blocks[1], rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(exact[2], in_blocks[2])


ANALYSES = Path(__file__).resolve().parents[1] / "analyses"


@pytest.mark.slow
def test_olsson_model_finds_the_textbook_k_composition(tmp_path):
    """Acceptance 3: on the Olsson script's trained 2-layer model the best induction head's top
    key sender is the best previous-token head, with an interval that excludes 0."""
    sys.path.insert(0, str(ANALYSES))
    try:
        import elhage2021_composition as script
    finally:
        sys.path.remove(str(ANALYSES))
    assert script.main(["--skip-smollm2", "--out", str(tmp_path)]) == 0


def independent_drops(model, batch, length, sender, receiver, means):
    """[batch] summed drop of receiver's induction attention (repeated half) when only its key
    projection reads the residual with the sender's slice of o_proj's input set to its mean;
    Llama modules and hooks only (no headprobe code), the forward stopped after the receiver."""
    (ls, hs), (lr, hr) = sender, receiver
    layers = model.model.layers
    s_attn, r_layer = layers[ls].self_attn, layers[lr]
    d = s_attn.head_dim

    class Stop(Exception):
        pass

    def forward(extra=None):
        kept = {}
        hooks = [
            s_attn.o_proj.register_forward_pre_hook(lambda m, a: kept.update(z=a[0])),
            r_layer.input_layernorm.register_forward_pre_hook(lambda m, a: kept.update(x=a[0])),
        ]

        def stop(m, a, o):
            kept["p"] = o[1][:, hr].float()  # [batch, query, key]
            raise Stop

        hooks.append(r_layer.self_attn.register_forward_hook(stop))
        if extra is not None:
            hooks.append(r_layer.self_attn.k_proj.register_forward_hook(lambda m, a, o: extra))
        try:
            with torch.no_grad():
                model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        except Stop:
            pass
        finally:
            for h in hooks:
                h.remove()
        return kept

    clean = forward()
    z = clean["z"].clone()
    z[..., hs * d : (hs + 1) * d] = means[ls, :, hs]
    with torch.no_grad():
        change = s_attn.o_proj(z) - s_attn.o_proj(clean["z"])
        k = r_layer.self_attn.k_proj(r_layer.input_layernorm(clean["x"] + change))
    patched = forward(k)
    i = torch.arange(clean["p"].shape[1])
    ids = batch.input_ids[0].tolist()
    half = next(p for p in range(length, len(ids)) if ids[p - length : p] == ids[p : p + length])
    target = (i - length + 1).clamp_min(0)  # the key after the earlier copy
    rows = (i >= half) & (batch.attention_mask[0] > 0)
    drop = clean["p"][:, i, target] - patched["p"][:, i, target]  # [batch, query]
    return (drop * rows).sum(-1)


@pytest.mark.slow
def test_smollm2_key_edges_match_independent_hooks():
    """Held out in spirit (acceptance 2): for SmolLM2's strongest induction head, the drop of
    its induction attention per key sender (every head of the three layers below it) ranks
    the senders as an independent hooked implementation does (Spearman >= 0.8), with the same
    top sender."""
    from scipy.stats import spearmanr

    from headprobe.model.gates import head_means
    from headprobe.model.loading import load_lm
    from headprobe.studies.composition.sweep import composition_sums, probe_batches
    from headprobe.studies.composition.tables import edges_frame, role_score_table

    model, tokenizer, _, _ = load_lm("smollm2", attn_implementation="eager")
    length = 30
    batches = probe_batches(model, tokenizer, length, 6, 6)
    means = head_means(model, batches, per_position=True)
    scout = composition_sums(model, batches, [(1, 0)], means)
    scores = role_score_table(scout)
    ind = scores[(scores["role"] == INDUCTION) & (scores["layer"] >= 3)]
    top = ind.sort_values("score", ascending=False).iloc[0]
    receiver = (int(top["layer"]), int(top["head"]))
    sums = composition_sums(model, batches, [receiver], means)
    edges = edges_frame(sums, "mean", {receiver: INDUCTION})
    keys = edges[(edges["channel"] == "k") & (edges["sender_layer"] >= receiver[0] - 3)]
    mine, theirs = [], []
    for r in keys.itertuples():
        drops = independent_drops(
            model, batches[0], length, (r.sender_layer, r.sender_head), receiver, means
        )
        rows = sums.role_rows[INDUCTION].sum()
        mine.append(r.role_effect)
        theirs.append(float(drops.sum()) / rows)
    rho = spearmanr(mine, theirs).statistic
    assert rho >= 0.8, (receiver, rho)
    assert int(np.argmax(mine)) == int(np.argmax(theirs))
    np.testing.assert_allclose(mine, theirs, atol=1e-4)


WRITE_NORM_FAMILIES = set(WRITE_NORMS)
SHORTCUT = [(n, s) for n, s in INTERFACE if n not in WRITE_NORM_FAMILIES]


@pytest.mark.parametrize("name,stack", SHORTCUT)
def test_shortcut_equals_general_path(name, stack):
    """The d_head-space shortcut (`model.projected`) gives every effect and estimate of the
    general path (the whole changed stream through the receiver layer's norm and projections),
    on every family where it applies: every sender of every layer below the last, every
    receiver head, a per-position mean baseline and per-row rows."""
    built = build(name)
    _, inputs = stack_batch(built, SENTENCES, stack)
    model = built.model
    cache = clean_cache(model, inputs, stack)
    rows = query_mask(inputs, stack).float()
    layer = len(cache.sites) - 1
    z = cache.slices[0]  # [batch, piece, head, d_head]
    gen = torch.Generator().manual_seed(1)
    means = torch.randn(len(cache.sites), z.shape[1], z.shape[2], z.shape[3], generator=gen)
    ids = inputs.get("decoder_input_ids") if stack == "decoder" else None
    targets = {"prev": role_targets(PREVIOUS_TOKEN, inputs["input_ids"] if ids is None else ids)}
    grads = torch.randn(3, z.shape[2], *cache.x[layer].shape, generator=gen)
    fast = edge_sums(model, cache, layer, None, means, rows, targets, grads=grads)
    assert cache.shortcuts.get(layer) is not None, f"{name}: the shortcut did not apply"
    slow = edge_sums(model, cache, layer, None, means, rows, targets, grads=grads, general=True)
    for key in ("pattern", "output", "estimate"):
        torch.testing.assert_close(
            getattr(fast, key), getattr(slow, key), atol=TOL, rtol=TOL, msg=f"{name} {key}"
        )
    torch.testing.assert_close(fast.role["prev"], slow.role["prev"], atol=TOL, rtol=TOL)
    assert float(fast.pattern.abs().sum()) > 0 and float(fast.output.abs().sum()) > 0


@pytest.mark.parametrize("name", sorted(WRITE_NORM_FAMILIES))
def test_write_norm_families_keep_the_general_path(name):
    """A norm on the attention output (Gemma-2/3) makes a sender's change nonlinear in its
    slice: the shortcut is not tried there."""
    built = build(name)
    _, inputs = stack_batch(built, SENTENCES, "decoder")
    cache = clean_cache(built.model, inputs, "decoder")
    edge_sums(built.model, cache, 1, [(0, 0)])
    assert 1 not in cache.shortcuts


@pytest.mark.parametrize(
    "name,stack", [("llama-gqa", "decoder"), ("bert", "encoder"), ("t5", "decoder")]
)
def test_resample_effects_equal_hooked_forward(name, stack):
    """Resample ablation: each row's sender slice is replaced by its own baseline (a partner's
    slices, [batch, layer, piece, head, d_head]); every effect equals the hooked forward."""
    built = build(name)
    _, inputs = stack_batch(built, SENTENCES, stack)
    rows = query_mask(inputs, stack).float()
    cache = clean_cache(built.model, inputs, stack)
    z = cache.slices[0]  # [batch, piece, head, d_head]
    gen = torch.Generator().manual_seed(2)
    per_row = torch.randn(z.shape[0], len(cache.sites), *z.shape[1:], generator=gen)
    ids = inputs.get("decoder_input_ids") if stack == "decoder" else None
    targets = role_targets(PREVIOUS_TOKEN, inputs["input_ids"] if ids is None else ids)
    for sender, r, channel in [((0, 1), 2, "k"), ((0, 3), 0, "q"), ((0, 2), 1, "v")]:
        got = edge_sums(built.model, cache, 1, [sender], per_row, rows, {"prev": targets}, [r])
        want = reference(
            built, inputs, stack, sender, (1, r), channel, per_row[:, sender[0], :, sender[1]]
        )
        c = CHANNELS.index(channel)
        real = lambda t: torch.where(rows > 0, t, 0.0).sum(-1)
        for value, ref in zip((got.pattern, got.output, got.role["prev"]), want):
            torch.testing.assert_close(value[:, 0, 0, c], real(ref), atol=TOL, rtol=TOL)
        assert float(got.output[:, 0, 0, c].abs().sum()) > 0


def test_resampled_pairs_rows_and_skips_the_unpaired():
    """`sweep.resampled`: a row is ablated with its partner's slices (the keyed pairing of
    `studies.ablation.kinds.Baselines`, inputs of one length); a row alone at its length is
    left out of every sum."""
    from test_capture import make_batch

    from headprobe.inputs.batching import Batch
    from headprobe.model.gates import head_slices
    from headprobe.studies.ablation.kinds import Baselines
    from headprobe.studies.composition.sweep import composition_sums, resampled

    built = build("llama-gqa")
    model = built.model
    words = [SENTENCES[0], list(reversed(SENTENCES[0])), SENTENCES[1], SENTENCES[0][::2][:5]]
    pad = built.tokenizer.pad_token_id or 0
    batch = make_batch(built.tokenizer, words, pad)
    baselines = Baselines(("resample",), seed=0)
    baselines.read(model, built.tokenizer, batch.examples)
    readout = Readout(model.config.hidden_size)
    sums = composition_sums(model, [batch], [(1, 0)], resampled(baselines), readout)
    lengths = [len(a) for a in batch.alignments]
    paired = [f"s{i}" for i in range(4) if lengths.count(lengths[i]) > 1]
    assert sorted(sums.units) == sorted(paired) and len(paired) >= 2
    assert len(paired) < 4, "the test needs a row without a partner"
    kept = [i for i in range(4) if f"s{i}" in paired]
    sub = Batch([batch.examples[i] for i in kept], [batch.alignments[i] for i in kept], 0)
    partners = [baselines.partners[batch.examples[i].unit] for i in kept]  # (example, alignment)
    assert all(p[0].unit != batch.examples[i].unit for p, i in zip(partners, kept))
    partner_batch = Batch([p[0] for p in partners], [p[1] for p in partners], 0)
    values = head_slices(model, partner_batch)
    want = composition_sums(model, [sub], [(1, 0)], values, readout)
    order = [want.units.index(u) for u in sums.units]
    np.testing.assert_allclose(sums.output, want.output[order], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sums.pattern, want.pattern[order], rtol=1e-5, atol=1e-6)
    assert float(np.abs(sums.output).sum()) > 0


def test_exact_causal_lm_equals_a_full_forward():
    """Exact path patching with the language-model loss: the layers below the receiver replay
    their clean outputs and the logits are taken at the scored pieces only; each edge's value
    equals a full gated forward of the whole model with `Objective.per_row`."""
    from transformers import LlamaForCausalLM

    from headprobe.model.gates import HeadGates
    from headprobe.model.objectives import Objective
    from headprobe.studies.composition.path_patching import (
        changed_slice,
        clean_pass,
        exact_rows,
        layer_blocks,
    )

    built = build("llama-gqa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(built.model.config).eval()
    batch, _ = stack_batch(built, SENTENCES, "decoder")
    objective = Objective.for_model(model, kind="causal_lm", stack="decoder")
    targets = objective.targets(model, batch)
    cache = clean_cache(model, targets.inputs, "decoder")
    assert layer_blocks(model, cache.sites) is not None
    edges = [((0, 3), (1, 1), "k"), ((0, 0), (1, 2), "q"), ((0, 1), (1, 0), "v")]
    got, tokens = exact_rows(model, cache, objective, targets, edges)
    with torch.no_grad():
        clean, want_tokens = objective.per_row(model, targets)
        for e, edge in enumerate(edges):
            base = torch.stack([cache.slices[l] for l in range(2)], 1).clone()
            base[:, 1, :, edge[1][1]] = changed_slice(model, cache, edge)
            gates = torch.ones(base.shape[0], 2, 4)
            gates[:, 1, edge[1][1]] = 0.0
            with HeadGates(model, gates, base, "decoder"):
                patched, _ = objective.per_row(model, targets)
            torch.testing.assert_close(got[:, e], patched - clean, atol=1e-5, rtol=1e-4)
            assert float((patched - clean).abs().sum()) > 0
    torch.testing.assert_close(tokens, want_tokens)
    # the layers' outputs kept from the cache's own pass: the same values, and the clean
    # objective runs no layer (one attention call fewer per layer)
    calls = []
    sites = attention_sites(model).of("decoder")
    hooks = [s.module.register_forward_pre_hook(lambda m, a: calls.append(m)) for s in sites]
    try:
        exact_rows(model, cache, objective, targets, edges)
        plain = len(calls)
        cache, kept = clean_pass(model, targets.inputs, "decoder")
        calls.clear()
        replayed, _ = exact_rows(model, cache, objective, targets, edges, kept=kept)
    finally:
        for h in hooks:
            h.remove()
    assert len(kept) == 2 and plain - len(calls) == 2
    torch.testing.assert_close(replayed, got, atol=1e-6, rtol=1e-5)


def test_shortcut_check_rejects_a_wrong_shortcut():
    """The per-layer check of the shortcut can fail: a gain off by 1% (or a module that reads
    its hidden states elsewhere, shown by the NaN stand-in) sends the layer to the general
    path."""
    from headprobe.model import projected

    built = build("llama-gqa")
    _, inputs = stack_batch(built, SENTENCES, "decoder")
    cache = clean_cache(built.model, inputs, "decoder")
    short = projected._build(built.model, cache, 1)
    assert projected._check(built.model, cache, short)
    short.weight = short.weight * 1.01
    assert not projected._check(built.model, cache, short)
    short = projected._build(built.model, cache, 1)
    short.modules = short.modules[:2]  # v_proj now runs on the NaN stand-in
    short.widths = short.widths[:2]
    assert not projected._check(built.model, cache, short)
