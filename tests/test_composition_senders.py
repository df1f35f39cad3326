"""MLP and embeddings senders (METHODS §18, `--senders heads,mlp,embed`): each effect of
`edge_sums` equals a direct hooked forward of the real model (its eager twin) on every
"interface" family, and the run writes their rows.

The reference is built here from the real modules, independently of `model.layer_cache`,
`model.mlp_writes` and the study. MLP sender (layer 0): pre-norm families run the model with the
MLP module's output replaced by its ablation value (a forward hook; Gemma's norm on the MLP
output runs on it) and read the residual stream entering the receiver's layer; post-norm
families carry the change through the norms after the MLP, frozen at their clean scale (§12).
Embeddings: the stream entering layer 0 is replaced by its ablation value in the receiver's
channel only (post-norm: through layer 0's norms, frozen). Then the receiver's channel
projection alone is fed the changed input in a second forward, as `test_composition.reference`
does for heads.
"""

from __future__ import annotations

import random

import pytest
import torch
from test_architectures import build, stack_batch
from test_capture import SENTENCES
from test_composition import (
    ALBERT,
    CHANNELS,
    INTERFACE,
    POST_NORMS,
    TOL,
    Calls,
    call_index,
    patched_representation,
    probs_of,
    receiver_effects,
)

from headprobe.model.discovery import attention_sites
from headprobe.model.gates import query_mask
from headprobe.model.layer_cache import clean_cache
from headprobe.studies.composition.intervention import edge_sums, role_targets
from headprobe.studies.composition.run_options import EMBED, MLP_HEAD
from headprobe.studies.composition.senders import Baseline, every_sender
from headprobe.studies.previous_token.analysis import NAME as PREVIOUS_TOKEN

BERT_MLP = "encoder.layer.0.output.dense"
T5_ENCODER = "encoder.block.0.layer.1.DenseReluDense"
# layer 0's MLP write module, named by hand per family (the reference does not search)
MLP = {
    ("bert", "encoder"): BERT_MLP,
    ("roberta", "encoder"): BERT_MLP,
    ("electra", "encoder"): BERT_MLP,
    ("xlm-roberta", "encoder"): BERT_MLP,
    ("distilbert", "encoder"): "transformer.layer.0.ffn",
    ("albert", "encoder"): ALBERT + "ffn_output",
    ("modernbert", "encoder"): "layers.0.mlp",
    ("gpt2", "decoder"): "h.0.mlp",
    ("opt", "decoder"): "decoder.layers.0.fc2",
    ("t5", "encoder"): T5_ENCODER,
    ("t5-encoder", "encoder"): T5_ENCODER,
    ("t5", "decoder"): "decoder.block.0.layer.2.DenseReluDense",
    ("bart", "encoder"): "encoder.layers.0.fc2",
    ("bart", "decoder"): "decoder.layers.0.fc2",
}
MLP_NAME = "layers.0.mlp"  # every other family's (GPT-NeoX, Llama, ..., gpt-oss)


def frozen(model, names, kept, change):
    """`change` through the named norms, each frozen at the scale of its clean input."""
    for name in names:
        norm, x = model.get_submodule(name), kept[name]
        change = change - change.mean(-1, keepdim=True)
        scale = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps)
        change = change * norm.weight / scale
    return change


def stream_input(c, sites, layer, kept, key):
    """A hook keeping the residual stream entering `layer` as kept[key]."""
    site = sites[layer]
    if site.norm_in is not None:
        count = sum(1 for s in sites[:layer] if s.norm_in is site.norm_in)
        c.pre(site.norm_in, count, lambda m, a: kept.update({key: a[0]}))
    else:
        c.pre(
            site.module,
            call_index(sites, site.module, layer),
            lambda m, a, k: kept.update({key: a[0] if a else k["hidden_states"]}),
            with_kwargs=True,
        )


