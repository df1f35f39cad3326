"""A pair-of-heads analysis through a whole run (tests/toy_pair_analysis.py): its pair table has
intervals that add across two shards exactly, its role rule reads the pair table, and the report
shows its pairs; pair tallies stay out of the per-head tables."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import headprobe
from headprobe.results.query import Results
from headprobe.scoring import registry
from headprobe.stats.pair_estimates import PAIR_COLUMNS

SAMPLE = Path(__file__).resolve().parents[1] / "headprobe/inputs/samples/sample.conllu"
# a bootstrap p is at least 1 / (1 + resamples): Holm over the tiny model's 144 pairs passes 0.05
# only from 2,880 resamples on
RESAMPLES = 4000


@pytest.fixture
def toy():
    import toy_pair_analysis

    registry.register(toy_pair_analysis.ANALYSIS, replace=True)
    yield toy_pair_analysis
    registry.unregister(toy_pair_analysis.NAME)


def shards(tmp_path) -> list[Path]:
    """The sample treebank cut in two files at a sentence boundary (a sentence is a unit)."""
    blocks = [b for b in SAMPLE.read_text(encoding="utf-8").split("\n\n") if b.strip()]
    paths = []
    for i, part in enumerate((blocks[:17], blocks[17:])):
        path = tmp_path / f"part{i}.conllu"
        path.write_text("\n\n".join(part) + "\n\n", encoding="utf-8")
        paths.append(path)
    return paths


def run(bert_family, treebank, out):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return headprobe.run(
            treebank=treebank,
            analyses=["argmax_agreement", "positional"],
            n_boot=RESAMPLES,
            loaded=(bert_family.sdpa, bert_family.tokenizer, "tiny"),
            pictures=False,
            progress=False,
            out=out,
        )


def test_a_toy_pair_analysis_through_a_run(toy, bert_family, tmp_path):
    from headprobe.report import build_report

    whole = run(bert_family, SAMPLE, tmp_path / "whole")
    table = whole.table("argmax_agreement_pairs")
    assert list(table.drop(columns="measure").columns) == PAIR_COLUMNS
    n_layers, n_heads = whole.n_layers, whole.n_heads
    assert len(table) == (n_layers * n_heads) ** 2
    assert table[["ci_low", "ci_high", "p_holm"]].notna().all().all()
    keyed = table.set_index(["layer", "head", "sender_layer", "sender_head"])["score"]
    swapped = table.set_index(["sender_layer", "sender_head", "layer", "head"])["score"]
    assert np.array_equal(keyed.to_numpy(), swapped.reindex(keyed.index).to_numpy())  # symmetric
    self_pairs = table[
        (table["layer"] == table["sender_layer"]) & (table["head"] == table["sender_head"])
    ]
    assert (self_pairs["score"] == 1.0).all()  # a head always agrees with itself
    n_words = sum(
        int(line.split("\t")[0].isdigit())
        for line in SAMPLE.read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert (table["n"] == n_words).all()
    assert "argmax_agreement" not in set(whole.counts["analysis"])  # pairs: no per-head counts

    # two shards of the units, added: the same table, intervals and Holm included
    parts = [run(bert_family, path, tmp_path / path.stem) for path in shards(tmp_path)]
    merged = Results.merge(*parts)
    pd.testing.assert_frame_equal(merged.table("argmax_agreement_pairs"), table, check_exact=True)

    # the role rule reads the pair table: receivers with a significant other sender above SHARE
    others = table[
        (table["layer"] != table["sender_layer"]) | (table["head"] != table["sender_head"])
    ]
    want = others[(others["ci_low"] >= toy.SHARE) & (others["p_holm"] < 0.05)]
    assert 0 < len(want) < len(others), len(want)  # the rule picks some pairs, not all
    roles = whole.roles
    assert "follows_evidence" in roles.columns
    got = roles.loc[roles["follows_evidence"] != "", ["layer", "head"]]
    assert set(map(tuple, got.to_numpy())) == set(map(tuple, want[["layer", "head"]].to_numpy()))
    for row in want.itertuples():
        evidence = roles.set_index(["layer", "head"]).loc[(row.layer, row.head), "follows_evidence"]
        numbers = f"{row.score:.4f} [{row.ci_low:.4f}, {row.ci_high:.4f}]"
        assert f"sender {row.sender_layer}-{row.sender_head} (argmax): {numbers}" in evidence

    # the report shows the significant pairs with their intervals
    paths = build_report(tmp_path / "whole")
    text = paths["markdown"].read_text()
    top = table[table["p_holm"] < 0.05].sort_values("score", ascending=False, kind="stable")
    first = top.iloc[0]
    assert "Heads that agree" in text and "Pairs that agree." in text
    assert f"[{first.ci_low:.4f}, {first.ci_high:.4f}]" in text

    # without a section of its own, the generic view shows its pair table's significant pairs
    registry.register(dataclasses.replace(toy.ANALYSIS, report=None), replace=True)
    text = build_report(tmp_path / "whole", tmp_path / "generic")["markdown"].read_text()
    assert "argmax_agreement_pairs: the 20 pairs of heads with the highest score" in text
    assert f"[{first.ci_low:.4f}, {first.ci_high:.4f}]" in text
