"""Best heads (METHODS §5), read from streaming tallies (`headprobe.scoring.tally`): per label,
the best head in-sample and held-out, the best baseline, and each head's test against it. The
numbers (intervals, gaps, held-out choices, McNemar, Holm) come from `headprobe.stats.estimates`.

    best, baselines, tests = selection_tables(tally, family=lambda label, n: n >= 50)

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

from headprobe.scoring import registry
from headprobe.stats.estimates import (
    choose,
    estimate,
    first_best_along,
    fold_ratio,
    holm,
    mcnemar_greater,
    paired_gap,
    pooled,
    ratio,
)

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
