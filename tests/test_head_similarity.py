"""Head clustering (Clark et al. 2019 section 5): JS divergence between heads on hand-built attention.

One 3-word sentence, one WordPiece piece per word (piece p = word p - 1; piece 0 [CLS],
piece 4 [SEP]); word rows written with key columns (w0, w1, w2, CLS, SEP) and pooled by the
real `LayerAttention`.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from headprobe.inputs.align import align_words
from headprobe.inputs.batching import Batch
from headprobe.inputs.corpora.base import Example
from headprobe.scoring.layer_attention import LayerAttention
from headprobe.scoring.pair_tally import pair_arrays
from headprobe.scoring.tally import unit_fold, unit_weights
from headprobe.studies.head_similarity import analysis as hs
from headprobe.studies.head_similarity.analysis import (
    HeadSimilarityScorer,
    distance_frame,
    js_row_sums,
)

WORDS = ["the", "cat", "sat"]
# head 0 (P) and head 1 (Q), rows = words as queries, no mass on the specials
P = [[1.0, 0.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0]]
Q = [[0.0, 1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0, 0.0], [0.0, 0.5, 0.5, 0.0, 0.0]]
# by hand, JS(P, Q) = H(M) - (H(P) + H(Q)) / 2 with M = (P + Q) / 2, natural logs:
#   row 0: M = [.5, .5, 0]: H(M) = ln 2, H(P) = H(Q) = 0               -> ln 2
#   row 1: P = Q                                                        -> 0
#   row 2: M = [0, .25, .75]: H(M) = .25 ln 4 + .75 ln 4/3; H(P) = 0, H(Q) = ln 2
ROW2 = 0.25 * math.log(4) + 0.75 * math.log(4 / 3) - math.log(2) / 2
JS_SUM = math.log(2) + 0.0 + ROW2
# the same three rows from both directions give the same divergence; a head against itself: 0


def pieces_of(word_rows) -> torch.Tensor:
    """[3 words x 5 keys (w0..w2, CLS, SEP)] -> [5 x 5] piece attention; special rows uniform."""
    w = torch.tensor(word_rows, dtype=torch.float32)
    p = torch.full((5, 5), 0.2)
    p[1:4, 1:4] = w[:, :3]
    p[1:4, 0] = w[:, 3]
    p[1:4, 4] = w[:, 4]
    return p


def run_scorer(wordpiece_tokenizer, examples, maps, n_heads=2, n_boot=1):
    batch = Batch(
        examples,
        align_words(wordpiece_tokenizer, [ex.words for ex in examples]),
        pad_id=wordpiece_tokenizer.pad_token_id,
    )
    pieces = torch.stack([torch.stack([pieces_of(m) for m in per_example]) for per_example in maps])
    scorer = HeadSimilarityScorer()
    scorer.bind(1, n_heads, [0], n_boot=n_boot)
    state = scorer.prepare(batch)
    scorer.update(LayerAttention(0, pieces[None], batch), state)
    scorer.end_batch(state)
    scorer.finish()
    return scorer


def test_js_of_two_3x3_maps_by_hand(wordpiece_tokenizer):
    example = Example(words=WORDS, unit="u1", source="t:1")
    scorer = run_scorer(wordpiece_tokenizer, [example], [[P, Q]])
    tally = scorer.tally_
    assert tally.sorted_labels() == ["js"] and tally.senders == [0]
    a = pair_arrays(tally, "js")
    assert a["n"][:, 0, 0].sum() == 3  # three word rows
    # [receiver head, sender head] of layer 0, summed over the folds
    js = a["hits"].sum(0)[0, 0, :, 0, :, 0]
    assert js == pytest.approx(np.array([[0.0, JS_SUM], [JS_SUM, 0.0]]), abs=1e-6)
    table = distance_frame(tally).set_index(["layer", "head", "sender_layer", "sender_head"])
    assert table.loc[(0, 0, 0, 1), "score"] == pytest.approx(JS_SUM / 3, abs=1e-6)
    assert table.loc[(0, 1, 0, 0), "score"] == pytest.approx(JS_SUM / 3, abs=1e-6)
    assert table.loc[(0, 0, 0, 0), "score"] == 0.0
    halves = table.loc[(0, 0, 0, 1), ["score_fold0", "score_fold1"]].to_numpy(np.float64)
    fold = unit_fold("u1")  # one unit: the other half has no rows
    assert halves[fold] == pytest.approx(JS_SUM / 3, abs=1e-6) and np.isnan(halves[1 - fold])


def test_pair_intervals_are_the_bootstrap_over_units(wordpiece_tokenizer):
    """Two units, (P, Q) and (P, P): the interval of the pair (0-0, 0-1) is the 2.5th and 97.5th
    percentile of sum_u w_u JS_u / sum_u w_u rows_u over the units' Poisson weights (METHODS §5),
    worked out here from the weights alone; Holm adjusts the pairs' p-values together."""
    units = [Example(words=WORDS, unit="u1", source="t:1"), Example(WORDS, unit="u2", source="t:2")]
    scorer = run_scorer(wordpiece_tokenizer, units, [[P, Q], [P, P]], n_boot=200)
    table = distance_frame(scorer.tally_).set_index(
        ["layer", "head", "sender_layer", "sender_head"]
    )
    w1, w2 = unit_weights("u1", n_boot=200), unit_weights("u2", n_boot=200)
    with np.errstate(invalid="ignore"):
        resampled = w1 * JS_SUM / (3 * w1 + 3 * w2)
    low, high = np.percentile(resampled[np.isfinite(resampled)], [2.5, 97.5])
    pair = table.loc[(0, 0, 0, 1)]
    assert pair["score"] == pytest.approx(JS_SUM / 6, abs=1e-6)
    assert (pair["ci_low"], pair["ci_high"]) == pytest.approx((low, high), abs=1e-6)
    assert pair["p"] == pytest.approx((1 + (resampled == 0).sum()) / 201)  # JS = 0 when w1 = 0
    same = table.loc[(0, 0, 0, 0)]
    # a head against itself: 0 in every resample that has rows (both weights 0: no value)
    assert same["score"] == 0.0
    assert same["p"] == pytest.approx((1 + np.isfinite(resampled).sum()) / 201)
    assert (table["p_holm"] >= table["p"]).all()
    assert list(distance_frame(scorer.tally_).columns) == hs.DISTANCE_COLUMNS


