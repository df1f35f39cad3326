"""Report section of the dependency analysis (`headprobe.studies.dependency.analysis`; Clark et al. 2019
section 4).

    section = dependency_section(results, "dependency")   # registered as the analysis's report

Accuracy and gap heatmaps, per-relation gaps, the arcs no head can predict and the best heads;
rendering only.
"""

from __future__ import annotations

import pandas as pd

from headprobe.extend import Cell, Figure, Paragraph, Section, Table
from headprobe.inputs.corpora.base import ALL
from headprobe.report.document import slug
from headprobe.report.heatmaps import accuracy_gap_figure, gap_grid_figure
from headprobe.report.rendered_tables import LEGEND, fmt, fmt_int
from headprobe.report.selection import (
    MAX_PANELS,
    accuracy_panels,
    best_tables,
    gap_items,
    split_by_size,
)
from headprobe.scoring import registry
from headprobe.stats.head_selection import min_trials
from headprobe.studies.dependency.analysis import NOT_PER_RELATION


def dependency_section(results, analysis: str) -> Section:
    """Dependency arcs: accuracy and gap heatmaps, per-relation gaps, unreachable arcs, best heads."""
    key = slug(analysis)
    s = Section(key, "Dependency arcs (Clark et al. 2019, section 4)")
    s.add(
        Paragraph(
            "dep->head: the dependent's attention argmax (self excluded) is its head; head<-dep: of all words, "
            "the head is the one attending most to the dependent. The baseline is the best of the fixed offsets "
            "(-5..5) and the first word, per relation. root and punct arcs are not scored per relation; ALL is "
            "every other arc."
        )
    )
    labels = results.labels(analysis)
    if not labels:
        s.add(Paragraph(f"No {analysis} rows for attention heads.", note=True))
        return s
    unreachable = results.unreachable_arcs(analysis)
    if results.summary.get("causal") or (
        len(unreachable) and unreachable["unreachable"].gt(0).any()
    ):
        s.add(_unreachable_table(unreachable, key))
    main = ALL if ALL in labels else labels[0]
    panels = accuracy_panels(results, analysis, main, registry.get(analysis).directions)
    if panels:
        s.add(
            Figure(
                f"{key}_all",
                accuracy_gap_figure(panels),
                f"Dependency accuracy per head for {main} arcs, each direction (left), and accuracy minus "
                f"the in-sample best baseline (right; named in the panel title). " + LEGEND,
                alt=f"{analysis} heatmaps {main}",
            )
        )
    big, _ = split_by_size(results, analysis, labels)
    items = gap_items(results, analysis, [x for x in big if x not in NOT_PER_RELATION][:MAX_PANELS])
    if items:
        s.add(
            Figure(
                f"{key}_relations",
                gap_grid_figure(items),
                f"Per relation with at least {min_trials(analysis)} arcs (largest first): accuracy in the "
                "head's better direction minus the relation's in-sample best baseline. Blue: below the "
                "baseline, red: above. " + LEGEND,
                alt="per-relation gap heatmaps",
            )
        )
    best_tables(s, results, analysis, labels)
    return s


def _unreachable_table(unreachable: pd.DataFrame, key: str) -> Table:
    directions = list(dict.fromkeys(unreachable["direction"]))
    rows, attrs = [], []
    for label, group in unreachable.groupby("label", sort=False):
        by_direction = group.set_index("direction")
        row = [Cell(label), Cell(fmt_int(group["n"].iloc[0]), {"col": "n"}, True)]
        for d in directions:
            row += [
                Cell(fmt_int(by_direction.at[d, "unreachable"]), {"col": f"unreachable:{d}"}, True),
                Cell(fmt(by_direction.at[d, "share"]), {"col": f"share:{d}"}, True),
            ]
        rows.append(row)
        attrs.append({"label": label})
    columns = ["Relation", "Arcs"] + [x for d in directions for x in (f"unreachable {d}", "share")]
    return Table(
        f"{key}-unreachable",
        "Arcs no head can predict, per relation and direction: their row (dep->head) or column "
        "(head<-dep) holds no attention once specials and self are removed (in a decoder, the first "
        "word's row and the last word's column). They count as misses, never as hits.",
        columns,
        rows,
        attrs,
    )
