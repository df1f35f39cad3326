"""Report tables and cell text, rendered from `Results` (nothing here computes a statistic).

    table = best_heads_table(results, "dependency", results.labels("dependency"))
    fmt(0.51234) == "0.5123"; head_name(2, 8) == "2-8"

Every number is a stored value of `results.best_heads`, `results.counts` or one of
the `Results` views, formatted; `BEST_HEADS_LEGEND` says in one sentence each what
the best-heads columns mean.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.report.document import Cell, Table
from headprobe.roles import MIN_ARCS, MIN_MENTIONS
from headprobe.stats import MIN_N

LEGEND = "L-H = layer-head, both 0-based."
MAX_VARIANT_COLUMNS = 4        # analyses with at most this many baselines show each one's accuracy
RUNNERS_UP = 3

BEST_HEADS_LEGEND = [
    "accuracy, 95% CI: hits / n of the best (layer, head, direction), with the 2.5th and 97.5th "
    "percentiles of 1,000 Poisson bootstrap resamples over units (documents, else sentences).",
    "baseline, gap: the best baseline on the same data (fixed offsets and the first word for "
    "dependency; nearest, head_match, rules for coreference) and the head's accuracy minus it, with a "
    "paired interval.",
    "p_value: one-sided exact McNemar test of the head against that in-sample best baseline, on the "
    "items exactly one of them gets right.",
    f"p_holm: p_value adjusted by Holm's method over its family of tests (for the role rules, every "
    f"head x relation with at least {MIN_ARCS} arcs, or every head on at least {MIN_MENTIONS} "
    f"coreference mentions; otherwise every head of that label).",
    "tied: how many (layer, head, direction) candidates share the best accuracy; above 1 it is flagged "
    "'(tie)' and the lowest layer, head, then dep->head is shown.",
    "folds_agree: whether the two halves of the held-out selection chose the same head and direction "
    "(when not, the held-out head reads 'fold-0 pick | fold-1 pick').",
    f"small_sample: the label has fewer than {MIN_N} trials, so no head is named and its interval is "
    f"unreliable.",
    "unreachable: arcs the shown direction cannot predict because their row (dep->head) or column "
    "(head<-dep) holds no attention once specials and self are removed (a decoder's first word's row, "
    "last word's column); they count as misses.",
    "note: why a row has no numbers (such as 'no held-out selection: fold 1 has no trials'); it is shown "
    "in their place.",
]


# ---------------------------------------------------------------- cell text

def head_name(layer, head) -> str:
    """Paper-style head name `L-H`, 0-based; '—' for no head (layer -1 or missing)."""
    if _missing(layer) or _missing(head) or int(layer) < 0:
        return "—"
    return f"{int(layer)}-{int(head)}"


def row_head_name(row: pd.Series | None) -> str:
    """`L-H` of a best-heads row; its `heads` text when it names two picks (held-out,
    folds disagreeing: 'fold-0 pick | fold-1 pick')."""
    if row is None:
        return "—"
    heads = row.get("heads")
    if isinstance(heads, str) and heads.strip():
        return heads.strip()
    return head_name(row.get("layer"), row.get("head"))


def fmt(x, nd: int = 4) -> str:
    if _missing(x):
        return "—"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return f"{float(x):.{nd}f}"


def fmt_int(x) -> str:
    return "—" if _missing(x) else f"{int(round(float(x)))}"


def fmt_ci(low, high, nd: int = 4, unreliable: bool = False) -> str:
    if _missing(low) or _missing(high):
        return "—"
    text = f"[{float(low):.{nd}f}, {float(high):.{nd}f}]"
    return text + " (unreliable)" if unreliable else text


def fmt_p(p) -> str:
    return "—" if _missing(p) else f"{float(p):.2g}"


def fmt_tied(tied) -> str:
    if _missing(tied):
        return "—"
    return f"{int(tied)} (tie)" if int(tied) > 1 else str(int(tied))


def fmt_flag(value) -> str:
    return "—" if _missing(value) else ("yes" if bool(value) else "no")


def _missing(x) -> bool:
    if x is None or x is pd.NA:
        return True
    try:
        return bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


def get(row: pd.Series | None, key: str):
    return row[key] if row is not None and key in row.index else np.nan


def note_of(row: pd.Series | None) -> str:
    note = get(row, "note")
    return note.strip() if isinstance(note, str) else ""


def to_matrix(df: pd.DataFrame, value: str, n_layers: int, n_heads: int) -> np.ndarray:
    """[layer, head] array of column `value` of a per-head frame (NaN where there is no row)."""
    mat = np.full((n_layers, n_heads), np.nan)
    for layer, head, v in zip(df["layer"], df["head"], df[value]):
        if 0 <= layer < n_layers and 0 <= head < n_heads:
            mat[int(layer), int(head)] = v
    return mat


# ---------------------------------------------------------------- best heads

def best_heads_table(results, analysis: str, labels: list[str], name: str | None = None) -> Table:
    """One row per label: the in-sample best head (with its baseline, gap, McNemar p_value and
    Holm p_holm, ties, unreachable arcs) beside the pooled held-out figures (folds_agree).
    A row's `note` (in-sample or held-out) is shown in place of that part's numbers."""
    scores = results.head_scores(analysis)
    directions = [d for d in dict.fromkeys(scores["direction"]) if d]
    variants = list(dict.fromkeys(results.baselines.loc[results.baselines["analysis"] == analysis, "variant"]))
    each_variant = variants if len(variants) <= MAX_VARIANT_COLUMNS else []
    best = results.best_heads
    best = best[(best["analysis"] == analysis) & (best["fold"] == "")]
    with_unreachable = bool(best["unreachable"].notna().any())

    columns = ["Label", "n", "Head"] + (["Direction"] if directions else []) + ["Accuracy", "95% CI"]
    if variants:
        columns += [f"{v} acc." for v in each_variant] + ["Baseline", "Baseline acc.", "Gap", "Gap CI",
                                                          "p_value", "p_holm"]
    columns += ["tied"] + (["unreachable"] if with_unreachable else [])
    columns += ["Held-out head", "Held-out acc.", "Held-out CI"]
    if variants:
        columns += ["Held-out gap", "Held-out gap CI"]
    columns += ["folds_agree", "small_sample", f"Next best (in-sample, up to {RUNNERS_UP})"]

    rows, attrs = [], []
    for label in labels:
        ins = results.best_head(analysis, label, "in-sample")
        held = results.best_head(analysis, label, "held-out")
        if ins is None:
            continue
        small = bool(get(ins, "small_sample")) if not _missing(get(ins, "small_sample")) else False
        row = [Cell(label), Cell(fmt_int(get(ins, "n")), {"col": "n"}, True)]
        part = [Cell(head_name(get(ins, "layer"), get(ins, "head")), {"col": "head"})]
        if directions:
            part.append(Cell(str(get(ins, "direction") or "—"), {"col": "direction"}))
        part += [Cell(fmt(get(ins, "accuracy")), {"col": "accuracy"}, True),
                 Cell(fmt_ci(get(ins, "ci_low"), get(ins, "ci_high"), unreliable=small), {"col": "ci"}, True)]
        if variants:
            accuracy = results.baseline_scores(analysis, label).set_index("variant")["accuracy"].to_dict()
            part += [Cell(fmt(accuracy.get(v)), {"col": f"baseline:{v}"}, True) for v in each_variant]
            part += [Cell(str(get(ins, "baseline_variant") or "—"), {"col": "baseline"}),
                     Cell(fmt(get(ins, "baseline_accuracy")), {"col": "baseline_accuracy"}, True),
                     Cell(fmt(get(ins, "gap")), {"col": "gap"}, True),
                     Cell(fmt_ci(get(ins, "gap_low"), get(ins, "gap_high"), unreliable=small), {"col": "gap_ci"}, True),
                     Cell(fmt_p(get(ins, "p_value")), {"col": "p_value"}, True),
                     Cell(fmt_p(get(ins, "p_holm")), {"col": "p_holm"}, True)]
        part.append(Cell(fmt_tied(get(ins, "tied")), {"col": "tied"}, True))
        if with_unreachable:
            part.append(Cell(fmt_int(get(ins, "unreachable")), {"col": "unreachable"}, True))
        row += _noted(part, note_of(ins))

        part = [Cell(row_head_name(held), {"col": "heldout_head"}),
                Cell(fmt(get(held, "accuracy")), {"col": "heldout_accuracy"}, True),
                Cell(fmt_ci(get(held, "ci_low"), get(held, "ci_high"), unreliable=small), {"col": "heldout_ci"}, True)]
        if variants:
            part += [Cell(fmt(get(held, "gap")), {"col": "heldout_gap"}, True),
                     Cell(fmt_ci(get(held, "gap_low"), get(held, "gap_high"), unreliable=small),
                          {"col": "heldout_gap_ci"}, True)]
        part.append(Cell(fmt_flag(get(held, "folds_agree")), {"col": "folds_agree"}))
        row += _noted(part, note_of(held) if held is not None else "no held-out row")
        row.append(Cell(fmt_flag(small), {"col": "small_sample"}))
        row.append(Cell(_runners_up(scores[scores["label"] == label], get(ins, "layer"), get(ins, "head")),
                        {"col": "next_best"}, wrap=True))
        rows.append(row)
        attrs.append({"analysis": analysis, "label": label, "layer": int(get(ins, "layer")),
                      "head": int(get(ins, "head")), "direction": str(get(ins, "direction") or ""),
                      "note": note_of(ins), "heldout-note": note_of(held)})
    caption = ("Best head per label: in-sample (selected and scored on all the data, as the papers did) and "
               "held-out (selected on one half of the units, scored on the other, and swapped; pooled). "
               "Columns as in the legend of the overview. " + LEGEND)
    return Table(name or f"{analysis}-top-heads", caption, columns, rows, attrs)


def _noted(cells: list[Cell], note: str) -> list[Cell]:
    """A part of a row, or, when it has a note, the note in its first cell and '—' elsewhere."""
    if not note:
        return cells
    first = Cell(note, dict(cells[0].attrs, note="1"), wrap=True)
    return [first] + [Cell("—", c.attrs, c.numeric) for c in cells[1:]]


def _runners_up(scores: pd.DataFrame, layer, head, k: int = RUNNERS_UP) -> str:
    """The next heads by in-sample accuracy (each head in its better direction)."""
    if not len(scores):
        return "—"
    ranked = scores.sort_values(["accuracy", "layer", "head", "direction"], ascending=[False, True, True, True],
                                kind="stable").drop_duplicates(["layer", "head"])
    if not _missing(layer) and int(layer) >= 0:
        ranked = ranked[~((ranked["layer"] == int(layer)) & (ranked["head"] == int(head)))]
    parts = [f"{head_name(r.layer, r.head)}{' ' + r.direction if r.direction else ''} {fmt(r.accuracy)}"
             for r in ranked.head(k).itertuples(index=False)]
    return "; ".join(parts) or "—"
