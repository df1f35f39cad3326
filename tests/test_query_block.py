"""Query blocks (issue 12): capture N query rows at a time; scorers count exactly the same.

`--query-block N` makes one layer's capture O(N x keys) per head instead of O(keys^2).
The blocks are cut at piece rows; the engine hands scorers the word rows that are
complete (`scoring.pooling.WordRows`), and dependency's head<-dep keeps a running column maximum.
Counts must equal the unblocked run's, for an encoder (BERT) and for a causal model
with grouped-query attention (Llama, 4 query heads over 2 KV heads).
"""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import WORDS, get_family
from test_capture import SENTENCES, make_batch
from test_engine import KEY, random_sentences

from headprobe.config import RunConfig
from headprobe.inputs.corpora.base import Example
from headprobe.inputs.corpora.corefud import Mention
from headprobe.model.capture import AttentionCapture, QueryBlock
from headprobe.scoring.engine import Engine
from headprobe.scoring.scorer_base import CountScorer, RowIndex
from headprobe.studies.coreference.analysis import CoreferenceScorer
from headprobe.studies.dependency.analysis import DependencyScorer
from headprobe.studies.positional.analysis import PositionalScorer
from headprobe.studies.surface.analysis import SurfaceScorer

RELATIONS = ["det", "nsubj", "obj", "amod"]


