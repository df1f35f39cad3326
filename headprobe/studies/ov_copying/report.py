"""The report section of what a head copies (METHODS §9; rendering only)

    ov_section(results, "ov_copying")             # copying score and copy rate maps, top copiers

Every number is a stored value of `ov_copying_heads`; nothing here computes a statistic.
"""

from __future__ import annotations

from headprobe.extend import Cell, Paragraph, Section, Table
from headprobe.report.document import slug
from headprobe.report.rendered_tables import LEGEND, fmt, fmt_ci, head_name
from headprobe.report.selection import described, head_maps

TOP = 10


def ov_section(results, analysis: str) -> Section:
    """OV copying: maps of copying score and copy rate, and the heads that copy most."""
    s = Section(slug(analysis), f"What a head copies: {analysis}")
    s.add(Paragraph(described(analysis)))
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
        head_maps(
            results,
            f"{slug(analysis)}_score",
            [("copying score", table, "copying")],
            "score",
            0.0,
            "RdBu_r",
        )
    )
    s.add(
        head_maps(results, f"{slug(analysis)}_rate", [("copy rate", table, "copy_rate")], "share")
    )
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
