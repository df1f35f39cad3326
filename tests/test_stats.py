"""headprobe.stats and Results.merge on hand-built unit counts whose answers are worked out by hand.

Unit counts have the columns of `headprobe.scorers.base.UNIT_COLUMNS`:
analysis, label, unit, layer, head, direction, variant, n, hits, mass.
Every selection test runs on a plain frame (object columns) and on the compact
frame the scorers produce (categorical keys, float32 values).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from headprobe import stats
from headprobe.results import Results
from headprobe.scorers.base import UNIT_COLUMNS, compact

try:
    from tests.fixtures_results import make_unit_counts
except ImportError:  # tests/ is not a package when run from inside it
    from fixtures_results import make_unit_counts

DEP, HEAD = "dep->head", "head<-dep"


# ----------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------
def head_row(unit, layer, head, direction, n, hits, label="det", analysis="dependency"):
    return dict(analysis=analysis, label=label, unit=unit, layer=layer, head=head, direction=direction,
                variant="", n=n, hits=hits, mass=np.nan)


def base_row(unit, variant, n, hits, label="det", analysis="dependency"):
    return dict(analysis=analysis, label=label, unit=unit, layer=-1, head=-1, direction="",
                variant=variant, n=n, hits=hits, mass=np.nan)


def frame(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=UNIT_COLUMNS)


def build(units, n, heads: dict, baselines: dict | None = None, label="det", analysis="dependency"):
    """Unit counts of one label.

    n: trials per unit (int or list per unit); heads: {(layer, head, direction): hits per unit};
    baselines: {variant: hits per unit}.
    """
    n = [n] * len(units) if np.isscalar(n) else list(n)
    rows = []
    for (layer, head, direction), hits in heads.items():
        rows += [head_row(u, layer, head, direction, k, h, label, analysis) for u, k, h in zip(units, n, hits)]
    for variant, hits in (baselines or {}).items():
        rows += [base_row(u, variant, k, h, label, analysis) for u, k, h in zip(units, n, hits)]
    return frame(rows)


@pytest.fixture(params=["plain", "compact"])
def form(request):
    """Apply to a unit-count frame: as built (object columns) or compacted like the scorers' output."""
    return (lambda f: f) if request.param == "plain" else compact


def one(table, **where) -> pd.Series:
    mask = np.ones(len(table), dtype=bool)
    for column, value in where.items():
        mask &= (table[column] == value).to_numpy()
    rows = table[mask]
    assert len(rows) == 1, f"expected one row for {where}, found {len(rows)}"
    return rows.iloc[0]


def split_by_fold(units, seed=stats.SEED):
    folds = stats.assign_folds(units, seed)
    return [u for u in units if folds[u] == 0], [u for u in units if folds[u] == 1]


UNITS = [f"s{i:02d}" for i in range(8)]


# ----------------------------------------------------------------------------------------
# folds
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_units", [1, 2, 3, 7, 10, 101])
def test_assign_folds_halves_and_coverage(n_units):
    units = [f"u{i}" for i in range(n_units)]
    folds = stats.assign_folds(units)
    assert set(folds) == set(units)                            # every unit, once (a dict)
    assert set(folds.values()) <= {0, 1}
    zeros = sum(1 for f in folds.values() if f == 0)
    assert abs(zeros - (n_units - zeros)) <= 1


def test_assign_folds_deterministic_and_order_free():
    units = [f"u{i}" for i in range(40)]
    first = stats.assign_folds(units, seed=3)
    assert stats.assign_folds(list(reversed(units)), seed=3) == first          # sorted inside
    assert stats.assign_folds(units + units[:5], seed=3) == first              # duplicates collapse
    assert stats.assign_folds(units, seed=3) == first


def test_assign_folds_seed_changes_split():
    units = [f"u{i}" for i in range(40)]
    assert stats.assign_folds(units, seed=0) != stats.assign_folds(units, seed=1)


