"""Report section of the parsing analysis (Clark et al. 2019 section 6; Htut et al. 2019).

    section = parsing_section(results, "parsing")     # registered as the analysis's report

Renders the stored `parse_scores`, `parse_gaps` and `parse_heads` tables: the
attention-only classifier against the best single head and the best offset baseline (UAS),
maximum spanning trees (UUAS) per head and over the classifier, with bootstrap intervals.
"""

from __future__ import annotations

import pandas as pd

from headprobe.extend import Cell, Figure, Paragraph, Section, Table
from headprobe.report.document import slug
from headprobe.report.heatmaps import heatmap_grid_figure
from headprobe.report.rendered_tables import LEGEND, fmt, fmt_ci, fmt_int, to_matrix


def parsing_section(results, analysis: str) -> Section:
    """The classifier's and the trees' scores, paired gaps, per-head accuracy (the analysis's tables)."""
    s = Section(
        slug(analysis), "Parsing with all heads (Clark et al. 2019, section 6; Htut et al. 2019)"
    )
    s.add(
        Paragraph(
            "Arcs: every arc but root and punct. The attention-only classifier (Clark et al.'s probe; 'probe' in the tables) scores a candidate head j of word i "
            "with a linear combination of every head's A[i, j] and A[j, i] and predicts the argmax over the other "
            "words of the sentence (softmax over them when fitting); it is fitted on one half of the units (METHODS §5 "
            "folds) and evaluated on the other, both ways, so its accuracy is held-out. Single heads and baselines "
            "are shown selected held-out (on the other half) and in-sample (on all data, as the papers did). Trees: "
            "a head's maximum spanning tree over A[d, h] + A[h, d], and the maximum spanning arborescence over the "
            "classifier's log-probabilities (Chu-Liu-Edmonds from a dummy root); UUAS counts a gold arc found as an "
            "undirected tree edge; 'chain' links adjacent words. Intervals: 95% Poisson bootstrap over units; "
            "differences are paired (same arcs, same resamples)."
        )
    )
    scores = results.table("parse_scores") if "parse_scores" in results.tables else pd.DataFrame()
    if not len(scores):
        s.add(Paragraph(f"No {analysis} rows in the results.", note=True))
        return s
    conventions = (results.summary.get("conventions") or {}).get("name")
    if conventions:
        s.add(
            Paragraph(
                f"Conventions: {conventions} (offset baselines as that preset defines them).",
                note=True,
            )
        )
    s.add(_scores_table(scores))
    s.add(_gaps_table(results.table("parse_gaps")))
    heads = results.table("parse_heads")
    figure = _heads_figure(heads, results.n_layers, results.n_heads, analysis)
    if figure is not None:
        s.add(figure)
    s.add(_mst_table(heads))
    return s


def _scores_table(scores) -> Table:
    """`parse_scores`: every predictor's accuracy with its interval."""
    rows = [
        [
            Cell(r.metric),
            Cell(r.predictor),
            Cell(r.selection),
            Cell(r.heads or r.variant or "—"),
            Cell(fmt_int(r.n), numeric=True),
            Cell(fmt(r.accuracy), numeric=True),
            Cell(fmt_ci(r.ci_low, r.ci_high), numeric=True),
            Cell(r.note or ""),
        ]
        for r in scores.itertuples(index=False)
    ]
    return Table(
        "parse-scores",
        "The classifier (probe), trees, best single head and baselines. " + LEGEND,
        [
            "Metric",
            "Predictor",
            "Selection",
            "Head / baseline",
            "Arcs",
            "Accuracy",
            "95% CI",
            "Note",
        ],
        rows,
    )


def _gaps_table(gaps) -> Table:
    """`parse_gaps`: the paired differences between predictors."""
    rows = [
        [
            Cell(r.metric),
            Cell(f"{r.predictor} - {r.versus}"),
            Cell(r.selection),
            Cell(fmt(r.gap), numeric=True),
            Cell(fmt_ci(r.gap_low, r.gap_high), numeric=True),
            Cell("yes" if r.gap_low > 0 or r.gap_high < 0 else "no"),
        ]
        for r in gaps.itertuples(index=False)
    ]
    return Table(
        "parse-gaps",
        "Paired differences (the single head's or baseline's selection as stated; the "
        "classifier (probe) is always held-out)",
        ["Metric", "Difference", "Selection", "Gap", "95% CI", "Excludes 0"],
        rows,
    )


def _heads_figure(heads, n_layers: int, n_heads: int, analysis: str) -> Figure | None:
    """Per head (`parse_heads`): argmax accuracy in each direction and the UUAS of its tree."""
    items = []
    for direction, title in (
        ("dep->head", "argmax UAS, dep->head"),
        ("head<-dep", "argmax UAS, head<-dep"),
        ("mst", "MST UUAS (A + A^T)"),
    ):
        one = heads[heads["direction"] == direction]
        if len(one):
            items.append((title, to_matrix(one, "accuracy", n_layers, n_heads)))
    if not items:
        return None
    return Figure(
        f"{slug(analysis)}_heads",
        heatmap_grid_figure(items, cbar_label="accuracy", vmin=0, vmax=1),
        "Per head, on the parsing arcs: argmax accuracy in each direction and the UUAS of its maximum "
        "spanning tree. " + LEGEND,
        alt="per-head parsing accuracy",
    )


def _mst_table(heads) -> Table:
    """The UUAS of every head's maximum spanning tree, best first."""
    mst = heads[heads["direction"] == "mst"].sort_values("accuracy", ascending=False, kind="stable")
    rows = [
        [
            Cell(f"{int(r.layer)}-{int(r.head)}"),
            Cell(fmt(r.accuracy), numeric=True),
            Cell(fmt_ci(r.ci_low, r.ci_high), numeric=True),
        ]
        for r in mst.itertuples(index=False)
    ]
    return Table(
        "parse-mst-heads",
        "MST UUAS of every head (in-sample), best first. " + LEGEND,
        ["Head", "UUAS", "95% CI"],
        rows,
        [{"layer": int(l), "head": int(h)} for l, h in zip(mst["layer"], mst["head"])],
        collapsed=True,
    )