@torch.no_grad()
def reference(built, inputs, stack, sender, receiver, channel, value, kept=None):
    """([batch, query] total variation, relative write change, drop of the attention to the
    previous key) of receiver (1, r) when its channel reads the stream with `sender` (MLP 0 or
    the embeddings) replaced by `value` ([hidden], [piece, hidden] or [batch, piece, hidden]);
    kept["zp"]: the receiver layer's changed output projection input."""
    model, name = built.eager, built.name
    sites = attention_sites(model).of(stack)
    layer, r = receiver
    r_site = sites[layer]
    post = POST_NORMS.get((name, stack), [])
    mlp = model.get_submodule(MLP.get((name, stack), MLP_NAME))
    kept = {} if kept is None else kept
    with Calls() as c:
        stream_input(c, sites, layer, kept, "x")
        stream_input(c, sites, 0, kept, "x0")
        c.post(mlp, 0, lambda m, a, o: kept.update(m=o[0] if isinstance(o, tuple) else o))
        c.pre(
            r_site.output,
            call_index(sites, r_site.output, layer),
            lambda m, a: kept.update(zr=a[0]),
        )
        for norm in post:
            c.pre(model.get_submodule(norm), 0, lambda m, a, n=norm: kept.update({n: a[0]}))
        out = model(**inputs, output_attentions=True)
    probs0 = probs_of(out, model, stack, layer)[:, r]
    if sender == EMBED:
        change = frozen(model, post, kept, value - kept["x0"])
    elif post:  # post-norm: the norms after the MLP, frozen
        m = kept["m"].reshape(kept["x"].shape)
        change = frozen(model, post[-1:], kept, value - m)
    else:  # pre-norm: the real forward with the MLP's output replaced
        shape = kept["m"].shape

        def replace(m, a, o):
            new = value.expand(kept["x"].shape).reshape(shape).to(kept["m"])
            return (new, *o[1:]) if isinstance(o, tuple) else new

        with Calls() as c:
            c.post(mlp, 0, replace)
            stream_input(c, sites, layer, kept, "x_new")
            model(**inputs)
        change = kept["x_new"] - kept["x"]
    return receiver_effects(built, inputs, stack, receiver, channel, kept, probs0, change)


@pytest.mark.parametrize("name,stack", INTERFACE)
def test_mlp_and_embed_effects_equal_hooked_forward(name, stack):
    """Zero, mean (per hidden unit, per position) and resample (per row) values of the MLP of
    layer 0 and of the embeddings, seeded receivers and channels of layer 1."""
    built = build(name)
    _, inputs = stack_batch(built, SENTENCES, stack)
    rows = query_mask(inputs, stack).float()  # [batch, piece]
    cache = clean_cache(built.model, inputs, stack, mlp=True)
    x = cache.x[0]  # [batch, piece, hidden]
    batch, piece, hidden = x.shape
    n_layers, heads = len(cache.sites), cache.sites[0].heads
    gen = torch.Generator().manual_seed(4)
    values = [
        None,
        (torch.randn(n_layers, hidden, generator=gen), torch.randn(hidden, generator=gen)),
        (torch.randn(n_layers, piece, hidden, generator=gen), torch.randn(piece, hidden, generator=gen)),
        (torch.randn(batch, n_layers, piece, hidden, generator=gen), torch.randn(batch, piece, hidden, generator=gen)),
    ]  # fmt: skip
    ids = inputs.get("decoder_input_ids") if stack == "decoder" else None
    targets = {"prev": role_targets(PREVIOUS_TOKEN, inputs["input_ids"] if ids is None else ids)}
    rng = random.Random(f"composition-senders:{name}:{stack}")
    senders = [EMBED, (0, MLP_HEAD)]
    for k, value in enumerate(values):
        r, channel = rng.randrange(heads), rng.choice(CHANNELS)
        base = None if value is None else Baseline(mlp=value[0], embed=value[1])
        got = edge_sums(built.model, cache, 1, senders, base, rows, targets, heads=[r])
        c = CHANNELS.index(channel)
        real = lambda t: torch.where(rows > 0, t, 0.0).sum(-1)  # padding rows left out
        for i, sender in enumerate(senders):
            if value is None:
                b = torch.zeros(hidden)
            else:
                b = value[1] if sender == EMBED else value[0][:, 0] if k == 3 else value[0][0]
            want = reference(built, inputs, stack, sender, (1, r), channel, b)
            triple = f"{name} {stack}: {sender} -> 1-{r} {channel}, values {k}"
            for mine, ref in zip((got.pattern, got.output, got.role["prev"]), want):
                torch.testing.assert_close(
                    mine[:, i, 0, c], real(ref), atol=TOL, rtol=TOL, msg=triple
                )
            assert float(got.output[:, i, 0, c].abs().sum()) > 0, triple