# ----------------------------------------------------------------------------------------
# tidy counts
# ----------------------------------------------------------------------------------------
def tidy_input():
    """Two analyses, two labels, heads with two directions, baselines and surface mass."""
    rng = np.random.default_rng(5)
    rows = []
    for u in UNITS:
        for label in ("det", "nsubj"):
            k = int(rng.integers(1, 5))
            for layer, head, direction in [(0, 0, DEP), (0, 0, HEAD), (1, 2, DEP)]:
                rows.append(head_row(u, layer, head, direction, k, int(rng.integers(0, k + 1)), label))
            rows.append(base_row(u, "offset=+1", k, int(rng.integers(0, k + 1)), label))
    for d in ("d0", "d1", "d2"):
        rows.append(dict(analysis="surface", label="self", unit=d, layer=0, head=1, direction="", variant="",
                         n=10, hits=np.nan, mass=float(rng.uniform(0, 10))))
    return frame(rows)


def test_tidy_counts_whole_and_folds(form):
    uc = tidy_input()
    tidy = stats.tidy_counts(form(uc))
    assert list(tidy.columns) == ["analysis", "label", "layer", "head", "direction", "variant", "fold", "n",
                                  "hits", "mass"]
    assert set(tidy["fold"]) == {"", "0", "1"}
    keys = ["analysis", "label", "layer", "head", "direction", "variant"]

    def sums(part):
        return part.groupby(keys)[["n", "hits", "mass"]].sum(min_count=1)

    # whole-data rows equal the sums over units
    whole = tidy[tidy["fold"] == ""].set_index(keys)[["n", "hits", "mass"]].sort_index()
    pd.testing.assert_frame_equal(whole, sums(uc).sort_index(), check_dtype=False)
    # a fold's rows are the sums over the units of that fold (folds drawn per analysis)
    for analysis in ("dependency", "surface"):
        units = uc.loc[uc["analysis"] == analysis, "unit"].unique()
        folds = stats.assign_folds(units)
        for f in (0, 1):
            part = uc[(uc["analysis"] == analysis) & uc["unit"].map(lambda u: folds.get(u) == f)]
            got = tidy[(tidy["fold"] == str(f)) & (tidy["analysis"] == analysis)].set_index(keys)
            pd.testing.assert_frame_equal(got[["n", "hits", "mass"]].sort_index(), sums(part).sort_index(),
                                          check_dtype=False)
    # and the two halves add up to the whole
    halves = tidy[tidy["fold"] != ""].groupby(keys)[["n", "hits", "mass"]].sum(min_count=1).sort_index()
    pd.testing.assert_frame_equal(halves, whole, check_dtype=False)
    # head rows carry no mass; the surface row carries no hits
    assert tidy.loc[tidy["analysis"] == "dependency", "mass"].isna().all()
    assert tidy.loc[tidy["analysis"] == "surface", "hits"].isna().all()


def test_tidy_counts_hand_numbers():
    uc = frame([head_row("a", 0, 0, DEP, 3, 1), head_row("b", 0, 0, DEP, 5, 4), head_row("c", 0, 0, DEP, 2, 2)])
    tidy = stats.tidy_counts(uc)
    row = one(tidy, fold="")
    assert (row["n"], row["hits"]) == (10, 7)
    folds = stats.assign_folds(["a", "b", "c"])
    for f in (0, 1):
        chosen = [u for u in "abc" if folds[u] == f]
        n = {"a": 3, "b": 5, "c": 2}
        hits = {"a": 1, "b": 4, "c": 2}
        row = one(tidy, fold=str(f))
        assert row["n"] == sum(n[u] for u in chosen)
        assert row["hits"] == sum(hits[u] for u in chosen)


