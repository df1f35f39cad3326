"""Streaming statistics (METHODS §5 and §6) on hand-built counts.

Counts are fed into a `Tally` the way scorers do (one row per unit and label, hits per
layer, head and direction, baseline hits, concordant hits); every expected figure is
worked out in the test or computed independently from its definition.
"""

from __future__ import annotations

from hashlib import blake2b

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import binomtest

from headprobe.results.query import Results
from headprobe.scoring.tally import Tally, unit_fold, unit_weights
from headprobe.stats import estimates, head_selection

D, H = "dep->head", "head<-dep"
VARIANTS = ("offset=-1", "first")


def dependency_tally(n_heads=2, n_boot=200, seed=0) -> Tally:
    return Tally(
        "dependency",
        directions=(D, H),
        variants=VARIANTS,
        layers=[0],
        n_heads=n_heads,
        resamples=n_boot,
        seed=seed,
        extras=("unreachable",),
    )


def add_arcs(tally: Tally, unit: str, label: str, head_hits, base_hits):
    """Add the arcs of one unit: `head_hits` [arc, head, direction] 0/1, `base_hits` [arc, variant] 0/1."""
    hits = torch.tensor(head_hits, dtype=torch.float32)  # [arc, head, dir]
    base = np.asarray(base_hits, dtype=np.float32)  # [arc, variant]
    n_arcs = hits.shape[0]
    values = hits.sum(0)[None, None]  # [row=1, layer=1, head, dir]
    tally.add(
        [unit],
        [label],
        values,
        [[n_arcs, n_arcs]],
        base.sum(0, keepdims=True),
        {"unreachable": np.zeros((1, 2), dtype=np.int64)},
    )
    both = torch.einsum("ahd,av->hdv", hits, torch.from_numpy(base))  # [head, dir, variant]
    tally.add_both([label], both[None, None])  # [label, layer, head, dir, variant]


# ------------------------------------------------------------------------ the METHODS §5 recipes


def test_folds_and_weights_follow_the_spec_recipe():
    for unit in ("weblog-1", "s1", "GUM_academic_art", "näive#3"):
        key = blake2b(f"0:fold:{unit}".encode(), digest_size=8).digest()
        assert unit_fold(unit) == int.from_bytes(key, "little") % 2
        k = int.from_bytes(blake2b(f"7:boot:{unit}".encode(), digest_size=8).digest(), "little")
        expected = np.random.Generator(np.random.PCG64(k)).poisson(1.0, 1000)
        assert np.array_equal(unit_weights(unit, seed=7), expected)
    # the seed changes the draw
    assert [unit_fold(f"u{i}", 0) for i in range(40)] != [unit_fold(f"u{i}", 1) for i in range(40)]


def test_totals_do_not_depend_on_order_or_sharding():
    rng = np.random.default_rng(3)
    rows = [
        (
            f"u{rng.integers(0, 12)}",
            str(rng.choice(["nsubj", "det", "ALL"])),
            rng.integers(0, 2, size=(3, 2, 2)),
            rng.integers(0, 2, size=(3, 2)),
        )
        for _ in range(60)
    ]
    one = dependency_tally(n_boot=50)
    for row in rows:
        add_arcs(one, *row)
    shards = [dependency_tally(n_boot=50) for _ in range(3)]
    for i, row in enumerate(reversed(rows)):
        add_arcs(shards[i % 3], *row)
    merged = shards[0].merge(shards[1]).merge(shards[2])
    assert one.sorted_labels() == merged.sorted_labels()
    for label in one.sorted_labels():
        a, b = one.arrays(label), merged.arrays(label)
        assert a.keys() == b.keys()
        for key in a:
            assert np.array_equal(a[key], b[key]), (label, key)
    # resample 0 is the data itself: plain hits per fold add up to the whole
    total = sum(np.asarray(r[2]).sum(0)[0, 0] for r in rows if r[1] == "det")
    assert one.arrays("det")["hits"][:, 0, 0, 0, 0].sum() == total


def test_save_and_load_round_trip(tmp_path):
    tally = dependency_tally(n_boot=20)
    add_arcs(tally, "u1", "det", [[[1, 0], [0, 1]]], [[1, 0]])
    tally.save(tmp_path / "t.npz")
    loaded = Tally.load(tmp_path / "t.npz")
    assert loaded.meta() == tally.meta()
    for key, value in tally.arrays("det").items():
        assert np.array_equal(loaded.arrays("det")[key], value)


# ------------------------------------------------------------------------ selection and flags


def many_units(tally, label, n_units, head_rate, base_rate, rng, arcs=4):
    """Units whose arcs are hit by head 0 with `head_rate`, head 1 never, the baseline with `base_rate`."""
    for u in range(n_units):
        hits = np.zeros((arcs, 2, 2))
        hits[:, 0, 0] = rng.random(arcs) < head_rate
        base = np.zeros((arcs, 2))
        base[:, 0] = rng.random(arcs) < base_rate
        add_arcs(tally, f"{label}-u{u}", label, hits, base)