def test_mixed_senders_equal_separate_calls():
    """Heads, the embeddings and the MLPs in one call (blocks never mix heads and the others;
    the heads through the d_head-space shortcut) give each sender's effects of its own call."""
    built = build("llama-gqa")
    _, inputs = stack_batch(built, SENTENCES, "decoder")
    cache = clean_cache(built.model, inputs, "decoder", mlp=True)
    senders = every_sender(cache, 1, ("heads", "mlp", "embed"))
    assert senders == [(0, h) for h in range(4)] + [EMBED, (0, MLP_HEAD)]
    gen = torch.Generator().manual_seed(5)
    hidden = cache.x[0].shape[-1]
    base = Baseline(torch.randn(2, 4, 8, generator=gen), torch.randn(2, hidden, generator=gen))
    both = edge_sums(built.model, cache, 1, senders, base, budget=1)  # one sender a block
    for i, sender in enumerate(senders):
        alone = edge_sums(built.model, cache, 1, [sender], base)
        torch.testing.assert_close(both.output[:, i], alone.output[:, 0], atol=TOL, rtol=TOL)
        torch.testing.assert_close(both.pattern[:, i], alone.pattern[:, 0], atol=TOL, rtol=TOL)
    assert float(both.output[:, -1].abs().sum()) > 0 and float(both.output[:, -2].abs().sum()) > 0


def test_graph_cards_and_reads_name_mlp_and_embed_senders():
    """The report names MLP senders "MLP L" and the embeddings "embed" (cards, the graph's
    nodes: MLPs right of their layer's heads, the embeddings below layer 0), gives them no head
    card, and `reads` answers for them as for a head."""
    from types import SimpleNamespace

    import pandas as pd

    from headprobe.studies.composition.analysis import reads
    from headprobe.studies.composition.graph import composition_graph, node
    from headprobe.studies.composition.report import card, head_lines

    rows = [  # receiver, channel, sender, kind, output effect
        (2, 1, "k", 1, 3, "head", 0.5),
        (2, 1, "k", 1, -1, "mlp", 0.9),
        (2, 1, "q", -1, -1, "embed", 0.7),
        (1, 0, "v", 0, -1, "mlp", 0.2),
    ]
    columns = ["layer", "head", "channel", "sender_layer", "sender_head", "sender"]
    edges = pd.DataFrame(rows, columns=columns + ["output_effect"])
    edges = edges.assign(p_holm=0.001, ablation="zero", pattern_effect=0.1)
    assert head_lines(edges, 2, 1) == [
        "reads through its query: embed (0.700)",
        "reads through its key: MLP 1 (0.900), 1-3 (0.500)",
    ]
    results = SimpleNamespace(tables={"composition_edges": edges})
    _, cards = card(results)
    assert set(cards) == {(2, 1), (1, 0), (1, 3)}
    assert list(reads(results, "2-1")["reads"]["k"]["sender"]) == ["mlp", "head"]
    assert list(reads(results, "MLP 1")["read_by"]["layer"]) == [2]
    assert list(reads(results, "embed")["read_by"]["channel"]) == ["q"]
    assert node(1, MLP_HEAD, 4) == (4.0, 1.0) and node(*EMBED, 4) == (1.5, -1.0)
    assert node(1, 3, 4) == (3.0, 1.0)
    assert composition_graph(edges, 3, 4) is not None


def hidden_mlps(model) -> None:
    """GPT-2's MLPs moved under a name no family uses (each block still calls its own)."""
    for block in model.h:
        module = block._modules.pop("mlp")
        block._modules["feedforward_x"] = module
        object.__setattr__(block, "mlp", module)  # the block's forward still finds it


def test_a_family_whose_mlp_is_not_found_is_refused_in_one_line():
    import headprobe
    from headprobe.core.errors import UsageError

    built = build("gpt2")
    hidden_mlps(built.model)
    _, inputs = stack_batch(built, SENTENCES[:2], "decoder")
    clean_cache(built.model, inputs, "decoder")  # heads alone: as before
    with pytest.raises(UsageError, match="no MLP found in layer 0 of GPT2Model") as err:
        clean_cache(built.model, inputs, "decoder", mlp=True)
    assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match="no MLP found in layer 0 of GPT2Model") as err:
        headprobe.run(
            loaded=(built.model, built.tokenizer, "gpt2"),
            analyses="composition",
            senders="heads,mlp",
            pictures=False,
            progress=False,
        )
    assert "\n" not in str(err.value)


def test_an_mlp_write_that_is_not_what_the_stream_receives_is_refused(monkeypatch):
    """The clean pass checks the write found against the residual stream: a module of the
    right shape that is not the MLP's write (here the input norms) is refused, never scored."""
    from headprobe.core.errors import UsageError
    from headprobe.model import mlp_writes

    built = build("llama-gqa")
    _, inputs = stack_batch(built, SENTENCES[:2], "decoder")
    norms = [layer.post_attention_layernorm for layer in built.model.layers]
    monkeypatch.setattr(mlp_writes, "mlp_modules", lambda model, stack: norms)
    with pytest.raises(UsageError, match="LlamaModel's MLP write of layer 0 is not") as err:
        clean_cache(built.model, inputs, "decoder", mlp=True)
    assert "\n" not in str(err.value)


