"""The surface analysis under several measures (METHODS §7; Kobayashi et al. 2020): its views.

    from headprobe.studies.surface.surface_measures import special_share, surface_side_by_side
    special_share(results)            # per layer: share of attention on [CLS]/[SEP] per measure
    surface_side_by_side(results)     # surface statistics per layer, one column per measure

The report's weights-beside-norms section shows them (`surface_report.measures_blocks`, the
analysis's `measures_report`) and `analyses/kobayashi2020_norms.py` writes them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.core.seeds import SEED
from headprobe.scoring.tally import N_BOOT, unit_weights
from headprobe.stats.estimates import interval
from headprobe.studies.surface.analysis import ANALYSIS

SURFACE = ANALYSIS.name  # the analysis whose masses these views read
SURFACE_SIDE = ("cls", "sep", "first", "punct", "self", "prev", "next", "entropy_ratio")


def surface_side_by_side(results, labels=SURFACE_SIDE):
    """Per layer and surface label: the mean mass (entropy ratio) under each measure, one column
    per measure, and `change` = second measure - first (`Results.mass_per_layer`)."""
    frames = []
    for measure in results.measures:
        per_layer = results.mass_per_layer(SURFACE, measure=measure)
        present = [label for label in labels if label in per_layer]
        if not len(per_layer) or not present:
            continue
        long = per_layer.melt(
            id_vars="layer", value_vars=present, var_name="label", value_name=measure
        )
        frames.append(long.set_index(["layer", "label"]))
    if not frames:
        return pd.DataFrame(columns=["layer", "label", *results.measures])
    wide = pd.concat(frames, axis=1).reset_index()
    wide["label"] = pd.Categorical(
        wide["label"], [x for x in labels if x in set(wide["label"])], ordered=True
    )
    wide = wide.sort_values(["label", "layer"], kind="stable").reset_index(drop=True)
    wide["label"] = wide["label"].astype(str)
    if len(results.measures) > 1:
        first, second = results.measures[:2]
        wide["change"] = wide[second] - wide[first]
    return wide


def special_share(
    results, labels=("cls", "sep"), n_boot: int | None = None, seed: int | None = None
):
    """Per layer: the mean share of a word's attention on the `labels` specials ([CLS]/BOS-like +
    [SEP]/EOS-like, surface masses summed over the layer's heads / trials) under each measure,
    and the change between the first two. With per-unit counts (`keep_unit_counts`), 95%
    percentile intervals from Poisson(1) resamples of the units (METHODS §5's unit weights; the
    change paired); without them the intervals are NaN."""
    n_boot = n_boot or int(results.summary.get("bootstrap_resamples") or N_BOOT)
    seed = int(results.summary.get("seed", SEED)) if seed is None else seed
    measures = results.measures
    units = results.unit_counts
    if units is not None and len(units):
        u = units[
            (units["analysis"].astype(str) == SURFACE) & units["label"].astype(str).isin(labels)
        ]
        u = u.assign(
            measure=u["measure"].astype(str),
            unit=u["unit"].astype(str),
            label=u["label"].astype(str),
        )
        mass = u.pivot_table(
            index=["unit"], columns=["measure", "layer"], values="mass", aggfunc="sum"
        )
        trials = u[u["label"] == labels[0]].pivot_table(
            index=["unit"], columns=["measure", "layer"], values="n", aggfunc="sum"
        )
        names = list(mass.index)
        weights = np.stack(
            [np.concatenate([[1.0], unit_weights(name, seed, n_boot)]) for name in names]
        )
        trials = trials.reindex(index=mass.index, columns=mass.columns).fillna(0)
        share = (weights.T @ mass.fillna(0).to_numpy()) / (
            weights.T @ trials.to_numpy()
        )  # [resample, column]
        share = pd.DataFrame(share, columns=mass.columns)  # [resample, (measure, layer)]
    else:
        c = results.counts
        c = c[
            (c["analysis"] == SURFACE)
            & (c["fold"] == "")
            & (c["layer"] >= 0)
            & c["label"].isin(labels)
        ]
        mass = c.groupby(["measure", "layer"])["mass"].sum()
        trials = c[c["label"] == labels[0]].groupby(["measure", "layer"])["n"].sum()
        share = pd.DataFrame([(mass / trials).to_numpy()], columns=mass.index)
    rows = []
    for layer in sorted({layer for _, layer in share.columns}):
        row = {"layer": layer}
        for measure in measures:
            values = share.get((measure, layer))
            row[measure] = np.nan if values is None else float(values.iloc[0])
            row[f"{measure}_low"], row[f"{measure}_high"] = _interval(values)
        if len(measures) > 1 and all((m, layer) in share.columns for m in measures[:2]):
            change = share[(measures[1], layer)] - share[(measures[0], layer)]
            row["change"] = float(change.iloc[0])
            row["change_low"], row["change_high"] = _interval(change)
        rows.append(row)
    return pd.DataFrame(rows)


def _interval(values) -> tuple[float, float]:
    """2.5th / 97.5th percentiles of resamples 1.. (METHODS §5: `stats.interval`), NaN without resamples."""
    if values is None or len(values) < 2:
        return np.nan, np.nan
    return interval(values.to_numpy()[1:])
