"""End to end on the real bundled models and the shared UD data (slow: ~2 minutes on 2 CPU cores).

- MiniLM on UD English EWT dev reproduces the SPEC section 2 reference table exactly.
- SmolLM2 (causal, GGUF) runs end to end on the first sentences of EWT dev.
- Coreference on UD English GUM dev with MiniLM.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import headprobe
from headprobe import models

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
EWT_DEV = DATA / "en_ewt-ud-dev.conllu"
GUM_DEV = DATA / "en_gum-ud-dev.conllu"

# SPEC section 2: relation, arcs, best head (L-H, 0-based), direction, accuracy, baseline
REFERENCE = [
    ("ALL", 20085, "2-1", "dep->head", 0.4542, 0.3451),
    ("nsubj", 2137, "2-8", "dep->head", 0.5559, 0.3388),
    ("det", 1841, "2-8", "dep->head", 0.8061, 0.5888),
    ("obj", 1211, "2-0", "dep->head", 0.7399, 0.3576),
    ("amod", 1326, "2-8", "dep->head", 0.7903, 0.7466),
    ("aux", 911, "1-4", "dep->head", 0.7003, 0.5434),
]


def need(path: Path) -> Path:
    if not path.is_file():
        pytest.skip(f"shared data not found: {path}")
    return path


@pytest.fixture(scope="module")
def minilm():
    return models.load(None, device="cpu")


@pytest.fixture(scope="module")
def ewt_results(minilm):
    return headprobe.run(treebank=need(EWT_DEV), analyses=["dependency"], pictures=False, progress=False,
                         n_boot=200, loaded=minilm)


@pytest.mark.parametrize("label, arcs, heads, direction, accuracy, baseline", REFERENCE,
                         ids=[r[0] for r in REFERENCE])
def test_ewt_reference_table(ewt_results, label, arcs, heads, direction, accuracy, baseline):
    best = ewt_results.best_heads
    rows = best[(best["analysis"] == "dependency") & (best["label"] == label) & (best["selection"] == "in-sample")]
    assert len(rows) == 1
    row = rows.iloc[0]
    assert int(row["n"]) == arcs
    assert row["heads"] == heads
    assert f"{row['layer']}-{row['head']}" == heads
    assert row["direction"] == direction
    assert round(float(row["accuracy"]), 4) == accuracy
    assert round(float(row["baseline_accuracy"]), 4) == baseline
    assert row["ci_low"] <= row["accuracy"] <= row["ci_high"]


def test_ewt_corpus_summary(ewt_results):
    summary = ewt_results.summary
    assert summary["runs"]["sentences"]["words"] == 25147
    assert summary["skipped"]["malformed_sentences"] == 0
    assert summary["causal"] is False
    assert (summary["n_layers"], summary["n_heads"]) == (6, 12)
    held = ewt_results.best_heads.query("label == 'ALL' and selection == 'held-out' and fold == ''").iloc[0]
    assert int(held["n"]) == 20085
    assert held["accuracy"] <= ewt_results.best_heads.query("label == 'ALL' and selection == 'in-sample'")[
        "accuracy"].iloc[0]


def first_sentences(path: Path, count: int, out: Path) -> Path:
    blocks = [b for b in path.read_text(encoding="utf-8").split("\n\n") if b.strip()]
    out.write_text("\n\n".join(blocks[:count]) + "\n\n", encoding="utf-8")
    return out


def test_smollm2_end_to_end(tmp_path):
    # ~30 s on 2 idle cores (GGUF load and dequantisation included)
    treebank = first_sentences(need(EWT_DEV), 100, tmp_path / "ewt-first.conllu")
    out = tmp_path / "results"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = headprobe.run("smollm2", treebank=treebank, out=out, pictures=False, progress=False,
                                n_boot=200, device="cpu")
    summary = results.summary
    assert summary["causal"] is True
    assert any("causal" in note for note in summary["notes"])
    assert (summary["n_layers"], summary["n_heads"]) == (30, 9)
    assert summary["runs"]["sentences"]["examples"] + summary["skipped"].get("sentences_too_long", 0) == 100
    for name in ("counts", "best_heads", "baselines", "positional_heads", "surface"):
        assert (out / f"{name}.parquet").is_file() and (out / f"{name}.csv").is_file()
    saved = json.loads((out / "summary.json").read_text())
    assert saved["causal"] is True and saved["notes"] == summary["notes"]
    best = results.best_heads
    all_row = best.query("analysis == 'dependency' and label == 'ALL' and selection == 'in-sample'").iloc[0]
    assert all_row["n"] > 1000 and 0 < all_row["accuracy"] <= 1
    assert set(results.counts["analysis"]) == {"dependency", "positional", "surface"}
    assert len(results.positional_heads) == 30 * 9


def test_coreference_gum(minilm):
    results = headprobe.run(coref=need(GUM_DEV), analyses=["coreference"], pictures=False, progress=False,
                            n_boot=200, loaded=minilm)
    best = results.best_heads
    assert set(best["analysis"]) == {"coreference"}
    for kind in ("ALL", "pronoun", "proper", "nominal"):
        rows = best[best["label"] == kind]
        assert sorted(zip(rows["selection"], rows["fold"])) == [
            ("held-out", ""), ("held-out", "0"), ("held-out", "1"), ("in-sample", "")], kind
        assert rows["ci_low"].le(rows["accuracy"]).all() and rows["accuracy"].le(rows["ci_high"]).all()
    all_in = best.query("label == 'ALL' and selection == 'in-sample'").iloc[0]
    assert int(all_in["n"]) == 2763
    assert int(best.query("label == 'ALL' and selection == 'held-out' and fold == ''").iloc[0]["n"]) == 2763
    kinds = best.query("label != 'ALL' and selection == 'in-sample'")
    assert int(kinds["n"].sum()) == 2763                     # pronoun + proper + nominal
    baselines = results.baselines
    for kind in ("ALL", "pronoun", "proper", "nominal"):
        assert set(baselines.loc[baselines["label"] == kind, "variant"]) >= {"nearest", "head_match", "rules"}
    assert results.summary["coreference_corpus"]["documents"] == 30
    units = results.unit_counts.loc[results.unit_counts["analysis"] == "coreference", "unit"]
    assert units.nunique() == 30                               # documents are the bootstrap / fold units