def hooked_writes(model, batch):
    """(embed [batch, piece, hidden], mlp [batch, layer, piece, hidden]) of Llama by hooks on its
    own modules: the input of layer 0's input norm, each layer's MLP output."""
    from headprobe.model.gates import model_inputs

    got: dict = {}
    layers = model.layers
    hooks = [
        layers[0].input_layernorm.register_forward_pre_hook(lambda m, a: got.setdefault("e", a[0]))
    ]
    for i, layer in enumerate(layers):
        hooks.append(layer.mlp.register_forward_hook(lambda m, a, o, i=i: got.update({i: o})))
    try:
        with torch.no_grad():
            model(**model_inputs(batch, None, model, "decoder"))
    finally:
        for h in hooks:
            h.remove()
    return got["e"], torch.stack([got[i] for i in range(len(layers))], 1)


def test_mean_and_resample_values_are_the_writes_of_the_inputs():
    """Mean ablation's values: each write averaged over the non-padding pieces (all positions;
    per position on inputs of one length); resample's: the partner input's own writes."""
    from test_capture import make_batch

    from headprobe.inputs.batching import Batch
    from headprobe.studies.ablation.kinds import Baselines
    from headprobe.studies.composition.senders import write_means
    from headprobe.studies.composition.sweep import resampled

    built = build("llama-gqa")
    model = built.model
    batch, inputs = stack_batch(built, SENTENCES, "decoder")
    embed, mlp = hooked_writes(
        model, batch
    )  # [batch, piece, hidden], [batch, layer, piece, hidden]
    mask = query_mask(inputs, "decoder").float()  # [batch, piece]
    got_embed, got_mlp = write_means(model, [batch], "decoder")
    n = mask.sum()
    torch.testing.assert_close(
        got_embed, (embed * mask[..., None]).sum((0, 1)) / n, atol=1e-5, rtol=1e-5
    )
    want = (mlp * mask[:, None, :, None]).sum((0, 2)) / n  # [layer, hidden]
    torch.testing.assert_close(got_mlp, want, atol=1e-5, rtol=1e-5)

    words = [SENTENCES[0], list(reversed(SENTENCES[0])), SENTENCES[1], SENTENCES[0][::2][:5]]
    batch = make_batch(built.tokenizer, words, built.tokenizer.pad_token_id or 0)
    baselines = Baselines(("resample",), seed=0)
    baselines.read(model, built.tokenizer, batch.examples)
    rows, base = resampled(baselines, None, ("heads", "mlp", "embed"))(model, batch)
    assert 2 <= len(rows.examples) < 4
    pairs = [baselines.partners[e.unit] for e in rows.examples]
    embed, mlp = hooked_writes(model, Batch([p[0] for p in pairs], [p[1] for p in pairs], 0))
    torch.testing.assert_close(base.embed, embed, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(base.mlp, mlp, atol=1e-6, rtol=1e-6)
    assert base.heads is not None and base.heads.dim() == 5


@pytest.mark.parametrize("name,stack", [("llama-gqa", "decoder"), ("bert", "encoder")])
def test_exact_path_patching_of_mlp_and_embed_edges_equals_hooked_forward(name, stack):
    """Through the model: the objective's change when only the receiver's channel reads the
    ablated MLP or embeddings equals a forward of the real model with the receiver's slice of
    its output projection's input set to the hooked reference's (pre-norm; post-norm with the
    frozen-norm reference)."""
    from headprobe.model.objectives import Objective
    from headprobe.studies.composition.path_patching import exact_rows

    built = build(name)
    batch, inputs = stack_batch(built, SENTENCES, stack)
    model = built.model
    cache = clean_cache(model, inputs, stack, mlp=True)
    objective = Objective.for_model(model, kind="representation", stack=stack)
    targets = objective.targets(model, batch)
    edges = [((0, MLP_HEAD), (1, 1), "k"), (EMBED, (1, 2), "q"), ((0, MLP_HEAD), (1, 0), "v")]
    got, _ = exact_rows(model, cache, objective, targets, edges)
    site = attention_sites(built.eager).of(stack)[1]
    rows = query_mask(inputs, stack).float()
    with torch.no_grad():
        h0 = built.eager(**inputs).last_hidden_state
    hidden = cache.x[0].shape[-1]
    for e, (sender, receiver, channel) in enumerate(edges):
        kept: dict = {}
        reference(built, inputs, stack, sender, receiver, channel, torch.zeros(hidden), kept)
        want = patched_representation(built, inputs, site, kept["zp"], receiver[1], rows, h0)
        torch.testing.assert_close(got[:, e], want, atol=TOL, rtol=1e-4, msg=f"{name} {e}")
        assert float(want.abs().sum()) > 0
