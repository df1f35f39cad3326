"""METHODS §5 and §6 recomputed independently: the tallies' resamples and folds, the paired gap
interval, Holm over the whole role family (each test fails on a planted bug: the family's Holm
correction left out of `head_selection.selection_tables`, or the gap's baseline left unresampled in
`estimates.paired_gap`).
"""

from __future__ import annotations

from hashlib import blake2b

import numpy as np
import pytest
import torch

from headprobe.results.query import Results
from headprobe.scoring.tally import Tally
from headprobe.stats import estimates, head_selection

D, H = "dep->head", "head<-dep"
VARIANTS = ("offset=-1", "first")


def tally(n_heads=2, n_boot=200, seed=0) -> Tally:
    return Tally(
        "dependency",
        directions=(D, H),
        variants=VARIANTS,
        layers=[0],
        n_heads=n_heads,
        resamples=n_boot,
        seed=seed,
    )


def add_unit(t: Tally, unit: str, label: str, head_hits, base_hits) -> None:
    """One unit's arcs: `head_hits` [arc, head, direction] 0/1, `base_hits` [arc, variant] 0/1."""
    hits = torch.tensor(np.asarray(head_hits), dtype=torch.float32)  # [arc, head, dir]
    base = np.asarray(base_hits, dtype=np.float32)  # [arc, variant]
    arcs = hits.shape[0]
    t.add([unit], [label], hits.sum(0)[None, None], [[arcs, arcs]], base.sum(0, keepdims=True))
    both = torch.einsum("ahd,av->hdv", hits, torch.from_numpy(base))  # [head, dir, variant]
    t.add_both([label], both[None, None])  # [label, layer, head, dir, variant]


