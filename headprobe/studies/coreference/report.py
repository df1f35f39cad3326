"""Report section of the coreference analysis (`headprobe.studies.coreference.analysis`; Clark et al.
2019 section 5).

    section = coreference_section(results, "coreference")   # registered as the analysis's report

Accuracy and gap heatmaps per mention kind and the best heads; rendering only.
"""

from __future__ import annotations

from headprobe.extend import Figure, Paragraph, Section
from headprobe.report.document import slug
from headprobe.report.heatmaps import accuracy_gap_figure
from headprobe.report.rendered_tables import LEGEND
from headprobe.report.selection import accuracy_panels, best_tables


def coreference_section(results, analysis: str) -> Section:
    """Coreference: accuracy and gap heatmaps per mention kind, best heads."""
    s = Section(slug(analysis), "Coreference (Clark et al. 2019, section 5)")
    s.add(
        Paragraph(
            "A mention's head word scores a hit when the candidate it attends to most is the head of a mention "
            "of its own cluster. Baselines: nearest (latest-starting candidate), head_match (same head word, "
            "else nearest) and, where present, a rule-based baseline."
        )
    )
    kinds = results.labels(analysis)
    panels = [p for kind in kinds for p in accuracy_panels(results, analysis, kind, [""])]
    if panels:
        s.add(
            Figure(
                slug(analysis),
                accuracy_gap_figure(panels),
                "Coreference accuracy per head for each mention kind (left) and accuracy minus the in-sample "
                "best baseline (right). " + LEGEND,
                alt=f"{analysis} heatmaps",
            )
        )
    else:
        s.add(Paragraph(f"No {analysis} rows for attention heads.", note=True))
    best_tables(s, results, analysis, kinds)
    return s