# ----------------------------------------------------------------------------------------
# best heads: in-sample
# ----------------------------------------------------------------------------------------
def test_in_sample_clear_winner_with_baseline(form):
    # 4 units x 5 arcs. Head 1-0 dep->head hits 4 of 5 in every unit (16/20 = 0.8);
    # the other candidates are far lower. offset=+1 hits 3/5 per unit (0.6), offset=-1 1/5 (0.2).
    units = UNITS[:4]
    uc = build(units, 5, {
        (0, 0, DEP): [1, 2, 1, 0], (0, 0, HEAD): [0, 0, 1, 1],
        (1, 0, DEP): [4, 4, 4, 4], (1, 0, HEAD): [2, 3, 2, 2],
        (1, 1, DEP): [3, 3, 3, 2],
    }, {"offset=+1": [3, 3, 3, 3], "offset=-1": [1, 1, 1, 1]})
    best, base = stats.selection_tables(form(uc), n_boot=100)
    row = one(best, analysis="dependency", label="det", selection="in-sample")
    assert (row["layer"], row["head"], row["direction"], row["heads"]) == (1, 0, DEP, "1-0")
    assert row["fold"] == ""
    assert (row["n"], row["hits"]) == (20, 16)
    assert row["accuracy"] == pytest.approx(0.8)
    assert row["baseline_variant"] == "offset=+1"
    assert row["baseline_hits"] == 12
    assert row["baseline_accuracy"] == pytest.approx(0.6)
    assert row["gap"] == pytest.approx(0.8 - 0.6)
    # the baselines table lists every variant with its own accuracy
    assert set(base["variant"]) == {"offset=+1", "offset=-1"}
    assert one(base, variant="offset=-1")["accuracy"] == pytest.approx(0.2)
    assert one(base, variant="offset=+1")["hits"] == 12
    # best_heads / baselines are the two halves of selection_tables
    pd.testing.assert_frame_equal(stats.best_heads(form(uc), n_boot=100), best)
    pd.testing.assert_frame_equal(stats.baselines(form(uc), n_boot=100), base)


@pytest.mark.parametrize("tied, expected", [
    # lowest layer first
    ([(2, 0, DEP), (1, 3, HEAD), (1, 1, HEAD)], (1, 1, HEAD)),
    # then lowest head
    ([(0, 3, DEP), (0, 2, HEAD)], (0, 2, HEAD)),
    # then dep->head before head<-dep
    ([(0, 2, HEAD), (0, 2, DEP)], (0, 2, DEP)),
    # all together
    ([(1, 1, DEP), (0, 2, HEAD), (0, 3, DEP), (0, 2, DEP)], (0, 2, DEP)),
])
def test_in_sample_ties(form, tied, expected):
    units = UNITS[:4]
    heads = {cand: [2, 1, 3, 0] for cand in tied}                 # identical hits in every unit
    heads[(0, 0, DEP)] = [1, 1, 0, 0]                              # a worse candidate
    uc = build(units, 4, heads)
    uc = uc.sample(frac=1.0, random_state=1).reset_index(drop=True)  # input order must not matter
    row = one(stats.best_heads(form(uc), n_boot=50), selection="in-sample")
    assert (row["layer"], row["head"], row["direction"]) == expected
    assert row["accuracy"] == pytest.approx(6 / 16)


def test_baseline_tie_goes_to_nearest_offset(form):
    uc = build(UNITS[:4], 4, {(0, 0, DEP): [1, 1, 1, 1]},
               {"offset=+2": [2, 2, 2, 2], "offset=+1": [2, 2, 2, 2], "offset=-1": [2, 2, 2, 2]})
    row = one(stats.best_heads(form(uc), n_boot=50), selection="in-sample")
    assert row["baseline_variant"] == "offset=-1"      # |k| first, then the negative side


def test_label_without_baselines_has_empty_baseline_columns():
    uc = build(UNITS[:4], 3, {(0, 0, DEP): [1, 2, 3, 0]})
    row = one(stats.best_heads(uc, n_boot=50), selection="in-sample")
    assert pd.isna(row["baseline_accuracy"]) and pd.isna(row["gap"])


