"""A new analysis is one module: registered, it appears in counts, best heads, roles and the
report, with no other file touched (tests/toy_analysis.py)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import headprobe
from headprobe import registry

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample.conllu"


@pytest.fixture
def toy():
    import toy_analysis
    registry.register(toy_analysis.ANALYSIS)
    yield toy_analysis
    registry.unregister("self_attention")


def test_builtin_analyses_are_registered():
    assert {"dependency", "positional", "surface", "coreference"} <= set(registry.names())
    assert registry.names("coreference") == ["coreference"]
    assert registry.get("dependency").baselines[-1] == "first"
    order = [rule.role for _, rule in registry.role_rules()]
    spec6 = ["positional", "syntactic", "coreference", "sink", "broad"]           # SPEC 6 order
    assert [role for role in order if role in spec6] == spec6
    with pytest.raises(ValueError, match="unknown analysis 'nope'; choose from dependency"):
        registry.get("nope")


def test_a_toy_analysis_appears_everywhere(toy, bert_family, tmp_path):
    from headprobe.report import build_report

    assert "self_attention" in registry.names()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = headprobe.run(treebank=SAMPLE, analyses=["self_attention", "positional"], n_boot=50,
                                loaded=(bert_family.sdpa, bert_family.tokenizer, "tiny"), pictures=False,
                                progress=False, out=tmp_path / "r")
    counts = results.counts
    toy_rows = counts[counts["analysis"] == "self_attention"]
    assert set(toy_rows["label"]) == {"self"}
    n_words = sum(int(line.split("\t")[0].isdigit()) for line in SAMPLE.read_text().splitlines()
                  if line and not line.startswith("#"))
    assert (toy_rows.loc[(toy_rows["fold"] == "") & (toy_rows["variant"] == ""), "n"] == n_words).all()
    assert set(toy_rows.loc[toy_rows["variant"] != "", "variant"]) == {"next"}
    best = results.best_heads
    assert set(best.loc[best["analysis"] == "self_attention", "selection"]) == {"in-sample", "held-out"}
    # the role rule is in use: its evidence column exists, and heads that meet it say so
    roles = results.roles
    assert "selfish_evidence" in roles.columns
    expected = set(map(tuple, results.head_scores("self_attention", "self")
                       .query("accuracy >= 0.5")[["layer", "head"]].to_numpy()))
    got = set(map(tuple, roles.loc[roles["all_roles"].str.contains("selfish"), ["layer", "head"]].to_numpy()))
    assert got == expected
    # the report has a section for it, and prints its rule
    paths = build_report(tmp_path / "r")
    text = paths["markdown"].read_text()
    assert "self_attention" in text and "selfish: a word's argmax is itself" in text
