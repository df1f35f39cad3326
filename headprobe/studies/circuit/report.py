"""The circuit analysis's console lines and report section (METHODS §20): CPR and CMD in-sample
and held out, the faithfulness curves, the smallest faithful circuit's nodes, the estimates
against exact path patching.

Rendering only: every number is a stored value of `circuit_curve`, `circuit_scores`,
`circuit_nodes`, `circuit_check` or `circuit_edges`; nothing here computes a statistic.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.extend import Cell, Figure, Paragraph, Section, Table
from headprobe.report import drawing as F
from headprobe.report.document import slug
from headprobe.report.selection import described

SAMPLES = (("held_out", "held out"), ("in_sample", "in-sample"))
TOP_EDGES = 15


def _ci(value, low, high, digits: int = 3) -> str:
    if pd.isna(value):
        return "—"
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def _info(results) -> dict:
    return results.summary.get("circuit") or {}


def notes(results) -> list[str]:
    """Why a curve or the held-out half is missing, and the circuit named, in plain lines."""
    info, out = _info(results), []
    if info.get("does_task") is False:
        out.append(
            "the model does not do this task (the difference's 95% interval does not lie above "
            "0): no circuit is evaluated"
        )
        return out
    sizes = info.get("fold_units") or []
    if sizes and min(sizes) < info.get("min_fold_units", 5):
        out.append(
            f"held out: the folds hold {sizes[0]} and {sizes[1]} units, fewer than "
            f"{info.get('min_fold_units', 5)} in one: no held-out curve (only in-sample)"
        )
    smallest = info.get("smallest_faithful")
    if smallest:
        out.append(
            f"smallest faithful circuit (held-out f >= 0.8 at its interval's lower end): "
            f"{smallest[1]:,} edges ({100 * smallest[0]:g}% of the graph)"
        )
    elif not out:
        out.append("no budget short of the whole graph keeps held-out f >= 0.8 at its lower end")
    return out


def console_text(results, top: int = 8) -> str:
    scores = results.tables.get("circuit_scores")
    info = _info(results)
    if scores is None:
        return ""
    lines = [f"\ncircuits over {info.get('edges', 0):,} edges (METHODS §20):"]
    for r in scores.itertuples(index=False):
        parts = [
            f"{label} {_ci(getattr(r, key), getattr(r, f'{key}_low'), getattr(r, f'{key}_high'))}"
            for key, label in SAMPLES
            if key in scores
        ]
        lines.append(f"  {r.score} ({r.ranking} ranking)  " + "  ".join(parts))
    check = results.tables.get("circuit_check")
    for r in (check if check is not None else pd.DataFrame()).itertuples(index=False):
        lines.append(
            f"  {r.estimate} against exact path patching on {r.edges} edges: Spearman "
            f"{r.spearman:+.2f} [{r.ci_low:+.2f}, {r.ci_high:+.2f}]"
        )
    lines += ["  " + n for n in notes(results)]
    return "\n".join(lines)


@F.planned
def curve_figure(panels: list, title: str) -> F.Drawing:
    """One panel per ranking: f against the budget (log axis, as MIB plots it; the areas are on
    the linear one), held out and in-sample, each with its 95% band, and f = 1 dashed."""
    fig = F.new_figure(3.6 * len(panels) + 0.4, 3.2)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    colors = {"held_out": "#1b9e77", "in_sample": "#7570b3"}
    for ax, (label, frame) in zip(axes, panels, strict=True):
        x = 100 * frame["budget"].to_numpy(float)
        for key, name in SAMPLES:
            if f"f_{key}" not in frame:
                continue
            ax.plot(x, frame[f"f_{key}"], marker="o", markersize=3, color=colors[key], label=name)
            ax.fill_between(
                x, frame[f"f_{key}_low"], frame[f"f_{key}_high"], color=colors[key], alpha=0.2
            )
        ax.axhline(1.0, color="#999999", linewidth=0.8, linestyle="--")
        ax.set_xscale("log")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("edges in the circuit (% of the graph)", fontsize=8)
        ax.set_ylabel("faithfulness f", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].legend(fontsize=7, frameon=False)
    F.finish(fig, title)
    return F.drawing(fig)


def section(results, name: str) -> Section:
    s = Section(slug(name), "Circuits on a task")
    s.add(Paragraph(described(name)))
    curve, scores = results.tables.get("circuit_curve"), results.tables.get("circuit_scores")
    for line in notes(results):
        s.add(Paragraph(line + ".", note=True))
    if curve is not None and len(curve):
        panels = [
            (
                f"{rank} ranking ({'CPR' if rank == 'signed' else 'CMD'})",
                curve[curve["ranking"] == rank],
            )
            for rank in ("signed", "absolute")
        ]
        s.add(
            Figure(
                "circuit_curve",
                curve_figure(panels, "Faithfulness of the top edges, held out and in-sample"),
                "f = (m(C) - m_corrupted) / (m_clean - m_corrupted) for the circuit of the top "
                "edges by EAP-IG at each budget: ranked by the signed score (left; CPR is the "
                "area under it) and by the absolute score (right; CMD is the area between it and "
                "1). Held out: each fold's circuit evaluated on the other fold's examples. "
                "Bands: 95% intervals over units.",
                alt="faithfulness curves against the share of edges kept",
            )
        )
        s.add(scores_table(scores))
        s.add(curve_table(curve))
    nodes = results.tables.get("circuit_nodes")
    if nodes is not None and len(nodes):
        s.add(nodes_table(nodes))
    check = results.tables.get("circuit_check")
    edges = results.tables.get("circuit_edges")
    if check is not None and len(check):
        s.add(check_table(check))
    if edges is not None and len(edges):
        s.add(edges_table(edges))
    return s


def scores_table(scores: pd.DataFrame) -> Table:
    columns = ["score", "ranking"] + [label for key, label in SAMPLES if key in scores]
    rows = []
    for r in scores.itertuples(index=False):
        row = [Cell(r.score), Cell(r.ranking)]
        for key, _ in SAMPLES:
            if key in scores:
                row.append(
                    Cell(_ci(getattr(r, key), getattr(r, f"{key}_low"), getattr(r, f"{key}_high")),
                         numeric=True, keep=True)
                )  # fmt: skip
        rows.append(row)
    caption = (
        "CPR (area under f, signed ranking; higher is better) and CMD (area between f and 1, "
        "absolute ranking; lower is better) over the budgets, with 95% intervals"
    )
    return Table("circuit_scores", caption, columns, rows)


def curve_table(curve: pd.DataFrame) -> Table:
    columns = ["ranking", "budget", "edges"] + [
        label for key, label in SAMPLES if f"f_{key}" in curve
    ]
    rows = []
    for r in curve.itertuples(index=False):
        row = [Cell(r.ranking), Cell(f"{100 * r.budget:g}%", numeric=True),
               Cell(f"{int(r.n_edges):,}", numeric=True)]  # fmt: skip
        for key, _ in SAMPLES:
            if f"f_{key}" in curve:
                row.append(
                    Cell(_ci(getattr(r, f"f_{key}"), getattr(r, f"f_{key}_low"),
                             getattr(r, f"f_{key}_high")), numeric=True, keep=True)
                )  # fmt: skip
        rows.append(row)
    caption = "Faithfulness f per budget, with 95% intervals over units"
    return Table("circuit_curve", caption, columns, rows, collapsed=True)


def nodes_table(nodes: pd.DataFrame) -> Table:
    columns = ["node", "in edges", "out edges", "patching role", "noising share"]
    rows = [
        [Cell(r.node, keep=True), Cell(str(int(r.in_edges)), numeric=True),
         Cell(str(int(r.out_edges)), numeric=True), Cell(getattr(r, "role", "") or ""),
         Cell("—" if pd.isna(getattr(r, "noise_share", np.nan)) else f"{r.noise_share:+.2f}",
              numeric=True)]
        for r in nodes.itertuples(index=False)
    ]  # fmt: skip
    caption = (
        "The smallest faithful circuit's nodes (dangling ones pruned), with the edges kept into "
        "and out of each, its task role and its noising share from the patching analysis"
    )
    return Table("circuit_nodes", caption, columns, rows, collapsed=len(rows) > 25)


def check_table(check: pd.DataFrame) -> Table:
    rows = [
        [Cell(r.estimate), Cell(str(r.edges), numeric=True),
         Cell(_ci(r.spearman, r.ci_low, r.ci_high, 2), numeric=True, keep=True),
         Cell(r.warning or "", wrap=True)]
        for r in check.itertuples(index=False)
    ]  # fmt: skip
    caption = (
        "Spearman's rho of each estimate with exact path patching on the validation sample (the "
        "top 20 edges by |EAP-IG| and 10 drawn at random), 95% interval"
    )
    return Table("circuit_check", caption, ["estimate", "edges", "rho", "warning"], rows)


def edges_table(edges: pd.DataFrame) -> Table:
    sample = edges[edges["exact"].notna()]
    top = sample.reindex(sample["eap_ig"].abs().sort_values(ascending=False).index).head(TOP_EDGES)
    rows = [
        [Cell(r.sender, keep=True), Cell(f"{r.receiver}{'.' + r.channel if r.channel else ''}", keep=True),
         Cell(f"{r.eap:+.3f}", numeric=True), Cell(f"{r.eap_ig:+.3f}", numeric=True),
         Cell(f"{r.exact:+.3f}", numeric=True)]
        for r in top.itertuples(index=False)
    ]  # fmt: skip
    caption = (
        f"The {len(top)} validation edges with the largest |EAP-IG|: the estimates beside the "
        "exact effect of taking the edge alone out (mean per example)"
    )
    return Table("circuit_edges", caption, ["sender", "receiver", "EAP", "EAP-IG", "exact"], rows)
