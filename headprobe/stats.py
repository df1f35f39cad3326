"""Honest numbers (SPEC section 5): folds, best heads in-sample and held-out, bootstrap.

Everything here works from per-unit counts (`unit_counts`), so shards that were
added together give the same answers as one run.

- Folds: the units of an analysis (sentences; documents for coreference) are
  shuffled with a fixed seed and cut in two halves, fold 0 and fold 1.
- Best head in-sample: the (layer, head, direction) with the highest accuracy
  on all units; ties go to the lowest layer, head, then `dep->head` first.
- Held-out: select on one fold, report on the other, and swap; the pooled row
  adds both evaluations up.
- Intervals: 95% percentile bootstrap over units, 1,000 resamples, fixed seed;
  the gap to the baseline is bootstrapped paired (same resamples).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

SEED = 0
N_BOOT = 1000
SCORED = ("dependency", "coreference")
DIRECTION_ORDER = {"dep->head": 0, "head<-dep": 1, "": 2}
KEYS = ["analysis", "label", "layer", "head", "direction", "variant"]


def assign_folds(units, seed: int = SEED) -> dict[str, int]:
    """Each unit -> 0 or 1: a fixed-seed shuffle of the sorted units, cut in halves."""
    ordered = sorted(set(units))
    order = np.random.default_rng(seed).permutation(len(ordered))
    half = (len(ordered) + 1) // 2
    return {ordered[i]: int(rank >= half) for rank, i in enumerate(order)}


def fold_map(unit_counts: pd.DataFrame, seed: int = SEED) -> pd.Series:
    """The fold of every row of `unit_counts` (folds drawn per analysis)."""
    folds = pd.Series(0, index=unit_counts.index, dtype=int)
    for analysis, rows in unit_counts.groupby("analysis", sort=False):
        mapping = assign_folds(rows["unit"].unique(), seed)
        folds.loc[rows.index] = rows["unit"].map(mapping).to_numpy()
    return folds


def tidy_counts(unit_counts: pd.DataFrame, seed: int = SEED) -> pd.DataFrame:
    """SPEC 5 tidy table: whole data (fold "") and each half (fold "0"/"1")."""
    def total(frame):
        return frame.groupby(KEYS, sort=True, dropna=False)[["n", "hits", "mass"]].sum(min_count=1).reset_index()

    whole = total(unit_counts).assign(fold="")
    folds = fold_map(unit_counts, seed)
    halves = [total(unit_counts[folds == f]).assign(fold=str(f)) for f in (0, 1)]
    out = pd.concat([whole, *halves], ignore_index=True)
    return out[["analysis", "label", "layer", "head", "direction", "variant", "fold", "n", "hits", "mass"]]


def bootstrap_weights(n_units: int, seed: int = SEED, n_boot: int = N_BOOT) -> np.ndarray:
    """[resample, unit]: how often each unit is drawn in each resample."""
    if n_units == 0:
        return np.zeros((n_boot, 0))
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_units, np.full(n_units, 1.0 / n_units), size=n_boot).astype(np.float64)


def interval(values: np.ndarray) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return float("nan"), float("nan")
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def ratio(hits, n):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, hits / np.where(n > 0, n, 1), np.nan)


class LabelTable:
    """Per-unit hits and trials of every candidate head and every baseline, for one label."""

    def __init__(self, rows: pd.DataFrame, units: list[str]):
        unit_index = {u: i for i, u in enumerate(units)}
        heads = rows[rows["variant"] == ""]
        cands = heads[["layer", "head", "direction"]].drop_duplicates()
        cands = cands.assign(rank=cands["direction"].map(DIRECTION_ORDER)).sort_values(["layer", "head", "rank"])
        self.candidates = list(cands[["layer", "head", "direction"]].itertuples(index=False, name=None))
        cand_index = {c: i for i, c in enumerate(self.candidates)}
        self.hits = np.zeros((len(units), len(self.candidates)))                     # [unit, candidate]
        self.n = np.zeros_like(self.hits)
        u = heads["unit"].map(unit_index).to_numpy()
        c = np.array([cand_index[k] for k in zip(heads["layer"], heads["head"], heads["direction"])], dtype=int)
        np.add.at(self.hits, (u, c), heads["hits"].to_numpy(dtype=float))
        np.add.at(self.n, (u, c), heads["n"].to_numpy(dtype=float))
        base = rows[rows["variant"] != ""]
        self.variants = sorted(base["variant"].unique(), key=_variant_key)
        var_index = {v: i for i, v in enumerate(self.variants)}
        self.base_hits = np.zeros((len(units), len(self.variants)))                   # [unit, variant]
        self.base_n = np.zeros_like(self.base_hits)
        if len(base):
            u = base["unit"].map(unit_index).to_numpy()
            v = base["variant"].map(var_index).to_numpy()
            np.add.at(self.base_hits, (u, v), base["hits"].to_numpy(dtype=float))
            np.add.at(self.base_n, (u, v), base["n"].to_numpy(dtype=float))

    def select(self, mask: np.ndarray) -> tuple[int, int | None]:
        """Best candidate and best baseline on the units in `mask` (first maximum wins)."""
        acc = ratio(self.hits[mask].sum(0), self.n[mask].sum(0))
        best = int(np.nanargmax(acc)) if np.isfinite(acc).any() else 0
        base = None
        if self.variants:
            bacc = ratio(self.base_hits[mask].sum(0), self.base_n[mask].sum(0))
            base = int(np.nanargmax(bacc)) if np.isfinite(bacc).any() else 0
        return best, base


def _variant_key(variant: str):
    if variant.startswith("offset="):
        return (0, abs(int(variant.split("=")[1])), int(variant.split("=")[1]))
    return (1, 0, variant)


def _row(analysis, label, selection, fold, cand, base_name, hits, n, base_hits, base_n, weights):
    """One best-heads row from per-unit vectors of the evaluated units."""
    acc = ratio(hits.sum(), n.sum()).item()
    boot = ratio(weights @ hits, weights @ n)
    row = dict(analysis=analysis, label=label, selection=selection, fold=fold,
               layer=cand[0] if cand else -1, head=cand[1] if cand else -1,
               direction=cand[2] if cand else "", n=n.sum(), hits=hits.sum(), accuracy=acc)
    row["ci_low"], row["ci_high"] = interval(boot)
    if base_hits is not None:
        bacc = ratio(base_hits.sum(), base_n.sum()).item()
        bboot = ratio(weights @ base_hits, weights @ base_n)
        row.update(baseline_variant=base_name, baseline_hits=base_hits.sum(), baseline_accuracy=bacc, gap=acc - bacc)
        row["gap_low"], row["gap_high"] = interval(boot - bboot)
    return row


def best_heads(unit_counts: pd.DataFrame, seed: int = SEED, n_boot: int = N_BOOT) -> pd.DataFrame:
    """Best (layer, head, direction) per analysis and label, in-sample and held-out."""
    out = []
    for analysis in SCORED:
        rows = unit_counts[unit_counts["analysis"] == analysis]
        if rows.empty:
            continue
        units = sorted(rows["unit"].unique())
        folds = np.array([assign_folds(units, seed)[u] for u in units])
        for label, label_rows in rows.groupby("label", sort=True):
            table = LabelTable(label_rows, units)
            if not table.candidates:
                continue
            present = (table.n.sum(1) > 0) | (table.base_n.sum(1) > 0)
            out.extend(_label_rows(analysis, label, table, present, folds, seed, n_boot))
    columns = ["analysis", "label", "selection", "fold", "layer", "head", "direction", "heads", "n", "hits",
               "accuracy", "ci_low", "ci_high", "baseline_variant", "baseline_hits", "baseline_accuracy", "gap",
               "gap_low", "gap_high"]
    frame = pd.DataFrame(out)
    if frame.empty:
        return pd.DataFrame(columns=columns)
    if "heads" not in frame:
        frame["heads"] = np.nan
    frame["heads"] = [given if isinstance(given, str) else (f"{l}-{h}" if l >= 0 else "")
                      for given, l, h in zip(frame["heads"], frame["layer"], frame["head"])]
    for column in columns:
        if column not in frame:
            frame[column] = np.nan
    return frame[columns]


def _label_rows(analysis, label, table, present, folds, seed, n_boot):
    def evaluate(selection, fold, cand_per_unit, base_per_unit, mask, cand, base_name, salt):
        idx = np.nonzero(mask)[0]
        hits = table.hits[idx, cand_per_unit[idx]]
        n = table.n[idx, cand_per_unit[idx]]
        weights = bootstrap_weights(len(idx), seed + salt, n_boot)
        if table.variants:
            bh, bn = table.base_hits[idx, base_per_unit[idx]], table.base_n[idx, base_per_unit[idx]]
        else:
            bh = bn = None
        return _row(analysis, label, selection, fold, cand, base_name, hits, n, bh, bn, weights)

    rows = []
    everyone = present.copy()
    best, base = table.select(everyone)
    units = np.arange(len(present))
    full = lambda value: np.full(len(present), value if value is not None else 0)
    rows.append(evaluate("in-sample", "", full(best), full(base), everyone, table.candidates[best],
                         table.variants[base] if base is not None else None, 0))
    # held-out: select on fold f, evaluate on fold 1 - f
    chosen = {f: table.select(present & (folds == f)) for f in (0, 1)}
    cand_per_unit = np.array([chosen[1 - folds[u]][0] for u in units])
    base_per_unit = np.array([chosen[1 - folds[u]][1] or 0 for u in units])
    for f in (0, 1):
        c, b = chosen[1 - f]
        rows.append(evaluate("held-out", str(f), cand_per_unit, base_per_unit, present & (folds == f),
                             table.candidates[c], table.variants[b] if b is not None else None, 1 + f))
    same = chosen[0][0] == chosen[1][0]
    same_base = chosen[0][1] == chosen[1][1]
    pooled = evaluate("held-out", "", cand_per_unit, base_per_unit, present,
                      table.candidates[chosen[0][0]] if same else None,
                      (table.variants[chosen[0][1]] if same_base else "per fold") if table.variants else None, 3)
    if not same:   # the two folds chose different heads: name both (selected on fold 0 | on fold 1)
        pooled["heads"] = " | ".join("{}-{}".format(*table.candidates[chosen[f][0]][:2]) for f in (0, 1))
    rows.append(pooled)
    return rows


def baselines(unit_counts: pd.DataFrame, seed: int = SEED, n_boot: int = N_BOOT) -> pd.DataFrame:
    """Every baseline's accuracy with its bootstrap interval, per analysis and label."""
    base = unit_counts[unit_counts["variant"] != ""]
    out = []
    for (analysis, label, variant), rows in base.groupby(["analysis", "label", "variant"], sort=True):
        per_unit = rows.groupby("unit")[["hits", "n"]].sum()
        hits, n = per_unit["hits"].to_numpy(float), per_unit["n"].to_numpy(float)
        weights = bootstrap_weights(len(per_unit), seed, n_boot)
        low, high = interval(ratio(weights @ hits, weights @ n))
        out.append(dict(analysis=analysis, label=label, variant=variant, n=n.sum(), hits=hits.sum(),
                        accuracy=ratio(hits.sum(), n.sum()).item(), ci_low=low, ci_high=high))
    return pd.DataFrame(out, columns=["analysis", "label", "variant", "n", "hits", "accuracy", "ci_low", "ci_high"])


