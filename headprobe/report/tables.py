"""Read a results directory and derive report tables from the tidy counts.

Every number the report shows comes from here, and every one of them is a
ratio or a sum of the stored tables (``counts``, ``best_heads``,
``summary.json``): accuracy = hits / n, mean mass = mass / n, summed over
heads or layers where a table is per layer. Nothing is recomputed from
attention.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from headprobe import stats

STRING_COLUMNS = ("analysis", "label", "direction", "variant", "fold", "selection",
                  "baseline", "baseline_variant", "heads")
DIRECTIONS = ("dep->head", "head<-dep")
SURFACE_LABELS = ("cls", "sep", "punct", "self", "prev", "next")
POSITIONAL_LABELS = ("-2", "-1", "0", "+1", "+2", "special", "other")
NOT_PER_RELATION = ("ALL", "root", "punct")


@dataclass
class ReportData:
    """The tables a report is built from."""

    counts: pd.DataFrame
    best_heads: pd.DataFrame
    summary: dict
    examples: list | None = None
    source: str = ""
    problems: list = field(default_factory=list)   # non-fatal reading problems, shown in the report

    @property
    def n_layers(self) -> int:
        if self.summary.get("n_layers") is not None:
            return int(self.summary["n_layers"])
        heads = self.counts[self.counts["layer"] >= 0]
        return int(heads["layer"].max()) + 1 if len(heads) else 0

    @property
    def n_heads(self) -> int:
        if self.summary.get("n_heads") is not None:
            return int(self.summary["n_heads"])
        heads = self.counts[self.counts["layer"] >= 0]
        return int(heads["head"].max()) + 1 if len(heads) else 0

    @property
    def analyses(self) -> list[str]:
        present = list(dict.fromkeys(self.counts["analysis"]))
        return present


def head_name(layer, head) -> str:
    """Paper-style head name `L-H`, 0-based."""
    try:
        if layer is None or head is None or pd.isna(layer) or pd.isna(head) or int(layer) < 0:
            return "—"
    except (TypeError, ValueError):
        return str(layer)
    return f"{int(layer)}-{int(head)}"


def normalize(df: pd.DataFrame) -> pd.DataFrame:
    """Strings for the key columns ('' for missing), ints for layer/head, floats for n/hits/mass."""
    df = df.copy()
    for col in STRING_COLUMNS:
        if col in df.columns:
            df[col] = df[col].map(_as_key).astype(object)
    for col in ("layer", "head"):
        if col in df.columns:
            df[col] = pd.to_numeric(df[col], errors="coerce").fillna(-1).astype(int)
    for col in ("n", "hits", "mass"):
        if col in df.columns:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    if "mass" not in df.columns and "n" in df.columns:
        df["mass"] = np.nan
    if "hits" not in df.columns and "n" in df.columns:
        df["hits"] = np.nan
    return df


def _as_key(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if np.isnan(value):
            return ""
        if value.is_integer():
            return str(int(value))
    return str(value)


def _read_table(directory: Path, stem: str) -> pd.DataFrame | None:
    parquet, csv = directory / f"{stem}.parquet", directory / f"{stem}.csv"
    if parquet.exists():
        return pd.read_parquet(parquet)
    if csv.exists():
        return pd.read_csv(csv, dtype={c: str for c in STRING_COLUMNS}, keep_default_na=False,
                           na_values={"n": [""], "hits": [""], "mass": [""]})
    return None


def load(results_dir) -> ReportData:
    """Read `counts`, `best_heads`, `summary.json` and, if present, `examples.json`.

    `results_dir` is a directory path or an object with `.counts`, `.best_heads`
    and `.summary` (the API's `Results`).
    """
    problems: list[str] = []
    if hasattr(results_dir, "counts"):
        counts = results_dir.counts
        best = getattr(results_dir, "best_heads", None)
        summary = dict(getattr(results_dir, "summary", {}) or {})
        examples = getattr(results_dir, "examples", None)
        source = "in-memory results"
    else:
        directory = Path(results_dir)
        if not directory.is_dir():
            raise FileNotFoundError(f"results directory not found: {directory}")
        counts = _read_table(directory, "counts")
        if counts is None:
            raise FileNotFoundError(f"{directory} has no counts.parquet or counts.csv")
        best = _read_table(directory, "best_heads")
        if best is None:
            problems.append("best_heads table not found: top-heads tables are left out.")
        summary_path = directory / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        if not summary_path.exists():
            problems.append("summary.json not found.")
        examples = None
        ex_path = directory / "examples.json"
        if ex_path.exists():
            try:
                examples = json.loads(ex_path.read_text())
            except json.JSONDecodeError as err:
                problems.append(f"examples.json could not be read ({err}).")
        source = str(directory)
    counts = normalize(counts)
    if best is None:
        best = pd.DataFrame(columns=["analysis", "label", "selection", "layer", "head",
                                     "direction", "n", "hits", "accuracy"])
    best = normalize(best)
    return ReportData(counts=counts, best_heads=best, summary=summary, examples=examples,
                      source=source, problems=problems)


# ---------------------------------------------------------------- accuracy tables

def head_scores(counts: pd.DataFrame, analysis: str, label: str | None = None,
                direction: str | None = None, fold: str = "") -> pd.DataFrame:
    """Per-head accuracy: columns label, layer, head, direction, n, hits, mass, accuracy."""
    c = counts[(counts["analysis"] == analysis) & (counts["variant"] == "")
               & (counts["fold"] == fold) & (counts["layer"] >= 0)]
    if label is not None:
        c = c[c["label"] == label]
    if direction is not None:
        c = c[c["direction"] == direction]
    g = (c.groupby(["label", "layer", "head", "direction"], as_index=False, sort=True)
         [["n", "hits", "mass"]].sum(min_count=1))
    g["accuracy"] = g["hits"] / g["n"].where(g["n"] > 0)
    return g


def baselines(counts: pd.DataFrame, analysis: str, label: str, direction: str | None = None,
              fold: str = "") -> pd.DataFrame:
    """Baseline accuracies for one label: columns variant, n, hits, accuracy (best first).

    Baseline rows (`variant` != '') may carry a direction or ''; rows of the asked
    direction are used when there are any, else the '' rows, else all.
    """
    c = counts[(counts["analysis"] == analysis) & (counts["variant"] != "")
               & (counts["fold"] == fold) & (counts["label"] == label)]
    if direction is not None and (c["direction"] == direction).any():
        c = c[c["direction"] == direction]
    elif (c["direction"] == "").any():
        c = c[c["direction"] == ""]
    elif len(c):
        c = c[c["direction"] == c["direction"].iloc[0]]
    g = c.groupby("variant", as_index=False, sort=True)[["n", "hits"]].sum()
    g["accuracy"] = g["hits"] / g["n"].where(g["n"] > 0)
    return g.sort_values(["accuracy", "variant"], ascending=[False, True],
                         kind="stable").reset_index(drop=True)


def best_heads_row(best: pd.DataFrame, analysis: str, label: str,
                   selection: str = "in-sample") -> pd.Series | None:
    """The best-heads row of one label and selection; of held-out rows, the pooled one
    (fold '': both halves' evaluations added up) rather than a single fold's."""
    rows = best[(best["analysis"] == analysis) & (best["label"] == label)]
    if "selection" in rows.columns:
        rows = rows[rows["selection"] == selection]
    if "fold" in rows.columns and (rows["fold"] == "").any():
        rows = rows[rows["fold"] == ""]
    return rows.iloc[0] if len(rows) else None


def row_head_name(row: pd.Series | None) -> str:
    """`L-H` of a best-heads row; its `heads` text when it names more than one head
    (held-out, when the two folds chose different heads: 'fold-0 pick | fold-1 pick')."""
    if row is None:
        return "—"
    if "heads" in row.index and isinstance(row["heads"], str) and row["heads"].strip():
        return row["heads"].strip()
    return head_name(row.get("layer"), row.get("head"))


def reference_baseline(data: ReportData, analysis: str, label: str,
                       direction: str | None = None) -> tuple[str | None, float]:
    """The baseline a gap is measured against: the variant the best-heads table names
    for this label (in-sample), looked up in counts; else the strongest baseline in counts."""
    bl = baselines(data.counts, analysis, label, direction)
    if not len(bl):
        return None, float("nan")
    row = best_heads_row(data.best_heads, analysis, label)
    if row is not None and "baseline_variant" in row.index and row["baseline_variant"]:
        hit = bl[bl["variant"] == row["baseline_variant"]]
        if len(hit):
            return str(hit["variant"].iloc[0]), float(hit["accuracy"].iloc[0])
    return str(bl["variant"].iloc[0]), float(bl["accuracy"].iloc[0])


def to_matrix(df: pd.DataFrame, value: str, n_layers: int, n_heads: int) -> np.ndarray:
    """A layer x head array of `value` (NaN where there is no row)."""
    mat = np.full((n_layers, n_heads), np.nan)
    for layer, head, v in zip(df["layer"], df["head"], df[value]):
        if 0 <= layer < n_layers and 0 <= head < n_heads:
            mat[int(layer), int(head)] = v
    return mat


def labels_by_size(counts: pd.DataFrame, analysis: str, exclude=()) -> list[str]:
    """Labels of an analysis, largest n first (n of one head, whole data)."""
    c = counts[(counts["analysis"] == analysis) & (counts["variant"] == "")
               & (counts["fold"] == "") & (counts["layer"] >= 0)]
    if not len(c):
        return []
    first = c[(c["layer"] == c["layer"].min())]
    first = first[first["head"] == first["head"].min()]
    if len(first["direction"].unique()) > 1:
        first = first[first["direction"] == first["direction"].iloc[0]]
    sizes = first.groupby("label")["n"].sum().sort_values(ascending=False, kind="stable")
    return [lab for lab in sizes.index if lab not in exclude]


# ---------------------------------------------------------------- surface / positional

def surface_per_head(counts: pd.DataFrame) -> pd.DataFrame:
    """Mean mass per head for each surface label (mass / n), entropy and its ratio to uniform."""
    g = stats.surface_table(counts)
    if not len(g):
        return pd.DataFrame(columns=["layer", "head"])
    wide = g.pivot_table(index=["layer", "head"], columns="label", values="mean",
                         aggfunc="first").reset_index()
    wide.columns.name = None
    wide = _order(wide, ["layer", "head"], SURFACE_ORDER)
    if "entropy" in wide.columns and "entropy_uniform" in wide.columns:
        wide["entropy_ratio"] = wide["entropy"] / wide["entropy_uniform"]
    if "cls" in wide.columns or "sep" in wide.columns:
        wide["cls_sep"] = wide.get("cls", 0).fillna(0) + wide.get("sep", 0).fillna(0)
    return wide


def surface_per_layer(counts: pd.DataFrame) -> pd.DataFrame:
    """Per layer: summed mass over the layer's heads / summed n (= mean over heads when n is equal)."""
    c = counts[(counts["analysis"] == "surface") & (counts["fold"] == "")
               & (counts["variant"] == "") & (counts["layer"] >= 0)]
    if not len(c):
        return pd.DataFrame(columns=["layer"])
    g = c.groupby(["layer", "label"], as_index=False)[["n", "mass"]].sum()
    g["mean"] = g["mass"] / g["n"].where(g["n"] > 0)
    wide = g.pivot_table(index="layer", columns="label", values="mean",
                         aggfunc="first").reset_index()
    wide.columns.name = None
    wide = _order(wide, ["layer"], SURFACE_ORDER)
    if "entropy" in wide.columns and "entropy_uniform" in wide.columns:
        wide["entropy_ratio"] = wide["entropy"] / wide["entropy_uniform"]
    return wide


def positional_shares(counts: pd.DataFrame) -> pd.DataFrame:
    """Per head: share of argmaxes at each positional label, and the dominant non-zero
    offset with its share (`stats.positional_heads`, renamed for the report)."""
    heads = stats.positional_heads(counts)
    if not len(heads):
        return pd.DataFrame(columns=["layer", "head", "dominant_offset", "dominant_share"])
    wide = heads.drop(columns="positional").rename(
        columns={"n": "words", "offset": "dominant_offset", "share": "dominant_share"})
    wide["dominant_offset"] = wide["dominant_offset"].where(wide["dominant_share"] > 0, "")
    return _order(wide, ["layer", "head"], POSITIONAL_LABELS)


def _order(df: pd.DataFrame, keys: list[str], known) -> pd.DataFrame:
    """Key columns first, then the known labels in their order, then anything else."""
    rest = [c for c in df.columns if c not in keys]
    ordered = [c for c in known if c in rest] + [c for c in rest if c not in known]
    return df[keys + ordered]


SURFACE_ORDER = ("cls", "sep", "punct", "self", "prev", "next", "entropy", "entropy_uniform")


# ---------------------------------------------------------------- formatting

def fmt(x, nd: int = 4) -> str:
    if x is None:
        return "—"
    try:
        if pd.isna(x):
            return "—"
    except (TypeError, ValueError):
        return str(x)
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return f"{float(x):.{nd}f}"


def fmt_int(x) -> str:
    try:
        if pd.isna(x):
            return "—"
    except (TypeError, ValueError):
        return str(x)
    return f"{int(round(float(x)))}"


def fmt_ci(low, high, nd: int = 4) -> str:
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return "—"
    return f"[{float(low):.{nd}f}, {float(high):.{nd}f}]"


def best_heads_table(data: ReportData, analysis: str, labels: list[str] | None = None,
                     min_n: float = 0) -> pd.DataFrame:
    """One row per label: the in-sample best head and the held-out figures, from best_heads.

    Columns: label, n, head (`L-H`), layer, head_index, direction, accuracy, ci_low, ci_high,
    baseline_variant, baseline_accuracy, gap, gap_low, gap_high, heldout_head,
    heldout_accuracy, heldout_ci_low, heldout_ci_high, heldout_gap, heldout_gap_low,
    heldout_gap_high. Labels default to those of the analysis, largest first (ALL first).
    """
    if labels is None:
        labels = labels_by_size(data.counts, analysis)
        if "ALL" in labels:
            labels = ["ALL"] + [x for x in labels if x != "ALL"]
    rows = []
    for label in labels:
        ins = best_heads_row(data.best_heads, analysis, label, "in-sample")
        if ins is None:
            continue
        held = best_heads_row(data.best_heads, analysis, label, "held-out")

        def g(row, key):
            return row[key] if row is not None and key in row.index else np.nan

        if not pd.isna(g(ins, "n")) and float(g(ins, "n")) < min_n:
            continue
        rows.append({
            "label": label, "n": int(g(ins, "n")) if not pd.isna(g(ins, "n")) else np.nan, "head": head_name(g(ins, "layer"), g(ins, "head")),
            "layer": g(ins, "layer"), "head_index": g(ins, "head"),
            "direction": g(ins, "direction"), "accuracy": g(ins, "accuracy"),
            "ci_low": g(ins, "ci_low"), "ci_high": g(ins, "ci_high"),
            "baseline_variant": g(ins, "baseline_variant"),
            "baseline_accuracy": g(ins, "baseline_accuracy"), "gap": g(ins, "gap"),
            "gap_low": g(ins, "gap_low"), "gap_high": g(ins, "gap_high"),
            "heldout_head": row_head_name(held),
            "heldout_accuracy": g(held, "accuracy"), "heldout_ci_low": g(held, "ci_low"),
            "heldout_ci_high": g(held, "ci_high"), "heldout_gap": g(held, "gap"),
            "heldout_gap_low": g(held, "gap_low"), "heldout_gap_high": g(held, "gap_high"),
        })
    return pd.DataFrame(rows)
