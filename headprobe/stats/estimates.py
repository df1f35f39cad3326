"""Ratios, intervals, paired gaps, held-out choices and tests (METHODS §5): the numbers every
analysis's estimates are made of; the only module that computes percentiles.

    acc, low, high = estimate(hits, n)                  # [resample, ...] -> ratio and 95% interval
    gap, low, high = paired_gap(hits, base_hits, n)     # paired: resample by resample
    hits_pooled, picks = selected(hits, n, "held-out")  # hits [fold, resample, option]
    p = holm(mcnemar_greater(head_only, baseline_only)) # one-sided exact McNemar, Holm-adjusted

Every count here is a `[fold, resample, ...]` array from a tally (`headprobe.scoring.tally`):
resample 0 is the data itself, resamples 1.. are the Poisson(1) resamples. Selection
reads resample 0; intervals read the resamples; a paired gap subtracts two ratios
resample by resample (same weights).
"""

from __future__ import annotations

import numpy as np

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
    b = np.rint(np.asarray(head_only, dtype=np.float64)).astype(np.int64)  # counts
    c = np.rint(np.asarray(baseline_only, dtype=np.float64)).astype(np.int64)
    total = b + c
    # binom.sf; scipy.special loads in a tenth of scipy.stats, and only when a test runs (the
    # registry imports this module: `headprobe run --help` need not load scipy)
    from scipy.special import bdtrc

    p = bdtrc(b - 1, total, 0.5)  # P(X > b - 1) = P(X >= b)
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