# ----------------------------------------------------------------------------------------
# best heads: held-out
# ----------------------------------------------------------------------------------------
def held_out_case():
    """Fold 0 prefers head A = 0-0 dep->head, fold 1 prefers head B = 1-1 head<-dep.

    10 arcs per unit, 3 units per fold.
      A: 8/10 per fold-0 unit, 3/10 per fold-1 unit  -> fold 0: 24/30, fold 1: 9/30, all 33/60
      B: 4/10 per fold-0 unit, 9/10 per fold-1 unit  -> fold 0: 12/30, fold 1: 27/30, all 39/60
      offset=+1: 5/10 on fold 0, 2/10 on fold 1      -> 15/30, 6/30, all 21/60
      offset=-1: 1/10 on fold 0, 7/10 on fold 1      -> 3/30, 21/30, all 24/60
    """
    units = UNITS[:6]
    f0, f1 = split_by_fold(units)
    assert len(f0) == len(f1) == 3

    def per_unit(on0, on1):
        return [on0 if u in f0 else on1 for u in units]

    heads = {(0, 0, DEP): per_unit(8, 3), (1, 1, HEAD): per_unit(4, 9), (0, 1, DEP): per_unit(1, 1)}
    baselines = {"offset=+1": per_unit(5, 2), "offset=-1": per_unit(1, 7)}
    return build(units, 10, heads, baselines)


def test_held_out_uses_head_selected_on_other_fold(form):
    best = stats.best_heads(form(held_out_case()), n_boot=200)
    rows = best[best["label"] == "det"]
    assert list(zip(rows["selection"], rows["fold"])) == [
        ("in-sample", ""), ("held-out", "0"), ("held-out", "1"), ("held-out", "")]

    ins = one(rows, selection="in-sample")
    assert (ins["layer"], ins["head"], ins["direction"]) == (1, 1, HEAD)          # 39/60 beats 33/60
    assert (ins["n"], ins["hits"]) == (60, 39)
    assert ins["baseline_variant"] == "offset=-1" and ins["baseline_hits"] == 24
    assert ins["gap"] == pytest.approx(39 / 60 - 24 / 60)

    # fold 0 is evaluated with the head chosen on fold 1 (B), which hits 4/10 on fold-0 units
    r0 = one(rows, selection="held-out", fold="0")
    assert (r0["layer"], r0["head"], r0["direction"], r0["heads"]) == (1, 1, HEAD, "1-1")
    assert (r0["n"], r0["hits"]) == (30, 12)
    assert r0["accuracy"] == pytest.approx(0.4)
    # ... and its baseline is the one chosen on fold 1 (offset=-1), evaluated on fold 0
    assert r0["baseline_variant"] == "offset=-1"
    assert r0["baseline_hits"] == 3
    assert r0["baseline_accuracy"] == pytest.approx(0.1)
    assert r0["gap"] == pytest.approx(0.4 - 0.1)

    # fold 1 is evaluated with the head chosen on fold 0 (A), which hits 3/10 on fold-1 units
    r1 = one(rows, selection="held-out", fold="1")
    assert (r1["layer"], r1["head"], r1["direction"], r1["heads"]) == (0, 0, DEP, "0-0")
    assert (r1["n"], r1["hits"]) == (30, 9)
    assert r1["baseline_variant"] == "offset=+1"
    assert r1["baseline_hits"] == 6
    assert r1["gap"] == pytest.approx(0.3 - 0.2)

    # the pooled row adds both evaluations and names both heads (selected on fold 0 | on fold 1)
    pooled = one(rows, selection="held-out", fold="")
    assert (pooled["n"], pooled["hits"]) == (60, 12 + 9)
    assert pooled["accuracy"] == pytest.approx(21 / 60)
    assert pooled["heads"] == "0-0 | 1-1"
    assert pooled["layer"] == -1 and pooled["head"] == -1
    assert pooled["baseline_variant"] == "per fold"
    assert pooled["baseline_hits"] == 3 + 6
    assert pooled["gap"] == pytest.approx(21 / 60 - 9 / 60)
    for row in (r0, r1, pooled):
        assert row["ci_low"] <= row["accuracy"] <= row["ci_high"]


