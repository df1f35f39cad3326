"""Report tables and cell text, rendered from `Results` (nothing here computes a statistic).

    table = best_heads_table(results, "dependency", results.labels("dependency"))
    fmt(0.51234) == "0.5123"; head_name(2, 8) == "2-8"
    pair_table_block(pairs, "my-pairs", "caption")    # a pair-of-heads table, intervals and Holm

Every number is a stored value of `results.best_heads`, `results.counts`, a pair table or one of
the `Results` views, formatted; `BEST_HEADS_LEGEND` says in one sentence each what
the best-heads columns mean.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from headprobe.report.document import Cell, Table
from headprobe.stats.head_selection import MIN_N

LEGEND = "L-H = layer-head, both 0-based."

BEST_HEADS_LEGEND = [
    "accuracy, 95% CI: hits / n of the best (layer, head, direction), with the 2.5th and 97.5th "
    "percentiles of 1,000 Poisson bootstrap resamples over units (documents, else sentences).",
    "baseline, gap: the best of the analysis's baselines (named in its section) on the same data, "
    "and the head's accuracy minus it, with a paired interval.",
    "p / Holm: the McNemar p_value and its Holm-adjusted p_holm (below), in one cell.",
    "p_value: one-sided exact McNemar test of the head against that in-sample best baseline, on the "
    "items exactly one of them gets right.",
    "p_holm: p_value adjusted by Holm's method over its family of tests (for a role rule, the family "
    "its description in the role map names; otherwise every head of that label).",
    "tied: how many (layer, head, direction) candidates share the best accuracy; above 1 it is flagged "
    "'tie (k)' and the lowest layer, head, then dep->head is shown.",
    "folds_agree: whether the two halves of the held-out selection chose the same head and direction "
    "(when not, the held-out head reads 'fold-0 pick | fold-1 pick').",
    f"small_sample: the label has fewer than {MIN_N} trials, so no head is named and its interval is "
    f"unreliable.",
    "unreachable: arcs the shown direction cannot predict because their row (dep->head) or column "
    "(head<-dep) holds no attention once specials and self are removed (a decoder's first word's row, "
    "last word's column); they count as misses.",
    "Flags: tie (k), folds differ (folds_agree is no), n unreachable, small sample; '—' when none.",
    "rounding: a value is shown to one digit past the first significant digit of its interval's width "
    "(3 decimals for a width of 0.04); the CSV files keep full precision.",
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
    """Two significant digits; '<1e-300' for a p-value that underflowed to 0."""
    if _missing(p):
        return "—"
    return "<1e-300" if float(p) == 0 else f"{float(p):.2g}"


def _missing(x) -> bool:
    if x is None or x is pd.NA:
        return True
    try:
        return bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


def get(row: pd.Series | None, key: str):
    return row[key] if row is not None and key in row.index else np.nan


def text_of(row: pd.Series | None, key: str, missing: str = "—") -> str:
    value = get(row, key)
    return missing if _missing(value) or value == "" else str(value)


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


# ---------------------------------------------------------------- rounding


def decimals(low, high, lo: int = 2, hi: int = 4) -> int:
    """Decimals a value with 95% interval [low, high] supports: one digit past the first
    significant digit of the interval's width (width 0.042 -> 3; 0.3 -> 2; 0.004 -> 4),
    within [lo, hi]; `hi` when there is no interval."""
    if _missing(low) or _missing(high) or not float(high) > float(low):
        return hi
    return int(min(hi, max(lo, 1 - math.floor(math.log10(float(high) - float(low))))))


def fmt_est(value, low, high, nd: int | None = None) -> str:
    """'0.556 [0.535,\u00a00.577]': a value and its interval in one cell, rounded to what the
    interval supports (a line may break only before the interval)."""
    if _missing(value):
        return "—"
    nd = decimals(low, high) if nd is None else nd
    if _missing(low) or _missing(high):
        return f"{float(value):.{nd}f}"
    return f"{float(value):.{nd}f} [{float(low):.{nd}f},\u00a0{float(high):.{nd}f}]"


def fmt_signed_est(value, low, high) -> str:
    """A difference and its interval (sign always shown)."""
    if _missing(value):
        return "—"
    nd = decimals(low, high)
    if _missing(low) or _missing(high):
        return f"{float(value):+.{nd}f}"
    return f"{float(value):+.{nd}f} [{float(low):+.{nd}f},\u00a0{float(high):+.{nd}f}]"


# ---------------------------------------------------------------- best heads

BEST_HEADS_COLUMNS = [
    "Label",
    "n",
    "Head",
    "Accuracy [95% CI]",
    "Baseline",
    "Gap [95% CI]",
    "p / Holm",
    "Held-out head",
    "Held-out acc. [95% CI]",
    "Held-out gap [95% CI]",
    "Flags",
]


def best_heads_table(results, analysis: str, labels: list[str], name: str | None = None) -> Table:
    """One row per label, narrow enough for a page: the in-sample best head (direction beside it),
    its accuracy with interval, the in-sample best baseline, the gap with its paired interval,
    McNemar p and Holm p in one cell, the pooled held-out head, accuracy and gap, and flags (ties,
    folds disagreeing, unreachable arcs, small sample). The columns left out (each baseline,
    next best heads, counts) are in the report's CSV (`findings.best_heads_export`). A row's
    `note` (in-sample or held-out) is shown in place of that part's numbers. Each cell keeps
    its full-precision values as data-* attributes."""
    rows, attrs = [], []
    for label in labels:
        ins = results.best_head(analysis, label, "in-sample")
        held = results.best_head(analysis, label, "held-out")
        if ins is None:
            continue
        row = [Cell(label), Cell(fmt_int(get(ins, "n")), {"col": "n"}, True)]
        row += _noted(_in_sample_cells(ins), note_of(ins))
        row += _noted(
            _held_out_cells(held), note_of(held) if held is not None else "no held-out row"
        )
        row.append(Cell(", ".join(_flags(ins, held)) or "—", {"col": "flags"}))
        rows.append(row)
        attrs.append(
            {
                "analysis": analysis,
                "label": label,
                "layer": int(get(ins, "layer")),
                "head": int(get(ins, "head")),
                "direction": str(get(ins, "direction") or ""),
                "note": note_of(ins),
                "heldout-note": note_of(held),
            }
        )
    caption = (
        "Best head per label: in-sample (selected and scored on all the data, as the papers did) and "
        "held-out (selected on one half of the units, scored on the other, and swapped; pooled). "
        f"Every column, each baseline and the next best heads: {analysis}_best_heads.csv. " + LEGEND
    )
    return Table(name or f"{analysis}-top-heads", caption, list(BEST_HEADS_COLUMNS), rows, attrs)


def _in_sample_cells(ins: pd.Series) -> list[Cell]:
    nd = decimals(get(ins, "ci_low"), get(ins, "ci_high"))
    direction = text_of(ins, "direction", "")
    head = head_name(get(ins, "layer"), get(ins, "head"))
    return [
        Cell(
            f"{head} {direction}".strip(),
            {"col": "head", "head": head, "direction": direction},
            keep=True,
        ),
        Cell(
            fmt_est(get(ins, "accuracy"), get(ins, "ci_low"), get(ins, "ci_high")),
            _values(ins, col="accuracy", value="accuracy", low="ci_low", high="ci_high"),
            True,
        ),
        Cell(
            f"{text_of(ins, 'baseline_variant')} {fmt(get(ins, 'baseline_accuracy'), nd)}",
            _values(ins, col="baseline", variant="baseline_variant", value="baseline_accuracy"),
        ),
        Cell(
            fmt_signed_est(get(ins, "gap"), get(ins, "gap_low"), get(ins, "gap_high")),
            _values(ins, col="gap", value="gap", low="gap_low", high="gap_high"),
            True,
        ),
        Cell(
            f"{fmt_p(get(ins, 'p_value'))} / {fmt_p(get(ins, 'p_holm'))}",
            _values(ins, col="p", p_value="p_value", p_holm="p_holm"),
            True,
        ),
    ]


def _held_out_cells(held: pd.Series | None) -> list[Cell]:
    return [
        Cell(
            f"{row_head_name(held)} {get(held, 'direction') or ''}".strip()
            if held is not None
            else "—",
            {"col": "heldout_head", "head": row_head_name(held)},
            keep=True,
        ),
        Cell(
            fmt_est(get(held, "accuracy"), get(held, "ci_low"), get(held, "ci_high")),
            _values(held, col="heldout_accuracy", value="accuracy", low="ci_low", high="ci_high"),
            True,
        ),
        Cell(
            fmt_signed_est(get(held, "gap"), get(held, "gap_low"), get(held, "gap_high")),
            _values(held, col="heldout_gap", value="gap", low="gap_low", high="gap_high"),
            True,
        ),
    ]


def _values(row: pd.Series | None, col: str, **fields) -> dict:
    """data-* attributes of a cell: its column name and the full-precision values it shows."""
    out = {"col": col}
    for key, source in fields.items():
        v = get(row, source)
        out[key] = "" if _missing(v) else (v if isinstance(v, str) else repr(float(v)))
    return out


def _flags(ins: pd.Series, held: pd.Series | None) -> list[str]:
    flags = []
    tied = get(ins, "tied")
    if not _missing(tied) and int(tied) > 1:
        flags.append(f"tie ({int(tied)})")
    agree = get(held, "folds_agree")
    if held is not None and not note_of(held) and not _missing(agree) and not bool(agree):
        flags.append("folds differ")
    unreachable = get(ins, "unreachable")
    if not _missing(unreachable) and float(unreachable) > 0:
        flags.append(f"{int(unreachable)} unreachable")
    if not _missing(get(ins, "small_sample")) and bool(get(ins, "small_sample")):
        flags.append("small sample")
    return flags


def _noted(cells: list[Cell], note: str) -> list[Cell]:
    """A part of a row, or, when it has a note, the note in its first cell and '—' elsewhere."""
    if not note:
        return cells
    first = Cell(note, dict(cells[0].attrs, note="1"), wrap=True)
    return [first] + [Cell("—", c.attrs, c.numeric) for c in cells[1:]]


# ---------------------------------------------------------------- pairs of heads


def pair_table_block(pairs: pd.DataFrame, name: str, caption: str, score: str = "score") -> Table:
    """A table of pairs of heads (`stats.pair_estimates.pair_table`'s rows, in the order given):
    receiver, sender, channel where the pairs have one, the score with its 95% bootstrap
    interval, n, and p / Holm."""
    channel = "channel" in pairs and pairs["channel"].astype(str).ne("").any()
    columns = ["Receiver", "Sender", *(["Channel"] if channel else [])]
    rows = [
        [
            Cell(head_name(r.layer, r.head)),
            Cell(head_name(r.sender_layer, r.sender_head)),
            *([Cell(str(r.channel))] if channel else []),
            Cell(fmt(r.score), numeric=True),
            Cell(fmt_ci(r.ci_low, r.ci_high), numeric=True),
            Cell(fmt_int(r.n), numeric=True),
            Cell(f"{fmt_p(r.p)} / {fmt_p(r.p_holm)}", numeric=True),
        ]
        for r in pairs.itertuples(index=False)
    ]
    return Table(
        name,
        caption,
        [*columns, score, "95% CI", "n", "p / Holm"],
        rows,
        [{"layer": int(l), "head": int(h)} for l, h in zip(pairs["layer"], pairs["head"])],
        collapsed=len(rows) > 40,
    )
