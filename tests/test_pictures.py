"""Example pictures: which sentence each label gets (seeded, moderate length, holding the relation),
which mention a coreference picture shows, and that the pictured attention is the model's.

The attention of a picture is checked against the eager twin's `output_attentions`
(tests/conftest.py): with every word a single WordPiece piece, word-level attention
is the piece-level attention between the [CLS] and [SEP] rows and columns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from headprobe.inputs.corpora.base import ALL, Example
from headprobe.inputs.corpora.corefud import Mention
from headprobe.results.examples import (
    MentionPicker,
    Reservoir,
    SentencePicker,
    example_pictures,
    gold_arcs,
    pick_mentions,
    pick_sentences,
    planned_pictures,
)
from headprobe.scoring.sentence_attention import head_matrices

WORDS = ["the", "big", "red", "cat", "sat", "on", "the", "mat", "and", "it", "ran", "down", "."]


def sentence(
    i: int, n_words: int, deprels: dict[int, str], head_of: dict[int, int] | None = None
) -> Example:
    """A sentence of `n_words` words: word 0 the root, every other word attached to word 0 as
    `dep` unless `deprels` says otherwise (heads from `head_of`, default 0)."""
    words = [WORDS[k % len(WORDS)] for k in range(n_words)]
    heads = [-1] + [(head_of or {}).get(k, 0) for k in range(1, n_words)]
    rels = ["root"] + [deprels.get(k, "dep") for k in range(1, n_words)]
    return Example(
        words, unit=f"s{i}", source=f"t.conllu:{i}", heads=heads, deprels=rels, sent_id=f"s{i}"
    )


def corpus() -> list[Example]:
    out = [sentence(0, 5, {1: "nsubj"})]  # too short
    out += [sentence(i, 10, {2: "nsubj", 3: "det"} if i % 2 else {2: "nsubj"}) for i in range(1, 7)]
    out.append(sentence(7, 30, {4: "iobj"}))  # long: iobj only here
    out.append(sentence(8, 45, {5: "xcomp"}))  # too long even as a fallback
    return out


def test_reservoir_is_uniform_per_label_and_seeded():
    picks = []
    for seed in range(1000):
        r = Reservoir(seed)
        for k in range(10):
            r.offer("x", k)
            r.offer("y", -k)  # another label's items do not move x's draw
        picks.append(r.picks("x")[0])
        alone = Reservoir(seed)
        for k in range(10):
            alone.offer("x", k)
        assert alone.picks("x") == r.picks("x")
    counts = np.bincount(picks, minlength=10)
    assert counts.min() > 60 and counts.max() < 140, counts  # expected 100 each, sd 9.5
    assert Reservoir(3).picks("never") == []


def test_pick_sentences_moderate_length_holding_the_relation():
    examples = corpus()
    chosen = pick_sentences(
        iter(examples), [ALL, "nsubj", "det", "iobj", "xcomp"], seed=0
    )  # one pass
    assert chosen[ALL][0].sent_id in {f"s{i}" for i in range(1, 7)}
    assert chosen["nsubj"][0].sent_id in {f"s{i}" for i in range(1, 7)}  # never s0: too short
    assert chosen["det"][0].sent_id in {"s1", "s3", "s5"}  # the ones holding det
    assert [e.sent_id for e in chosen["iobj"]] == ["s7"]  # fallback: longer
    assert chosen["xcomp"] == []  # over 40 words
    # the seed decides, not the corpus order: many seeds, many different sentences
    picks = {s: pick_sentences(examples, [ALL, "nsubj"], seed=s) for s in range(40)}
    assert len({p["nsubj"][0].sent_id for p in picks.values()}) >= 4
    assert any(
        p[ALL][0].sent_id != p["nsubj"][0].sent_id for p in picks.values()
    )  # each label its own
    assert all(
        pick_sentences(examples, ["nsubj"], seed=s)["nsubj"][0] is p["nsubj"][0]
        for s, p in picks.items()
    )
    assert gold_arcs(examples[2], "nsubj") == [[2, 0]]
    assert gold_arcs(examples[2], ALL) == [[k, 0] for k in range(1, 10)]  # root not in ALL


def coref_window() -> Example:
    words = [
        "Maria",
        "said",
        "that",
        "she",
        "would",
        "drive",
        "the",
        "red",
        "car",
        "and",
        "it",
        "was",
        "fast",
        ".",
    ]
    upos = [
        "PROPN",
        "VERB",
        "SCONJ",
        "PRON",
        "AUX",
        "VERB",
        "DET",
        "ADJ",
        "NOUN",
        "CCONJ",
        "PRON",
        "AUX",
        "ADJ",
        "PUNCT",
    ]
    mentions = [
        Mention(0, 1, "e1", 0),
        Mention(3, 4, "e1", 3),
        Mention(6, 9, "e2", 8),
        Mention(10, 11, "e2", 10),
    ]
    return Example(
        words,
        unit="doc1",
        source="g.conllu:1",
        upos=upos,
        feats=[{} for _ in words],
        mentions=mentions,
        sent_id="doc1-s1",
    )


def test_pick_mentions_show_a_mention_and_its_antecedent():
    window = coref_window()
    chosen = pick_mentions(iter([window]), [ALL, "pronoun", "proper"], seed=0)
    assert chosen["proper"] == []  # Maria is never a scored mention
    she_or_it = {
        (p.query, p.antecedent)
        for s in range(30)
        for p in pick_mentions([window], [ALL], seed=s)[ALL]
    }
    assert she_or_it == {(3, 0), (10, 8)}  # both scored mentions get drawn
    pick = chosen["pronoun"][0]
    assert pick.kind == "pronoun" and pick.query in (3, 10)
    expected = {3: ((3, 4), 0, (0, 1), [0]), 10: ((10, 11), 8, (6, 9), [8])}[pick.query]
    assert (pick.mention, pick.antecedent, pick.antecedent_span, pick.gold) == expected
    far = pick_mentions([window], [ALL], seed=0, span=(20, 25))  # no antecedent that far back
    assert far[ALL] == []


def best_heads(rows) -> pd.DataFrame:
    return pd.DataFrame(
        [
            dict(
                analysis=a,
                label=label,
                selection="in-sample",
                fold="",
                layer=layer,
                head=head,
                direction=d,
                n=n,
            )
            for a, label, layer, head, d, n in rows
        ]
    )


def eager_words(family, words, layer, head) -> np.ndarray:
    """Word x word attention from the eager twin (every word one piece: drop [CLS], [SEP])."""
    enc = family.tokenizer(words, is_split_into_words=True, return_tensors="pt")
    assert enc["input_ids"].shape[1] == len(words) + 2  # one piece per word
    with torch.no_grad():
        out = family.eager(**enc, output_attentions=True)
    return out.attentions[layer][0, head, 1:-1, 1:-1].numpy()  # [word, word]


def test_pictures_show_the_heads_attention(bert_family):
    examples = [sentence(i, 11, {2: "nsubj", 4: "det"}, {4: 3}) for i in range(5)]
    table = best_heads(
        [
            ("dependency", "nsubj", 2, 1, "dep->head", 40),
            ("dependency", "det", 1, 3, "head<-dep", 35),
            ("dependency", "rare", -1, -1, "", 3),
        ]
    )
    window = coref_window()
    window.words = [w.lower() if w != "Maria" else "dog" for w in window.words]  # single pieces
    window.words = [
        w if w in ("dog", "the", "red", "and", "it", "was", "sat", ".") else "cat"
        for w in window.words
    ]
    table = pd.concat(
        [table, best_heads([("coreference", "pronoun", 0, 2, "", 60)])], ignore_index=True
    )
    planned = planned_pictures(table, examples, seed=1, coref=[window])
    assert all(p.entry["attention"] is None for p in planned)  # chosen before any pass
    requests = [p.request for p in planned]
    pictures = example_pictures(
        planned, head_matrices(bert_family.sdpa, bert_family.tokenizer, requests)
    )
    assert [(p["analysis"], p["label"]) for p in pictures] == [
        ("dependency", "nsubj"),
        ("dependency", "det"),
        ("coreference", "pronoun"),
    ]
    for p in pictures[:2]:
        ex = next(e for e in examples if e.sent_id == p["sentence"])
        assert p["words"] == ex.words and p["gold"] == gold_arcs(ex, p["label"])
        assert p["gold"] == ([[2, 0]] if p["label"] == "nsubj" else [[4, 3]])
        np.testing.assert_allclose(
            p["attention"], eager_words(bert_family, ex.words, p["layer"], p["head"]), atol=1e-5
        )
    coref = pictures[2]
    whole = eager_words(bert_family, window.words, 0, 2)
    lo = coref["offset"]
    hi = lo + len(coref["words"])
    assert coref["words"] == window.words[lo:hi]
    np.testing.assert_allclose(coref["attention"], whole[lo:hi, lo:hi], atol=1e-5)
    query = 3 if coref["mention"] == [3 - lo, 4 - lo] else 10
    antecedent = {3: 0, 10: 8}[query]
    assert coref["gold"] == [[query - lo, antecedent - lo]]
    assert lo == max(0, {3: 0, 10: 6}[query] - 3) and hi == min(len(window.words), query + 1 + 3)


def test_pickers_watching_a_pass_pick_as_the_eager_functions():
    """A run's pickers see every label as the corpus streams past and are asked for a few labels
    afterwards: the picks are those of `pick_sentences` / `pick_mentions` over the corpus, whatever
    the labels asked, for any seed (each label's draw depends on its own examples only)."""
    examples = corpus()
    window = coref_window()
    for seed in range(30):
        sentences, mentions = SentencePicker(seed), MentionPicker(seed)
        assert list(sentences.watch(iter(examples))) == examples
        assert list(mentions.watch([window, window])) == [window, window]
        for labels in ([ALL, "nsubj", "det", "iobj", "xcomp"], ["det"], ["nsubj", ALL]):
            eager = pick_sentences(examples, labels, seed=seed)
            assert {k: [e.sent_id for e in v] for k, v in sentences.chosen(labels).items()} == {
                k: [e.sent_id for e in v] for k, v in eager.items()
            }
        for kinds in ([ALL, "pronoun", "proper"], ["pronoun"]):
            eager = pick_mentions([window, window], kinds, seed=seed)
            assert {
                k: [(p.query, p.antecedent) for p in v] for k, v in mentions.chosen(kinds).items()
            } == {k: [(p.query, p.antecedent) for p in v] for k, v in eager.items()}
