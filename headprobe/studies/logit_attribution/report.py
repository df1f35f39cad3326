"""The report section of what a head writes into the logits (METHODS §9; rendering only)

    logit_section(results, "logit_attribution")   # DLA and share > 0 maps, writers and suppressors

Every number is a stored value of `logit_attribution_heads`, `logit_attribution_writers` or
`best_heads`; nothing here computes a statistic.
"""

from __future__ import annotations

import pandas as pd

from headprobe.extend import Cell, Paragraph, Section, Table
from headprobe.report.document import slug
from headprobe.report.rendered_tables import LEGEND, fmt, fmt_ci, head_name
from headprobe.report.selection import described, head_maps

TOP = 10


def _dla_rows(table: pd.DataFrame) -> list[list[Cell]]:
    return [
        [
            Cell(head_name(r.layer, r.head)),
            Cell(fmt(r.dla, 4), numeric=True),
            Cell(fmt_ci(r.dla_low, r.dla_high, 4), numeric=True),
            Cell(fmt(r.fold0, 4), numeric=True),
            Cell(fmt(r.fold1, 4), numeric=True),
            Cell(fmt(r.share_positive, 3), numeric=True),
            Cell(fmt_ci(r.share_low, r.share_high, 3), numeric=True),
        ]
        for r in table.itertuples(index=False)
    ]


def _held_out(results, analysis: str) -> str:
    """One sentence: the best head by mean DLA chosen on one half of the units and reported on
    the other, both halves pooled (`best_heads`)."""
    best = results.best_heads
    if best is None or not len(best) or "selection" not in best:
        return ""
    rows = best[
        (best["analysis"] == analysis)
        & (best["selection"] == "held-out")
        & (best["label"] == "dla")
        & (best["fold"].isna() | (best["fold"].astype(str).isin(["", "None", "nan"])))
    ]
    if not len(rows):
        return ""
    r = rows.iloc[0]
    return (
        f"Held out (chosen on one half of the units, reported on the other, pooled): heads "
        f"{r['heads']}, mean DLA {fmt(r['accuracy'], 4)} {fmt_ci(r['ci_low'], r['ci_high'], 4)}."
    )


def logit_section(results, analysis: str) -> Section:
    """Direct logit attribution: maps of mean DLA and share DLA > 0, the writers and the suppressors."""
    s = Section(slug(analysis), f"What a head writes: {analysis}")
    s.add(Paragraph(described(analysis)))
    table = results.tables.get(f"{analysis}_heads")
    if table is None or not len(table):
        s.add(Paragraph(f"No {analysis} rows.", note=True))
        return s
    s.add(Paragraph(f"Scored positions: {int(table['n'].iloc[0]):,}."))
    items = [("mean DLA", table, "dla")]
    s.add(
        head_maps(results, f"{slug(analysis)}_dla", items, "logit units", center=0.0, cmap="RdBu_r")
    )
    items = [("share DLA > 0", table, "share_positive")]
    s.add(head_maps(results, f"{slug(analysis)}_share", items, "share of positions"))
    writers = results.tables.get(f"{analysis}_writers", pd.DataFrame())
    columns = ["Head", "mean DLA", "95% CI", "fold 0", "fold 1", "share > 0", "95% CI"]
    for kind, caption in (
        ("writes", "The heads that write the next token most (largest mean DLA)"),
        ("suppresses", "The heads that suppress the next token most (most negative mean DLA)"),
    ):
        chosen = writers[writers["kind"] == kind] if len(writers) else writers
        if len(chosen):
            s.add(
                Table(
                    f"{slug(analysis)}-{kind}", caption + ". " + LEGEND, columns, _dla_rows(chosen)
                )
            )
    held = _held_out(results, analysis)
    if held:
        s.add(Paragraph(held))
    return s