def positional_heads(counts: pd.DataFrame, threshold: float = 0.9) -> pd.DataFrame:
    """Per head: the share of argmaxes at each offset; positional if one non-zero offset >= threshold."""
    rows = counts[(counts["analysis"] == "positional") & (counts["fold"] == "")]
    if rows.empty:
        return pd.DataFrame(columns=["layer", "head", "offset", "share", "positional"])
    share = rows.assign(share=rows["hits"] / rows["n"]).pivot_table(
        index=["layer", "head"], columns="label", values="share", aggfunc="sum").fillna(0.0)
    nonzero = [c for c in ("-2", "-1", "+1", "+2") if c in share.columns]
    top = share[nonzero].idxmax(axis=1)
    out = share.reset_index()
    out["offset"] = top.to_numpy()
    out["share"] = share[nonzero].max(axis=1).to_numpy()
    out["positional"] = out["share"] >= threshold
    out.columns.name = None
    return out


def surface_table(counts: pd.DataFrame) -> pd.DataFrame:
    """Per head and statistic: mean = mass / n (whole data)."""
    rows = counts[(counts["analysis"] == "surface") & (counts["fold"] == "")]
    out = rows[["label", "layer", "head", "n", "mass"]].copy()
    out["mean"] = out["mass"] / out["n"]
    return out.reset_index(drop=True)