def test_held_out_same_head_on_both_folds(form):
    units = UNITS[:6]
    uc = build(units, 4, {(0, 1, DEP): [3, 4, 3, 4, 3, 4], (0, 0, DEP): [1, 0, 1, 0, 1, 0]},
               {"offset=+1": [2] * 6})
    best = stats.best_heads(form(uc), n_boot=50)
    pooled = one(best, selection="held-out", fold="")
    assert (pooled["layer"], pooled["head"], pooled["direction"], pooled["heads"]) == (0, 1, DEP, "0-1")
    assert pooled["baseline_variant"] == "offset=+1"
    ins = one(best, selection="in-sample")
    # with the same choice on both folds, held-out equals in-sample
    assert (pooled["n"], pooled["hits"], pooled["accuracy"]) == (ins["n"], ins["hits"], ins["accuracy"])


def test_held_out_with_label_in_one_fold_only():
    # a label seen only in fold-0 units: the fold-1 row has no arcs (NaN accuracy), nothing crashes
    units = UNITS[:6]
    f0, _ = split_by_fold(units)
    rows = [head_row(u, 0, 0, DEP, 2, 1, label="rare") for u in f0]
    rows += [head_row(u, 0, 0, DEP, 2, 2, label="det") for u in units]
    best = stats.best_heads(frame(rows), n_boot=50)
    r1 = one(best, label="rare", selection="held-out", fold="1")
    assert r1["n"] == 0 and np.isnan(r1["accuracy"])
    assert one(best, label="rare", selection="held-out", fold="0")["n"] == 2 * len(f0)


