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

from functools import lru_cache

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


def codes(frame: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(integer code per row, category values) of a column, categorical or not."""
    values = frame[column]
    if not isinstance(values.dtype, pd.CategoricalDtype):
        values = values.astype(str).astype("category")
    return values.cat.codes.to_numpy(), np.asarray(values.cat.categories.astype(str))


def fold_map(unit_counts: pd.DataFrame, seed: int = SEED) -> np.ndarray:
    """The fold of every row of `unit_counts` (folds drawn per analysis, over its units)."""
    folds = np.zeros(len(unit_counts), dtype=np.int8)
    analysis, _ = codes(unit_counts, "analysis")
    unit, unit_names = codes(unit_counts, "unit")
    for a in np.unique(analysis):
        rows = analysis == a
        present = np.unique(unit[rows])
        mapping = assign_folds(unit_names[present], seed)
        fold_of = np.zeros(len(unit_names), dtype=np.int8)
        fold_of[present] = [mapping[u] for u in unit_names[present]]
        folds[rows] = fold_of[unit[rows]]
    return folds


def tidy_counts(unit_counts: pd.DataFrame, seed: int = SEED) -> pd.DataFrame:
    """SPEC 5 tidy table: whole data (fold "") and each half (fold "0"/"1")."""
    def total(frame):
        summed = frame.groupby(KEYS, sort=True, observed=True, dropna=False)[["n", "hits", "mass"]]
        out = summed.sum(min_count=1).reset_index()
        for column in ("analysis", "label", "direction", "variant"):
            out[column] = out[column].astype(str)
        for column in ("n", "hits", "mass"):
            out[column] = out[column].astype(np.float64)
        return out.astype({"layer": int, "head": int})

    whole = total(unit_counts).assign(fold="")
    folds = fold_map(unit_counts, seed)
    halves = [total(unit_counts[folds == f]).assign(fold=str(f)) for f in (0, 1)]
    out = pd.concat([whole, *halves], ignore_index=True)
    return out[["analysis", "label", "layer", "head", "direction", "variant", "fold", "n", "hits", "mass"]]


@lru_cache(maxsize=64)
def bootstrap_weights(n_units: int, seed: int = SEED, n_boot: int = N_BOOT) -> np.ndarray:
    """[resample, unit]: how often each unit is drawn in each resample (read-only, cached)."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n_units, size=(n_boot, n_units)) if n_units else np.zeros((n_boot, 0), int)
    flat = (np.arange(n_boot)[:, None] * n_units + draws).ravel()
    weights = np.bincount(flat, minlength=n_boot * n_units).reshape(n_boot, n_units).astype(np.float64)
    weights.flags.writeable = False
    return weights


def interval(values: np.ndarray) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return float("nan"), float("nan")
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def ratio(hits, n):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, hits / np.where(n > 0, n, 1), np.nan)


def add_up(shape, rows, columns, values) -> np.ndarray:
    """A dense [rows, columns] matrix with `values` summed at (rows, columns)."""
    flat = np.bincount(rows * shape[1] + columns, weights=values, minlength=shape[0] * shape[1])
    return flat.reshape(shape)


