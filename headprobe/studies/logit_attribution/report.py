"""Report sections of what a head writes (METHODS §9; rendering only, the numbers are Results tables)

    logit_section(results, "logit_attribution")   # DLA and share > 0 maps, writers and suppressors
    ov_section(results, "ov_copying")             # copying score and copy rate maps, top copiers

Every number is a stored value of `logit_attribution_heads`, `logit_attribution_writers`,
`ov_copying_heads` or `best_heads`; nothing here computes a statistic.
"""

from __future__ import annotations

import pandas as pd

from headprobe.report import figures as F
from headprobe.report.document import Cell, Figure, Paragraph, Section, Table, slug
from headprobe.report.tables import LEGEND, fmt, fmt_ci, head_name, to_matrix
from headprobe.scorers import registry

TOP = 10


def _described(analysis: str) -> str:
    text = registry.get(analysis).description
    return text[0].upper() + text[1:] + "." if text else ""


def _map(results, name: str, items, cbar: str, center=None, cmap="viridis") -> Figure:
    """Layer x head maps of several columns of one per-head table, one colour scale."""
    n_layers, n_heads = results.n_layers, results.n_heads
    return Figure(
        name,
        F.heatmap_grid_figure(
            [
                (title, to_matrix(table, column, n_layers, n_heads))
                for title, table, column in items
            ],
            cbar_label=cbar,
            center=center,
            cmap=cmap,
        ),
        ", ".join(title for title, _, _ in items) + " per head. " + LEGEND,
        alt=f"{name} heatmaps",
    )


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
    s.add(Paragraph(_described(analysis)))
    table = results.tables.get(f"{analysis}_heads")
    if table is None or not len(table):
        s.add(Paragraph(f"No {analysis} rows.", note=True))
        return s
    s.add(Paragraph(f"Scored positions: {int(table['n'].iloc[0]):,}."))
    items = [("mean DLA", table, "dla")]
    s.add(_map(results, f"{slug(analysis)}_dla", items, "logit units", center=0.0, cmap="RdBu_r"))
    items = [("share DLA > 0", table, "share_positive")]
    s.add(_map(results, f"{slug(analysis)}_share", items, "share of positions"))
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


def ov_section(results, analysis: str) -> Section:
    """OV copying: maps of copying score and copy rate, and the heads that copy most."""
    s = Section(slug(analysis), f"What a head copies: {analysis}")
    s.add(Paragraph(_described(analysis)))
    table = results.tables.get(f"{analysis}_heads")
    if table is None or not len(table):
        s.add(Paragraph(f"No {analysis} rows.", note=True))
        return s
    r0 = table.iloc[0]
    s.add(
        Paragraph(
            f"W_U: {r0['unembedding']}; copy rate over {int(r0['n']):,} sampled tokens, "
            f"own id in the top {int(r0['top_k'])}."
        )
    )
    s.add(
        _map(
            results,
            f"{slug(analysis)}_score",
            [("copying score", table, "copying")],
            "score",
            0.0,
            "RdBu_r",
        )
    )
    s.add(_map(results, f"{slug(analysis)}_rate", [("copy rate", table, "copy_rate")], "share"))
    top = table.sort_values(["copy_rate", "copying"], ascending=False, kind="stable").head(TOP)
    s.add(
        Table(
            f"{slug(analysis)}-top",
            f"The {len(top)} heads with the highest copy rate (Wilson 95% interval). " + LEGEND,
            ["Head", "copying score", "copy rate", "95% CI", "tokens"],
            [
                [
                    Cell(head_name(r.layer, r.head)),
                    Cell(fmt(r.copying, 3), numeric=True),
                    Cell(fmt(r.copy_rate, 3), numeric=True),
                    Cell(fmt_ci(r.copy_low, r.copy_high, 3), numeric=True),
                    Cell(f"{int(r.n):,}", numeric=True),
                ]
                for r in top.itertuples(index=False)
            ],
        )
    )
    return s
