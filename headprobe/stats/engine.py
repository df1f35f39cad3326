"""Honest numbers (METHODS §5), read from streaming tallies (`headprobe.scoring.tally`): the one
statistics engine (every interval, selection and gap of every analysis is computed here).

    best, baselines, tests = selection_tables(tally, family=lambda label, n: n >= 50)
    acc, low, high = estimate(hits, n)                  # [resample, ...] -> ratio and 95% interval
    gap, low, high = paired_gap(hits, base_hits, n)     # paired: resample by resample
    hits_pooled, picks = selected(hits, n, "held-out")  # hits [fold, resample, option]

- Units are documents where the corpus marks them, else sentences; a unit's fold
  and bootstrap weights come from a keyed hash of its id (`tally.unit_fold`,
  `tally.unit_weights`), so every figure here is the same whatever the sharding.
- Best head in-sample: the (layer, head, direction) with the highest accuracy on all
  units; ties go to the lowest layer, head, then `dep->head`; exact ties are counted
  (`tied`). Baseline: the best of the analysis's baselines, first in declared order on ties.
- Held-out: select head, direction and baseline on one fold, evaluate on the other,
  swap, and pool the two evaluations. A fold with no trials selects nothing.
- Intervals: 95% percentiles of the Poisson(1) resamples; the gap is paired.
- Small samples: a label with fewer than `MIN_N` trials names no head.
- Tests: one-sided exact McNemar of a head (in its better direction) against the
  in-sample best baseline, on the discordant items; Holm over a family.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import binom

from headprobe.core.seeds import SEED  # noqa: F401  (re-exported for the stats API)
from headprobe.scoring import registry
from headprobe.scoring.tally import N_BOOT, unit_fold  # noqa: F401  (re-exported: one owner, tally)

MIN_N = 30


def min_trials(analysis: str) -> int:
    """The fewest trials a label of `analysis` needs to name a best head or a role: its own
    (`Analysis.min_n`), else `MIN_N`."""
    return registry.min_n(analysis, MIN_N)


ALPHA = 0.05
NO_SELECTION = "no held-out selection"

BEST_COLUMNS = [
    "analysis",
    "label",
    "selection",
    "fold",
    "layer",
    "head",
    "direction",
    "heads",
    "n",
    "hits",
    "accuracy",
    "ci_low",
    "ci_high",
    "baseline_variant",
    "baseline_hits",
    "baseline_accuracy",
    "gap",
    "gap_low",
    "gap_high",
    "unreachable",
    "tied",
    "folds_agree",
    "small_sample",
    "p_value",
    "p_holm",
    "note",
]
# what a best head is shown with wherever a few are listed (the run summary's headline, the
# report's findings, runs side by side, the console): the one list, each place takes its view
SHOWN_COLUMNS = [
    "analysis",
    "label",
    "selection",
    "heads",
    "direction",
    "n",
    "accuracy",
    "ci_low",
    "ci_high",
    "baseline_variant",
    "baseline_accuracy",
    "gap",
    "gap_low",
    "gap_high",
]
BASELINE_COLUMNS = ["analysis", "label", "variant", "n", "hits", "accuracy", "ci_low", "ci_high"]
TEST_COLUMNS = [
    "analysis",
    "label",
    "layer",
    "head",
    "direction",
    "n",
    "hits",
    "accuracy",
    "baseline_variant",
    "baseline_accuracy",
    "gap",
    "head_only",
    "baseline_only",
    "p_value",
    "family",
    "p_holm",
    "heldout_accuracy",
    "heldout_baseline",
    "heldout_gap",
    "heldout_gap_low",
    "heldout_gap_high",
]


# ------------------------------------------------------------------------ the engine
#
# Every count here is a `[fold, resample, ...]` array from a tally (`headprobe.scoring.tally`):
# resample 0 is the data itself, resamples 1.. are the Poisson(1) resamples. Selection
# reads resample 0; intervals read the resamples; a paired gap subtracts two ratios
# resample by resample (same weights).

Q = (2.5, 97.5)  # the 95% percentile interval's ends (METHODS §5)


def ratio(hits, n):
    """hits / n, elementwise; NaN where n is 0."""
    hits, n = np.asarray(hits, dtype=np.float64), np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, hits / np.where(n > 0, n, 1), np.nan)


def percentiles(values, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) = the 2.5th and 97.5th percentiles (numpy's linear interpolation) along
    `axis` (the resamples) of the finite values, for every other cell at once; NaN where a
    cell has none. The one owner of the interval's ends (METHODS §5).

        low, high = percentiles(ratio(hits[1:], n[1:]))        # hits, n: [resample, layer, head]
    """
    v = np.moveaxis(np.asarray(values, dtype=np.float64), axis, 0)
    shape = v.shape[1:]
    flat = v.reshape(v.shape[0], int(np.prod(shape)))  # [resample, cell]
    finite = np.isfinite(flat)
    out = np.full((2, flat.shape[1]), np.nan)
    if finite.all() and flat.shape[0]:
        out[:] = np.percentile(flat, Q, axis=0)
    elif flat.size:
        # a percentile depends only on the sorted values: sort the non-finite ones last and
        # take each cell's finite prefix, all cells with the same count at once
        ordered = np.sort(np.where(finite, flat, np.inf), axis=0)
        count = finite.sum(0)  # [cell]
        for k in np.unique(count[count > 0]):
            cells = count == k
            out[:, cells] = np.percentile(ordered[:k, cells], Q, axis=0)
    return out[0].reshape(shape), out[1].reshape(shape)


