"""METHODS §5: a fold with no trials selects nothing. A one-sentence treebank and a one-document
coreference file give held-out rows that say so, with no numbers and no head 0-0."""

from __future__ import annotations

import warnings
from pathlib import Path

import headprobe
from headprobe.stats.head_selection import NO_SELECTION

DATA = Path(__file__).resolve().parents[1] / "headprobe" / "inputs" / "samples"


def run(family, **sources):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return headprobe.run(
            loaded=(family.sdpa, family.tokenizer, "tiny"),
            n_boot=50,
            pictures=False,
            progress=False,
            **sources,
        )


def assert_no_held_out_selection(best, analysis):
    held = best[(best["analysis"] == analysis) & (best["selection"] == "held-out")]
    assert len(held) and held["note"].str.startswith(NO_SELECTION).all()
    assert (
        (held["layer"] == -1).all() and (held["head"] == -1).all() and held["accuracy"].isna().all()
    )
    assert (held["heads"] == "").all()
    ins = best[(best["analysis"] == analysis) & (best["selection"] == "in-sample")]
    assert ins["n"].gt(0).all()  # in-sample rows keep their counts


def test_one_sentence_treebank(bert_family, tmp_path):
    text = (DATA / "sample.conllu").read_text().split("\n\n")
    one = tmp_path / "one.conllu"
    one.write_text(text[0].strip() + "\n\n")
    results = run(bert_family, treebank=one, analyses=["dependency"])
    assert_no_held_out_selection(results.best_heads, "dependency")
    assert results.head_tests["heldout_gap"].isna().all()
    assert (results.roles["role"] != "syntactic").all()


def test_one_document_coref_file(bert_family, tmp_path):
    lines = (DATA / "sample_coref.conllu").read_text().splitlines()
    second_doc = next(i for i, line in enumerate(lines) if line.startswith("# newdoc") and i > 0)
    one = tmp_path / "one_doc.conllu"
    one.write_text("\n".join(lines[:second_doc]).rstrip("\n") + "\n\n")
    results = run(bert_family, coref=one, analyses=["coreference"])
    assert set(results.best_heads["analysis"]) == {"coreference"}
    assert_no_held_out_selection(results.best_heads, "coreference")
