"""Report section: attention weights beside norm-based attention (METHODS §7; Kobayashi et al. 2020).

    section = measures_section(results)        # results scored with --measure weights,norms

Renders the views of `headprobe.results.measure_views`: the share of attention on [CLS]/[SEP] per layer
under each measure (with intervals when per-unit counts were kept), the surface statistics
per layer side by side, the role maps side by side, and the heads whose role changed.
"""

from __future__ import annotations

import numpy as np

from headprobe.report import figures as F
from headprobe.report.document import Cell, Figure, Paragraph, Section, Table
from headprobe.report.tables import LEGEND, fmt, fmt_ci
from headprobe.results.measure_views import role_changes, special_share, surface_side_by_side
from headprobe.stats.roles import role_colors

SURFACE_NAMES = {
    "cls": "[CLS]/BOS",
    "sep": "[SEP]/EOS",
    "first": "first position",
    "punct": "punctuation",
    "self": "self",
    "prev": "previous word",
    "next": "next word",
    "entropy_ratio": "entropy / uniform",
}


def measures_section(results) -> Section:
    first, second = results.measures[:2]
    s = Section(
        "measures",
        f"What heads pass on: {first} beside {second} (METHODS §7; Kobayashi et al. 2020)",
    )
    s.add(
        Paragraph(
            "A weight a[i, j] says how much a head looks at key j; N[i, j] = a[i, j] * ||v_j W_O|| says how much of "
            "key j reaches the head's output (v_j: the head's value vector of j, W_O: the head's block of the "
            "attention output projection). Argmax scores (dependency, coreference, positional, token patterns) "
            "use N; mass scores (surface, sinks, head similarity) use N with each row normalised to sum 1. Every "
            "other section of this report shows the first measure; every table of the results has both, in its "
            "`measure` column."
        )
    )
    share = special_share(results)
    if len(share):
        s.add(_special_share_table(share, first, second))
    side = surface_side_by_side(results)
    if len(side):
        s.add(_surface_table(side, first, second))
    _roles(s, results, first, second)
    return s


def _special_share_table(share, first: str, second: str) -> Table:
    """The share of attention on the special tokens per layer under each measure, and its change."""
    has_ci = share[f"{first}_low"].notna().any()
    rows = [
        [
            Cell(str(int(r["layer"]))),
            *[
                Cell(
                    fmt(r[m]) + (" " + fmt_ci(r[f"{m}_low"], r[f"{m}_high"]) if has_ci else ""),
                    numeric=True,
                )
                for m in (first, second)
            ],
            Cell(
                fmt(r.get("change", np.nan))
                + (
                    " " + fmt_ci(r["change_low"], r["change_high"])
                    if has_ci and "change_low" in r
                    else ""
                ),
                numeric=True,
            ),
        ]
        for _, r in share.iterrows()
    ]
    note = (
        "95% intervals: Poisson bootstrap over units, the change paired"
        if has_ci
        else "no intervals: they need per-unit counts (--keep-unit-counts)"
    )
    return Table(
        "measures-special-share",
        f"Share of a word's attention on [CLS]/BOS + [SEP]/EOS per layer, "
        f"mean over heads ({note}). Layers 0-based.",
        ["Layer", first, second, f"{second} - {first}"],
        rows,
    )


def _surface_table(side, first: str, second: str) -> Table:
    """The surface statistics per layer under each measure, and their change."""
    rows = [
        [
            Cell(SURFACE_NAMES.get(r.label, r.label)),
            Cell(str(int(r.layer))),
            Cell(fmt(getattr(r, first)), numeric=True),
            Cell(fmt(getattr(r, second)), numeric=True),
            Cell(fmt(r.change), numeric=True),
        ]
        for r in side.itertuples(index=False)
    ]
    return Table(
        "measures-surface",
        "Surface statistics per layer (mean over heads) under each measure",
        ["Statistic", "Layer", first, second, "Change"],
        rows,
        collapsed=len(rows) > 40,
    )


def _roles(s: Section, results, first: str, second: str) -> None:
    roles = results.roles
    if not len(roles):
        return
    colors = role_colors(results)
    maps = [
        (measure, roles[roles["measure"] == measure], results.n_layers, results.n_heads)
        for measure in (first, second)
    ]
    s.add(
        Figure(
            "measures_roles",
            F.role_maps_figure(maps, colors),
            f"Head-role maps: rules met on {first} (left) and on {second} (right). " + LEGEND,
            alt="role maps per measure",
        )
    )
    changed = role_changes(results)
    if not len(changed):
        s.add(Paragraph(f"No head's role differs between {first} and {second}."))
        return
    rows = [
        [
            Cell(r["name"]),
            Cell(r[f"role_{first}"]),
            Cell(r[f"detail_{first}"] or "—", wrap=True),
            Cell(r[f"role_{second}"]),
            Cell(r[f"detail_{second}"] or "—", wrap=True),
            Cell(r[f"evidence_{second}"] or r[f"evidence_{first}"] or "—", wrap=True),
        ]
        for _, r in changed.iterrows()
    ]
    s.add(
        Table(
            "measures-role-changes",
            f"What changed: the {len(rows)} heads whose role differs. " + LEGEND,
            ["Head", f"Role ({first})", "Detail", f"Role ({second})", "Detail", "Evidence"],
            rows,
            [{"layer": int(r["layer"]), "head": int(r["head"])} for _, r in changed.iterrows()],
            collapsed=len(rows) > 40,
        )
    )
