"""The `counts` table (METHODS §5): one tally as a tidy DataFrame, head cells and baselines, for
the whole data and each fold, resample 0 (the data itself).

    frame = tidy_counts(tally)                          # columns COUNT_COLUMNS
"""

from __future__ import annotations

import numpy as np
import pandas as pd


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
