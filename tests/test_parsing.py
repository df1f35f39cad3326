"""Parsing from attention: spanning trees against brute force, the probe on planted attention,
and the single-head counts against the dependency scorer's."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import networkx as nx
import numpy as np
import pytest
import torch
from conftest import WHOLE_WORDS

from headprobe.inputs.align import align_words
from headprobe.inputs.batching import Batch
from headprobe.inputs.corpora.base import Example
from headprobe.scoring.layer_attention import LayerAttention
from headprobe.stats.trees import _cycle, max_arborescence, max_spanning_tree, undirected_hits
from headprobe.studies.dependency.analysis import DependencyScorer
from headprobe.studies.parsing.analysis import ParsingScorer, parse_tables
from headprobe.studies.parsing.probe import (
    candidate_index,
    fit_classifier,
    log_softmax_rows,
    pair_features,
)

# ---------------------------------------------------------------------------------------
# trees
# ---------------------------------------------------------------------------------------


def all_trees(n: int, one_root_child: bool):
    """Every head assignment of n words (ROOT = -1) that is a tree."""
    for heads in itertools.product(range(-1, n), repeat=n):
        if any(h == d for d, h in enumerate(heads)):
            continue
        if one_root_child and sum(h < 0 for h in heads) != 1:
            continue
        nodes = np.array([-1] + [h + 1 for h in heads])  # node 0 = ROOT
        if not _cycle(nodes):
            yield heads


def tree_score(heads, scores, root=None):
    return sum(
        (root[d] if root is not None else 0.0) if h < 0 else scores[d, h]
        for d, h in enumerate(heads)
    )


@pytest.mark.parametrize("seed", range(6))
def test_arborescence_is_the_best_of_all_trees_of_five_words(seed):
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(5, 5))  # scores[d, h]: arc h -> d
    root = rng.normal(size=5)
    for root_scores, one_child in ((root, False), (None, True)):
        trees = list(all_trees(5, one_child))
        best = max(trees, key=lambda heads: tree_score(heads, scores, root_scores))
        got = max_arborescence(scores, root_scores)
        assert tuple(got) == best
        assert tree_score(got, scores, root_scores) == pytest.approx(
            tree_score(best, scores, root_scores)
        )
    assert len(list(all_trees(5, False))) == 6**4  # Cayley: (n + 1)^(n - 1) trees


@pytest.mark.parametrize("seed", range(4))
def test_arborescence_agrees_with_networkx(seed):
    rng = np.random.default_rng(100 + seed)
    n = 9
    scores = rng.random((n, n))
    low = scores[~np.eye(n, dtype=bool)].min() - 1.0
    graph = nx.DiGraph()
    graph.add_weighted_edges_from((n, d, low) for d in range(n))
    graph.add_weighted_edges_from(
        (h, d, scores[d, h]) for d in range(n) for h in range(n) if h != d
    )
    tree = nx.maximum_spanning_arborescence(graph)
    want = [-1] * n
    for h, d in tree.edges():
        want[d] = -1 if h == n else h
    assert list(max_arborescence(scores)) == want


@pytest.mark.parametrize("seed", range(6))
def test_prim_is_the_best_undirected_tree_of_five_words(seed):
    """Symmetric scores (a head's A + A^T): the spanning tree of Prim's algorithm (batched, torch) is the
    best of all trees; its edges are those of the arborescence with one ROOT child."""
    rng = np.random.default_rng(10 + seed)
    a = rng.random((5, 5))
    sym = a + a.T
    best = max(all_trees(5, True), key=lambda heads: tree_score(heads, sym))
    best_edges = {frozenset((d, h)) for d, h in enumerate(best) if h >= 0}
    graphs = torch.tensor(np.stack([sym, sym[::-1, ::-1].copy()]))  # a second graph, words reversed
    parents = max_spanning_tree(graphs, torch.tensor([5, 5])).numpy()
    assert {frozenset((d, p)) for d, p in enumerate(parents[0]) if p >= 0} == best_edges
    reversed_edges = {frozenset((4 - d, 4 - p)) for d, p in enumerate(parents[1]) if p >= 0}
    assert reversed_edges == best_edges
    arborescence = max_arborescence(sym)
    assert {frozenset((d, h)) for d, h in enumerate(arborescence) if h >= 0} == best_edges


def test_prim_respects_sentence_length_and_undirected_hits():
    scores = torch.zeros(1, 4, 4)
    scores[0] = torch.tensor(
        [[0, 5, 1, 9], [5, 0, 2, 9], [1, 2, 0, 9], [9, 9, 9, 0.0]]
    )  # word 3 = padding
    parents = max_spanning_tree(scores, torch.tensor([3]))[0].tolist()
    assert parents == [-1, 0, 1, -1]  # 0-1 (5), then 1-2 (2); padding untouched
    assert undirected_hits(parents, [1, 2, 2, 0], [0, 1, 0, 2]).tolist() == [
        True,
        True,
        False,
        False,
    ]


# ---------------------------------------------------------------------------------------
# the probe
# ---------------------------------------------------------------------------------------
K = 4  # heads (1 layer)
PLANTED = {
    (0, 1): 3.0,
    (1, 3): 2.0,
}  # (direction, head): weight; direction 0 = A[i, j], 1 = A[j, i]
N_WORDS = 6


def planted_sentences(n_sentences: int, seed: int):
    """Random word attention for K heads; each word's gold head is the argmax over j != i of
    3 A_1[i, j] + 2 A_3[j, i], which no single head finds alone."""
    rng = np.random.default_rng(seed)
    words = WHOLE_WORDS[:N_WORDS]
    out = []
    for s in range(n_sentences):
        att = rng.dirichlet(np.full(N_WORDS + 2, 0.5), size=(K, N_WORDS))  # [head, word, key]
        score = sum(
            w * (att[k, :, :N_WORDS] if d == 0 else att[k, :, :N_WORDS].T)
            for (d, k), w in PLANTED.items()
        )
        np.fill_diagonal(score, -np.inf)
        heads = score.argmax(axis=1).tolist()
        out.append(
            (
                Example(
                    words=list(words),
                    unit=f"u{s}",
                    source=f"t:{s}",
                    heads=heads,
                    deprels=["dep"] * N_WORDS,
                ),
                att,
            )
        )
    return out


def to_pieces(att: np.ndarray) -> torch.Tensor:
    """[K, word, word + 2 (CLS, SEP)] -> [K, piece, piece] with [CLS] first and [SEP] last."""
    n = att.shape[1]
    p = torch.full((K, n + 2, n + 2), 1.0 / (n + 2))
    a = torch.tensor(att, dtype=torch.float32)
    p[:, 1 : n + 1, 1 : n + 1] = a[:, :, :n]
    p[:, 1 : n + 1, 0] = a[:, :, n]
    p[:, 1 : n + 1, n + 1] = a[:, :, n + 1]
    return p


def score_corpus(scorer, tokenizer, sentences, batch_size=40, n_boot=20):
    scorer.bind(1, K, [0], n_boot=n_boot)
    for start in range(0, len(sentences), batch_size):
        part = sentences[start : start + batch_size]
        examples = [ex for ex, _ in part]
        batch = Batch(
            examples,
            align_words(tokenizer, [ex.words for ex in examples]),
            pad_id=tokenizer.pad_token_id,
        )
        pieces = torch.stack([to_pieces(att) for _, att in part])
        state = scorer.prepare(batch)
        scorer.update(LayerAttention(0, pieces[None], batch), state)
        scorer.end_batch(state)
    scorer.finish()
    return scorer


def test_probe_recovers_a_planted_head_combination(wordpiece_tokenizer, tmp_path):
    sentences = planted_sentences(240, seed=0)
    scorer = score_corpus(ParsingScorer(work_dir=str(tmp_path)), wordpiece_tokenizer, sentences)
    assert list(tmp_path.iterdir()) == []  # the feature files are gone
    tables = parse_tables(SimpleNamespace(tallies={"parsing": scorer.tally_}))
    scores = tables["parse_scores"].set_index(["metric", "predictor", "selection"])
    probe = scores.loc[("UAS", "probe", "held-out")]
    head = scores.loc[("UAS", "best head", "in-sample")]
    assert probe["n"] == 240 * N_WORDS
    assert probe["accuracy"] > 0.97  # held-out: fitted on the other half
    assert head["accuracy"] < 0.8  # no single head does it
    gaps = tables["parse_gaps"].set_index(["metric", "predictor", "versus", "selection"])
    assert gaps.loc[("UAS", "probe", "best head", "held-out"), "gap_low"] > 0.1
    for (
        weights
    ) in scorer.classifier_weights_.values():  # features: A[i, j] of heads 0..K-1, then A[j, i]
        planted = [d * K + k for d, k in PLANTED]
        top = np.argsort(-np.abs(weights))[:2]
        assert set(top) == set(planted)
        others = np.delete(np.abs(weights), planted)
        assert others.max() < 0.2 * np.abs(weights[planted]).min()
        assert weights[planted[0]] / weights[planted[1]] == pytest.approx(1.5, rel=0.25)


def test_counts_without_features_are_refused(wordpiece_tokenizer, tmp_path):
    """A run resumed from a checkpoint has counts from before it but no features: finish says so
    (and removes its feature files) instead of fitting the probe on part of the corpus."""
    scorer = ParsingScorer(work_dir=str(tmp_path))
    scorer.bind(1, K, [0], n_boot=2)
    scorer.tally_.add(
        ["earlier"], ["ALL"], None, np.ones((1, 3)), np.zeros((1, len(scorer.variants)))
    )
    sentences = planted_sentences(4, seed=2)
    with pytest.raises(RuntimeError, match="resumed from a checkpoint"):
        score_corpus(scorer, wordpiece_tokenizer, sentences)
    assert list(tmp_path.iterdir()) == []


def test_fit_classifier_on_separable_toy_data():
    """Two items, three candidates each; feature 0 marks the gold candidate: its weight goes up."""
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.5], [1.0, 0.0], [0.0, 0.0]])
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    gold = torch.tensor([0, 4])
    w = fit_classifier(lambda: [(x, group, 2, gold)], 2, 2, l2=1e-2, max_iter=50)
    assert w[0] > 1.0 and w[0] > abs(w[1])


def test_pair_features_order():
    a = torch.arange(2 * 3 * 3, dtype=torch.float32).reshape(2, 3, 3)  # [K, i, j]
    f = pair_features(a, 3)
    assert f.shape == (6, 4)
    # rows (0,1), (0,2), (1,0), (1,2), (2,0), (2,1); columns A_0[i,j], A_1[i,j], A_0[j,i], A_1[j,i]
    assert f[0].tolist() == [a[0, 0, 1], a[1, 0, 1], a[0, 1, 0], a[1, 1, 0]]
    assert f[3].tolist() == [a[0, 1, 2], a[1, 1, 2], a[0, 2, 1], a[1, 2, 1]]
    assert candidate_index(3, 1).tolist() == [0, 2]
    rows = log_softmax_rows(np.array([[-np.inf, 0.0], [1.0, -np.inf]]))
    assert rows.tolist() == [[-np.inf, 0.0], [0.0, -np.inf]]


# ---------------------------------------------------------------------------------------
# single heads and baselines on the parsing arcs
# ---------------------------------------------------------------------------------------


def test_single_head_counts_match_the_dependency_scorer(wordpiece_tokenizer, tmp_path):
    """Under SPEC the parsing arcs are the dependency scorer's ALL: same argmax hits, same offset
    baselines; `chain` counts arcs between adjacent words."""
    sentences = planted_sentences(60, seed=1)
    for k, (example, _) in enumerate(sentences):  # some punct and a root, not scored
        example.heads[0], example.deprels[0] = -1, "root"
        if k % 2:
            example.deprels[-1] = "punct"
    parsing = score_corpus(ParsingScorer(work_dir=str(tmp_path)), wordpiece_tokenizer, sentences)
    dependency = score_corpus(DependencyScorer(), wordpiece_tokenizer, sentences)
    ours, theirs = parsing.tally_.arrays("ALL"), dependency.tally_.arrays("ALL")
    assert ours["n"][..., 0].tolist() == theirs["n"][..., 0].tolist()
    assert (ours["hits"][..., :2] == theirs["hits"]).all()
    offsets = [parsing.variants.index(v) for v in dependency.variants]
    assert (ours["base"][..., offsets] == theirs["base"]).all()
    arcs = [
        (i, h)
        for ex, _ in sentences
        for i, (h, r) in enumerate(zip(ex.heads, ex.deprels))
        if h >= 0 and r not in ("root", "punct")
    ]
    assert ours["base"][:, 0, parsing.variants.index("chain")].sum() == sum(
        abs(i - h) == 1 for i, h in arcs
    )
    tables = parse_tables(SimpleNamespace(tallies={"parsing": parsing.tally_}))
    heads = tables["parse_heads"]
    assert set(heads["direction"]) == {"dep->head", "head<-dep", "mst"} and len(heads) == 3 * K
    assert heads["accuracy"].between(0, 1).all()


# ---------------------------------------------------------------------------------------
# end to end (tiny random BERT, the bundled sample): saved, loaded, reported
# ---------------------------------------------------------------------------------------
DATA = Path(__file__).resolve().parents[1] / "headprobe" / "inputs" / "samples"


def run_tiny(family, **options):
    import warnings

    import headprobe

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return headprobe.run(
            loaded=(family.sdpa, family.tokenizer, "tiny"),
            n_boot=20,
            pictures=False,
            progress=False,
            **options,
        )


def test_run_save_load_and_report(bert_family, tmp_path):
    from headprobe.report import build_report
    from headprobe.results import store
    from headprobe.results.query import Results

    out = tmp_path / "results"
    results = run_tiny(
        bert_family,
        treebank=DATA / "sample.conllu",
        analyses=["dependency", "parsing", "head_similarity"],
    )
    results.save(out)
    scores = results.table("parse_scores").set_index(["metric", "predictor", "selection"])
    dependency_all = results.best_head("dependency", "ALL")
    assert scores.loc[("UAS", "best head", "in-sample"), "n"] == dependency_all["n"]
    assert scores.loc[("UAS", "best head", "in-sample"), "accuracy"] == pytest.approx(
        dependency_all["accuracy"]
    )
    assert scores.loc[("UAS", "probe", "held-out"), "n"] == dependency_all["n"]
    k = results.n_layers * results.n_heads
    assert (
        len(results.table("head_distances")) == k * k and len(results.table("head_clusters")) == k
    )
    loaded = Results.load(out)
    for name in ("parse_scores", "parse_gaps", "parse_heads", "head_distances", "head_clusters"):
        assert len(loaded.table(name)) == len(results.table(name))
    report = Path(build_report(loaded, tmp_path / store.REPORT_DIR)["markdown"]).read_text()
    assert "## Head clusters (Clark et al. 2019, section 5)" in report
    assert "## Parsing with all heads" in report and "probe - best head" in report
    assert results.summary["conventions"]["name"] == "headprobe"


def test_one_fold_without_arcs_says_so(bert_family, tmp_path):
    text = (DATA / "sample.conllu").read_text().split("\n\n")
    one = tmp_path / "one.conllu"
    one.write_text(text[0].strip() + "\n\n")
    results = run_tiny(bert_family, treebank=one, analyses=["parsing"])
    scores = results.table("parse_scores").set_index(["metric", "predictor", "selection"])
    assert scores.loc[("UAS", "probe", "held-out"), "hits"] == 0
    assert scores.loc[("UAS", "probe", "held-out"), "note"].startswith("no held-out evaluation")
