"""Norm-based attention (issue 17, METHODS §7; Kobayashi et al. 2020).

- capture's `value_norms` equal ||v_j^h W_O^h|| computed directly from the value projection's
  output (hooked) and the output projection's weight, for BERT (W_O beside the
  self-attention: `attention.output.dense`), GPT-2 (Conv1D `c_proj`, values from the fused
  `c_attn`), Llama with grouped-query attention (`o_proj`), T5's encoder and cross attention
  (`o`; cross keys are the encoder's pieces), a BERT spread over devices by accelerate
  with a layer offloaded to disk, and two families that compute attention themselves (legacy
  path): MPNet (`attn.v`, `attn.o`) and SqueezeBERT (grouped pointwise convolutions, channels
  first; its output_attentions are scores, the capture hands on their softmax);
- adding `norms` to a run leaves every `weights` count bit-identical;
- a hand-built 3-piece input whose [SEP] value has norm 0: its mass vanishes under norms.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import get_family, tiny_mpnet
from test_capture import SENTENCES, make_batch

import headprobe
from headprobe.config import RunConfig
from headprobe.inputs.align import align_words
from headprobe.inputs.batching import Batch
from headprobe.inputs.corpora.base import Example
from headprobe.inputs.samples import SAMPLE  # the tiny sample: the default corpus is EWT dev
from headprobe.model.capture import AttentionCapture, QueryBlock
from headprobe.model.head_quantities import CaptureUnavailable, Heads
from headprobe.scoring.engine import Engine
from headprobe.scoring.layer_attention import measured_attention
from headprobe.scoring.layer_stack import with_layer_axis
from headprobe.studies.coreference.analysis import CoreferenceScorer
from headprobe.studies.dependency.analysis import DependencyScorer
from headprobe.studies.positional.analysis import PositionalScorer
from headprobe.studies.surface.analysis import SurfaceScorer

TOL = 1e-5


def module_outputs(model, inputs, modules) -> dict[int, torch.Tensor]:
    """{i: output of modules[i]} from one forward pass (forward hooks, removed afterwards)."""
    values: dict[int, torch.Tensor] = {}
    handles = [
        module.register_forward_hook(
            lambda module, args, output, i=i: values.__setitem__(i, output.detach().clone())
        )
        for i, module in enumerate(modules)
    ]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return values


def direct_value_norms(model, name: str, inputs) -> dict[int, torch.Tensor]:
    """{layer: [batch, head, key]} from the value projection's output (a forward hook) and the
    output projection's weight, head by head: || W_O[:, h*d:(h+1)*d] @ v_j^(group of h) ||."""
    config = model.config
    n_heads = config.num_attention_heads
    hidden = config.hidden_size
    if name == "bert":
        sites = [
            (layer.attention.self.value, layer.attention.output.dense.weight)
            for layer in model.encoder.layer
        ]
    elif name == "gpt2":
        sites = [
            (block.attn.c_attn, block.attn.c_proj.weight.T) for block in model.h
        ]  # Conv1D: [in, out]
    else:
        sites = [(layer.self_attn.v_proj, layer.self_attn.o_proj.weight) for layer in model.layers]
    values = module_outputs(model, inputs, [projection for projection, _ in sites])
    out = {}
    for layer, (_, weight) in enumerate(sites):
        v = values[layer]  # [batch, key, features]
        if name == "gpt2":
            v = v[..., 2 * hidden :]  # q, k, v = c_attn(x).split(hidden)
        d = weight.shape[1] // n_heads
        kv = v.shape[-1] // d
        v = v.reshape(v.shape[0], v.shape[1], kv, d)  # [batch, key, kv_head, d]
        norms = []
        for h in range(n_heads):
            w_h = weight[:, h * d : (h + 1) * d].detach().to(torch.float64)  # [hidden, d]
            v_h = v[:, :, h // (n_heads // kv)].to(torch.float64)  # [batch, key, d]
            norms.append(torch.linalg.vector_norm(v_h @ w_h.T, dim=-1))  # [batch, key]
        out[layer] = torch.stack(norms, dim=1).float()  # [batch, head, key]
    return out


def captured_norms(model, inputs, needs=("value_norms",)) -> dict[int, torch.Tensor]:
    with torch.no_grad(), headprobe.capture_heads(model, needs=needs) as heads:
        model(**inputs)
    return heads.value_norms


def inputs_of(family):
    batch = make_batch(family.tokenizer, SENTENCES, family.pad_id)
    return dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
@pytest.mark.parametrize("needs", [("value_norms",), ("probs", "value_norms")])
def test_value_norms_equal_the_direct_computation(name, needs):
    family = get_family(name)
    inputs = inputs_of(family)
    expected = direct_value_norms(family.sdpa, name, inputs)
    got = captured_norms(family.sdpa, inputs, needs)
    assert sorted(got) == list(range(family.n_layers))
    for layer, norms in expected.items():
        assert got[layer].shape == norms.shape
        assert got[layer].dtype == torch.float32
        torch.testing.assert_close(got[layer], norms, rtol=TOL, atol=TOL)
        assert norms.std() > 0.05 * norms.mean()  # not a constant a wrong head could match


@pytest.mark.parametrize("stack", ["encoder", "cross"])
def test_value_norms_of_t5_encoder_and_cross_attention(stack):
    """T5 (W_O named `o`, values from `v`): the encoder's self-attention and the decoder's cross
    attention, whose keys (and values) are the encoder's pieces."""
    from test_architectures import build, stack_batch

    built = build("t5")
    model = built.model
    _, inputs = stack_batch(built, SENTENCES, stack)
    sites = (
        [block.layer[0].SelfAttention for block in model.encoder.block]
        if stack == "encoder"
        else [block.layer[1].EncDecAttention for block in model.decoder.block]
    )
    values = module_outputs(model, inputs, [attention.v for attention in sites])
    with (
        torch.no_grad(),
        headprobe.capture_heads(model, needs={"probs", "value_norms"}, stack=stack) as heads,
    ):
        model(**inputs)
    n_heads, d = model.config.num_heads, model.config.d_kv
    for layer, attention in enumerate(sites):
        v = (
            values[layer].reshape(*values[layer].shape[:2], n_heads, d).double()
        )  # [batch, key, head, d]
        w = attention.o.weight.detach().double().reshape(-1, n_heads, d)  # [hidden, head, d]
        expected = torch.linalg.vector_norm(
            torch.einsum("bkhd,ohd->bhko", v, w), dim=-1
        ).float()  # [b, h, key]
        assert heads.value_norms[layer].shape == expected.shape
        assert expected.shape[-1] == inputs["input_ids"].shape[1]  # keys: the encoder's pieces
        torch.testing.assert_close(heads.value_norms[layer], expected, rtol=TOL, atol=TOL)


def test_value_norms_of_grouped_heads_differ_per_query_head():
    """GQA (Llama: 4 query heads over 2 KV heads): heads 0 and 1 read the same value vectors
    but have their own W_O blocks, so their norms differ."""
    family = get_family("llama")
    got = captured_norms(family.sdpa, inputs_of(family))[0]  # [batch, head, key]
    assert not torch.allclose(got[:, 0], got[:, 1])


def test_value_norms_on_a_model_spread_over_devices(tmp_path):
    """accelerate dispatch, layer 1 offloaded to disk (weights on the meta device between
    forwards): the captured norms equal the plain model's direct computation."""
    accelerate = pytest.importorskip("accelerate")
    family = get_family("bert")
    device_map = {
        "embeddings": "cpu",
        "encoder.layer.0": "cpu",
        "encoder.layer.1": "disk",
        "encoder.layer.2": "cpu",
        "pooler": "cpu",
    }
    split = accelerate.dispatch_model(
        copy.deepcopy(family.sdpa), device_map=device_map, offload_dir=tmp_path, force_hooks=True
    )
    assert next(split.encoder.layer[1].parameters()).device.type == "meta"
    inputs = inputs_of(family)
    expected = direct_value_norms(family.sdpa, "bert", inputs)
    got = captured_norms(split, inputs, ("probs", "value_norms"))
    for layer, norms in expected.items():
        torch.testing.assert_close(got[layer], norms, rtol=TOL, atol=TOL)


def test_named_capture_hands_on_what_is_asked_and_leaves_the_output():
    family = get_family("llama")
    inputs = inputs_of(family)
    with torch.no_grad():
        reference = family.sdpa(**inputs).last_hidden_state
        seen = []
        with AttentionCapture(
            family.sdpa,
            [1],
            lambda layer, heads, block: seen.append((layer, heads, block)),
            query_block=4,
            needs={"probs", "value_norms"},
        ):
            blocked = family.sdpa(**inputs).last_hidden_state
    torch.testing.assert_close(blocked, reference, rtol=TOL, atol=TOL)
    t = inputs["input_ids"].shape[1]
    assert [block for _, _, block in seen] == [
        QueryBlock(s, min(s + 4, t), t) for s in range(0, t, 4)
    ]
    for _layer, heads, block in seen:
        assert isinstance(heads, Heads) and set(heads) == {"probs", "value_norms"}
        assert heads.probs.shape[2] == block.stop - block.start
        assert heads.value_norms.shape[-1] == t  # every key in every block


def norms_by_hand(values: torch.Tensor, weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[batch, head, key]: || W_O[:, h*d:(h+1)*d] @ v_j^h || head by head, from the value
    projection's output `values` [batch, key, heads * d] and the output projection's weight
    `weight` [hidden, heads * d]."""
    d = weight.shape[1] // n_heads
    norms = []
    for h in range(n_heads):
        w_h = weight[:, h * d : (h + 1) * d].detach().double()  # [hidden, d]
        v_h = values[..., h * d : (h + 1) * d].double()  # [batch, key, d]
        norms.append(torch.linalg.vector_norm(v_h @ w_h.T, dim=-1))  # [batch, key]
    return torch.stack(norms, dim=1).float()  # [batch, head, key]


def test_value_norms_of_squeezebert_by_hand():
    """SqueezeBERT (legacy path): values from the value convolution's output ([batch, channel,
    key], channel h*8+i is head h's feature i), W_O the output convolution's weight written out
    block-diagonal by hand (2 groups); on a padded batch, with and without probs. The probs
    are its own softmax modules' output, not the scores its output_attentions returns."""
    from test_architectures import build, softmax_outputs, stack_batch
    from test_sites import block_diagonal_by_hand

    built = build("squeezebert")
    model = built.model
    _, inputs = stack_batch(built, SENTENCES, "encoder")
    layers = model.encoder.layers
    values = module_outputs(model, inputs, [layer.attention.value for layer in layers])
    for needs in (("value_norms",), ("probs", "value_norms")):
        with torch.no_grad(), headprobe.capture_heads(model, needs=needs) as heads:
            model(**inputs)
        for i, layer in enumerate(layers):
            weight = block_diagonal_by_hand(layer.post_attention.conv1d)  # [hidden, hidden]
            expected = norms_by_hand(values[i].transpose(1, 2), weight, 4)  # [batch, head, key]
            torch.testing.assert_close(heads.value_norms[i], expected, rtol=TOL, atol=TOL)
            assert expected.std() > 0.05 * expected.mean()
    probs = softmax_outputs(model, inputs)
    for i in range(2):
        torch.testing.assert_close(heads.probs[i], probs[i], rtol=TOL, atol=TOL)
        assert inputs["attention_mask"].min() == 0 and heads.probs[i].min() == 0  # masked keys


def test_bad_needs_and_the_legacy_path(bert_family):
    """MPNet computes attention itself, yet its value and output projections are found: value
    norms (by hand) and head outputs are captured. BLOOM's values come out of a fused
    query_key_value in an interleaved layout: value_norms is refused in one line."""
    from test_architectures import build

    with pytest.raises(ValueError, match="unknown capture quantity 'values'"):
        AttentionCapture(bert_family.sdpa, None, None, needs={"values"})
    legacy = tiny_mpnet(bert_family.tokenizer)
    inputs = inputs_of(bert_family)
    values = module_outputs(
        legacy, inputs, [layer.attention.attn.v for layer in legacy.encoder.layer]
    )
    with torch.no_grad(), headprobe.capture_heads(legacy, needs={"probs", "value_norms"}) as heads:
        legacy(**inputs)
    assert sorted(heads.probs) == sorted(heads.value_norms) == [0, 1]
    for i, layer in enumerate(legacy.encoder.layer):
        expected = norms_by_hand(values[i], layer.attention.attn.o.weight, 4)
        torch.testing.assert_close(heads.value_norms[i], expected, rtol=TOL, atol=TOL)
    with torch.no_grad(), headprobe.capture_heads(legacy, needs={"head_output"}) as heads:
        legacy(**inputs)
    assert sorted(heads.head_output) == [0, 1]
    bloom = build("bloom-alibi").model
    with pytest.raises(
        CaptureUnavailable, match="BloomModel.*no value projection.*value_norms.*norms measure"
    ):
        AttentionCapture(bloom, None, None, needs={"probs", "value_norms"})


# ------------------------------------------------------------------------ weights unchanged


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_adding_norms_leaves_every_weights_row_bit_identical(name):
    """One run with `weights`, one with `weights,norms`: every table's weights rows are equal,
    values and dtypes (counts, best heads, intervals, tests, roles, every analysis's tables),
    and every weights tally total is bit-identical; the norms rows differ somewhere."""
    from headprobe.scoring import registry

    family = get_family(name)
    readers = [
        a.name for a in registry.analyses() if not hasattr(a.scorer, "model_pass")
    ]  # read attention (or only weights: ov_copying, given once under the first measure)
    options = dict(
        loaded=(family.sdpa, family.tokenizer, name),
        progress=False,
        n_boot=20,
        pictures=False,
        analyses=readers + ["ablation"],
        treebank="headprobe/inputs/samples/sample.conllu",
        coref="headprobe/inputs/samples/sample_coref.conllu",
    )
    weights = headprobe.run(**options)
    both = headprobe.run(**options, measure="weights,norms")
    assert set(weights.tables) == set(both.tables)
    assert both.measures == ["weights", "norms"] and weights.measures == ["weights"]
    assert (
        "ablation" in both.tallies and "ablation@norms" not in both.tallies
    )  # no attention: scored once
    for table_name in (
        "counts",
        "best_heads",
        "baselines",
        "head_tests",
        "roles",
        "positional_heads",
        "surface",
        "head_distances",
        "parse_scores",
        "previous_token_heads",
        "sink_heads",
    ):
        assert set(both.table(table_name)["measure"]) == {"weights", "norms"}, table_name
    for table_name, table in both.tables.items():
        if not len(table):  # e.g. ablation_kinds of a run with one kind of ablation
            continue
        assert "weights" in set(table["measure"]), table_name  # ablation's tables: weights only
        rows = table[table["measure"] == "weights"].reset_index(drop=True)
        pd.testing.assert_frame_equal(
            rows, weights.table(table_name), check_exact=True, obj=table_name
        )
    for key, tally in weights.tallies.items():
        for label in tally.sorted_labels():
            for array, value in tally.arrays(label).items():
                assert np.array_equal(value, both.tallies[key].arrays(label)[array]), (
                    key,
                    label,
                    array,
                )
    counts = both.counts[both.counts["analysis"].isin(readers)]
    n = counts[counts["measure"] == "norms"].reset_index(drop=True)
    w = counts[counts["measure"] == "weights"].reset_index(drop=True)
    assert (n["hits"].fillna(-1) != w["hits"].fillna(-1)).any()  # the norms were scored, not copied
    assert (n["n"] == w["n"]).all()  # same items, same trials


def test_only_norms_and_a_bad_measure(bert_family):
    from headprobe.core.errors import UsageError

    results = headprobe.run(
        loaded=(bert_family.sdpa, bert_family.tokenizer, "bert"),
        progress=False,
        n_boot=10,
        pictures=False,
        analyses=["positional"],
        measure="norms",
        treebank=SAMPLE,
    )
    assert list(results.tallies) == ["positional@norms"] and set(
        results.positional_heads["measure"]
    ) == {"norms"}
    assert len(results.head_scores("positional")) == 3 * 4 * 7  # the views read the measure present
    with pytest.raises(UsageError, match="--measure: unknown measure 'norm'"):
        headprobe.run(
            loaded=(bert_family.sdpa, bert_family.tokenizer, "bert"), measure="weights,norm"
        )
    from test_architectures import build

    bloom = build("bloom-alibi")  # output_attentions only, values from a fused projection
    with pytest.raises(UsageError, match="--measure norms: BloomModel .* value_norms"):
        headprobe.run(
            loaded=(bloom.model, bloom.tokenizer, "bloom"), measure="norms", progress=False
        )


def test_norms_counts_identical_with_query_blocks():
    """Causal GQA Llama, --query-block 4: the counts of both measures, scored in one call per
    layer, equal the unblocked counts."""
    from test_query_block import corpus

    family = get_family("llama")
    examples = corpus(seed=7)[:12]

    def score(query_block):
        scorers = [
            cls() for cls in (DependencyScorer, PositionalScorer, SurfaceScorer, CoreferenceScorer)
        ]
        for scorer in scorers:
            scorer.measures = ("weights", "norms")
        engine = Engine(
            family.sdpa,
            family.tokenizer,
            scorers,
            RunConfig(batch_size=4, progress=False, n_boot=10, query_block=query_block),
        )
        engine.run(examples)
        assert engine.needs == {"probs", "value_norms"} and engine.query_block == query_block
        return {key: tally for s in scorers for key, tally in s.tallies_.items()}

    whole, blocked = score(None), score(4)
    assert len(whole) == 8 and {t.measure for t in whole.values()} == {"weights", "norms"}
    for analysis, tally in whole.items():
        for label in tally.sorted_labels():
            for array, value in tally.arrays(label).items():
                other = blocked[analysis].arrays(label)[array]
                if analysis.startswith("surface") and array == "hits":
                    np.testing.assert_allclose(value, other, rtol=1e-5, atol=1e-6)
                else:
                    assert np.array_equal(value, other), (analysis, label, array)


# ------------------------------------------------------------------- a hand-built example


def test_a_zero_norm_key_loses_its_mass_under_norms(wordpiece_tokenizer):
    """[CLS] cat [SEP]: one word, three pieces. Head 0: the word's row puts 0.2 / 0.3 / 0.5 on
    [CLS] / cat / [SEP]; value norms 0.5 / 1 / 0, so N = 0.1 / 0.3 / 0 and its row shares are
    0.25 / 0.75 / 0: under norms the [SEP] mass vanishes (0.5 -> 0), self rises (0.3 -> 0.75),
    the argmax moves from [SEP] (special) to the word itself (offset 0), and the row's entropy is
    that of (0.25, 0.75). Head 1: every norm 2, so norms equal weights."""
    example = Example(words=["cat"], unit="u", source="t:1")
    batch = Batch(
        [example],
        align_words(wordpiece_tokenizer, [example.words]),
        wordpiece_tokenizer.pad_token_id,
    )
    assert batch.alignments[0].piece_word == [-1, 0, -1]
    row = torch.tensor([0.2, 0.3, 0.5])
    probs = torch.full((1, 2, 3, 3), 1 / 3)  # [batch, head, query, key]
    probs[0, :, 1] = row
    value_norms = torch.tensor([[[0.5, 1.0, 0.0], [2.0, 2.0, 2.0]]])  # [batch, head, key]
    heads = Heads(probs=probs, value_norms=value_norms)
    scorers, states = [], {}
    for cls in (SurfaceScorer, PositionalScorer):  # each counts both measures in one call
        scorer = cls()
        scorer.measures = ("weights", "norms")
        scorer.bind(1, 2, [0], n_boot=2, keep_units=True)
        states[scorer] = scorer.prepare(batch)
        scorers.append(scorer)
    for scorer, att in measured_attention(scorers, (0,), with_layer_axis(heads), batch):
        assert att.measures == ("weights", "norms") and att.words.shape[1] == 2
        scorer.update(att, states[scorer])
    for scorer in scorers:
        scorer.end_batch(states[scorer])
    counts = pd.concat([s.unit_counts() for s in scorers]).astype(
        {"measure": str, "label": str, "analysis": str}
    )

    def value(analysis, measure, label, head, column):
        rows = counts[
            (counts.analysis == analysis)
            & (counts.measure == measure)
            & (counts.label == label)
            & (counts["head"] == head)
        ]
        assert len(rows) == 1
        return float(rows[column].iloc[0])

    expected = {
        "weights": {"sep": 0.5, "self": 0.3, "cls": 0.2},
        "norms": {"sep": 0.0, "self": 0.75, "cls": 0.25},
    }
    for measure, masses in expected.items():
        for label, mass in masses.items():
            assert value("surface", measure, label, 0, "mass") == pytest.approx(mass, abs=1e-6)
            assert value("surface", measure, label, 1, "mass") == pytest.approx(
                expected["weights"][label], abs=1e-6
            )
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert value("surface", "norms", "entropy", 0, "mass") == pytest.approx(entropy, abs=1e-6)
    assert (
        value("positional", "weights", "special", 0, "hits") == 1
        and value("positional", "weights", "0", 0, "hits") == 0
    )
    assert (
        value("positional", "norms", "0", 0, "hits") == 1
        and value("positional", "norms", "special", 0, "hits") == 0
    )


# ------------------------------------------------------------------ side by side (report)


def test_special_share_and_the_report_section(bert_family, tmp_path):
    """special_share's point estimates are the surface masses to [CLS] + [SEP] per layer of each
    measure; its intervals (per-unit counts) bracket them; the report gets a measures section;
    with the random-init control, the control is scored on each measure too."""
    from headprobe.report import build_report
    from headprobe.studies.surface.surface_measures import special_share, surface_side_by_side

    results = headprobe.run(
        loaded=(bert_family.sdpa, bert_family.tokenizer, "bert"),
        progress=False,
        n_boot=50,
        pictures=False,
        analyses=["surface", "positional", "dependency"],
        measure="weights,norms",
        keep_unit_counts=True,
        control="random-init",
        treebank=SAMPLE,
    )
    assert "dependency@norms~control" in results.tallies  # the random-init control, per measure too
    assert set(results.control_best_heads["measure"]) == {"weights", "norms"}
    assert results.for_measure("norms").control.best_heads["measure"].eq("norms").all()
    share = special_share(results)
    assert list(share["layer"]) == [0, 1, 2]
    for measure in ("weights", "norms"):
        per_layer = results.mass_per_layer("surface", measure=measure)
        np.testing.assert_allclose(share[measure], per_layer["cls"] + per_layer["sep"], rtol=1e-6)
        assert (share[f"{measure}_low"] <= share[measure]).all() and (
            share[measure] <= share[f"{measure}_high"]
        ).all()
    np.testing.assert_allclose(share["change"], share["norms"] - share["weights"], atol=1e-9)
    side = surface_side_by_side(results)
    sep = side[side["label"] == "sep"]
    np.testing.assert_allclose(
        sep["norms"], results.mass_per_layer("surface", measure="norms")["sep"]
    )
    markdown = build_report(results, tmp_path / "report")["markdown"].read_text()
    assert (
        '<a id="measures"></a>' in markdown
        and "Share of a word's attention on [CLS]/BOS" in markdown
    )
    assert markdown.count('<a id="surface"></a>') == 1


def test_role_changes_lists_heads_whose_role_differs():
    from headprobe.results.measure_views import role_changes
    from headprobe.results.query import Results

    def roles(measure, names):
        return pd.DataFrame(
            {
                "measure": measure,
                "layer": [0, 0, 1],
                "head": [0, 1, 0],
                "name": ["0-0", "0-1", "1-0"],
                "role": names,
                "detail": ["", "offset -1", ""],
                "evidence": ["", "share 0.95", ""],
            }
        )

    table = pd.concat(
        [
            roles("weights", ["sink", "positional", "none"]),
            roles("norms", ["none", "positional", "none"]),
        ]
    )
    results = Results(
        {},
        {"n_layers": 2, "n_heads": 2},
        tables={
            "roles": table.reset_index(drop=True),
            "counts": pd.DataFrame({"measure": ["weights", "norms"]}),
        },
    )
    changed = role_changes(results)
    assert list(changed["name"]) == ["0-0"]
    assert (changed["role_weights"].iloc[0], changed["role_norms"].iloc[0]) == ("sink", "none")


def test_cli_measure(tiny_model, tmp_path, capsys):
    """`headprobe run --measure weights,norms`: one tally per analysis and measure on disk, every
    table with both measures, loadable (manifest verified); a bad --measure: one line, exit 2,
    before the model loads."""
    from headprobe.cli import main
    from headprobe.results.query import Results

    assert (
        main(
            [
                "run",
                "--model",
                str(tmp_path / "no-model"),
                "--measure",
                "weights,norm",
                "--out",
                str(tmp_path / "bad"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert (
        "--measure: unknown measure 'norm'" in err
        and "no-model" not in err
        and "Traceback" not in err
    )
    out = tmp_path / "results"
    assert (
        main(
            [
                "run",
                "--model",
                tiny_model,
                "--out",
                str(out),
                "--no-report",
                "--quiet",
                "--bootstrap",
                "20",
                "--analyses",
                "dependency,surface",
                "--measure",
                "weights,norms",
                "--treebank",
                str(SAMPLE),
            ]
        )
        == 0
    )
    assert sorted(p.name for p in (out / "tallies").iterdir()) == [
        "dependency.npz",
        "dependency@norms.npz",
        "surface.npz",
        "surface@norms.npz",
    ]
    loaded = Results.load(out)
    assert loaded.measures == ["weights", "norms"]
    assert loaded.tallies["dependency@norms"].measure == "norms"
    for name in ("counts", "best_heads", "head_tests", "roles", "surface"):
        assert set(pd.read_parquet(out / f"{name}.parquet")["measure"]) == {"weights", "norms"}, (
            name
        )
    assert loaded.for_measure("norms").best_heads.equals(
        loaded.best_heads[loaded.best_heads["measure"] == "norms"].reset_index(drop=True)
    )
