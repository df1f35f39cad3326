"""The patching analysis's console lines, report section and head cards (METHODS §19): the
metric first, layer x head heatmaps of the three effects' shares, the task roles with their
evidence, the estimates against the exact values, the largest nodes.

Rendering only: every number is a stored value of `patching_metric`, `patching_nodes`,
`patching_check` or `patching_heads`; nothing here computes a statistic.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.extend import Cell, Figure, Paragraph, Section, Table
from headprobe.report import drawing as F
from headprobe.report.document import slug
from headprobe.report.selection import described
from headprobe.stats.head_selection import min_trials
from headprobe.studies.patching.task_roles import ALPHA, RULES, TASK_ROLES

EFFECTS = (("noise", "noising"), ("denoise", "denoising"), ("direct", "direct effect"))
TOP_NODES = 12
CARD_KEYS = 6  # pieces a head card names from its attention row


def _ci(value, low, high, digits: int = 2) -> str:
    if pd.isna(value):
        return "—"
    return f"{value:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def metric_line(metric: pd.DataFrame) -> str:
    m = metric.set_index("metric")
    parts = [
        f"{name} {_ci(m.loc[name, 'value'], m.loc[name, 'low'], m.loc[name, 'high'])}"
        for name in ("clean", "corrupted", "difference")
    ]
    n = int(m.loc["clean", "n"])
    return f"logit difference (answer - distractor), mean of {n:,} examples: " + "; ".join(parts)


def failed_line() -> str:
    return (
        "the model does not do this task (the difference's 95% interval does not lie above 0): "
        "no head is named"
    )


def few_line(results) -> str:
    units = (results.summary.get("patching") or {}).get("units", 0)
    return f"{units} units, fewer than {min_trials('patching')}: no head is named (METHODS §5)"


def too_few(results) -> bool:
    info = results.summary.get("patching") or {}
    return not info.get("enough_units", True)


def console_text(results, top: int = 8) -> str:
    """What the CLI prints after a task run."""
    metric = results.tables.get("patching_metric")
    if metric is None or not len(metric):
        return ""
    summary = results.task_summary()
    lines = [f"\ntask '{summary['task']}': " + metric_line(metric)]
    if not summary["does_task"]:
        return "\n".join(lines + ["  " + failed_line()])
    if too_few(results):
        lines.append("  " + few_line(results))
    nodes = results.tables["patching_nodes"]
    best = nodes.reindex(nodes["noise"].abs().sort_values(ascending=False).index).head(top)
    lines.append("  largest noising effects (share of the difference [95% CI]):")
    for r in best.itertuples(index=False):
        lines.append(
            f"    {r.node:>7}  noise {_ci(r.noise_share, r.noise_share_low, r.noise_share_high)}"
            f"  denoise {_ci(r.denoise_share, r.denoise_share_low, r.denoise_share_high)}"
            f"  direct {_ci(r.direct_share, r.direct_share_low, r.direct_share_high)}"
        )
    heads = results.tables.get("patching_heads")
    for role in TASK_ROLES:
        mine = heads[heads["role"] == role] if heads is not None and len(heads) else []
        if len(mine):
            names = ", ".join(f"{int(r.layer)}-{int(r.head)}" for r in mine.itertuples())
            lines.append(f"  {role} ({RULES[role]}): {names}")
    check = results.tables.get("patching_check")
    for r in (check if check is not None else pd.DataFrame()).itertuples(index=False):
        lines.append(
            f"  estimate {r.estimate} against the exact {r.effect} over {r.nodes} nodes: "
            f"Spearman {_ci(r.spearman, r.ci_low, r.ci_high)}"
        )
        if isinstance(r.warning, str) and r.warning:
            lines.append(f"  WARNING: {r.warning}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- figures
def grid(nodes: pd.DataFrame, column: str, n_layers: int, n_heads: int) -> np.ndarray:
    """[layer, head] of a head column of `patching_nodes` (NaN where absent)."""
    mat = np.full((n_layers, n_heads), np.nan)
    heads = nodes[nodes["head"] >= 0]
    mat[heads["layer"].to_numpy(int), heads["head"].to_numpy(int)] = heads[column].to_numpy(float)
    return mat


@F.planned
def effects_figure(panels: list, marks: list, title: str) -> F.Drawing:
    """One layer x head heatmap per effect's share, one diverging scale centred at 0; a dot marks
    the cells whose effect is significant (`p_holm` < 0.05)."""
    from headprobe.report.heatmaps import draw_heatmap, small_panel_size, thin_ticks

    n_layers, n_heads = panels[0][1].shape
    w, h = small_panel_size(n_layers, n_heads)
    fig = F.new_figure(len(panels) * w + 0.9, h + 0.6)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    finite = np.concatenate([m[np.isfinite(m)] for _, m in panels] + [np.zeros(1)])
    lim = float(np.abs(finite).max()) or 1.0
    mesh = None
    for ax, (label, mat), mark in zip(axes, panels, marks):
        text = np.where(mark, "•", "").astype(object)
        mesh = draw_heatmap(
            ax, mat, cmap="RdBu_r", vmin=-lim, vmax=lim, annot_text=text, cbar_label=None
        )
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("head (0-based)", fontsize=8)
        ax.set_ylabel("layer (0-based)", fontsize=8)
        thin_ticks(ax, n_layers, n_heads)
    F.finish(fig, title, right=0.9)
    bar = fig.add_axes((1 - 0.7 / fig.get_figwidth(), 0.2, 0.12 / fig.get_figwidth(), 0.6))
    cb = fig.colorbar(mesh, cax=bar)
    cb.set_label("share of m_clean - m_corrupted", fontsize=8)
    cb.ax.tick_params(labelsize=7)
    return F.drawing(fig)


@F.planned
def estimates_figure(points: list, title: str) -> F.Drawing:
    """One scatter per (estimate, effect): a point per node, the estimate against the exact value,
    the diagonal drawn."""
    fig = F.new_figure(3.0 * len(points) + 0.4, 3.2)
    axes = fig.subplots(1, len(points), squeeze=False)[0]
    for ax, (label, exact, estimate, kinds) in zip(axes, points, strict=True):
        colors = {"head": "#4c72b0", "mlp": "#dd8452", "embed": "#55a868"}
        for kind in ("head", "mlp", "embed"):
            mine = np.asarray(kinds) == kind
            ax.scatter(np.asarray(exact)[mine], np.asarray(estimate)[mine], s=9, alpha=0.7,
                       color=colors[kind], label=kind)  # fmt: skip
        lo = float(np.nanmin([np.nanmin(exact), np.nanmin(estimate)]))
        hi = float(np.nanmax([np.nanmax(exact), np.nanmax(estimate)]))
        ax.plot([lo, hi], [lo, hi], color="#999999", linewidth=0.8, linestyle="--")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("exact (mean per example)", fontsize=8)
        ax.set_ylabel("estimate", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].legend(fontsize=7, frameon=False)
    F.finish(fig, title)
    return F.drawing(fig)


# ---------------------------------------------------------------------------------- section
def section(results, name: str) -> Section:
    s = Section(slug(name), "Heads on a task: patching")
    s.add(Paragraph(described(name)))
    metric = results.tables.get("patching_metric")
    if metric is None or not len(metric):
        s.add(Paragraph("No patching tables in these results.", note=True))
        return s
    summary = results.task_summary()
    s.add(Paragraph(f"Task '{summary['task']}': {metric_line(metric)}."))
    s.add(metric_table(metric))
    if not summary["does_task"]:
        s.add(Paragraph(failed_line() + ".", note=True))
    elif too_few(results):
        s.add(Paragraph(few_line(results) + ".", note=True))
    nodes = results.tables["patching_nodes"]
    n_layers, n_heads = results.n_layers, results.n_heads
    panels, marks = [], []
    for column, label in EFFECTS:
        if nodes[f"{column}_share"].notna().any():
            panels.append((label, grid(nodes, f"{column}_share", n_layers, n_heads)))
            p = "p_holm" if column == "direct" else f"p_holm_{column}"
            marks.append(grid(nodes, p, n_layers, n_heads) < ALPHA)
    s.add(
        Figure(
            "patching_effects",
            effects_figure(panels, marks, "Each head's effect as a share of the difference"),
            "Noising (the clean run with the head's output from the corrupted one), denoising "
            "(the reverse) and the direct effect (only the head's write to the final residual "
            "stream changed), each as a share of m_clean - m_corrupted, on a diverging scale "
            "centred at 0 (red: the head carries the behaviour). A dot marks a significant "
            "effect (Holm over every node, p < 0.05). Layers and heads are 0-based.",
            alt="layer by head heatmaps of the noising, denoising and direct effects",
        )
    )
    s.add(nodes_table(nodes))
    if summary["does_task"]:
        s.add(roles_table(results.tables.get("patching_heads")))
    check = results.tables.get("patching_check")
    if check is not None and len(check):
        s.add(estimates_block(nodes, check))
        s.add(check_table(check))
    return s


def metric_table(metric: pd.DataFrame) -> Table:
    rows = [
        [Cell(r.metric), Cell(f"{r.value:+.3f}", numeric=True),
         Cell(f"[{r.low:+.3f}, {r.high:+.3f}]", numeric=True, keep=True), Cell(f"{int(r.n):,}", numeric=True)]
        for r in metric.itertuples(index=False)
    ]  # fmt: skip
    caption = "The metric, logit[answer] - logit[distractor] at the scored piece: mean per example, 95% interval"
    return Table("patching_metric", caption, ["prompt", "mean", "95% CI", "examples"], rows)


def nodes_table(nodes: pd.DataFrame) -> Table:
    top = nodes.reindex(nodes["noise"].abs().sort_values(ascending=False).index).head(TOP_NODES)
    rows = [
        [Cell(r.node, keep=True),
         Cell(_ci(r.noise_share, r.noise_share_low, r.noise_share_high), numeric=True, keep=True),
         Cell(_ci(r.denoise_share, r.denoise_share_low, r.denoise_share_high), numeric=True, keep=True),
         Cell(_ci(r.direct_share, r.direct_share_low, r.direct_share_high), numeric=True, keep=True),
         Cell(f"{r.p_holm:.2g}", numeric=True), Cell(r.role or "")]
        for r in top.itertuples(index=False)
    ]  # fmt: skip
    columns = ["node", "noising", "denoising", "direct", "p_holm", "role"]
    caption = (
        f"The {len(top)} nodes with the largest noising effect (heads L-H, MLPs, the embeddings): "
        "each effect as a share of the difference, with its 95% interval"
    )
    return Table("patching_top_nodes", caption, columns, rows)


def roles_table(heads: pd.DataFrame | None) -> Table:
    columns = ["head", "role", "direct", "answer part", "distractor part", "evidence"]
    rows = []
    for r in (heads if heads is not None else pd.DataFrame()).itertuples(index=False):
        rows.append(
            [Cell(f"{int(r.layer)}-{int(r.head)}", keep=True), Cell(r.role, keep=True),
             Cell(f"{r.direct:+.3f}", numeric=True), Cell(f"{r.direct_answer:+.3f}", numeric=True),
             Cell(f"{r.direct_distractor:+.3f}", numeric=True), Cell(r.evidence, wrap=True)]
        )  # fmt: skip
    rules = "; ".join(f"{role}: {RULES[role]}" for role in TASK_ROLES)
    caption = f"Movers, suppressors, negative movers and other significant heads ({rules})"
    return Table("patching_roles", caption, columns, rows, collapsed=len(rows) > 20)


def estimates_block(nodes: pd.DataFrame, check: pd.DataFrame) -> Figure:
    kinds = np.where(nodes["head"] >= 0, "head", np.where(nodes["node"] == "embed", "embed", "mlp"))
    points = []
    for r in check.itertuples(index=False):
        column = f"{r.estimate.replace('*', '_star')}_{r.effect}"
        points.append(
            (f"{r.estimate} ({r.effect})", nodes[r.effect].tolist(), nodes[column].tolist(),
             kinds.tolist())
        )  # fmt: skip
    return Figure(
        "patching_estimates",
        estimates_figure(points, "Estimates against the exact values, one point per node"),
        "Each first-order estimate against the exact effect it estimates, per node (mean per "
        "example); the dashed line is equality. The table below gives the rank correlations.",
        alt="scatter plots of the estimates against the exact effects",
    )


def check_table(check: pd.DataFrame) -> Table:
    rows = [
        [Cell(r.estimate), Cell(r.effect), Cell(str(r.nodes), numeric=True),
         Cell(_ci(r.spearman, r.ci_low, r.ci_high), numeric=True, keep=True),
         Cell(r.warning or "", wrap=True)]
        for r in check.itertuples(index=False)
    ]  # fmt: skip
    caption = "Spearman's rho of each estimate with the exact values over every node, 95% interval"
    return Table("patching_check", caption, ["estimate", "effect", "nodes", "rho", "warning"], rows)


# ---------------------------------------------------------------------------------- cards
def card(results) -> tuple[str, dict]:
    """Each head's task effects and, where the run kept it, its attention row from the scored
    piece of the task's first example."""
    nodes = results.tables.get("patching_nodes")
    if nodes is None or not len(nodes):
        return "Task", {}
    row = results.task_summary().get("attention_row") or {}
    lines = {}
    for r in nodes[nodes["head"] >= 0].itertuples(index=False):
        key = (int(r.layer), int(r.head))
        lines[key] = [
            f"noising {_ci(r.noise_share, r.noise_share_low, r.noise_share_high)}, denoising "
            f"{_ci(r.denoise_share, r.denoise_share_low, r.denoise_share_high)}, direct "
            f"{_ci(r.direct_share, r.direct_share_low, r.direct_share_high)} (shares)"
            + (f"; task role: {r.role}" if r.role else "")
        ]
        weights = row.get("weights", {}).get(f"{key[0]}-{key[1]}")
        if weights:
            pieces = row["pieces"]
            order = np.argsort(weights)[::-1][:CARD_KEYS]
            lines[key].append(
                "attention from the scored piece (first example): "
                + ", ".join(f"{pieces[k]!r} {weights[k]:.2f}" for k in order)
            )
    return "Task: effects (share of the difference) and attention from the scored piece", lines