def with_mentions(examples, seed=0):
    """The examples with random mentions (two entities, nested and repeated) for coreference."""
    rng = random.Random(seed)
    out = []
    for ex in examples:
        n = len(ex.words)
        mentions = []
        for _ in range(n // 2):
            start = rng.randrange(n)
            end = rng.randint(start + 1, min(n, start + 3))
            mentions.append(Mention(start, end, rng.choice("AB"), rng.randrange(start, end)))
        upos = [rng.choice(["PRON", "PROPN", "NOUN"]) for _ in range(n)]
        out.append(
            Example(
                ex.words,
                ex.unit,
                ex.source,
                ex.heads,
                ex.deprels,
                upos,
                [{} for _ in range(n)],
                mentions,
            )
        )
    return out


def corpus(seed=0):
    """Random sentences of 1-12 words (words of 1-3 pieces), plus same-length ones whose word
    boundaries differ (one bucket: the rows of one example wait for another's), with mentions."""
    rng = random.Random(seed)
    sentences = random_sentences(24, seed=seed)
    long = []  # ~20-30 pieces, same piece count, different words
    for index in range(6):
        words = ["unbelievable"] * (index % 3) + [
            rng.choice(WORDS[:19]) for _ in range(18 - 2 * (index % 3))
        ]
        n = len(words)
        heads = [-1] + [rng.randrange(n) for _ in range(n - 1)]
        heads = [h if h != i else (i + 1) % n for i, h in enumerate(heads)]
        long.append(
            Example(
                words,
                f"long{index}",
                f"long:{index}",
                heads,
                ["root"] + [rng.choice(RELATIONS) for _ in range(n - 1)],
            )
        )
    return with_mentions(sentences + long, seed)


def scorers(extra=()):
    return [DependencyScorer(), PositionalScorer(), SurfaceScorer(), CoreferenceScorer(), *extra]


def score(family, examples, query_block=None, from_mode="mean", batch_size=4):
    engine = Engine(
        family.sdpa,
        family.tokenizer,
        scorers(),
        RunConfig(
            batch_size=batch_size,
            progress=False,
            keep_unit_counts=True,
            n_boot=20,
            query_block=query_block,
            from_mode=from_mode,
        ),
    )
    engine.run(examples)
    counts = pd.concat([s.unit_counts() for s in engine.scorers], ignore_index=True)
    counts = counts.astype({c: str for c in ("analysis", "label", "unit", "direction", "variant")})
    counts = counts.astype({"layer": int, "head": int, "n": float, "hits": float, "mass": float})
    return engine, counts.sort_values(KEY, ignore_index=True)


def assert_identical(a: pd.DataFrame, b: pd.DataFrame, engine_a, engine_b):
    assert len(a) == len(b)
    pd.testing.assert_frame_equal(a[KEY], b[KEY])
    assert (a.n.values == b.n.values).all()
    assert (a.hits.fillna(-1).values == b.hits.fillna(-1).values).all(), "argmax counts differ"
    np.testing.assert_allclose(a.mass.values, b.mass.values, rtol=1e-5, atol=1e-5)
    # the streaming totals too (every fold and resample, baselines, McNemar's joint hits)
    for x, y in zip(engine_a.scorers, engine_b.scorers):
        assert x.tally_.sorted_labels() == y.tally_.sorted_labels()
        for label in x.tally_.sorted_labels():
            p, q = x.tally_.arrays(label), y.tally_.arrays(label)
            for key in p:
                if key == "hits" and x.value == "mass":
                    np.testing.assert_allclose(p[key], q[key], rtol=1e-5, atol=1e-5)
                else:
                    assert np.array_equal(p[key], q[key]), (x.analysis, label, key)


# ---------------------------------------------------------------------------------- capture


@pytest.mark.parametrize("name", ["bert", "llama", "gpt2"])
def test_capture_blocks_are_the_rows_of_the_whole(name):
    """Blocks of 3 query rows, in order, are the rows of the unblocked probabilities, and the
    model's output does not change (the layer's output is assembled from the blocks)."""
    family = get_family(name)
    batch = make_batch(family.tokenizer, SENTENCES, family.pad_id)
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    whole, blocks = {}, []
    with torch.no_grad():
        with AttentionCapture(
            family.sdpa, None, lambda layer, probs: whole.__setitem__(layer, probs.clone())
        ):
            reference = family.sdpa(**inputs).last_hidden_state
        with AttentionCapture(
            family.sdpa,
            None,
            lambda layer, probs, block: blocks.append((layer, probs.clone(), block)),
            query_block=3,
        ) as cap:
            blocked = family.sdpa(**inputs).last_hidden_state
    t = batch.n_pieces
    starts = list(range(0, t, 3))
    assert [(layer, block) for layer, _, block in blocks] == [
        (layer, QueryBlock(s, min(s + 3, t), t)) for layer in range(family.n_layers) for s in starts
    ]
    assert cap.calls_ == {layer: 1 for layer in range(family.n_layers)}
    for layer in range(family.n_layers):
        rows = torch.cat([p for l, p, _ in blocks if l == layer], dim=2)
        assert rows.shape == whole[layer].shape
        assert torch.allclose(rows, whole[layer], atol=1e-6)
    assert torch.allclose(blocked, reference, atol=1e-5)


def test_query_block_must_be_positive(bert_family):
    with pytest.raises(ValueError, match="at least 1"):
        AttentionCapture(bert_family.sdpa, None, None, query_block=0)


# ---------------------------------------------------------------------------------- counts


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_query_block_8_counts_identical(name):
    """--query-block 8: every count equal to the unblocked run (encoder; causal GQA)."""
    family = get_family(name)
    if name == "llama":
        config = family.sdpa.config
        assert config.num_key_value_heads < config.num_attention_heads  # grouped-query attention
    examples = corpus()
    plain_engine, plain = score(family, examples)
    blocked_engine, blocked = score(family, examples, query_block=8)
    assert blocked_engine.query_block == 8 and plain_engine.query_block is None
    assert_identical(plain, blocked, plain_engine, blocked_engine)
    assert (plain.analysis == "coreference").any() and (plain.analysis == "dependency").any()


@pytest.mark.parametrize("from_mode", ["first", "max"])
@pytest.mark.parametrize("query_block", [1, 5])
def test_other_pooling_and_block_sizes(from_mode, query_block):
    """From-pooling first / max (a running maximum over blocks), one row per block, odd sizes."""
    family = get_family("llama")
    examples = corpus(seed=1)[:14]
    plain_engine, plain = score(family, examples, from_mode=from_mode)
    blocked_engine, blocked = score(family, examples, query_block=query_block, from_mode=from_mode)
    assert_identical(plain, blocked, plain_engine, blocked_engine)


def test_block_larger_than_input_is_the_unblocked_path(bert_family):
    examples = corpus(seed=2)[:8]
    plain_engine, plain = score(bert_family, examples)
    blocked_engine, blocked = score(bert_family, examples, query_block=512)
    assert_identical(plain, blocked, plain_engine, blocked_engine)
    assert (plain.mass.fillna(-1).values == blocked.mass.fillna(-1).values).all()  # bit for bit


class WholeMatrixScorer(CountScorer):
    """A scorer that does not declare block support: it needs whole matrices."""

    analysis = "whole"

    def prepare(self, batch):
        rows = RowIndex()
        for example in batch.examples:
            rows.count(example.unit, "all", 1)
        return self.new_state(batch, rows.keys, rows.n)

    def update(self, att, state):
        batch = state.batch
        assert att.pieces.shape[-2] == att.pieces.shape[-1] == batch.n_pieces  # every query row
        assert att.words.shape[-2] == batch.max_words


def test_scorer_without_block_support_gets_whole_matrices(bert_family):
    examples = corpus(seed=3)[:6]
    engine = Engine(
        bert_family.sdpa,
        bert_family.tokenizer,
        scorers([WholeMatrixScorer()]),
        RunConfig(batch_size=4, progress=False, n_boot=5, query_block=4),
    )
    stats = engine.run(examples)
    assert engine.query_block is None
    assert "WholeMatrixScorer" in " ".join(stats["notes"])
