"""The engine: batch-size invariance, OOM backoff, skipped examples (issue 2, point 6)."""

from __future__ import annotations

import random

import pandas as pd
import pytest
import torch
from conftest import WORDS

from headprobe.config import RunConfig
from headprobe.inputs.corpora.base import Example
from headprobe.scoring import engine as engine_module
from headprobe.scoring.engine import Engine
from headprobe.studies.dependency.analysis import DependencyScorer, scored_arcs
from headprobe.studies.positional.analysis import PositionalScorer
from headprobe.studies.surface.analysis import SurfaceScorer

KEY = ["analysis", "label", "unit", "layer", "head", "direction", "variant"]
RELATIONS = ["det", "nsubj", "obj", "amod", "obl", "advmod", "punct"]


def random_sentences(n: int = 20, seed: int = 0, same_length: bool = False) -> list[Example]:
    """Random sentences; with `same_length`, permutations of one word list, so every sentence
    has the same number of pieces (pre-split words tokenize independently) and they share a bucket."""
    rng = random.Random(seed)
    base = [rng.choice(WORDS) for _ in range(8)]
    examples = []
    for index in range(n):
        if same_length:
            words = rng.sample(base, len(base))
        else:
            words = [rng.choice(WORDS) for _ in range(rng.randint(1, 12))]
        length = len(words)
        root = rng.randrange(length)
        heads = [
            -1 if i == root else rng.choice([j for j in range(length) if j != i])
            for i in range(length)
        ]
        deprels = ["root" if i == root else rng.choice(RELATIONS) for i in range(length)]
        upos = ["PUNCT" if w in {"$", ",", ".", "!"} else "X" for w in words]
        examples.append(
            Example(
                words=words,
                unit=f"r{index:02d}",
                source=f"random:{index}",
                heads=heads,
                deprels=deprels,
                upos=upos,
            )
        )
    return examples


def scorers():
    return [DependencyScorer(), PositionalScorer(), SurfaceScorer()]


def run(model, tokenizer, examples, batch_size, **kwargs):
    engine = Engine(
        model,
        tokenizer,
        scorers(),
        RunConfig(batch_size=batch_size, progress=False, keep_unit_counts=True),
        **kwargs,
    )
    engine.run(examples)
    counts = pd.concat([s.unit_counts() for s in engine.scorers], ignore_index=True)
    # plain dtypes (keys may come back categorical, whose sort order follows first appearance)
    counts = counts.astype({c: str for c in ("analysis", "label", "unit", "direction", "variant")})
    counts = counts.astype({"layer": int, "head": int, "n": float, "hits": float, "mass": float})
    return engine, counts.sort_values(KEY, ignore_index=True)


def assert_same_counts(a: pd.DataFrame, b: pd.DataFrame):
    assert len(a) == len(b)
    pd.testing.assert_frame_equal(a[KEY], b[KEY])
    assert (a.n.values == b.n.values).all()
    hits_a, hits_b = a.hits.fillna(-1).values, b.hits.fillna(-1).values
    assert (hits_a == hits_b).all(), "argmax counts differ"
    pd.testing.assert_series_equal(a.mass, b.mass, rtol=1e-4, atol=1e-5)


@pytest.fixture(params=["bert", "gpt2"])
def tiny(request, bert_family, gpt2_family):
    return {"bert": bert_family, "gpt2": gpt2_family}[request.param]


def test_batch_size_and_order_do_not_change_counts(tiny):
    examples = random_sentences()
    engine1, one = run(tiny.sdpa, tiny.tokenizer, examples, batch_size=1)
    engine7, seven = run(tiny.sdpa, tiny.tokenizer, examples, batch_size=7)
    shuffled = examples[:]
    random.Random(1).shuffle(shuffled)
    _, mixed = run(tiny.sdpa, tiny.tokenizer, shuffled, batch_size=7)
    assert_same_counts(one, seven)
    assert_same_counts(one, mixed)
    assert engine1.stats_["examples"] == engine7.stats_["examples"] == 20
    assert engine7.stats_["words"] == sum(len(ex.words) for ex in examples)
    assert engine7.stats_["skipped"] == {}
    # every example counted once: dependency ALL trials = its scored arcs; positional n = its words
    dep = seven[(seven.analysis == "dependency") & (seven.variant == "") & (seven.label == "ALL")]
    for ex in examples:
        arcs = len(scored_arcs(ex))
        rows = dep[dep.unit == ex.unit]
        assert len(rows) == (2 * tiny.n_layers * 4 if arcs else 0)
        assert (rows.n == arcs).all()
        pos = seven[(seven.analysis == "positional") & (seven.unit == ex.unit)]
        # per layer and head, the 7 buckets share out the example's words
        assert (pos.groupby(["layer", "head"]).hits.sum() == len(ex.words)).all()