def test_best_head_intervals_and_gap():
    rng = np.random.default_rng(0)
    tally = dependency_tally()
    many_units(tally, "nsubj", 60, 0.8, 0.3, rng)
    best, baselines, tests = head_selection.selection_tables(tally)
    row = best[(best.label == "nsubj") & (best.selection == "in-sample")].iloc[0]
    whole = tally.arrays("nsubj")
    hits = whole["hits"][:, 0, 0, 0, 0].sum()
    n = whole["n"][:, 0, 0].sum()
    assert (row.layer, row["head"], row.direction) == (0, 0, D)
    assert row.n == n == 240 and row.hits == hits
    assert row.accuracy == pytest.approx(hits / n)
    # the interval is the 2.5/97.5 percentiles of the resampled ratios
    boot = whole["hits"][:, 1:, 0, 0, 0].sum(0) / whole["n"][:, 1:, 0].sum(0)
    assert (row.ci_low, row.ci_high) == pytest.approx(tuple(np.percentile(boot, [2.5, 97.5])))
    assert row.ci_low < row.accuracy < row.ci_high
    assert row.baseline_variant == "offset=-1" and row.gap > 0.3 and row.gap_low > 0
    assert not row.small_sample and row.tied == 1 and row.note == ""
    held = best[(best.label == "nsubj") & (best.selection == "held-out") & (best.fold == "")].iloc[
        0
    ]
    assert held.folds_agree and held.heads == "0-0" and held.n == 240
    assert set(baselines.variant) == set(VARIANTS)


def test_first_baseline_wins_the_tie_break_order():
    """offset=-1 and first both hit 3 of 4 arcs: the declared order picks offset=-1; with one
    more `first` hit, first wins."""
    tally = dependency_tally()
    for u in range(40):
        add_arcs(tally, f"u{u}", "list", np.zeros((4, 2, 2)), [[1, 1], [1, 1], [1, 1], [0, 0]])
    best, _, _ = head_selection.selection_tables(tally)
    assert best[best.selection == "in-sample"].iloc[0].baseline_variant == "offset=-1"
    tally = dependency_tally()
    for u in range(40):
        add_arcs(tally, f"u{u}", "list", np.zeros((4, 2, 2)), [[1, 1], [1, 1], [1, 1], [0, 1]])
    best, _, _ = head_selection.selection_tables(tally)
    row = best[best.selection == "in-sample"].iloc[0]
    assert row.baseline_variant == "first" and row.baseline_accuracy == 1.0


def test_an_exact_tie_is_flagged_and_the_lowest_head_wins():
    tally = dependency_tally()
    for u in range(40):
        add_arcs(tally, f"u{u}", "det", [[[1, 0], [1, 0]], [[0, 0], [0, 0]]], [[0, 0], [0, 0]])
    best, _, _ = head_selection.selection_tables(tally)
    row = best[best.selection == "in-sample"].iloc[0]
    assert (row.layer, row["head"], row.direction) == (0, 0, D)
    assert row.tied == 2


def test_small_label_names_no_head():
    tally = dependency_tally()
    for u in range(5):  # 5 units x 2 arcs = 10 trials < 30
        add_arcs(tally, f"u{u}", "orphan", [[[1, 0], [0, 0]], [[1, 0], [0, 0]]], [[0, 0], [0, 0]])
    best, _, tests = head_selection.selection_tables(tally)
    rows = best[best.label == "orphan"]
    ins = rows[rows.selection == "in-sample"].iloc[0]
    assert ins.small_sample and ins.layer == -1 and ins.heads == ""
    assert ins.n == 10 and ins.accuracy == 1.0  # shown with its counts
    assert "fewer than 30" in ins.note
    assert rows[rows.selection == "held-out"]["small_sample"].any()


def test_a_fold_without_trials_selects_nothing():
    """One unit: one fold is empty, so no held-out row names a head (never head 0-0 by default)."""
    tally = dependency_tally()
    add_arcs(tally, "only-doc", "det", np.ones((40, 2, 2)), np.zeros((40, 2)))
    best, _, tests = head_selection.selection_tables(tally)
    held = best[best.selection == "held-out"]
    assert len(held) == 3
    assert (held.layer == -1).all() and held.accuracy.isna().all()
    assert held.note.str.startswith(head_selection.NO_SELECTION).all()
    assert tests["heldout_gap"].isna().all()  # no held-out gap for the role rule either


def test_mcnemar_against_scipy_binomtest():
    for b, c in [(12, 3), (5, 5), (0, 4), (30, 11), (1, 0), (0, 0)]:
        expected = binomtest(b, b + c, 0.5, alternative="greater").pvalue if b + c else 1.0
        assert estimates.mcnemar_greater(b, c) == pytest.approx(expected, rel=1e-12)
    # in a table: head 0 hits 9 arcs the baseline misses, the baseline hits 2 the head misses
    tally = dependency_tally()
    hits = np.zeros((40, 2, 2))
    base = np.zeros((40, 2))
    hits[:20, 0, 0] = 1  # head 0: arcs 0..19
    base[11:22, 0] = 1  # baseline: arcs 11..21 -> both 11..19 (9); base only 20, 21
    hits[:9, 0, 0] = 1
    add_arcs(tally, "u", "det", hits, base)
    best, _, tests = head_selection.selection_tables(tally)
    row = best[best.selection == "in-sample"].iloc[0]
    head_only, base_only = 20 - 9, 2
    assert row.p_value == pytest.approx(
        binomtest(head_only, head_only + base_only, 0.5, alternative="greater").pvalue
    )
    t = tests[tests["head"] == 0].iloc[0]
    assert (t.head_only, t.baseline_only) == (head_only, base_only)