def hashed(seed: int, kind: str, unit: str) -> int:
    """METHODS §5's keyed hash, written out here from its definition."""
    digest = blake2b(f"{seed}:{kind}:{unit}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def weights(unit: str, seed: int, n_boot: int) -> np.ndarray:
    """[1 + n_boot]: weight 1 (the data), then the unit's Poisson(1) draws (METHODS §5)."""
    rng = np.random.Generator(np.random.PCG64(hashed(seed, "boot", unit)))
    return np.concatenate([[1], rng.poisson(1.0, n_boot)])


def holm_by_hand(p: list[float]) -> list[float]:
    """Holm's step-down adjustment, one test at a time."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    out, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, (m - rank) * p[i])
        out[i] = min(1.0, running)
    return out


# ------------------------------------------------------------------ tallies: weights and folds


@pytest.mark.parametrize("seed", [0, 5])
def test_each_resample_is_the_weighted_sum_over_units(seed):
    rng = np.random.default_rng(seed)
    n_boot = 60
    t = tally(n_boot=n_boot, seed=seed)
    units = [f"doc-{k}" for k in range(25)]
    expected = {
        name: np.zeros((2, 1 + n_boot) + shape)
        for name, shape in (("hits", (2, 2)), ("n", (2,)), ("base", (2,)))
    }  # [fold, resample, ...]
    for unit in units:
        arcs = int(rng.integers(1, 6))
        head = rng.integers(0, 2, size=(arcs, 2, 2))
        base = rng.integers(0, 2, size=(arcs, 2))
        add_unit(t, unit, "nsubj", head, base)
        fold = hashed(seed, "fold", unit) % 2
        w = weights(unit, seed, n_boot)  # [resample]
        expected["hits"][fold] += w[:, None, None] * head.sum(0)
        expected["n"][fold] += w[:, None] * arcs
        expected["base"][fold] += w[:, None] * base.sum(0)
    got = t.arrays("nsubj")
    assert np.array_equal(got["hits"][:, :, 0], expected["hits"])  # [fold, resample, head, dir]
    assert np.array_equal(got["n"], expected["n"])
    assert np.array_equal(got["base"], expected["base"])


def test_each_unit_sits_in_the_fold_its_hash_gives():
    """Unit k hits 2**k arcs, so the data's hits per fold spell out which units it holds."""
    t = tally(n_heads=1, n_boot=1)
    units = [f"GUM_{k}" for k in range(16)]
    for k, unit in enumerate(units):
        arcs = 2**k
        add_unit(t, unit, "ALL", np.ones((arcs, 1, 2)), np.zeros((arcs, 2)))
    hits = t.arrays("ALL")["hits"][:, 0, 0, 0, 0].astype(np.int64)  # [fold] resample 0
    for fold in (0, 1):
        members = {u for k, u in enumerate(units) if (int(hits[fold]) >> k) & 1}
        assert members == {u for u in units if hashed(0, "fold", u) % 2 == fold}
    assert hits.sum() == 2**16 - 1 and 0 < hits[0] < hits.sum()


# ------------------------------------------------------------------ the paired gap


def correlated_units(t: Tally, rng, n_units=40, arcs=6) -> None:
    """Units of very different difficulty: head 0 and the baseline hit the same easy units, so
    the paired interval of their gap is far narrower than an unpaired one."""
    for u in range(n_units):
        easy = rng.random() < 0.5
        head = np.zeros((arcs, 2, 2))
        base = np.zeros((arcs, 2))
        head[:, 0, 0] = 1 if easy else rng.random(arcs) < 0.3
        base[:, 0] = 1 if easy else 0
        add_unit(t, f"u{u}", "nsubj", head, base)


def test_gap_interval_is_paired():
    rng = np.random.default_rng(4)
    t = tally(n_boot=400)
    correlated_units(t, rng)
    best, _, _ = head_selection.selection_tables(t)
    row = best[(best.label == "nsubj") & (best.selection == "in-sample")].iloc[0]
    assert (row.layer, row["head"], row.direction, row.baseline_variant) == (0, 0, D, "offset=-1")
    a = t.arrays("nsubj")
    hits = a["hits"][:, :, 0, 0, 0].sum(0)  # [resample]
    base = a["base"][:, :, 0].sum(0)  # [resample]
    n = a["n"][:, :, 0].sum(0)  # [resample]
    paired = hits[1:] / n[1:] - base[1:] / n[1:]  # the same weights on both sides
    low, high = np.percentile(paired, [2.5, 97.5])
    assert row.gap == pytest.approx(hits[0] / n[0] - base[0] / n[0])
    assert (row.gap_low, row.gap_high) == pytest.approx((low, high), abs=1e-12)
    # an unpaired interval (the baseline at its data value) is a different, wider one
    unpaired = np.percentile(hits[1:] / n[1:] - base[0] / n[0], [2.5, 97.5])
    assert unpaired[1] - unpaired[0] > 2 * (high - low)


def test_heldout_gap_interval_of_every_head_is_paired():
    """`head_tests` gives every head's held-out gap an interval (METHODS §6's evidence). Here the
    choices are the same on both folds (dep->head is the only direction that hits, `first`
    never hits), so the held-out gap of a head on resample b is its hits over both folds minus
    the baseline's, over the same arcs: head 0 (tracks the baseline) and head 1 (hits at random)."""
    rng = np.random.default_rng(4)
    t = tally(n_boot=400)
    for u in range(40):
        easy = rng.random() < 0.5
        head = np.zeros((6, 2, 2))  # [arc, head, direction]
        head[:, 0, 0] = 1 if easy else rng.random(6) < 0.3
        head[:, 1, 0] = rng.random(6) < 0.6
        base = np.zeros((6, 2))
        base[:, 0] = 1 if easy else 0
        add_unit(t, f"u{u}", "nsubj", head, base)
    tests = Results({"dependency": t}, {"n_layers": 1, "n_heads": 2}).head_tests
    a = t.arrays("nsubj")
    n = a["n"][:, :, 0].sum(0)  # [resample] both folds
    base = a["base"][:, :, 0].sum(0)  # [resample] offset=-1
    for h in (0, 1):
        row = tests[(tests.label == "nsubj") & (tests["head"] == h)].iloc[0]
        hits = a["hits"][:, :, 0, h, 0].sum(0)  # [resample] dep->head
        gaps = hits / n - base / n  # the same weights on both sides
        low, high = np.percentile(gaps[1:], [2.5, 97.5])
        assert row.heldout_gap == pytest.approx(gaps[0], abs=1e-12)
        assert (row.heldout_gap_low, row.heldout_gap_high) == pytest.approx((low, high), abs=1e-12)
        assert low < row.heldout_gap < high


def test_paired_gap_function_pairs_resample_by_resample():
    rng = np.random.default_rng(0)
    n = rng.integers(50, 60, size=101).astype(float)  # [resample]
    hits = np.floor(n * rng.uniform(0.3, 0.9, size=101))
    other = hits - rng.integers(0, 5, size=101)  # tracks hits resample by resample
    gap, low, high = estimates.paired_gap(hits, other, n)
    diffs = hits[1:] / n[1:] - other[1:] / n[1:]
    assert gap == pytest.approx(hits[0] / n[0] - other[0] / n[0])
    assert (low, high) == pytest.approx(tuple(np.percentile(diffs, [2.5, 97.5])), abs=1e-12)


# ------------------------------------------------------------------ Holm over the whole family


def modest_head(t: Tally, label: str, rng) -> None:
    """60 arcs over 15 units: head 0 alone hits 12, the baseline alone 3, both 20, neither 25
    (one-sided McNemar p = P(X >= 12 | 15, 1/2) = 576 / 2**15 = 0.0176; gap 9 / 60 = 0.15);
    head 1 never hits; `first` never hits."""
    kinds = np.array([0] * 12 + [1] * 3 + [2] * 20 + [3] * 25)
    rng.shuffle(kinds)
    for u, chunk in enumerate(kinds.reshape(15, 4)):
        head = np.zeros((4, 2, 2))
        base = np.zeros((4, 2))
        head[:, 0, 0] = np.isin(chunk, (0, 2))
        base[:, 0] = np.isin(chunk, (1, 2))
        add_unit(t, f"{label}-{u}", label, head, base)


def equal_head(t: Tally, label: str, rng) -> None:
    """60 arcs: head 0 hits exactly the baseline's arcs (p = 1); head 1 never hits."""
    for u in range(15):
        hit = rng.random(4) < 0.5
        head = np.zeros((4, 2, 2))
        head[:, 0, 0] = hit
        base = np.zeros((4, 2))
        base[:, 0] = hit
        add_unit(t, f"{label}-{u}", label, head, base)


def family_results(other_relations: int) -> Results:
    rng = np.random.default_rng(7)
    t = tally()
    modest_head(t, "nsubj", rng)
    for label in ("obj", "det", "amod", "case")[:other_relations]:
        equal_head(t, label, rng)
    return Results({"dependency": t}, {"n_layers": 1, "n_heads": 2})


def test_p_holm_is_holm_over_the_whole_family():
    results = family_results(other_relations=2)
    tests = results.head_tests
    family = tests[tests.family == "roles"]
    assert len(family) == 6  # 3 relations x 2 heads, all one family
    by_hand = holm_by_hand(family["p_value"].tolist())
    assert family["p_holm"].tolist() == pytest.approx(by_hand, abs=1e-15)
    nsubj = family[(family.label == "nsubj") & (family["head"] == 0)].iloc[0]
    assert nsubj.p_value == pytest.approx(576 / 2**15)
    assert nsubj.p_holm == pytest.approx(6 * 576 / 2**15)
    best = results.best_heads
    row = best[(best.label == "nsubj") & (best.selection == "in-sample")].iloc[0]
    assert row.p_holm == pytest.approx(nsubj.p_holm)
    # ALL is outside the role family: its heads are a family of their own
    all_tests = tests[tests.label == "ALL"]
    assert all_tests["p_holm"].tolist() == pytest.approx(
        holm_by_hand(all_tests["p_value"].tolist()), abs=1e-15
    )


def test_holm_refuses_a_role_a_raw_p_would_give():
    """The same head and arcs: syntactic when the family is small (Holm p = 2 x 0.0176), refused
    when the family holds 3 relations x 2 heads (Holm p = 6 x 0.0176 = 0.105 >= 0.05), although
    its raw p (0.0176) and held-out gap (0.15) pass."""
    small = family_results(other_relations=0)
    roles = small.roles.set_index("head")
    assert roles.loc[0, "role"] == "syntactic" and roles.loc[0, "detail"] == "nsubj"
    large = family_results(other_relations=2)
    tests = large.head_tests
    nsubj = tests[(tests.label == "nsubj") & (tests["head"] == 0)].iloc[0]
    assert nsubj.p_value < 0.05 and nsubj.heldout_gap == pytest.approx(0.15)
    assert nsubj.p_holm >= 0.05
    assert large.roles.set_index("head").loc[0, "role"] == "none"