# ----------------------------------------------------------------------------------------
# bootstrap
# ----------------------------------------------------------------------------------------
def varied_case():
    units = [f"s{i:02d}" for i in range(30)]
    rng = np.random.default_rng(11)
    n = rng.integers(2, 9, size=len(units))
    hits = [int(rng.integers(0, k + 1)) for k in n]
    other = [int(rng.integers(0, k // 2 + 1)) for k in n]
    base = [int(rng.integers(0, k + 1)) for k in n]
    return build(units, list(n), {(0, 0, DEP): hits, (0, 1, DEP): other}, {"offset=+1": base})


def test_bootstrap_interval_contains_estimate_and_is_over_units(form):
    uc = varied_case()
    best = stats.best_heads(form(uc), n_boot=500)
    row = one(best, selection="in-sample")
    assert row["ci_low"] < row["accuracy"] < row["ci_high"]
    assert row["gap_low"] < row["gap"] < row["gap_high"]
    # recompute by hand: resample sentences (units) with the module's fixed-seed weights
    rows = uc[(uc["layer"] == row["layer"]) & (uc["head"] == row["head"]) & (uc["direction"] == row["direction"])]
    per_unit = rows.set_index("unit").sort_index()
    weights = stats.bootstrap_weights(len(per_unit), stats.SEED, 500)
    boot = (weights @ per_unit["hits"].to_numpy(float)) / (weights @ per_unit["n"].to_numpy(float))
    low, high = np.percentile(boot, [2.5, 97.5])
    assert row["ci_low"] == pytest.approx(low) and row["ci_high"] == pytest.approx(high)


def test_bootstrap_weights_shape():
    w = stats.bootstrap_weights(7, 0, 100)
    assert w.shape == (100, 7)
    assert (w.sum(axis=1) == 7).all()            # each resample draws 7 units with replacement


def test_bootstrap_zero_width_when_every_unit_has_same_accuracy(form):
    # every unit: half its arcs hit, whatever its size -> every resample gives exactly 0.5
    n = [2, 4, 6, 8, 10, 2, 4, 6]
    uc = build(UNITS, n, {(0, 0, DEP): [k // 2 for k in n], (0, 1, DEP): [0] * 8},
               {"offset=+1": [k // 2 for k in n]})
    best = stats.best_heads(form(uc), n_boot=300)
    for _, row in best.iterrows():
        if row["selection"] == "in-sample" or row["fold"] == "":
            assert row["accuracy"] == 0.5
        assert row["ci_low"] == row["ci_high"] == row["accuracy"]
        assert row["gap_low"] == row["gap_high"] == 0.0


def test_bootstrap_reproducible_and_seeded():
    uc = varied_case()
    stats.bootstrap_weights.cache_clear()
    first = stats.best_heads(uc, seed=0, n_boot=300)
    stats.bootstrap_weights.cache_clear()                       # recomputed, not just the cached array
    again = stats.best_heads(uc, seed=0, n_boot=300)
    pd.testing.assert_frame_equal(first, again)
    other = stats.best_heads(uc, seed=1, n_boot=300)
    ins0, ins1 = one(first, selection="in-sample"), one(other, selection="in-sample")
    assert ins0["accuracy"] == ins1["accuracy"]                 # the point estimate does not move
    assert (ins0["ci_low"], ins0["ci_high"]) != (ins1["ci_low"], ins1["ci_high"])


def test_gap_interval_is_paired():
    # the head and the baseline hit exactly the same arcs in every unit; accuracies vary by unit,
    # so each has a wide interval, but every resample gives a gap of exactly 0
    rng = np.random.default_rng(2)
    n = list(rng.integers(2, 9, size=20))
    hits = [int(rng.integers(0, k + 1)) for k in n]
    units = [f"s{i:02d}" for i in range(20)]
    uc = build(units, n, {(0, 0, DEP): hits, (0, 1, DEP): [0] * 20}, {"offset=+1": hits})
    best = stats.best_heads(uc, n_boot=500)
    ins = one(best, selection="in-sample")
    assert ins["ci_high"] - ins["ci_low"] > 0.1
    assert ins["gap"] == 0.0
    assert (ins["gap_low"], ins["gap_high"]) == (0.0, 0.0)
    base = one(stats.baselines(uc, n_boot=500), variant="offset=+1")
    assert (base["ci_low"], base["ci_high"]) == (ins["ci_low"], ins["ci_high"])


# ----------------------------------------------------------------------------------------
# positional heads
# ----------------------------------------------------------------------------------------
def positional_counts():
    """Tidy counts (analysis positional), 100 word queries per head, argmax shares by hand."""
    shares = {
        (0, 0): {"-1": 95, "0": 3, "other": 2},                 # 0.95 at -1: positional
        (0, 1): {"-1": 85, "+1": 10, "0": 5},                   # 0.85: not
        (0, 2): {"0": 100},                                      # all on self: never positional
        (1, 0): {"+2": 90, "special": 10},                      # exactly 0.9 at +2: positional
        (1, 1): {"special": 95, "-1": 5},                       # special is not an offset
    }
    rows = []
    labels = ["-2", "-1", "0", "+1", "+2", "special", "other"]
    for (layer, head), got in shares.items():
        for label in labels:
            rows.append(dict(analysis="positional", label=label, layer=layer, head=head, direction="",
                             variant="", fold="", n=100.0, hits=float(got.get(label, 0)), mass=np.nan))
            # fold rows say something else: they must be ignored
            rows.append(dict(analysis="positional", label=label, layer=layer, head=head, direction="",
                             variant="", fold="0", n=50.0, hits=50.0 if label == "+1" else 0.0, mass=np.nan))
    rows.append(dict(analysis="dependency", label="-1", layer=0, head=1, direction=DEP, variant="", fold="",
                     n=10.0, hits=10.0, mass=np.nan))          # other analyses are ignored too
    return pd.DataFrame(rows)


def test_positional_heads():
    table = stats.positional_heads(positional_counts()).set_index(["layer", "head"])
    assert len(table) == 5
    assert table.loc[(0, 0), "positional"] and table.loc[(0, 0), "offset"] == "-1"
    assert table.loc[(0, 0), "share"] == pytest.approx(0.95)
    assert not table.loc[(0, 1), "positional"]
    assert table.loc[(0, 1), "offset"] == "-1" and table.loc[(0, 1), "share"] == pytest.approx(0.85)
    assert not table.loc[(0, 2), "positional"]
    assert table.loc[(0, 2), "0"] == pytest.approx(1.0)
    assert table.loc[(1, 0), "positional"] and table.loc[(1, 0), "offset"] == "+2"
    assert not table.loc[(1, 1), "positional"]
    # per-offset shares are kept as columns
    assert table.loc[(0, 1), "+1"] == pytest.approx(0.10)
    assert stats.positional_heads(positional_counts(), threshold=0.96).query("positional").empty


def test_positional_heads_empty():
    out = stats.positional_heads(positional_counts().query("analysis == 'dependency'"))
    assert out.empty and {"layer", "head", "offset", "share", "positional"} <= set(out.columns)


# ----------------------------------------------------------------------------------------
# merge
# ----------------------------------------------------------------------------------------
def assert_same_results(merged: Results, reference: Results):
    for name in ("best_heads", "baselines", "counts", "positional_heads", "surface"):
        pd.testing.assert_frame_equal(getattr(merged, name).reset_index(drop=True),
                                      getattr(reference, name).reset_index(drop=True),
                                      check_dtype=False, check_categorical=False, rtol=1e-5)


@pytest.mark.parametrize("shard_by", ["unit", "layer"])
def test_merge_equals_concatenated_counts(shard_by):
    uc = make_unit_counts(seed=4, n_sentences=30, n_docs=8)
    if shard_by == "unit":       # two shards of one corpus
        first = uc["unit"].isin(sorted(uc["unit"].unique())[::2])
    else:                        # two devices, each scoring some layers (baselines go with the first)
        first = uc["layer"] <= 0
    a, b = uc[first], uc[~first]
    parts = [Results.from_unit_counts(part, {"model": "m"}, n_boot=100) for part in (a, b)]
    merged = Results.merge(*parts, n_boot=100)
    reference = Results.from_unit_counts(pd.concat([a, b], ignore_index=True), n_boot=100)
    assert_same_results(merged, reference)
    assert merged.summary["merged_from"] == 2
    assert merged.best_heads["heads"].tolist() == reference.best_heads["heads"].tolist()


def test_merge_sums_split_counts_of_the_same_unit():
    # one sentence scored in two shards (its arcs split): the merged row adds them up
    a = frame([head_row("s1", 0, 0, DEP, 3, 1), head_row("s2", 0, 0, DEP, 2, 2)])
    b = frame([head_row("s1", 0, 0, DEP, 4, 3)])
    merged = Results.merge(Results.from_unit_counts(a, n_boot=20), Results.from_unit_counts(b, n_boot=20),
                           n_boot=20)
    assert len(merged.unit_counts) == 2
    s1 = merged.unit_counts[merged.unit_counts["unit"] == "s1"].iloc[0]
    assert (s1["n"], s1["hits"]) == (7, 4)
    row = one(merged.best_heads, selection="in-sample")
    assert (row["n"], row["hits"]) == (9, 6)


def test_merge_summary_describes_the_merged_tables():
    # shards run with a non-default seed and resample count (`--seed 3 --bootstrap 100`): the merged
    # summary must say which seed / resamples its tables were built with, and they must be those
    uc = make_unit_counts(seed=4, n_sentences=30, n_docs=8)
    first = uc["unit"].isin(sorted(uc["unit"].unique())[::2])
    parts = [Results.from_unit_counts(uc[mask], {"model": "m"}, seed=3, n_boot=100) for mask in (first, ~first)]
    merged = Results.merge(*parts)
    seed, n_boot = merged.summary["seed"], merged.summary["bootstrap_resamples"]
    reference = Results.from_unit_counts(uc, seed=seed, n_boot=n_boot)
    assert_same_results(merged, reference)