def test_rows_are_renormalised_and_specials_are_keys(wordpiece_tokenizer):
    """Mass on [SEP] is part of the distribution: a head parking everything on [SEP] is far from one
    attending to words; a row scaled by a constant is the same distribution."""
    sep = [[0.0, 0.0, 0.0, 0.0, 1.0]] * 3
    example = Example(words=WORDS, unit="u1", source="t:1")
    scorer = run_scorer(wordpiece_tokenizer, [example], [[sep, P]])
    a = pair_arrays(scorer.tally_, "js")["hits"].sum(0)[0, 0, 0, 0, :, 0]  # receiver 0-0
    assert a[1] == pytest.approx(3 * math.log(2), abs=1e-6)  # disjoint supports: ln 2 per row


def test_units_add_up_and_pairs_match_a_direct_computation(monkeypatch):
    """js_row_sums against a per-pair NumPy computation, with blocks forced small (chunk edges)."""
    monkeypatch.setattr(hs, "CHUNK_BYTES", 1)
    rng = np.random.default_rng(0)
    k, rows, keys = 5, 7, 4
    p = rng.dirichlet(np.ones(keys), size=(k, rows))
    p[0, 0] = [1.0, 0.0, 0.0, 0.0]  # a zero: 0 log 0 = 0
    group = np.array([0, 0, 1, 1, 1, 2, 2])
    got = js_row_sums(torch.tensor(p, dtype=torch.float32), torch.tensor(group), 3).numpy()

    def entropy(x):
        x = x[x > 0]
        return -(x * np.log(x)).sum()

    want = np.zeros((3, k, k))
    for a in range(k):
        for b in range(k):
            for r in range(rows):
                m = (p[a, r] + p[b, r]) / 2
                want[group[r], a, b] += entropy(m) - (entropy(p[a, r]) + entropy(p[b, r])) / 2
    assert got == pytest.approx(want, abs=1e-5)


def test_clusters_and_layer_cohesion():
    """Two layers of two heads, heads of a layer close together: the nearest head is in its layer,
    the clusters are the layers, within-layer divergence is smaller."""
    heads = [(0, 0), (0, 1), (1, 0), (1, 1)]
    close = {frozenset([(0, 0), (0, 1)]), frozenset([(1, 0), (1, 1)])}
    rows = []
    for a in heads:
        for b in heads:
            js = 0.0 if a == b else (0.05 if frozenset([a, b]) in close else 0.5)
            rows.append(
                dict(
                    layer=a[0],
                    head=a[1],
                    sender_layer=b[0],
                    sender_head=b[1],
                    n=10.0,
                    score=js,
                    score_fold0=js,
                    score_fold1=js,
                )
            )
    distances = pd.DataFrame(rows)
    clusters = hs.head_clusters(distances)
    assert list(clusters["nearest_same_layer"]) == [True] * 4
    assert clusters.groupby("layer")["cluster"].nunique().eq(1).all()
    assert clusters["cluster"].nunique() == 2
    cohesion = hs.layer_cohesion(distances, clusters, n_perm=99)
    assert cohesion["within_layer_js"] == pytest.approx(0.05)
    assert cohesion["between_layer_js"] == pytest.approx(0.5)
    assert cohesion["adjusted_rand_clusters_layers"] == pytest.approx(1.0)
    assert cohesion["nearest_same_layer"] == 1.0


def test_report_section_renders(wordpiece_tokenizer):
    """The registered report section renders from the stored tables (no model)."""
    from headprobe.report.document import Figure
    from headprobe.studies.head_similarity.report import head_clusters_section

    example = Example(words=WORDS, unit="u1", source="t:1")
    scorer = run_scorer(wordpiece_tokenizer, [example], [[P, Q, P, Q]], n_heads=4)
    distances = distance_frame(scorer.tally_)
    tables = {"head_distances": distances, "head_clusters": hs.head_clusters(distances)}
    results = SimpleNamespace(
        tables=tables,
        table=tables.__getitem__,
        summary={"seed": 0},
        analyses=["head_similarity"],
        roles=pd.DataFrame(columns=["layer", "head", "role"]),
    )
    section = head_clusters_section(results, "head_similarity")
    figures = [b for b in section.blocks if isinstance(b, Figure)]
    assert [f.name for f in figures] == [
        "head_clusters_roles",
        "head_clusters_layers",
        "head_clusters_dendrogram",
    ]
    assert all(f.png.startswith(b"\x89PNG") for f in figures)
    from headprobe.report.document import Table

    closest = next(b for b in section.blocks if isinstance(b, Table) and "closest" in b.name)
    # heads 0 and 2 (both P), 1 and 3 (both Q): those two pairs are 0 apart, the others JS_SUM / 3
    assert [(r[0].text, r[1].text) for r in closest.rows[:2]] == [("0-0", "0-2"), ("0-1", "0-3")]
    assert [r[2].text for r in closest.rows] == ["0.0000"] * 2 + [f"{JS_SUM / 3:.4f}"] * 4