def interval(values) -> tuple[float, float]:
    """2.5th and 97.5th percentiles (linear interpolation) of the finite values of a 1-D array."""
    low, high = percentiles(np.ravel(values))
    return float(low), float(high)


def estimate(hits, n) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ratio on the data, interval low, interval high) of hits / n; hits and n are
    [resample, ...] (resample 0 the data; they broadcast), the rest is kept.

        acc, low, high = estimate(hits.sum(0), n.sum(0)[:, None, None])   # whole data, per head
    """
    value = ratio(hits, n)
    low, high = percentiles(value[1:])
    return value[0], low, high


def wilson(hits, n, z: float = 1.959963984540054) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of the Wilson score interval (95% by default) of a binomial share hits / n;
    arrays broadcast. Used where the trials are a fixed sample, not units that resample
    (the OV copy rate's sampled tokens, METHODS §9)."""
    hits, n = np.asarray(hits, dtype=float), np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = hits / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def paired_gap(hits, other, n, n_other=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(gap on the data, low, high) of hits / n - other / n_other (default: the same trials),
    resample by resample (paired: the same weights on both sides); arrays as in `estimate`."""
    gap = ratio(hits, n) - ratio(other, n if n_other is None else n_other)
    low, high = percentiles(gap[1:])
    return gap[0], low, high


def first_best(scores) -> int | None:
    """Index of the first maximum of a 1-D `scores` (NaN never wins); None if all are NaN."""
    scores = np.asarray(scores, dtype=np.float64)
    if not np.isfinite(scores).any():
        return None
    return int(np.nanargmax(scores))


def first_best_along(scores, axis: int = -1) -> np.ndarray:
    """Index of the first maximum along `axis` for every other cell (non-finite values never
    win; 0 where a cell has no finite value)."""
    scores = np.asarray(scores, dtype=np.float64)
    return np.argmax(np.where(np.isfinite(scores), scores, -np.inf), axis=axis)


def fold_ratio(hits, n, folds):
    """[option] hits / n on the data of `folds`: hits [fold, resample, option], n [fold, resample]
    or [fold, resample, option]."""
    f = list(folds)
    return ratio(np.asarray(hits)[f, 0].sum(0), np.asarray(n)[f, 0].sum(0))


def choose(hits, n, folds, default=None):
    """The option (last axis of hits [fold, resample, option]) with the best ratio on the data
    of `folds`, the first on ties; `default` when no option has a trial there."""
    best = first_best(fold_ratio(hits, n, folds))
    return default if best is None else best


def heldout_choices(hits, n, default=None) -> dict[int, object]:
    """{fold f: the option chosen on the other fold} (`choose`), the picks to evaluate on f."""
    return {f: choose(hits, n, (1 - f,), default) for f in (0, 1)}


def pooled(values, picks: dict) -> np.ndarray:
    """[resample] values [fold, resample, option] of option picks[f] on each fold f, added up."""
    return sum(values[f, :, k] for f, k in picks.items())


def selected(hits, n, selection: str, default=None):
    """(hits [resample], {fold: pick}) of the best option: "in-sample" (chosen on all the data)
    or "held-out" (chosen on one fold, evaluated on the other, both ways, pooled)."""
    if selection == "in-sample":
        k = choose(hits, n, (0, 1), default)
        picks = {0: k, 1: k}
    else:
        picks = heldout_choices(hits, n, default)
    return pooled(hits, picks), picks


def mcnemar_greater(head_only, baseline_only) -> np.ndarray:
    """One-sided exact McNemar p-value that the head beats the baseline:
    P(X >= head_only) for X ~ Binomial(head_only + baseline_only, 1/2); 1 with no discordant item."""
    b = np.asarray(head_only, dtype=np.float64)
    c = np.asarray(baseline_only, dtype=np.float64)
    total = b + c
    p = binom.sf(b - 1, total, 0.5)
    return np.where(total > 0, p, 1.0)


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values (monotone, capped at 1), in the input order."""
    p = np.asarray(p_values, dtype=np.float64)
    m = p.size
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    adjusted = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    out = np.empty(m)
    out[order] = adjusted
    return out


# ------------------------------------------------------------------------ one label


class LabelTotals:
    """One label's tally as candidate matrices; candidates are (layer, head, direction) in
    that sort order, so the first maximum is the METHODS §2 tie-break."""

    def __init__(self, tally, label: str):
        a = tally.arrays(label)
        hits = a["hits"]  # [fold, resample, layer, head, direction]
        folds, resamples, n_layers, n_heads, n_dirs = hits.shape
        self.shape = (n_layers, n_heads, n_dirs)
        self.hits = hits.reshape(folds, resamples, -1).astype(np.float64)  # [fold, resample, cand]
        self.dir_of = np.tile(np.arange(n_dirs), n_layers * n_heads)  # [cand]
        self.n = a["n"][..., self.dir_of]  # [fold, resample, cand]
        self.base = a["base"].astype(np.float64)  # [fold, resample, variant]
        self.base_n = a["n"][..., 0]  # [fold, resample]
        self.both = (
            a["both"].reshape(self.hits.shape[-1], a["both"].shape[-1]).astype(np.float64)
        )  # [cand, variant]
        self.extra = {
            k.split(":", 1)[1]: v for k, v in a.items() if k.startswith("extra:")
        }  # [fold, dir]
        layers, directions = tally.layers, tally.directions
        self.candidates = [
            (layers[c // (n_heads * n_dirs)], (c // n_dirs) % n_heads, directions[c % n_dirs])
            for c in range(self.hits.shape[-1])
        ]
        self.variants = list(tally.variants)
        # McNemar applies to hit counts (whole numbers), not to summed attention
        self.counts_hits = tally.value == "hits" or bool(
            np.array_equal(self.hits[:, 0], np.round(self.hits[:, 0]))
        )

    # data subsets: a tuple of folds
    def trials(self, folds) -> float:
        return float(self.base_n[list(folds), 0].sum()) if self.base_n.size else 0.0

    def accuracy(self, folds) -> np.ndarray:
        """[cand] plain accuracy on `folds`."""
        return fold_ratio(self.hits, self.n, folds)

    def select(self, folds) -> tuple[int | None, int | None]:
        """(best candidate, best baseline) on `folds`: first maximum; None with no trials."""
        if self.n[list(folds), 0].sum() <= 0:
            return None, None
        best = choose(self.hits, self.n, folds)
        base = choose(self.base, self.base_n, folds) if self.variants else None
        return best, base

    def tied(self, folds, cand: int) -> int:
        acc = self.accuracy(folds)
        return int(np.sum(acc == acc[cand]))

    def evaluate(self, picks: dict[int, tuple[int, int | None]]):
        """Hits, trials and baseline hits per resample [resample] of evaluating, on each fold f,
        the (candidate, baseline) `picks[f]`."""
        cands = {f: c for f, (c, _) in picks.items()}
        base = pooled(self.base, {f: b for f, (_, b) in picks.items()}) if self.variants else None
        return pooled(self.hits, cands), pooled(self.n, cands), base

    def unreachable(self, folds, cand: int) -> float:
        if "unreachable" not in self.extra:
            return float("nan")
        return float(self.extra["unreachable"][list(folds), self.dir_of[cand]].sum())

    def heldout_heads(self, cand: np.ndarray):
        """Per head (`cand`: its candidates [head] in one direction each), evaluated on each fold
        in the direction, and against the baseline, chosen on the other fold, pooled:
        (accuracy [head], baseline accuracy, gap [head], gap low [head], gap high [head]), the
        gap's interval paired over the resamples (`paired_gap`); NaN when a fold has no trials."""
        n_dirs = self.shape[2]
        first = cand - cand % n_dirs  # [head] direction 0
        hits, n, base, base_n = 0.0, 0.0, 0.0, 0.0
        for f in (0, 1):
            other = self.accuracy((1 - f,)).reshape(len(cand), n_dirs)  # [head, dir]
            if not np.isfinite(other).any() or self.trials((1 - f,)) <= 0:
                empty = np.full(len(cand), np.nan)
                return empty, np.nan, empty, empty, empty
            chosen = first + first_best_along(other)  # [head]
            hits = hits + self.hits[f, :, chosen].T  # [resample, head]
            n = n + self.n[f, :, chosen].T  # [resample, head]
            base = base + self.base[f, :, self.select((1 - f,))[1]]  # [resample]
            base_n = base_n + self.base_n[f]  # [resample]
        gap, low, high = paired_gap(hits, base[:, None], n, base_n[:, None])
        return ratio(hits[0], n[0]), ratio(base[0], base_n[0]).item(), gap, low, high


def _row(analysis, label, totals, selection, fold, picks, cand, base_idx):
    """One best-heads row from evaluating `picks` ({fold: (cand, base)})."""
    hits, n, base = totals.evaluate(picks)
    acc, low, high = estimate(hits, n)
    layer, head, direction = totals.candidates[cand] if cand is not None else (-1, -1, "")
    row = dict(
        analysis=analysis,
        label=label,
        selection=selection,
        fold=fold,
        layer=layer,
        head=head,
        direction=direction,
        heads=f"{layer}-{head}" if cand is not None else "",
        n=float(n[0]),
        hits=float(hits[0]),
        accuracy=float(acc),
        ci_low=float(low),
        ci_high=float(high),
    )
    if base is not None:
        gap, gap_low, gap_high = paired_gap(hits, base, n)
        row.update(
            baseline_variant=totals.variants[base_idx] if base_idx is not None else "per fold",
            baseline_hits=float(base[0]),
            baseline_accuracy=ratio(base[0], n[0]).item(),
            gap=float(gap),
            gap_low=float(gap_low),
            gap_high=float(gap_high),
        )
    return row


def _empty_row(analysis, label, selection, fold, n, note, min_n=MIN_N):
    return dict(
        analysis=analysis,
        label=label,
        selection=selection,
        fold=fold,
        layer=-1,
        head=-1,
        direction="",
        heads="",
        n=n,
        hits=np.nan,
        accuracy=np.nan,
        note=note,
        small_sample=n < min_n,
    )


def label_rows(analysis: str, label: str, totals: LabelTotals, min_n: int = MIN_N) -> list[dict]:
    """In-sample, held-out per fold and pooled held-out rows of one label."""
    both = (0, 1)
    n_all = totals.trials(both)
    best, base = totals.select(both)
    if best is None:
        return [_empty_row(analysis, label, "in-sample", "", n_all, "no trials", min_n)]
    return [_in_sample_row(analysis, label, totals, best, base, min_n)] + _held_out_rows(
        analysis, label, totals, min_n
    )


def _in_sample_row(analysis: str, label: str, totals: LabelTotals, best, base, min_n: int) -> dict:
    """The label's best head and baseline chosen and scored on all data (`best`, `base`: their
    candidate indices), with McNemar's test against the baseline where hits are counted."""
    both = (0, 1)
    small = totals.trials(both) < min_n
    row = _row(
        analysis, label, totals, "in-sample", "", {0: (best, base), 1: (best, base)}, best, base
    )
    row.update(
        tied=totals.tied(both, best), small_sample=small, unreachable=totals.unreachable(both, best)
    )
    if base is not None and totals.counts_hits:  # McNemar needs hits, not summed attention
        b = totals.hits[:, 0, best].sum() - totals.both[best, base]
        c = totals.base[:, 0, base].sum() - totals.both[best, base]
        row.update(p_value=float(mcnemar_greater(b, c)))
    if small:  # shown with its counts, never named
        row.update(
            layer=-1,
            head=-1,
            direction="",
            heads="",
            note=f"fewer than {min_n} trials: no best head",
        )
    return row


def _held_out_rows(analysis: str, label: str, totals: LabelTotals, min_n: int) -> list[dict]:
    """Per fold, the head the other fold chose scored on it, then both folds pooled."""
    both = (0, 1)
    n_all = totals.trials(both)
    small = n_all < min_n
    rows = []
    chosen = {f: totals.select((f,)) for f in both}
    empty = [f for f in both if chosen[f][0] is None]
    if empty:
        note = f"{NO_SELECTION}: fold {empty[0]} has no trials"
        rows += [
            _empty_row(analysis, label, "held-out", str(f), totals.trials((f,)), note, min_n)
            for f in both
        ]
        rows.append(_empty_row(analysis, label, "held-out", "", n_all, note, min_n))
        return rows
    for f in both:  # evaluate on fold f what the other fold chose
        c, b = chosen[1 - f]
        r = _row(analysis, label, totals, "held-out", str(f), {f: (c, b)}, c, b)
        r.update(small_sample=totals.trials((f,)) < min_n, unreachable=totals.unreachable((f,), c))
        rows.append(r)
    picks = {f: chosen[1 - f] for f in both}
    same = chosen[0][0] == chosen[1][0]
    same_base = chosen[0][1] == chosen[1][1]
    pooled = _row(
        analysis,
        label,
        totals,
        "held-out",
        "",
        picks,
        chosen[0][0] if same else None,
        chosen[0][1] if same_base else None,
    )
    pooled.update(folds_agree=bool(same), small_sample=small)
    if not same:  # name both picks (selected on fold 0 | on fold 1)
        picks_named = [totals.candidates[chosen[f][0]] for f in both]
        same_head = picks_named[0][:2] == picks_named[1][:2]
        pooled["heads"] = " | ".join(
            f"{l}-{h} {d}" if same_head else f"{l}-{h}" for l, h, d in picks_named
        )
    if small:
        pooled.update(
            layer=-1,
            head=-1,
            direction="",
            heads="",
            note=f"fewer than {min_n} trials: no best head",
        )
    rows.append(pooled)
    return rows


def baseline_rows(analysis: str, label: str, totals: LabelTotals) -> list[dict]:
    hits = totals.base.sum(0)  # [resample, variant]
    n = totals.base_n.sum(0)  # [resample]
    acc, low, high = estimate(hits, n[:, None])
    return [
        dict(
            analysis=analysis,
            label=label,
            variant=name,
            n=float(n[0]),
            hits=float(hits[0, v]),
            accuracy=float(acc[v]),
            ci_low=float(low[v]),
            ci_high=float(high[v]),
        )
        for v, name in enumerate(totals.variants)
    ]


def head_tests(analysis: str, label: str, totals: LabelTotals) -> pd.DataFrame:
    """Per head: its better direction in-sample, the McNemar test against the in-sample best
    baseline, and the held-out gap (direction and baseline chosen on the other fold)."""
    n_layers, n_heads, n_dirs = totals.shape
    acc = totals.accuracy((0, 1)).reshape(n_layers * n_heads, n_dirs)  # [head, dir]
    if not np.isfinite(acc).any() or not totals.variants or not totals.counts_hits:
        return pd.DataFrame(
            columns=TEST_COLUMNS
        )  # McNemar tests hits; mass has no discordant items
    cand = np.arange(n_layers * n_heads) * n_dirs + first_best_along(
        acc
    )  # [head] better direction; ties: first
    _, base = totals.select((0, 1))
    hits = totals.hits[:, 0, cand].sum(0)
    n = totals.n[:, 0, cand].sum(0)
    base_hits = totals.base[:, 0, base].sum()
    concordant = totals.both[cand, base]
    head_only, baseline_only = hits - concordant, base_hits - concordant
    held_acc, held_bacc, held_gap, gap_low, gap_high = totals.heldout_heads(cand)
    accuracy, baseline_accuracy = ratio(hits, n), ratio(base_hits, n)
    layer_head = [totals.candidates[c][:3] for c in cand]
    return pd.DataFrame(
        {
            "analysis": analysis,
            "label": label,
            "layer": [x[0] for x in layer_head],
            "head": [x[1] for x in layer_head],
            "direction": [x[2] for x in layer_head],
            "n": n,
            "hits": hits,
            "accuracy": accuracy,
            "baseline_variant": totals.variants[base],
            "baseline_accuracy": baseline_accuracy,
            "gap": accuracy - baseline_accuracy,
            "head_only": head_only,
            "baseline_only": baseline_only,
            "p_value": mcnemar_greater(head_only, baseline_only),
            "family": "",
            "p_holm": np.nan,
            "heldout_accuracy": held_acc,
            "heldout_baseline": held_bacc,
            "heldout_gap": held_gap,
            "heldout_gap_low": gap_low,
            "heldout_gap_high": gap_high,
        },
        columns=TEST_COLUMNS,
    )


# ------------------------------------------------------------------------ one analysis


def selection_tables(tally, family=None, min_n: int = MIN_N, selects=None):
    """(best_heads, baselines, head_tests) of one analysis's tally (of the labels `selects(label)`
    keeps; None: every label).

    `family(label, n) -> bool` names the labels whose (head, label) tests form the
    analysis's role family (METHODS §6: Holm runs over all of them together); every other
    label's heads are a family of their own. `p_holm` of a best-heads row is its head's
    adjusted value in that family.
    """
    analysis = tally.analysis
    best, base, tests = [], [], []
    for label in tally.sorted_labels():
        if selects is not None and not selects(label):
            continue
        totals = LabelTotals(tally, label)
        base += baseline_rows(analysis, label, totals)
        best += label_rows(analysis, label, totals, min_n)
        t = head_tests(analysis, label, totals)
        if len(t):
            n = totals.trials((0, 1))
            t["family"] = "roles" if family is not None and family(label, n) else label
            tests.append(t)
    tests = pd.concat(tests, ignore_index=True) if tests else pd.DataFrame(columns=TEST_COLUMNS)
    p_holm = np.full(len(tests), np.nan)
    for _, index in tests.groupby("family").indices.items():
        p_holm[index] = holm(tests["p_value"].to_numpy(np.float64)[index])
    tests["p_holm"] = p_holm
    best = _best_frame(best)
    if len(tests) and len(best):
        adjusted = tests.set_index(["label", "layer", "head"])["p_holm"]
        named = (best["selection"] == "in-sample") & (best["layer"] >= 0)
        keys = list(
            zip(best.loc[named, "label"], best.loc[named, "layer"], best.loc[named, "head"])
        )
        best.loc[named, "p_holm"] = adjusted.reindex(keys).to_numpy(np.float64)
    return best, pd.DataFrame(base, columns=BASELINE_COLUMNS), tests


def _best_frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=BEST_COLUMNS)
    for column in BEST_COLUMNS:
        if column not in frame:
            frame[column] = np.nan
    for column in ("note", "heads", "baseline_variant"):
        frame[column] = frame[column].astype(object).where(frame[column].notna(), "").astype(str)
    frame["tied"] = frame["tied"].astype("Int64")  # candidates at the best accuracy
    frame["folds_agree"] = frame["folds_agree"].astype("boolean")  # held-out pooled rows only
    frame["small_sample"] = frame["small_sample"].fillna(False).astype(bool)
    return frame[BEST_COLUMNS]


def tidy_counts(tally) -> pd.DataFrame:
    """METHODS §5 tidy table of one tally: whole data (fold "") and each half ("0", "1"),
    resample 0 (the data itself); baselines as rows with `variant` and layer = head = -1."""
    columns = _count_columns(tally)
    if not columns["label"]:
        return pd.DataFrame(columns=COUNT_COLUMNS)
    cat = lambda parts: np.concatenate(parts)
    variant_code, direction_code = cat(columns["variant"]), cat(columns["direction"])
    value = cat(columns["value"])
    is_head = variant_code < 0
    names = np.asarray(tally.directions + ("",), dtype=object)
    variants = np.asarray(tuple(tally.variants) + ("",), dtype=object)
    frame = pd.DataFrame(
        {
            "analysis": tally.analysis,
            "label": np.asarray(columns["label"], dtype=object),
            "layer": cat(columns["layer"]).astype(np.int64),
            "head": cat(columns["head"]).astype(np.int64),
            "direction": names[direction_code],
            "variant": variants[variant_code],
            "fold": np.asarray(columns["fold"], dtype=object),
            "n": cat(columns["n"]).astype(np.float64),
            "hits": np.where(is_head & (tally.value == "mass"), np.nan, value),
            "mass": np.where(is_head & (tally.value == "mass"), value, np.nan),
            "unreachable": cat(columns["unreachable"]),
        }
    )
    return frame[COUNT_COLUMNS]


def _count_columns(tally) -> dict[str, list]:
    """The parts of `tidy_counts`'s columns, per label and fold: the head cells (every layer,
    head, direction) then the baselines (direction and variant as codes; -1: none)."""
    n_heads, n_dirs = tally.n_heads, len(tally.directions)
    layer, head, direction = (
        x.ravel()
        for x in np.meshgrid(
            np.asarray(tally.layers), np.arange(n_heads), np.arange(n_dirs), indexing="ij"
        )
    )
    n_cells, n_variants = layer.size, len(tally.variants)
    columns = {
        name: []
        for name in (
            "label",
            "layer",
            "head",
            "direction",
            "variant",
            "fold",
            "n",
            "value",
            "unreachable",
        )
    }
    for label in tally.sorted_labels():
        a = tally.arrays(label)
        hits = a["hits"][:, 0].reshape(a["hits"].shape[0], -1)  # [fold, cell]
        n = a["n"][:, 0]  # [fold, direction]
        base = a["base"][:, 0]  # [fold, variant]
        unreachable = a.get("extra:unreachable")  # [fold, direction]
        for fold in ("", "0", "1"):
            pick = (lambda x: x.sum(0)) if fold == "" else (lambda x, f=int(fold): x[f])
            t = pick(n)
            columns["label"] += [label] * (n_cells + n_variants)
            columns["layer"] += [layer, np.full(n_variants, -1)]
            columns["head"] += [head, np.full(n_variants, -1)]
            columns["direction"] += [direction, np.full(n_variants, -1)]
            columns["variant"] += [np.full(n_cells, -1), np.arange(n_variants)]
            columns["fold"] += [fold] * (n_cells + n_variants)
            columns["n"] += [t[direction], np.full(n_variants, t[0] if t.size else 0.0)]
            columns["value"] += [pick(hits).astype(np.float64), pick(base).astype(np.float64)]
            u = (
                np.full(n_cells, np.nan)
                if unreachable is None
                else pick(unreachable)[direction].astype(np.float64)
            )
            columns["unreachable"] += [u, np.full(n_variants, np.nan)]
    return columns


COUNT_COLUMNS = [
    "analysis",
    "label",
    "layer",
    "head",
    "direction",
    "variant",
    "fold",
    "n",
    "hits",
    "mass",
    "unreachable",
]