class LabelTable:
    """Per-unit hits and trials of every candidate head and every baseline, for one label."""

    def __init__(self, unit_code: np.ndarray, n_units: int, variant: np.ndarray, direction: np.ndarray,
                 layer: np.ndarray, head: np.ndarray, n: np.ndarray, hits: np.ndarray):
        # all arrays: [row] of one label; unit_code indexes the analysis's units; variant "" for heads
        is_head = variant == ""
        cand_key = (layer.astype(np.int64) * 100_000 + head) * 4 + direction             # sorts as (layer, head, dir)
        keys, cand_code = np.unique(cand_key[is_head], return_inverse=True)
        order = {v: k for k, v in DIRECTION_ORDER.items()}
        self.candidates = [(int(k // 4 // 100_000), int(k // 4 % 100_000), order[int(k % 4)]) for k in keys]
        shape = (n_units, len(self.candidates))
        self.hits = add_up(shape, unit_code[is_head], cand_code, hits[is_head])        # [unit, candidate]
        self.n = add_up(shape, unit_code[is_head], cand_code, n[is_head])
        self.variants = sorted(set(variant[~is_head]), key=_variant_key)
        var_index = {v: i for i, v in enumerate(self.variants)}
        var_code = np.array([var_index[v] for v in variant[~is_head]], dtype=np.int64)
        shape = (n_units, len(self.variants))
        self.base_hits = add_up(shape, unit_code[~is_head], var_code, hits[~is_head])   # [unit, variant]
        self.base_n = add_up(shape, unit_code[~is_head], var_code, n[~is_head])

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


BEST_COLUMNS = ["analysis", "label", "selection", "fold", "layer", "head", "direction", "heads", "n", "hits",
                "accuracy", "ci_low", "ci_high", "baseline_variant", "baseline_hits", "baseline_accuracy", "gap",
                "gap_low", "gap_high"]
BASELINE_COLUMNS = ["analysis", "label", "variant", "n", "hits", "accuracy", "ci_low", "ci_high"]


def selection_tables(unit_counts: pd.DataFrame, seed: int = SEED, n_boot: int = N_BOOT):
    """(best_heads, baselines) for every scored analysis and label.

    One bootstrap matrix per analysis, over all its units, serves every label,
    fold, head and baseline: intervals are over units (sentences, documents)
    and every gap is paired.
    """
    best, base = [], []
    analysis_code, analysis_names = codes(unit_counts, "analysis")
    for analysis in SCORED:
        if analysis not in analysis_names:
            continue
        rows = unit_counts[analysis_code == list(analysis_names).index(analysis)]
        unit, unit_names = codes(rows, "unit")
        present_codes = np.unique(unit)
        units = sorted(unit_names[present_codes])
        position = np.full(len(unit_names), -1)
        position[present_codes] = pd.Index(units).get_indexer(unit_names[present_codes])
        mapping = assign_folds(units, seed)
        folds = np.array([mapping[u] for u in units])
        weights = bootstrap_weights(len(units), seed, n_boot)                       # [resample, unit]
        label, label_names = codes(rows, "label")
        variant_code, variant_names = codes(rows, "variant")
        direction_code, direction_names = codes(rows, "direction")
        direction_rank = np.array([DIRECTION_ORDER[d] for d in direction_names])[direction_code]
        variant = variant_names[variant_code]
        layer, head = rows["layer"].to_numpy(), rows["head"].to_numpy()
        n, hits = rows["n"].to_numpy(np.float64), rows["hits"].to_numpy(np.float64)
        by_label = np.argsort(label, kind="stable")
        bounds = np.searchsorted(label[by_label], np.arange(len(label_names) + 1))
        for index in sorted(range(len(label_names)), key=lambda i: label_names[i]):
            take = by_label[bounds[index]:bounds[index + 1]]
            if take.size == 0:
                continue
            table = LabelTable(position[unit[take]], len(units), variant[take], direction_rank[take],
                               layer[take], head[take], n[take], hits[take])
            name = label_names[index]
            for v, variant_name in enumerate(table.variants):
                bh, bn = table.base_hits[:, v], table.base_n[:, v]
                low, high = interval(ratio(weights @ bh, weights @ bn))
                base.append(dict(analysis=analysis, label=name, variant=variant_name, n=bn.sum(), hits=bh.sum(),
                                 accuracy=ratio(bh.sum(), bn.sum()).item(), ci_low=low, ci_high=high))
            if table.candidates:
                best.extend(_label_rows(analysis, name, table, folds, weights))
    return _best_frame(best), pd.DataFrame(base, columns=BASELINE_COLUMNS)


def _best_frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=BEST_COLUMNS)
    if "heads" not in frame:
        frame["heads"] = np.nan
    frame["heads"] = [given if isinstance(given, str) else (f"{l}-{h}" if l >= 0 else "")
                      for given, l, h in zip(frame["heads"], frame["layer"], frame["head"])]
    for column in BEST_COLUMNS:
        if column not in frame:
            frame[column] = np.nan
    return frame[BEST_COLUMNS]


def best_heads(unit_counts: pd.DataFrame, seed: int = SEED, n_boot: int = N_BOOT) -> pd.DataFrame:
    """Best (layer, head, direction) per analysis and label, in-sample and held-out."""
    return selection_tables(unit_counts, seed, n_boot)[0]


def baselines(unit_counts: pd.DataFrame, seed: int = SEED, n_boot: int = N_BOOT) -> pd.DataFrame:
    """Every baseline's accuracy with its bootstrap interval, per analysis and label."""
    return selection_tables(unit_counts, seed, n_boot)[1]


def _label_rows(analysis, label, table, folds, weights):
    """In-sample, held-out per fold and pooled held-out rows for one label."""
    n_units = len(folds)

    units = np.arange(n_units)

    def evaluate(selection, fold, cand_per_unit, base_per_unit, mask, cand, base_name):
        # per-unit vectors over all units, zero outside `mask`: resampled units outside add nothing
        pick = lambda matrix, column: np.where(mask, matrix[units, column], 0.0)
        hits, n = pick(table.hits, cand_per_unit), pick(table.n, cand_per_unit)
        bh = bn = None
        if table.variants:
            bh, bn = pick(table.base_hits, base_per_unit), pick(table.base_n, base_per_unit)
        return _row(analysis, label, selection, fold, cand, base_name, hits, n, bh, bn, weights)

    everyone = np.ones(n_units, dtype=bool)
    best, base = table.select(everyone)
    full = lambda value: np.full(n_units, value if value is not None else 0)
    rows = [evaluate("in-sample", "", full(best), full(base), everyone, table.candidates[best],
                     table.variants[base] if base is not None else None)]
    # held-out: select on fold f, evaluate on the other fold, and swap
    chosen = {f: table.select(folds == f) for f in (0, 1)}
    cand_per_unit = np.array([chosen[1 - f][0] for f in folds])
    base_per_unit = np.array([chosen[1 - f][1] or 0 for f in folds])
    for f in (0, 1):
        c, b = chosen[1 - f]
        rows.append(evaluate("held-out", str(f), cand_per_unit, base_per_unit, folds == f,
                             table.candidates[c], table.variants[b] if b is not None else None))
    same = chosen[0][0] == chosen[1][0]
    same_base = chosen[0][1] == chosen[1][1]
    pooled = evaluate("held-out", "", cand_per_unit, base_per_unit, everyone,
                      table.candidates[chosen[0][0]] if same else None,
                      (table.variants[chosen[0][1]] if same_base else "per fold") if table.variants else None)
    if not same:   # the two folds chose different heads: name both (selected on fold 0 | on fold 1)
        picks = [table.candidates[chosen[f][0]] for f in (0, 1)]
        same_head = picks[0][:2] == picks[1][:2]          # then only the direction differs: say which
        pooled["heads"] = " | ".join(f"{l}-{h} {d}" if same_head else f"{l}-{h}" for l, h, d in picks)
    rows.append(pooled)
    return rows


def positional_heads(counts: pd.DataFrame, threshold: float = 0.9) -> pd.DataFrame:
    """Per head: the share of argmaxes at each offset; positional if one non-zero offset >= threshold."""
    rows = counts[(counts["analysis"] == "positional") & (counts["fold"] == "")]
    if rows.empty:
        return pd.DataFrame(columns=["layer", "head", "n", "offset", "share", "positional"])
    share = rows.assign(share=rows["hits"] / rows["n"]).pivot_table(
        index=["layer", "head"], columns="label", values="share", aggfunc="sum").fillna(0.0)
    nonzero = [c for c in ("-2", "-1", "+1", "+2") if c in share.columns]
    top = share[nonzero].idxmax(axis=1)
    out = share.reset_index()
    out.insert(2, "n", rows.groupby(["layer", "head"])["n"].max().reindex(share.index).to_numpy())
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
