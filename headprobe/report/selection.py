"""What the report shows of a selection analysis (best heads, intervals): the primitives its
section is built from (`default_section`, and the sections the analyses declare).

    panels = accuracy_panels(results, "dependency", "ALL", ["dep->head", "head<-dep"])
    items = gap_items(results, analysis, labels)        # per label: the heads' gap to the baseline
    best_tables(section, results, analysis, labels)     # best heads, small labels apart

Rendering only: every number is a stored value of `best_heads`, `head_scores` or `head_tests`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.report.document import Figure, Section
from headprobe.report.heatmaps import heatmap_grid_figure
from headprobe.report.rendered_tables import LEGEND, best_heads_table, to_matrix
from headprobe.scoring import registry
from headprobe.stats.head_selection import min_trials

MAX_PANELS = 12  # the most heatmap panels a section draws


def described(analysis: str) -> str:
    """The registered description of `analysis` as a sentence ("" for a name not registered)."""
    try:
        text = registry.get(analysis).description
    except ValueError:
        return ""
    return text[0].upper() + text[1:] + "." if text else ""


def head_maps(results, name: str, items, cbar: str, center=None, cmap="viridis") -> Figure:
    """Layer x head maps of several columns of per-head tables, one colour scale: `items` are
    (title, table, column)."""
    n_layers, n_heads = results.n_layers, results.n_heads
    return Figure(
        name,
        heatmap_grid_figure(
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


def accuracy_panels(results, analysis: str, label: str, directions) -> list:
    """(title, accuracy [layer, head], accuracy - in-sample best baseline or None, baseline text)."""
    best = results.best_head(analysis, label)
    variant = best["baseline_variant"] if best is not None else ""
    base = best["baseline_accuracy"] if best is not None else np.nan
    panels = []
    for direction in directions:
        scores = results.head_scores(analysis, label, direction or None)
        if not len(scores):
            continue
        acc = to_matrix(scores, "accuracy", results.n_layers, results.n_heads)
        title = f"{label}, {direction}" if direction else label
        if variant and not pd.isna(base):
            panels.append((title, acc, acc - base, f"{variant}: {base:.4f}"))
        else:
            panels.append((title, acc, None, "none"))
    return panels


def gap_items(results, analysis: str, labels: list[str]) -> list:
    """Per label: (title, [layer, head] accuracy in each head's better direction minus the
    in-sample best baseline), from `head_tests`."""
    tests = results.head_tests
    items = []
    for label in labels:
        t = tests[(tests["analysis"] == analysis) & (tests["label"] == label)]
        if len(t):
            items.append(
                (
                    f"{label} (vs {t['baseline_variant'].iloc[0]})",
                    to_matrix(t, "gap", results.n_layers, results.n_heads),
                )
            )
    return items


def split_by_size(results, analysis: str, labels: list[str]) -> tuple[list[str], list[str]]:
    """Labels with at least the analysis's `min_n` trials, and the rest."""
    min_n = min_trials(analysis)
    rows = {label: results.best_head(analysis, label) for label in labels}
    big = [x for x in labels if rows[x] is not None and rows[x]["n"] >= min_n]
    return big, [x for x in labels if x not in big]


def best_tables(s: Section, results, analysis: str, labels: list[str]) -> None:
    big, small = split_by_size(results, analysis, labels)
    s.add(best_heads_table(results, analysis, big))
    if small:
        table = best_heads_table(results, analysis, small, name=f"{analysis}-top-heads-small")
        table.caption = (
            f"Labels with fewer than {min_trials(analysis)} trials (same columns): shown with their "
            f"counts, never named a best head"
        )
        table.collapsed = True
        s.add(table)
