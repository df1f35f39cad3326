"""Scorers on hand-built attention (METHODS §2 and §4); every expected count is worked out below.

Two 4-word sentences, each word exactly one WordPiece piece, so piece p = word p - 1,
piece 0 = [CLS], piece 5 = [SEP]. Word-level matrices are written with key columns
(w0, w1, w2, w3, CLS, SEP), turned into piece attention, and pooled by the real
`LayerAttention`; the scorers then run the engine's lifecycle.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import make_gpt2

from headprobe.inputs.align import align_words
from headprobe.inputs.batching import Batch
from headprobe.inputs.corpora.base import Example
from headprobe.scoring.layer_attention import LayerAttention
from headprobe.scoring.scorer_base import masked_word_attention
from headprobe.studies.dependency.analysis import DependencyScorer
from headprobe.studies.positional.analysis import PositionalScorer
from headprobe.studies.surface.analysis import SurfaceScorer

S1 = Example(
    words=["the", "big", "cat", "sat"],
    unit="s1",
    source="t:1",
    heads=[2, 2, 3, -1],
    deprels=["det", "amod", "nsubj", "root"],
    upos=["DET", "ADJ", "NOUN", "VERB"],
)
S2 = Example(
    words=["the", "cat", "sat", "."],
    unit="s2",
    source="t:2",
    heads=[1, 2, -1, 2],
    deprels=["det", "nsubj", "root", "punct"],
    upos=["DET", "NOUN", "VERB", "PUNCT"],
)
LAYER = 1  # the model has layers 0, 1; only layer 1 is scored


@pytest.fixture
def batch(wordpiece_tokenizer) -> Batch:
    examples = [S1, S2]
    alignments = align_words(wordpiece_tokenizer, [ex.words for ex in examples])
    for a in alignments:
        assert a.piece_word == [-1, 0, 1, 2, 3, -1]  # one piece per word
    return Batch(examples, alignments, pad_id=wordpiece_tokenizer.pad_token_id)


def to_pieces(word_rows) -> torch.Tensor:
    """[4 words x 6 keys (w0..w3, CLS, SEP)] -> [6 x 6] piece attention; special query rows uniform."""
    w = torch.tensor(word_rows, dtype=torch.float32)
    p = torch.full((6, 6), 1 / 6)
    p[1:5, 1:5] = w[:, :4]
    p[1:5, 0] = w[:, 4]
    p[1:5, 5] = w[:, 5]
    return p


def attention(per_example_per_head) -> torch.Tensor:
    """[[ex0 head0, ex0 head1], [ex1 head0, ex1 head1]] word rows -> [2, 2, 6, 6] pieces."""
    return torch.stack([torch.stack([to_pieces(h) for h in ex]) for ex in per_example_per_head])


def run(scorer, batch, pieces, n_layers=2, n_heads=2, layers=(LAYER,), causal=False):
    """The engine's calls: bind once (`causal`: the stack's attention is causal), then state =
    prepare(batch), update per layer, end_batch."""
    scorer.bind(n_layers, n_heads, list(layers), keep_units=True, causal=causal)
    state = scorer.prepare(batch)
    att = LayerAttention(LAYER, pieces[None], batch)
    scorer.update(att, state)
    scorer.end_batch(state)
    return scorer.unit_counts(), att


def head_rows(counts, value="hits"):
    """{(unit, label, direction, head): (n, value)} for the attention-head rows."""
    rows = counts[counts.variant == ""]
    assert set(rows.layer) == {LAYER}
    return {
        (r.unit, r.label, r.direction, r.head): (r.n, getattr(r, value)) for r in rows.itertuples()
    }


# ---------------------------------------------------------------------------------------
# dependency
# ---------------------------------------------------------------------------------------
# Specials get 5.0 / 4.0 in head 0: more than any word, and must be dropped.
DEP_S1_H0 = [
    [0.9, 0.3, 0.5, 0.2, 5.0, 4.0],
    [0.3, 0.0, 0.3, 0.1, 5.0, 4.0],
    [0.4, 0.2, 0.7, 0.6, 5.0, 4.0],
    [0.4, 0.1, 0.8, 0.0, 5.0, 4.0],
]
NEXT_WORD = [
    [0.0, 1, 0, 0, 0, 0],  # head 1: each word attends to the next one
    [0.0, 0, 1, 0, 0, 0],
    [0.0, 0, 0, 1, 0, 0],
    [0.0, 0, 0, 0, 0, 0],
]
DEP_S2_H0 = [
    [0.0, 0.6, 0.4, 0.0, 5.0, 4.0],
    [0.5, 0.0, 0.5, 0.0, 5.0, 4.0],
    [0.1, 0.2, 0.0, 0.7, 5.0, 4.0],
    [0.0, 0.0, 0.9, 0.1, 5.0, 4.0],
]
# s1 arcs (dependent -> head): det 0->2, amod 1->2, nsubj 2->3 (root not scored)
# s2 arcs: det 0->1, nsubj 1->2 (root and punct 3->2 not scored)
#
# dep->head: argmax over row i with A[i, i] := 0
#   s1 h0: det   row0 [0, .3, .5, .2] -> 2 = head: hit      (self .9 zeroed)
#          amod  row1 [.3, 0, .3, .1] -> tie 0/2 -> 0: miss (lowest index)
#          nsubj row2 [.4, .2, 0, .6] -> 3: hit            (self .7 would have won)
#   s1 h1: det row0 -> 1 miss; amod row1 -> 2 hit; nsubj row2 -> 3 hit
#   s2 h0: det   row0 [0, .6, .4, 0] -> 1: hit;  nsubj row1 [.5, 0, .5, 0] -> tie -> 0: miss
#   s2 h1: det row0 -> 1 hit; nsubj row1 -> 2 hit
# head<-dep: argmax over column i (which word attends most to the dependent), A[i, i] := 0
#   s1 h0: det   col0 [0, .3, .4, .4] -> tie rows 2/3 -> 2 = head: hit (lowest index)
#          amod  col1 [.3, 0, .2, .1] -> 0: miss
#          nsubj col2 [.5, .3, 0, .8] -> 3: hit
#   s1 h1: col0 all 0 -> 0 miss; col1 -> row 0 miss; col2 -> row 1 miss
#   s2 h0: det   col0 [0, .5, .1, 0] -> 1: hit;  nsubj col1 [.6, 0, .2, 0] -> 0: miss
#   s2 h1: col0 all 0 -> 0 miss (head is 1); col1 -> row 0 miss (head is 2)
D, H = "dep->head", "head<-dep"
DEP_EXPECTED = {
    # (unit, label, direction, head): (n, hits)
    ("s1", "det", D, 0): (1, 1),
    ("s1", "amod", D, 0): (1, 0),
    ("s1", "nsubj", D, 0): (1, 1),
    ("s1", "ALL", D, 0): (3, 2),
    ("s1", "det", D, 1): (1, 0),
    ("s1", "amod", D, 1): (1, 1),
    ("s1", "nsubj", D, 1): (1, 1),
    ("s1", "ALL", D, 1): (3, 2),
    ("s1", "det", H, 0): (1, 1),
    ("s1", "amod", H, 0): (1, 0),
    ("s1", "nsubj", H, 0): (1, 1),
    ("s1", "ALL", H, 0): (3, 2),
    ("s1", "det", H, 1): (1, 0),
    ("s1", "amod", H, 1): (1, 0),
    ("s1", "nsubj", H, 1): (1, 0),
    ("s1", "ALL", H, 1): (3, 0),
    ("s2", "det", D, 0): (1, 1),
    ("s2", "nsubj", D, 0): (1, 0),
    ("s2", "ALL", D, 0): (2, 1),
    ("s2", "det", D, 1): (1, 1),
    ("s2", "nsubj", D, 1): (1, 1),
    ("s2", "ALL", D, 1): (2, 2),
    ("s2", "det", H, 0): (1, 1),
    ("s2", "nsubj", H, 0): (1, 0),
    ("s2", "ALL", H, 0): (2, 1),
    ("s2", "det", H, 1): (1, 0),
    ("s2", "nsubj", H, 1): (1, 0),
    ("s2", "ALL", H, 1): (2, 0),
}


def test_dependency_hits(batch):
    pieces = attention([[DEP_S1_H0, NEXT_WORD], [DEP_S2_H0, NEXT_WORD]])
    counts, att = run(DependencyScorer(), batch, pieces)
    # the pooled word-level attention is the matrix written above
    assert torch.allclose(att.words[0, 0, 0, 0], torch.tensor(DEP_S1_H0), atol=1e-6)
    assert torch.allclose(att.words[0, 0, 1, 1], torch.tensor(NEXT_WORD), atol=1e-6)
    assert set(counts.analysis) == {"dependency"}
    assert head_rows(counts) == DEP_EXPECTED  # no root / punct rows, nothing else


def test_dependency_baselines(batch):
    pieces = attention([[DEP_S1_H0, NEXT_WORD], [DEP_S2_H0, NEXT_WORD]])
    counts, _ = run(DependencyScorer(), batch, pieces)
    base = counts[counts.variant != ""]
    assert set(base["layer"]) == {-1} and set(base["head"]) == {-1} and set(base.direction) == {""}
    offsets = [f"offset={k:+d}" for k in (-5, -4, -3, -2, -1, 1, 2, 3, 4, 5)] + ["first"]
    assert set(base.variant) == set(offsets)  # `first` predicts word 0: no arc here is headed by it
    got = {(r.unit, r.label, r.variant): (r.n, r.hits) for r in base.itertuples()}
    # offsets of the arcs: s1 det 0->2 = +2, amod 1->2 = +1, nsubj 2->3 = +1; s2 det +1, nsubj +1
    hits = {
        ("s1", "det"): {"offset=+2": 1},
        ("s1", "amod"): {"offset=+1": 1},
        ("s1", "nsubj"): {"offset=+1": 1},
        ("s1", "ALL"): {"offset=+1": 2, "offset=+2": 1},
        ("s2", "det"): {"offset=+1": 1},
        ("s2", "nsubj"): {"offset=+1": 1},
        ("s2", "ALL"): {"offset=+1": 2},
    }
    n = {
        ("s1", "det"): 1,
        ("s1", "amod"): 1,
        ("s1", "nsubj"): 1,
        ("s1", "ALL"): 3,
        ("s2", "det"): 1,
        ("s2", "nsubj"): 1,
        ("s2", "ALL"): 2,
    }
    expected = {
        (unit, label, v): (n[(unit, label)], hits[(unit, label)].get(v, 0))
        for (unit, label) in n
        for v in offsets
    }
    assert got == expected


def test_dependency_two_batches_add_up(batch):
    """Counts of two batches are kept as separate chunks and add up (shards merge by summing)."""
    pieces = attention([[DEP_S1_H0, NEXT_WORD], [DEP_S2_H0, NEXT_WORD]])
    scorer = DependencyScorer()
    scorer.bind(2, 2, [LAYER], keep_units=True)
    for _ in range(2):
        state = scorer.prepare(batch)
        scorer.update(LayerAttention(LAYER, pieces[None], batch), state)
        scorer.end_batch(state)
    rows = scorer.unit_counts()
    rows = (
        rows[rows.variant == ""]
        .groupby(["unit", "label", "direction", "head"])[["n", "hits"]]
        .sum()
    )
    doubled = {key: (2 * n, 2 * h) for key, (n, h) in DEP_EXPECTED.items()}
    assert {key: (r.n, r.hits) for key, r in zip(rows.index, rows.itertuples())} == doubled


def test_masked_word_attention(batch):
    pieces = attention([[DEP_S1_H0, NEXT_WORD], [DEP_S2_H0, NEXT_WORD]])
    att = LayerAttention(LAYER, pieces[None], batch)
    scores = masked_word_attention(att, batch, drop_self=True)[0, 0]  # the one layer and measure
    assert scores.shape == (2, 2, 4, 4)  # specials dropped
    assert torch.all(scores.diagonal(dim1=-2, dim2=-1) == 0)
    assert torch.allclose(scores[0, 0, 0], torch.tensor([0.0, 0.3, 0.5, 0.2]))  # not renormalised
    kept = masked_word_attention(att, batch, drop_self=False)[0, 0]
    assert kept[0, 0, 0, 0].item() == pytest.approx(0.9)


def test_dependency_padding_is_masked(wordpiece_tokenizer):
    """Whatever sits in padding word rows/columns never wins an argmax."""
    short = Example(
        words=["the", "cat"], unit="short", source="t:3", heads=[1, -1], deprels=["det", "root"]
    )
    examples = [S1, short]
    batch = Batch(
        examples,
        align_words(wordpiece_tokenizer, [ex.words for ex in examples]),
        pad_id=wordpiece_tokenizer.pad_token_id,
    )
    words = torch.zeros(2, 1, 4, 6)  # s1: all 0 -> every argmax is word 0
    words[1, 0, 0] = torch.tensor([0.0, 0.1, 9.0, 9.0, 0.0, 0.0])  # "the": cat .1, padding words 9
    words[1, 0, 1] = torch.tensor([0.2, 0.0, 9.0, 9.0, 0.0, 0.0])  # "cat": the .2
    words[1, 0, 2:, :] = 9.0  # padding word rows
    att = SimpleNamespace(
        words=words[None, None], pieces=None, layers=(LAYER,)
    )  # a stand-in for LayerAttention
    scorer = DependencyScorer()
    scorer.bind(2, 1, [LAYER], keep_units=True)
    state = scorer.prepare(batch)
    scorer.update(att, state)
    scorer.end_batch(state)
    got = head_rows(scorer.unit_counts())
    # short, det 0 -> 1. dep->head: row 0 = [0 (self), .1, pad, pad] -> 1: hit (9.0 would win unmasked)
    #                    head<-dep: column 0 = [0 (self), .2, pad, pad] -> 1: hit
    assert got[("short", "det", D, 0)] == (1, 1) and got[("short", "det", H, 0)] == (1, 1)
    assert got[("short", "ALL", D, 0)] == (1, 1) and got[("short", "ALL", H, 0)] == (1, 1)
    # s1: every argmax is word 0 (all ties at 0, lowest index); no arc has head 0 -> no hits
    assert all(hits == 0 for (unit, _, _, _), (_, hits) in got.items() if unit == "s1")


# ---------------------------------------------------------------------------------------
# positional
# ---------------------------------------------------------------------------------------
POS_S1_H0 = [
    [0.9, 0.1, 0.0, 0.0, 0.0, 0.0],  # -> w0 (self): offset 0
    [0.6, 0.2, 0.1, 0.0, 0.1, 0.0],  # -> w0: offset -1
    [0.1, 0.1, 0.1, 0.1, 0.6, 0.0],  # -> CLS: special
    [0.7, 0.1, 0.1, 0.1, 0.0, 0.0],
]  # -> w0: offset -3: other
POS_S1_H1 = [
    [0.0, 1, 0, 0, 0, 0],  # +1
    [0.0, 0, 1, 0, 0, 0],  # +1
    [0.0, 0, 0, 1, 0, 0],  # +1
    [0.0, 0, 0, 0, 0, 1],
]  # -> SEP: special
POS_S2_H0 = [
    [0.5, 0.5, 0, 0, 0, 0],  # tie self/next -> w0: offset 0
    [0, 0, 0, 0.2, 0, 0.1],  # -> w3: offset +2
    [1.0, 0, 0, 0, 0, 0],  # -> w0: offset -2
    [0, 0, 0, 0, 0.3, 0.3],
]  # tie CLS/SEP -> CLS: special
UNIFORM = [[1 / 6] * 6] * 4  # everything ties -> w0: offsets 0, -1, -2, -3 (other)
POS_EXPECTED_HITS = {
    ("s1", 0): {"0": 1, "-1": 1, "special": 1, "other": 1},
    ("s1", 1): {"+1": 3, "special": 1},
    ("s2", 0): {"0": 1, "+2": 1, "-2": 1, "special": 1},
    ("s2", 1): {"0": 1, "-1": 1, "-2": 1, "other": 1},
}
POS_LABELS = ["-2", "-1", "0", "+1", "+2", "special", "other"]


def test_positional_buckets(batch):
    pieces = attention([[POS_S1_H0, POS_S1_H1], [POS_S2_H0, UNIFORM]])
    counts, _ = run(PositionalScorer(), batch, pieces)
    assert set(counts.analysis) == {"positional"} and set(counts.direction) == {""}
    expected = {
        (unit, label, "", head): (4, POS_EXPECTED_HITS[(unit, head)].get(label, 0))
        for unit in ("s1", "s2")
        for head in (0, 1)
        for label in POS_LABELS
    }
    assert head_rows(counts) == expected


def test_positional_without_specials():
    """GPT-2 style: no specials, so the CLS/SEP key columns never count."""
    tok = make_gpt2(add_prefix_space=True)
    ex = Example(words=["the", "cat", "sat"], unit="g", source="t:4")
    batch = Batch([ex], align_words(tok, [ex.words]), pad_id=tok.eos_token_id)
    p = torch.tensor([[1.0, 0, 0], [0.3, 0.7, 0], [0.2, 0.5, 0.3]])[None, None]
    # row 0 -> 0 (offset 0), row 1 -> 1 (offset 0), row 2 -> 1 (offset -1)
    counts, _ = run(PositionalScorer(), batch, p, n_heads=1, causal=True)
    expected = {("g", label, "", 0): (3, {"0": 2, "-1": 1}.get(label, 0)) for label in POS_LABELS}
    assert head_rows(counts) == expected


# ---------------------------------------------------------------------------------------
# surface
# ---------------------------------------------------------------------------------------
S2_H1 = [
    [0.25, 0.25, 0.0, 0.0, 0.25, 0.25],  # the: w0, w1, CLS, SEP
    [0.5, 0.5, 0.0, 0.0, 0.0, 0.0],  # cat: the, self
    [0.0, 0.0, 0.0, 1.0, 0.0, 0.0],  # sat: "."
    [0.2, 0.3, 0.4, 0.0, 0.1, 0.0],
]  # .: the .2, cat .3, sat .4, CLS .1
S1_H1 = [[0.0, 1, 0, 0, 0, 0], [0.0, 0, 1, 0, 0, 0], [0.0, 0, 0, 1, 0, 0], [0.0, 0, 0, 0, 0, 1]]
LN6 = math.log(6)
H_1234 = -sum(p * math.log(p) for p in (0.1, 0.2, 0.3, 0.4))
# masses summed over the 4 word queries (n: 4; prev/next: 3; entropy: 4 pieces)
SURFACE_EXPECTED = {
    # uniform 1/6 over 6 keys: self 4/6, prev 3/6, next 3/6, CLS 4/6, SEP 4/6; entropy ln 6 each
    # first position = [CLS] (the tokenizer puts it first): the same as cls, all 4 words as queries
    ("s1", 0): dict(
        self=4 / 6, prev=3 / 6, next=3 / 6, cls=4 / 6, sep=4 / 6, punct=0.0, entropy=4 * LN6
    ),
    # s2 has a punctuation word ("."): each word pays it 1/6
    ("s2", 0): dict(
        self=4 / 6, prev=3 / 6, next=3 / 6, cls=4 / 6, sep=4 / 6, punct=4 / 6, entropy=4 * LN6
    ),
    # one-hot next word, last word -> SEP: next 1+1+1, SEP 1, entropy 0
    ("s1", 1): dict(self=0.0, prev=0.0, next=3.0, cls=0.0, sep=1.0, punct=0.0, entropy=0.0),
    # self .25+.5+0+0; prev (cat->the .5)+(sat->cat 0)+(.->sat .4); next (the->cat .25)+(cat->sat 0)+(sat->. 1)
    # cls .25+.1; sep .25; punct (to ".") 1.0 from "sat"; entropy ln4 + ln2 + 0 + H(.1,.2,.3,.4)
    ("s2", 1): dict(
        self=0.75,
        prev=0.9,
        next=1.25,
        cls=0.35,
        sep=0.25,
        punct=1.0,
        entropy=math.log(4) + math.log(2) + H_1234,
    ),
}
for _masses in SURFACE_EXPECTED.values():
    _masses["first"] = _masses["cls"]
SURFACE_N = dict(
    self=4, prev=3, next=3, cls=4, sep=4, punct=4, first=4, entropy=4, entropy_uniform=4
)


def test_surface_masses_and_entropy(batch):
    pieces = attention([[UNIFORM, S1_H1], [UNIFORM, S2_H1]])
    # the "." row of S2_H1 puts .1 on CLS, .2/.3/.4 on the words: as pieces [.1, .2, .3, .4, 0, 0]
    assert torch.allclose(pieces[1, 1, 4], torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0, 0.0]))
    counts, _ = run(SurfaceScorer(), batch, pieces)
    assert set(counts.analysis) == {"surface"}
    assert counts.hits.isna().all()
    got = head_rows(counts, value="mass")
    for (unit, head), masses in SURFACE_EXPECTED.items():
        # no causal mask, 6 keys visible to every query piece: uniform entropy ln 6 per piece
        masses = dict(masses, entropy_uniform=4 * LN6)
        for label, mass in masses.items():
            n, value = got.pop((unit, label, "", head))
            assert n == SURFACE_N[label], (unit, head, label)
            assert value == pytest.approx(mass, abs=1e-5), (unit, head, label)
    assert got == {}


def test_surface_causal_multi_piece():
    """GPT-2 style, causal, no specials; "unbelievable" = 3 pieces (Ġun, believ, able), "cat" = 1."""
    tok = make_gpt2(add_prefix_space=True)
    ex = Example(words=["unbelievable", "cat"], unit="g", source="t:5")
    batch = Batch([ex], align_words(tok, [ex.words]), pad_id=tok.eos_token_id)
    assert batch.piece_word.tolist() == [[0, 0, 0, 1]]
    # uniform over the visible keys: piece t sees t + 1 keys
    p = torch.tensor([[1.0, 0, 0, 0], [1 / 2, 1 / 2, 0, 0], [1 / 3, 1 / 3, 1 / 3, 0], [1 / 4] * 4])[
        None, None
    ]
    counts, _ = run(SurfaceScorer(), batch, p, n_heads=1, causal=True)
    got = head_rows(counts, value="mass")
    # unbelievable row = mean of piece rows 0-2, each summing to 1 over its own pieces: self 1, next (cat) 0
    # cat row: to unbelievable 3/4 (prev), to itself 1/4
    # entropy: ln1 + ln2 + ln3 + ln4 = ln 24; uniform entropy the same (rows are uniform over what they see)
    # first position = the first word (no BOS): only "cat" is a query after it, paying it 3/4
    expected = dict(
        self=(2, 1.25),
        prev=(1, 0.75),
        next=(1, 0.0),
        cls=(2, 0.0),
        sep=(2, 0.0),
        punct=(2, 0.0),
        first=(1, 0.75),
        entropy=(4, math.log(24)),
        entropy_uniform=(4, math.log(24)),
    )
    assert set(got) == {("g", label, "", 0) for label in expected}
    for label, (n, mass) in expected.items():
        got_n, got_mass = got[("g", label, "", 0)]
        assert got_n == n, label
        assert got_mass == pytest.approx(mass, abs=1e-5), label


# ---------------------------------------------------------------------------------------
# METHODS §2: the `first` baseline, and rows / columns with no attention left (causal)
# ---------------------------------------------------------------------------------------
# s3: "sat the cat .": `list` arcs the -> sat (offset -1) and cat -> sat (offset -2) are
# both headed by word 0, so `first` predicts 2 of 2, each offset only 1.
S3 = Example(
    words=["sat", "the", "cat", "."],
    unit="s3",
    source="t:3",
    heads=[-1, 0, 0, 0],
    deprels=["root", "list", "list", "punct"],
)
# s4, causal: "the cat sat ." with det 0->1, nsubj 1->2, list 3->0; each word attends
# uniformly to the words it can see (itself and earlier ones), nothing to the specials.
S4 = Example(
    words=["the", "cat", "sat", "."],
    unit="s4",
    source="t:4",
    heads=[1, 2, -1, 0],
    deprels=["det", "nsubj", "root", "list"],
)
CAUSAL_UNIFORM = [
    [1.0, 0, 0, 0, 0, 0],
    [1 / 2, 1 / 2, 0, 0, 0, 0],
    [1 / 3, 1 / 3, 1 / 3, 0, 0, 0],
    [1 / 4, 1 / 4, 1 / 4, 1 / 4, 0, 0],
]


def one_example_batch(tokenizer, example):
    return Batch([example], align_words(tokenizer, [example.words]), pad_id=tokenizer.pad_token_id)


def test_first_baseline_predicts_word_one(wordpiece_tokenizer):
    batch = one_example_batch(wordpiece_tokenizer, S3)
    counts, _ = run(DependencyScorer(), batch, attention([[NEXT_WORD, NEXT_WORD]]))
    base = counts[(counts.variant != "") & (counts.label == "list")].set_index("variant")
    assert base.loc["first", "hits"] == 2 and base.loc["first", "n"] == 2
    assert base.loc["offset=-1", "hits"] == 1 and base.loc["offset=-2", "hits"] == 1
    assert base.drop(index=["first", "offset=-1", "offset=-2"])["hits"].eq(0).all()


def test_empty_row_or_column_predicts_nothing(wordpiece_tokenizer):
    """dep->head: `the` (word 0) sees no other word: its row is empty, the det arc is a miss and
    unreachable. head<-dep: no word after `.` attends to it: its column is empty, and the
    `list` arc (head = word 0, which a tie-break to the lowest index would have 'predicted') is
    a miss and unreachable.
        det   0->1: dep->head row 0 empty (miss); head<-dep col 0 = [-, 1/2, 1/3, 1/4] -> 1 hit
        nsubj 1->2: dep->head row 1 = [1/2, -] -> 0 miss; head<-dep col 1 = [1/3, 1/4] -> 2 hit
        list  3->0: dep->head row 3 = [1/4, 1/4, 1/4] -> tie -> 0 hit; head<-dep col 3 empty (miss)
    """
    batch = one_example_batch(wordpiece_tokenizer, S4)
    scorer = DependencyScorer()
    counts, _ = run(scorer, batch, attention([[CAUSAL_UNIFORM, CAUSAL_UNIFORM]]), causal=True)
    got = head_rows(counts)
    for head in (0, 1):
        assert got[("s4", "det", D, head)] == (1, 0)
        assert got[("s4", "det", H, head)] == (1, 1)
        assert got[("s4", "nsubj", D, head)] == (1, 0)
        assert got[("s4", "nsubj", H, head)] == (1, 1)
        assert got[("s4", "list", D, head)] == (1, 1)
        assert got[("s4", "list", H, head)] == (1, 0)
        assert got[("s4", "ALL", D, head)] == (3, 1)
        assert got[("s4", "ALL", H, head)] == (3, 2)
    unreachable = {
        label: scorer.tally_.arrays(label)["extra:unreachable"].sum(0).tolist()
        for label in ("det", "nsubj", "list", "ALL")
    }  # [dep->head, head<-dep]
    assert unreachable == {"det": [1, 0], "nsubj": [0, 0], "list": [0, 1], "ALL": [1, 1]}
