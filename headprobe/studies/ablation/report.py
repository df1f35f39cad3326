"""Report sections of the ablation analyses (`headprobe.studies.ablation.analysis`): does the head matter?

    importance_section(results, "importance")   # heatmap, top heads, role + importance rank, scatter
    prune_section(results, "prune_curve")         # the pruning curve and its table

Rendering only: every number is a stored value of `importance_heads` / `ablation_heads`,
`head_ranks`, `prune_curve` or `roles` (its `score` and `importance_*` columns); nothing
here computes a statistic.
"""

from __future__ import annotations

import pandas as pd

from headprobe.extend import Cell, Figure, Paragraph, Section, Table
from headprobe.report.document import slug
from headprobe.report.drawing import Drawing, drawing, finish, new_figure, planned
from headprobe.report.heatmaps import heatmap_grid_figure
from headprobe.report.rendered_tables import LEGEND, fmt, fmt_ci, fmt_int, head_name, to_matrix
from headprobe.report.selection import described
from headprobe.scoring import registry
from headprobe.stats.roles import NONE, importance_ranks, role_colors

TOP_HEADS = 10


# ---------------------------------------------------------------- text


def role_with_importance(row) -> str:
    """'syntactic (nsubj), importance rank 3 of 72' of a `roles` row (role alone without ranks)."""
    role = row["role"] if not row.get("detail") else f"{row['role']} ({row['detail']})"
    rank = row.get("importance_rank")
    if rank is None or pd.isna(rank):
        return role
    return f"{role}, {row['importance_by']} rank {int(rank)} of {int(row['importance_of'])}"


# ---------------------------------------------------------------- figures


@planned
def prune_figure(curve: pd.DataFrame, title: str) -> Drawing:
    """The objective (with its 95% interval) against the share of heads removed."""
    fig = new_figure(5.2, 3.4)
    ax = fig.subplots()
    x = curve["fraction"].to_numpy(float) * 100
    ax.fill_between(
        x,
        curve["ci_low"].to_numpy(float),
        curve["ci_high"].to_numpy(float),
        alpha=0.25,
        color="#4c72b0",
        linewidth=0,
        label="95% interval",
    )
    ax.plot(x, curve["value"].to_numpy(float), marker="o", color="#4c72b0", label="objective")
    ax.set_xlabel("heads removed (%), least important first", fontsize=8)
    ax.set_ylabel("objective", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7)
    finish(fig)
    return drawing(fig)


@planned
def role_importance_figure(roles: pd.DataFrame, colors: dict[str, str], by: str) -> Drawing:
    """Each head with a role: the number that decided its role against its importance."""
    fig = new_figure(5.6, 3.8)
    ax = fig.subplots()
    shown = roles[
        (roles["role"] != NONE) & roles["score"].notna() & roles["importance_score"].notna()
    ]
    for role, group in shown.groupby("role", sort=False):
        ax.scatter(
            group["importance_score"],
            group["score"],
            s=22,
            color=colors.get(role, "#333333"),
            label=role,
            edgecolor="white",
            linewidth=0.4,
        )
        for r in group.itertuples(index=False):
            ax.annotate(
                r.name,
                (r.importance_score, r.score),
                fontsize=6,
                xytext=(2, 2),
                textcoords="offset points",
            )
    ax.set_xlabel(f"{by} (per piece)", fontsize=8)
    ax.set_ylabel("role score (the number that decided the role)", fontsize=8)
    ax.tick_params(labelsize=7)
    if len(shown):
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no head has a role", ha="center", va="center", transform=ax.transAxes)
    finish(fig)
    return drawing(fig)


# ---------------------------------------------------------------- sections


def importance_section(results, analysis: str) -> Section:
    """One head-importance analysis (`importance`, `ablation`): per-head heatmap, the top heads with
    intervals, and, for the analysis the run ranks heads by, every role beside its rank."""
    s = Section(slug(analysis), f"Does the head matter? {analysis}")
    s.add(Paragraph(described(analysis)))
    table = next(
        (
            results.tables[name]
            for name in _declared_tables(analysis)
            if name in results.tables and {"score", "ci_low"} <= set(results.tables[name])
        ),
        None,
    )
    if table is None or not len(table):
        s.add(Paragraph(f"No {analysis} rows.", note=True))
        return s
    s.add(Paragraph(f"Objective: {table['objective'].iloc[0]}."))
    s.add(
        Figure(
            f"{slug(analysis)}_heads",
            heatmap_grid_figure(
                [(analysis, to_matrix(table, "score", results.n_layers, results.n_heads))],
                cbar_label="per piece",
            ),
            f"{analysis} per head (sum over units / pieces scored). " + LEGEND,
            alt=f"{analysis} heatmap",
        )
    )
    top = table.sort_values("score", ascending=False, kind="stable").head(TOP_HEADS)
    s.add(
        Table(
            f"{slug(analysis)}-top",
            f"The {len(top)} heads with the largest {analysis} (95% interval over "
            "units; fold 0 / fold 1: each half of the units). " + LEGEND,
            ["Head", analysis, "95% CI", "fold 0", "fold 1", "pieces"],
            [
                [
                    Cell(head_name(r.layer, r.head)),
                    Cell(fmt(r.score, 5), numeric=True),
                    Cell(fmt_ci(r.ci_low, r.ci_high, 5), numeric=True),
                    Cell(fmt(r.fold0, 5), numeric=True),
                    Cell(fmt(r.fold1, 5), numeric=True),
                    Cell(f"{int(r.n):,}", numeric=True),
                ]
                for r in top.itertuples(index=False)
            ],
        )
    )
    ranks = importance_ranks(results)
    if ranks is not None and len(ranks) and ranks["by"].iloc[0] == analysis:
        _roles_by_importance(s, results, analysis)
    return s


