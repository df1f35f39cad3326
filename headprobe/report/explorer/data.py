"""The explorer's data: one JSON-ready dict of a run's per-head numbers and stored attention.

    data = explorer_data(results)        # {"heads", "roles", "relations", "scores", "attention", ...}

Every number is a stored value of a `Results` table (rounded to `DIGITS` decimals) or of
`head_attention.npz` (uint8, base64): nothing is recomputed. Heads are listed layer-major over
the scored layers; each per-head array is indexed like `heads`. Per-head tables are found
generically: any table of the results, other than the ones read explicitly (`OWN`), with one
row per head (per label and measure where it has those columns) gives one score per numeric
column, so a newly registered analysis's table appears without a change here.
"""

from __future__ import annotations

import base64
import math

import numpy as np
import pandas as pd

from headprobe.model.control import TABLE_PREFIX

DIGITS = 4
OWN = ("counts", "best_heads", "baselines", "head_tests", "roles")  # read explicitly below
KEYS = ("measure", "label", "layer", "head")
SKIP_COLUMNS = ("layer", "head", "n", "kv_head", "kv_group", "fold")
MAX_SCORES = 300  # colour-by choices kept (the first tables, in the results' order)


def _num(value):
    """A JSON number (rounded) or None for NaN / missing."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return None if not math.isfinite(x) else round(x, DIGITS)


def head_keys(results) -> list[tuple[int, int]]:
    return [(layer, head) for layer in results.layers for head in range(results.n_heads)]


def _per_head(frame: pd.DataFrame, column: str, index: dict) -> list:
    """`column` of `frame` (one row per head) as a list indexed like the heads (None: no row)."""
    out = [None] * len(index)
    for layer, head, value in zip(frame["layer"], frame["head"], frame[column]):
        i = index.get((int(layer), int(head)))
        if i is not None:
            out[i] = _num(value) if not isinstance(value, str) else value
    return out


def roles_data(results, index: dict) -> dict:
    from headprobe.stats.roles import role_colors

    shown = results.for_measure()
    roles = shown.roles
    columns = {"role": "role", "detail": "detail", "evidence": "evidence", "all": "all_roles"}
    out = {"colors": role_colors(shown)}
    for key, column in columns.items():
        values = _per_head(roles, column, index) if column in roles else [None] * len(index)
        out[key] = ["" if v is None else str(v) for v in values]
    return out


def relations_data(results, index: dict) -> list[dict]:
    """Per (analysis, label, measure) of `head_tests`: each head's held-out and in-sample accuracy
    and direction, the held-out baseline, and the intervals the best-heads table gives the heads it
    names (selection, fold, accuracy, interval)."""
    tests = results.tables.get("head_tests")
    if tests is None or not len(tests):
        return []
    best = results.tables.get("best_heads", pd.DataFrame())
    out = []
    for (analysis, label, measure), rows in tests.groupby(
        ["analysis", "label", "measure"], sort=False
    ):
        named = best[
            (best["analysis"] == analysis)
            & (best["label"] == label)
            & (best["measure"] == measure)
            & (best["layer"] >= 0)
        ]
        out.append(
            {
                "analysis": analysis,
                "label": label,
                "measure": measure,
                "heldout": _per_head(rows, "heldout_accuracy", index),
                "accuracy": _per_head(rows, "accuracy", index),
                "baseline": _per_head(rows, "heldout_baseline", index),
                "baseline_variant": str(rows["baseline_variant"].iloc[0]),
                **_directions(rows, index),
                "n": _num(rows["n"].max()),
                "intervals": [
                    {
                        "head": index.get((int(r.layer), int(r.head))),
                        "selection": r.selection,
                        "fold": str(r.fold),
                        "accuracy": _num(r.accuracy),
                        "low": _num(r.ci_low),
                        "high": _num(r.ci_high),
                        "baseline": _num(r.baseline_accuracy),
                    }
                    for r in named.itertuples()
                ],
            }
        )
    return out


def _directions(rows: pd.DataFrame, index: dict) -> dict:
    """{"directions": names, "direction": per head, the index of its name (None: no row)}."""
    names = list(dict.fromkeys(str(d) for d in rows["direction"]))
    per = _per_head(rows, "direction", index)
    return {"directions": names, "direction": [None if d is None else names.index(d) for d in per]}


def per_head_tables(results) -> dict[str, pd.DataFrame]:
    """The tables with one row per head (per label and measure where they have those columns)."""
    found = {}
    for name, table in results.tables.items():
        if name in OWN or name.startswith(TABLE_PREFIX) or not len(table):
            continue
        if not {"layer", "head"} <= set(table.columns):
            continue
        keys = [k for k in KEYS if k in table.columns]
        if table.duplicated(keys).any():
            continue  # pairs of heads, folds, ...: not a score per head
        found[name] = table
    return found


def scores_data(results, index: dict) -> list[dict]:
    """One entry per numeric column (per label and measure) of every per-head table."""
    out = []
    for name, table in per_head_tables(results).items():
        groups = [k for k in ("label", "measure") if k in table.columns]
        parts = table.groupby(groups, sort=False) if groups else [((), table)]
        for key, rows in parts:
            key = key if isinstance(key, tuple) else (key,)
            where = dict(zip(groups, (str(k) for k in key)))
            for column in rows.columns:
                if column in SKIP_COLUMNS or column in groups:
                    continue
                kind = rows[column].dtype
                if not (pd.api.types.is_numeric_dtype(kind) or pd.api.types.is_bool_dtype(kind)):
                    continue
                values = _per_head(
                    rows.assign(**{column: rows[column].astype(float)}), column, index
                )
                if all(v is None for v in values):
                    continue
                out.append({"table": name, "column": column, **where, "values": values})
                if len(out) >= MAX_SCORES:
                    return out
    return out


def cards_data(results, keys: list[tuple[int, int]]) -> list[dict]:
    """What the analyses of the run say on each head's card (`Analysis.card`): per analysis its
    title and, per head in `keys` order, its lines ([] where it says nothing)."""
    from headprobe.scoring import registry

    out = []
    for name in results.analyses:
        try:
            analysis = registry.get(name)
        except ValueError:
            continue
        make = analysis.card_lines()
        if make is None:
            continue
        title, lines = make(results)
        if any(lines.values()):
            out.append(
                {
                    "analysis": name,
                    "title": title,
                    "lines": [list(lines.get(key, [])) for key in keys],
                }
            )
    return out


def attention_data(results) -> dict | None:
    """The stored attention (`head_attention.npz`), its cells base64, rows in `heads` order."""
    kept = getattr(results, "head_attention", None)
    if not kept:
        return None
    from headprobe.results.head_attention import SCALE

    layers = [layer for layer in results.layers if layer in kept["layers"]]
    rows = [kept["layers"].index(layer) for layer in layers]
    cells = np.ascontiguousarray(kept["attention"][rows])  # [layer, head, cells] uint8
    return {
        "layers": layers,
        "n_heads": int(kept["n_heads"]),
        "scale": SCALE,
        "sentences": kept["sentences"],
        "cells_per_head": int(cells.shape[2]),
        "cells": base64.b64encode(cells.tobytes()).decode("ascii"),
    }


def explorer_data(results) -> dict:
    """Everything the explorer shows, for `results` (a `Results`)."""
    keys = head_keys(results)
    index = {key: i for i, key in enumerate(keys)}
    return {
        "model": str(results.summary.get("model", "")),
        "layers": list(results.layers),
        "n_heads": int(results.n_heads),
        "heads": [f"{layer}-{head}" for layer, head in keys],
        "measures": list(results.measures),
        "roles": roles_data(results, index),
        "relations": relations_data(results, index),
        "scores": scores_data(results, index),
        "attention": attention_data(results),
        "cards": cards_data(results, keys),
    }