@pytest.mark.parametrize(
    "n_layers, fit, expected",
    [
        (6, 6, 6),
        (6, 5, 3),
        (6, 4, 3),
        (6, 2, 2),
        (6, 1, 1),
        (6, 0, 1),
        (7, 3, 3),
        (2, 9, 2),
        (1, 0, 1),
    ],
)
def test_layer_groups_are_as_few_and_as_even_as_the_budget_allows(n_layers, fit, expected):
    """`group_size`: a budget that fits `fit` layers (0: not even one) makes
    ceil(n / fit) groups of at most `expected` layers (six that fit five: 3 + 3, not 5 + 1)."""
    per_layer = 1000
    size = engine_module.group_size(n_layers, per_layer, fit * per_layer + per_layer // 2)
    assert size == expected
    assert -(-n_layers // size) == -(-n_layers // max(fit, 1))  # no more groups than needed


def test_layers_scored_one_at_a_time_give_the_counts_of_one_stack(tiny, monkeypatch):
    """A stack budget below one layer's attention (one layer a group) and the default, which
    holds every layer of these short inputs (one group), count the same."""
    examples = random_sentences()
    sizes = []
    stack = engine_module.LayerStack
    monkeypatch.setattr(
        engine_module, "LayerStack", lambda layers, size: sizes.append(size) or stack(layers, size)
    )
    _, whole = run(tiny.sdpa, tiny.tokenizer, examples, batch_size=7)
    assert sizes and set(sizes) == {tiny.n_layers}
    sizes.clear()
    monkeypatch.setitem(engine_module.STACK_BYTES, "cpu", 1)
    _, single = run(tiny.sdpa, tiny.tokenizer, examples, batch_size=7)
    assert sizes and set(sizes) == {1}
    assert_same_counts(whole, single)


def test_a_one_shot_iterable_is_read_a_chunk_and_the_pool_ahead(bert_family, monkeypatch):
    """A generator (no len, read once) gives the list's counts. The engine takes at most
    `PREFETCH` + 2 chunks (`engine.CHUNK`) of examples ahead of those it has scored (the one it
    works on, those its reader has tokenized ahead, the one the reader works on), besides those
    waiting in its pool, which holds at most `POOL_BATCHES` x batch size x `POOL_AT` pieces; batches mix
    chunks."""
    examples = random_sentences(20)
    _, reference = run(bert_family.sdpa, bert_family.tokenizer, examples, batch_size=4)
    monkeypatch.setattr(engine_module, "CHUNK", 6)
    monkeypatch.setattr(engine_module, "FULL_AT", {"cpu": 4})  # a full batch: 4 x 4 = 16 pieces
    monkeypatch.setattr(engine_module, "POOL_BATCHES", 2)  # the pool: 2 x 4 x 4 = 32 pieces
    monkeypatch.setattr(engine_module, "POOL_AT", 4)
    monkeypatch.setattr(engine_module, "PREFETCH", 1)
    taken, scored, ahead, batches = [], [], [], []

    def stream():
        for example in examples:
            taken.append(example)
            yield example

    score = Engine._score

    def watched(self, batch):
        pool = self._pass.pool
        assert pool.pieces <= 32
        ahead.append(len(taken) - len(scored) - len(pool))
        batches.append(list(self._pass.queue[0]))
        score(self, batch)
        scored.extend(batch.examples)

    monkeypatch.setattr(Engine, "_score", watched)
    engine, counts = run(bert_family.sdpa, bert_family.tokenizer, stream(), batch_size=4)
    assert_same_counts(reference, counts)
    assert engine.stats_["examples"] == len(scored) == 20 and len(taken) == 20
    assert max(ahead) <= 6 * (1 + 2)
    assert sorted(i for ordinals in batches for i in ordinals) == list(range(20))
    assert any(len({i // 6 for i in ordinals}) > 1 for ordinals in batches)  # across chunks


def test_layer_subset(bert_family):
    """Layer subset: only asked-for layers appear in the counts."""
    examples = random_sentences(6, seed=3)
    engine = Engine(
        bert_family.sdpa,
        bert_family.tokenizer,
        scorers(),
        RunConfig(layers=[2], batch_size=4, keep_unit_counts=True, progress=False),
    )
    engine.run(examples)
    for scorer in engine.scorers:
        counts = scorer.unit_counts()
        assert set(counts.loc[counts.variant == "", "layer"]) == {2}


def test_buckets_hold_one_length(tiny):
    """No padding: every batch holds examples of exactly one piece count (batch-size invariance)."""
    from headprobe.inputs.batching import bucket, prepare

    prepared = prepare(random_sentences(40, seed=5), tiny.tokenizer, 512)
    batches = bucket(prepared, 4)
    assert sorted(i for batch in batches for i in batch) == list(range(40))
    for batch in batches:
        assert len({len(prepared.alignments[i]) for i in batch}) == 1
        assert 1 <= len(batch) <= 4
    lengths = [len(prepared.alignments[batch[0]]) for batch in batches]
    assert lengths == sorted(lengths, reverse=True)


def test_oom_backoff(tiny, monkeypatch):
    examples = random_sentences(same_length=True)
    _, reference = run(tiny.sdpa, tiny.tokenizer, examples, batch_size=4)

    model = tiny.sdpa
    forward = model.forward
    sizes: list[tuple[int, bool]] = []

    def forward_with_small_memory(*args, **kwargs):
        size = kwargs["input_ids"].shape[0]
        if size > 4:
            sizes.append((size, False))
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        sizes.append((size, True))
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", forward_with_small_memory)
    engine, backed_off = run(model, tiny.tokenizer, examples, batch_size=7)
    assert_same_counts(reference, backed_off)
    # 20 examples in batches of 7, 7, 6: each too big, each retried in halves 3 + 4, 3 + 4, 3 + 3
    assert sizes == [
        (7, False),
        (3, True),
        (4, True),
        (7, False),
        (3, True),
        (4, True),
        (6, False),
        (3, True),
        (3, True),
    ]
    assert sum(size for size, ok in sizes if ok) == 20
    assert engine.stats_["examples"] == 20
    assert engine.batch_size_ == 3


def test_oom_of_a_single_example_is_raised(bert_family, monkeypatch):
    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(bert_family.sdpa, "forward", no_memory)
    with pytest.raises(torch.OutOfMemoryError):
        run(bert_family.sdpa, bert_family.tokenizer, random_sentences(3), batch_size=2)


def test_other_errors_are_not_retried(bert_family, monkeypatch):
    calls = []

    def broken(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(bert_family.sdpa, "forward", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        run(
            bert_family.sdpa,
            bert_family.tokenizer,
            random_sentences(8, same_length=True),
            batch_size=8,
        )
    assert calls == [8]


def test_skipped_examples_are_counted(bert_family):
    """BERT fixture: max_position_embeddings 40. 38 words + [CLS] + [SEP] = 40 pieces fits;
    39 words = 41 pieces does not; "\\x00" is deleted by the normalizer: a word without pieces."""
    fits = Example(
        words=["the"] * 38,
        unit="fits",
        source="x:1",
        heads=[-1] + [0] * 37,
        deprels=["root"] + ["det"] * 37,
    )
    too_long = Example(
        words=["the"] * 39,
        unit="long",
        source="x:2",
        heads=[-1] + [0] * 38,
        deprels=["root"] + ["det"] * 38,
    )
    empty = Example(
        words=["the", "\x00", "cat"],
        unit="empty",
        source="x:3",
        heads=[2, 2, -1],
        deprels=["det", "dep", "root"],
    )
    examples = random_sentences(5) + [fits, too_long, empty]
    engine, counts = run(bert_family.sdpa, bert_family.tokenizer, examples, batch_size=4)
    assert engine.stats_["skipped"] == {"too_long": 1, "word_without_piece": 1}
    assert engine.stats_["examples"] == 6
    assert engine.stats_["words"] == sum(len(ex.words) for ex in examples[:5]) + 38
    sources = engine.stats_["skipped_sources"]
    assert len(sources) == 2
    assert any(s.startswith("x:2") for s in sources) and any(s.startswith("x:3") for s in sources)
    units = set(counts.unit)
    assert "fits" in units and "long" not in units and "empty" not in units
    dep = counts[
        (counts.analysis == "dependency") & (counts.unit == "fits") & (counts.variant == "")
    ]
    assert set(dep.n) == {37}  # 37 det arcs


def test_skipped_too_long_gpt2(gpt2_family):
    """GPT-2 fixture: n_positions 40, no special pieces: 40 words fit, 41 do not."""
    fits = Example(
        words=["cat"] * 40,
        unit="fits",
        source="g:1",
        heads=[-1] + [0] * 39,
        deprels=["root"] + ["nmod"] * 39,
    )
    too_long = Example(
        words=["cat"] * 41,
        unit="long",
        source="g:2",
        heads=[-1] + [0] * 40,
        deprels=["root"] + ["nmod"] * 40,
    )
    engine, counts = run(gpt2_family.sdpa, gpt2_family.tokenizer, [fits, too_long], batch_size=2)
    assert engine.stats_["skipped"] == {"too_long": 1}
    assert set(counts.unit) == {"fits"}


def test_roberta_position_offset_limits_length(roberta_family):
    """RoBERTa numbers positions from padding_idx + 1 (= 2 here), so max_position_embeddings 42
    leaves room for 40 pieces. A 42-piece sentence (40 words + <s> + </s>) must be skipped as
    too_long and counted (METHODS §1), not crash the run with an index error; 40 pieces fit."""
    fam = roberta_family
    fits = Example(
        words=["cat"] * 38,
        unit="fits",
        source="r:1",
        heads=[-1] + [0] * 37,
        deprels=["root"] + ["nmod"] * 37,
    )
    too_long = Example(
        words=["cat"] * 40,
        unit="long",
        source="r:2",
        heads=[-1] + [0] * 39,
        deprels=["root"] + ["nmod"] * 39,
    )
    engine, counts = run(fam.sdpa, fam.tokenizer, [fits, too_long], batch_size=1)
    assert engine.stats_["skipped"] == {"too_long": 1}
    assert set(counts.unit) == {"fits"}


def test_the_pass_ends_at_the_last_scored_layer_and_counts_the_same(tiny, monkeypatch):
    """The attention pass stops the model once the last scored layer's attention is read: that
    layer's MLP never runs, and the counts equal those of passes run whole (the stop turned
    off, as for an offloaded model)."""
    import headprobe.model.capture as capture
    from headprobe.model.discovery import attention_sites

    examples = random_sentences(12, seed=5)
    last = tiny.n_layers - 1
    mlps = [
        module
        for name, module in tiny.sdpa.named_modules()
        if name.endswith((f"h.{last}.mlp", f"layer.{last}.intermediate"))
    ]
    assert len(mlps) == 1
    attention_sites(tiny.sdpa)  # found once per model, by a whole forward of its own
    calls = []
    handle = mlps[0].register_forward_pre_hook(lambda m, args: calls.append(1))
    try:
        _, stopped = run(tiny.sdpa, tiny.tokenizer, examples, batch_size=5)
        assert calls == []
        monkeypatch.setattr(capture, "offloaded", lambda model: True)
        _, whole = run(tiny.sdpa, tiny.tokenizer, examples, batch_size=5)
        assert calls  # run whole: the MLP ran
    finally:
        handle.remove()
    assert_same_counts(stopped, whole)