def _roles_by_importance(s: Section, results, by: str) -> None:
    roles = results.roles
    if "importance_rank" not in roles:
        return
    ordered = roles.sort_values(["importance_rank", "layer", "head"], kind="stable")
    s.add(
        Table(
            f"{slug(by)}-roles",
            f"Every head's role beside its rank by {by} (1 = most important). " + LEGEND,
            ["Head", "Role and importance", f"{by}", "Role score"],
            [
                [
                    Cell(r["name"]),
                    Cell(role_with_importance(r), wrap=True),
                    Cell(fmt(r["importance_score"], 5), numeric=True),
                    Cell(fmt(r["score"]), numeric=True),
                ]
                for _, r in ordered.iterrows()
            ],
            collapsed=len(ordered) > 40,
        )
    )
    s.add(
        Figure(
            f"{slug(by)}_roles",
            role_importance_figure(roles, role_colors(results), by),
            f"Role score (the number that decided each head's role: offset share, held-out gap, sink mass, "
            f"entropy ratio, a pattern's score) against {by}; heads without a role are left out.",
            alt=f"role score against {by}",
        )
    )


def groups_section(results, analysis: str) -> Section:
    """Named groups of heads gated together (`analysis`'s declared tables): each group against the
    intact model, and each named group against the others."""
    s = Section(slug(analysis), "Heads gated in groups")
    s.add(Paragraph(described(analysis)))
    names = _declared_tables(analysis)
    groups = results.tables.get(names[0]) if names else None
    if groups is None or not len(groups):
        s.add(Paragraph("No groups of heads in these results.", note=True))
        return s
    s.add(Paragraph(f"Objective: {groups['objective'].iloc[0]}. Changes are paired (same units)."))
    s.add(
        Table(
            f"{slug(analysis)}-groups",
            "Each group gated to 0 together: the objective and its change from the intact model, "
            "with 95% intervals. " + LEGEND,
            ["Group", "Heads", "Objective", "95% CI", "Change", "95% CI (change)"],
            [
                [
                    Cell(r.group),
                    Cell(r.heads or "—", wrap=True),
                    Cell(fmt(r.value, 5), numeric=True),
                    Cell(fmt_ci(r.ci_low, r.ci_high, 5), numeric=True),
                    Cell(fmt(r.change, 5), numeric=True),
                    Cell(fmt_ci(r.change_low, r.change_high, 5), numeric=True),
                ]
                for r in groups.itertuples(index=False)
            ],
        )
    )
    versus = results.tables.get(names[1]) if len(names) > 1 else None
    if versus is not None and len(versus):
        s.add(
            Table(
                f"{slug(analysis)}-versus",
                "Group against group: the objective's change from gating the second to gating "
                "the first, paired 95% interval. " + LEGEND,
                ["Group", "Versus", "Change", "95% CI"],
                [
                    [
                        Cell(r.group),
                        Cell(r.versus),
                        Cell(fmt(r.change, 5), numeric=True),
                        Cell(fmt_ci(r.change_low, r.change_high, 5), numeric=True),
                    ]
                    for r in versus.itertuples(index=False)
                ],
            )
        )
    return s


def prune_section(results, analysis: str) -> Section:
    """The pruning curve (`analysis`'s declared table): figure, order used, and every point."""
    s = Section(slug(analysis), "Pruning curve")
    s.add(Paragraph(described(analysis)))
    curve = next(
        (results.tables.get(name) for name in _declared_tables(analysis) if name in results.tables),
        None,
    )
    if curve is None or not len(curve):
        s.add(Paragraph("No pruning curve in these results.", note=True))
        return s
    by = curve["order_by"].iloc[0]
    s.add(
        Paragraph(
            f"Heads removed in order of their {by} score, least important first"
            f"{' (an estimate, not the exact effect: METHODS §8)' if by == 'importance' else ' (exact effects)'} ({by}: "
            f"{described(by) or 'see its section'}); each point gates that share of all "
            f"{fmt_int(curve['heads_total'].iloc[0])} heads to 0 together. Objective: "
            f"{curve['objective'].iloc[0]}. The change from 0% is paired (same bootstrap weights)."
        )
    )
    s.add(
        Figure(
            slug(analysis),
            prune_figure(curve, f"pruning curve (order: {by})"),
            "The objective as heads are removed, with its 95% interval over units.",
            alt="pruning curve",
        )
    )
    s.add(
        Table(
            f"{slug(analysis)}-points",
            "Pruning curve: heads removed at each point (beyond the previous "
            "one), the objective and its change from 0% with 95% intervals. " + LEGEND,
            [
                "Removed",
                "Heads",
                "New heads removed",
                "Objective",
                "95% CI",
                "Change",
                "95% CI (change)",
            ],
            [
                [
                    Cell(r.percent),
                    Cell(fmt_int(r.heads_removed), numeric=True),
                    Cell(r.removed or "—", wrap=True),
                    Cell(fmt(r.value, 5), numeric=True),
                    Cell(fmt_ci(r.ci_low, r.ci_high, 5), numeric=True),
                    Cell(fmt(r.change, 5), numeric=True),
                    Cell(fmt_ci(r.change_low, r.change_high, 5), numeric=True),
                ]
                for r in curve.itertuples(index=False)
            ],
        )
    )
    return s


def _declared_tables(analysis: str) -> list[str]:
    try:
        return list(registry.get(analysis).tables)
    except ValueError:
        return []