def test_holm_against_a_hand_computed_example():
    # sorted: .005 x4 = .02; .01 x3 = .03; .03 x2 = .06; .04 x1 = .04 -> .06 (monotone)
    assert estimates.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert estimates.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert estimates.holm([]).size == 0


def test_role_rule_needs_held_out_gap_and_holm():
    """Head 0 beats the baseline by far on 60 units (syntactic); head 1 never hits (none)."""
    rng = np.random.default_rng(1)
    tally = dependency_tally()
    many_units(tally, "nsubj", 60, 0.9, 0.3, rng)
    many_units(tally, "dep", 5, 0.9, 0.3, rng)  # 20 arcs < 50: not tested
    results = Results({"dependency": tally}, {"n_layers": 1, "n_heads": 2})
    tests = results.head_tests
    tested = tests[tests.family == "roles"]
    assert set(tested.label) == {"nsubj"}
    roles = results.roles.set_index("head")
    assert roles.loc[0, "role"] == "syntactic" and roles.loc[0, "detail"] == "nsubj"
    assert "held-out" in roles.loc[0, "evidence"] and "Holm" in roles.loc[0, "evidence"]
    assert roles.loc[1, "role"] == "none"


def test_results_round_trip_and_merge(tmp_path):
    rng = np.random.default_rng(2)
    parts = [dependency_tally(n_boot=50) for _ in range(2)]
    whole = dependency_tally(n_boot=50)
    for u in range(30):
        hits = rng.integers(0, 2, size=(4, 2, 2))
        base = rng.integers(0, 2, size=(4, 2))
        add_arcs(parts[u % 2], f"u{u}", "nsubj", hits, base)
        add_arcs(whole, f"u{u}", "nsubj", hits, base)
    summary = {"n_layers": 1, "n_heads": 2, "model": "m"}
    merged = Results.merge(
        Results({"dependency": parts[0]}, summary), Results({"dependency": parts[1]}, summary)
    )
    one = Results({"dependency": whole}, summary)
    for name in ("counts", "best_heads", "baselines", "head_tests", "roles"):
        pd.testing.assert_frame_equal(merged.table(name), one.table(name), obj=name)
    one.save(tmp_path / "r")
    loaded = Results.load(tmp_path / "r")
    for name in ("counts", "best_heads", "baselines", "head_tests", "roles"):
        pd.testing.assert_frame_equal(
            loaded.table(name), one.table(name), check_dtype=False, obj=name
        )


def test_percentiles_are_numpys_on_each_cells_finite_values():
    """The vectorised interval equals numpy's percentile of each cell's finite resamples
    (cells with different numbers of NaN, an inf, one cell with none, no resamples at all)."""
    rng = np.random.default_rng(3)
    values = rng.random((200, 4, 3))
    values[rng.random(values.shape) < 0.2] = np.nan
    values[:, 1, 2] = np.nan
    values[7, 0, 0] = np.inf
    low, high = estimates.percentiles(values)
    for i in range(4):
        for j in range(3):
            cell = values[:, i, j]
            cell = cell[np.isfinite(cell)]
            if not cell.size:
                assert np.isnan(low[i, j]) and np.isnan(high[i, j])
                continue
            assert (low[i, j], high[i, j]) == tuple(np.percentile(cell, [2.5, 97.5]))
    assert estimates.interval(values[:, 2, 1]) == (low[2, 1], high[2, 1])
    empty = estimates.percentiles(np.zeros((0, 2)))
    assert np.isnan(empty[0]).all() and np.isnan(empty[1]).all()


def test_held_out_selection_picks_on_the_other_fold_and_pools():
    # two options; fold 0: option 0 is better (8/10 vs 5/10); fold 1: option 1 (9/10 vs 2/10)
    hits = np.array([[[8, 5]], [[2, 9]]], dtype=float)  # [fold, resample, option]
    n = np.array([[10], [10]], dtype=float)  # [fold, resample]
    pooled, picks = estimates.selected(hits, n, "held-out")
    assert picks == {0: 1, 1: 0}  # fold 0 is scored with fold 1's choice, and back
    assert list(pooled) == [5 + 2]
    pooled, picks = estimates.selected(hits, n, "in-sample")  # 10/20 vs 14/20
    assert picks == {0: 1, 1: 1} and list(pooled) == [14]
    gap, _, _ = estimates.paired_gap(pooled, hits[:, :, 0].sum(0), n.sum(0))
    assert gap == pytest.approx((14 - 10) / 20)
    assert (
        estimates.choose(hits, np.zeros_like(n), (0,), default=-1) == -1
    )  # no trials: nothing chosen
