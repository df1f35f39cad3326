"""Counts keyed by a pair of heads: (receiver layer-head, sender layer-head, channel).

    tally = pair_tally("composition", channels=("q", "k", "v"), layers=[0, 1], n_heads=4)
    add_pairs(tally, units, labels, values, n)   # values [row, layer, head, s_layer, s_head, channel]
    pair_arrays(tally, "label")["hits"]          # [fold, resample, layer, head, s_layer, s_head, channel]

A pair tally is a `Tally` whose head axis holds (receiver head, sender layer, sender head) flat
(`Tally.senders`: the sender layers), so it streams, checkpoints, saves, merges across shards
and sums across processes exactly as a tally keyed by one head does, with the same per-unit
folds and bootstrap weights (METHODS §5). A channel is a direction of the tally (e.g. q, k, v
composition, or one value). `headprobe.stats.pair_estimates.pair_table` turns it into a table
with intervals and Holm-adjusted p-values.
"""

from __future__ import annotations

import numpy as np

from headprobe.scoring.tally import Tally


def pair_tally(
    analysis: str, *, channels=("",), layers=(), n_heads: int = 0, senders=None, **options
) -> Tally:
    """A tally keyed by (receiver layer, receiver head, sender layer, sender head, channel):
    receivers in `layers`, senders in `senders` (default: the same layers); `options` as
    `Tally`'s (value, resamples, bootstrap, seed, device, model, measure)."""
    senders = list(layers) if senders is None else list(senders)
    if not senders:
        raise ValueError(f"{analysis}: a pair tally needs at least one sender layer")
    return Tally(
        analysis, directions=channels, layers=layers, n_heads=n_heads, senders=senders, **options
    )


def add_pairs(tally: Tally, units, labels, values, n) -> None:
    """Add one batch of rows, one per (unit, label): `values` [row, layer, head, sender layer,
    sender head, channel] hits or mass (a device tensor), `n` [row, channel] trials."""
    rows, layers, heads, s_layers, s_heads, channels = values.shape
    assert (s_layers, s_heads) == (len(tally.senders), tally.n_heads), values.shape
    tally.add(units, labels, values.reshape(rows, layers, heads * s_layers * s_heads, channels), n)


def pair_arrays(tally: Tally, label: str) -> dict[str, np.ndarray]:
    """One label's totals, `hits` as [fold, resample, layer, head, sender layer, sender head,
    channel] and `n` as [fold, resample, channel]."""
    arrays = tally.arrays(label)
    hits = arrays["hits"]
    folds, resamples, layers, _, channels = hits.shape
    shape = (folds, resamples, layers, tally.n_heads, len(tally.senders), tally.n_heads, channels)
    return {**arrays, "hits": hits.reshape(shape)}
