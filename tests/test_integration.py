"""End to end on the real bundled models and the shared UD data (slow: a few minutes on 2 CPU cores).

- MiniLM on UD English EWT dev reproduces the METHODS §2 reference table exactly; its
  streaming (Poisson) intervals agree with the exact multinomial bootstrap over the kept
  per-unit counts; three shards merged, and a shuffled order, give identical tables.
- SmolLM2 (causal, GGUF) runs end to end on the first sentences of EWT dev.
- Coreference on UD English GUM dev with MiniLM.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import headprobe
from headprobe.core import seeds
from headprobe.model import loading as models
from headprobe.results import store
from headprobe.results.query import Results
from headprobe.scoring import tally
from headprobe.stats import estimates

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
EWT_DEV = DATA / "en_ewt-ud-dev.conllu"
GUM_DEV = DATA / "en_gum-ud-dev.conllu"

# METHODS §2: relation, arcs, best head (L-H, 0-based), direction, accuracy, baseline
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
    return headprobe.run(
        treebank=need(EWT_DEV), pictures=False, progress=False, keep_unit_counts=True, loaded=minilm
    )


@pytest.mark.parametrize(
    "label, arcs, heads, direction, accuracy, baseline", REFERENCE, ids=[r[0] for r in REFERENCE]
)
def test_ewt_reference_table(ewt_results, label, arcs, heads, direction, accuracy, baseline):
    best = ewt_results.best_heads
    rows = best[
        (best["analysis"] == "dependency")
        & (best["label"] == label)
        & (best["selection"] == "in-sample")
    ]
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
    held = ewt_results.best_heads.query(
        "label == 'ALL' and selection == 'held-out' and fold == ''"
    ).iloc[0]
    assert int(held["n"]) == 20085
    assert (
        held["accuracy"]
        <= ewt_results.best_heads.query("label == 'ALL' and selection == 'in-sample'")[
            "accuracy"
        ].iloc[0]
    )


def multinomial_intervals(
    unit_counts: pd.DataFrame,
    analysis: str,
    label: str,
    layer: int,
    head: int,
    direction: str,
    variant: str,
    seed: int = seeds.SEED,
    n_boot: int = tally.N_BOOT,
):
    """Reference: the classic multinomial bootstrap over units (resample units with
    replacement) from per-unit rows (`--keep-unit-counts`), for one head and one baseline.
    Returns ((acc_low, acc_high), (gap_low, gap_high)). The reference the streaming Poisson
    intervals are checked against (runs never use it)."""
    rows = unit_counts[
        (unit_counts["analysis"].astype(str) == analysis)
        & (unit_counts["label"].astype(str) == label)
    ]
    units = sorted(set(rows["unit"].astype(str)))
    index = {u: i for i, u in enumerate(units)}
    head_rows = rows[
        (rows["layer"] == layer)
        & (rows["head"] == head)
        & (rows["direction"].astype(str) == direction)
        & (rows["variant"].astype(str) == "")
    ]
    base_rows = rows[rows["variant"].astype(str) == variant]

    def per_unit(frame):
        out = np.zeros((2, len(units)))
        for u, n, h in zip(frame["unit"].astype(str), frame["n"], frame["hits"]):
            out[0, index[u]] += h
            out[1, index[u]] += n
        return out

    h, b = per_unit(head_rows), per_unit(base_rows)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(units), size=(n_boot, len(units)))
    weights = np.stack([np.bincount(d, minlength=len(units)) for d in draws]).astype(np.float64)
    acc = estimates.ratio(weights @ h[0], weights @ h[1])
    bacc = estimates.ratio(weights @ b[0], weights @ b[1])
    return estimates.interval(acc), estimates.interval(acc - bacc)


@pytest.mark.parametrize("label", [r[0] for r in REFERENCE])
def test_streaming_intervals_match_the_multinomial_bootstrap(ewt_results, label):
    """Poisson(1) weights by unit hash vs resampling units with replacement (both 1,000
    resamples over EWT's 318 documents): every endpoint agrees within 0.01."""
    row = ewt_results.best_head("dependency", label)
    (low, high), (gap_low, gap_high) = multinomial_intervals(
        ewt_results.unit_counts,
        "dependency",
        label,
        int(row["layer"]),
        int(row["head"]),
        row["direction"],
        row["baseline_variant"],
    )
    assert abs(row["ci_low"] - low) < 0.01 and abs(row["ci_high"] - high) < 0.01
    assert abs(row["gap_low"] - gap_low) < 0.01 and abs(row["gap_high"] - gap_high) < 0.01


def test_minilm_roles(ewt_results):
    roles = ewt_results.roles
    assert len(roles) == 72
    syntactic = int((roles["role"] == "syntactic").sum())
    assert 8 <= syntactic <= 20, roles["role"].value_counts().to_dict()


def ewt_blocks() -> list[tuple[str, str]]:
    """(document id, sentence block) of every EWT dev sentence."""
    out, doc = [], None
    for block in need(EWT_DEV).read_text(encoding="utf-8").split("\n\n"):
        if not block.strip():
            continue
        lines = block.strip("\n").split("\n")
        for line in lines:
            if line.startswith("# newdoc id"):
                doc = line.split("=", 1)[1].strip()
        out.append((doc, "\n".join(line for line in lines if not line.startswith("# newdoc"))))
    return out


def write_blocks(path: Path, blocks) -> Path:
    """Sentences in the given order, each under its own document (a `# newdoc id` where it changes)."""
    lines, current = [], None
    for doc, block in blocks:
        if doc != current:
            lines.append(f"# newdoc id = {doc}")
            current = doc
        lines.append(block + "\n")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def assert_same_tables(a, b):
    for name in ("best_heads", "baselines", "head_tests", "roles", "positional_heads"):
        pd.testing.assert_frame_equal(
            a.table(name).reset_index(drop=True), b.table(name).reset_index(drop=True), obj=name
        )
    ca, cb = a.counts, b.counts
    pd.testing.assert_frame_equal(ca.drop(columns="mass"), cb.drop(columns="mass"), obj="counts")
    # summed attention (surface) is float32 attention summed per batch, and a sentence's batch
    # (its padding to the batch's longest word count) changes the order of those sums: equal to
    # float32 rounding, not bit for bit
    assert np.allclose(ca["mass"], cb["mass"], rtol=1e-5, atol=1e-6, equal_nan=True)


def test_shards_merged_and_shuffled_order_give_identical_tables(ewt_results, minilm, tmp_path):
    blocks = ewt_blocks()
    options = dict(
        analyses=["dependency", "positional", "surface"],
        pictures=False,
        progress=False,
        loaded=minilm,
    )
    parts = []
    for i, cut in enumerate(
        np.array_split(np.arange(len(blocks)), 3)
    ):  # cuts fall inside documents
        path = write_blocks(tmp_path / f"shard{i}.conllu", [blocks[j] for j in cut])
        parts.append(headprobe.run(treebank=path, **options))
    assert_same_tables(Results.merge(*parts), ewt_results)
    order = np.random.default_rng(0).permutation(len(blocks))
    shuffled = write_blocks(tmp_path / "shuffled.conllu", [blocks[j] for j in order])
    assert_same_tables(headprobe.run(treebank=shuffled, **options), ewt_results)


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
        results = headprobe.run(
            "smollm2",
            treebank=treebank,
            out=out,
            pictures=False,
            progress=False,
            n_boot=200,
            device="cpu",
        )
    summary = results.summary
    assert summary["causal"] is True
    assert any("causal" in note for note in summary["notes"])
    assert (summary["n_layers"], summary["n_heads"]) == (30, 9)
    assert (
        summary["runs"]["sentences"]["examples"] + summary["skipped"].get("sentences_too_long", 0)
        == 100
    )
    for name in ("counts", "best_heads", "baselines", "positional_heads", "surface"):
        assert (out / store.table_file(name)).is_file() and (
            out / store.table_file(name, ".csv")
        ).is_file()
    saved = json.loads((out / store.SUMMARY).read_text())
    assert saved["causal"] is True and saved["notes"] == summary["notes"]
    best = results.best_heads
    all_row = best.query(
        "analysis == 'dependency' and label == 'ALL' and selection == 'in-sample'"
    ).iloc[0]
    assert all_row["n"] > 1000 and 0 < all_row["accuracy"] <= 1
    assert set(results.counts["analysis"]) == {"dependency", "positional", "surface"}
    assert len(results.positional_heads) == 30 * 9


def test_coreference_gum(minilm):
    results = headprobe.run(
        coref=need(GUM_DEV),
        analyses=["coreference"],
        pictures=False,
        progress=False,
        n_boot=200,
        loaded=minilm,
        keep_unit_counts=True,
    )
    best = results.best_heads
    assert set(best["analysis"]) == {"coreference"}
    for kind in ("ALL", "pronoun", "proper", "nominal"):
        rows = best[best["label"] == kind]
        assert sorted(zip(rows["selection"], rows["fold"])) == [
            ("held-out", ""),
            ("held-out", "0"),
            ("held-out", "1"),
            ("in-sample", ""),
        ], kind
        assert (
            rows["ci_low"].le(rows["accuracy"]).all() and rows["accuracy"].le(rows["ci_high"]).all()
        )
    all_in = best.query("label == 'ALL' and selection == 'in-sample'").iloc[0]
    assert int(all_in["n"]) == 2763
    assert (
        int(best.query("label == 'ALL' and selection == 'held-out' and fold == ''").iloc[0]["n"])
        == 2763
    )
    kinds = best.query("label != 'ALL' and selection == 'in-sample'")
    assert int(kinds["n"].sum()) == 2763  # pronoun + proper + nominal
    baselines = results.baselines
    for kind in ("ALL", "pronoun", "proper", "nominal"):
        assert set(baselines.loc[baselines["label"] == kind, "variant"]) >= {
            "nearest",
            "head_match",
            "rules",
        }
    assert results.summary["coreference_corpus"]["documents"] == 30
    units = results.unit_counts.loc[results.unit_counts["analysis"] == "coreference", "unit"]
    assert units.nunique() == 30  # documents are the bootstrap / fold units
