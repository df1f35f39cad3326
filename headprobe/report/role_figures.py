"""The role figures (each `@planned`, returned as a `Drawing`, `headprobe.report.drawing`): a
model's role map (`role_map_figure`), several side by side (`role_maps_figure`), and two
models' roles compared (`compare_roles_figure`). Layers and heads are 0-based on every axis.

    drawing = role_map_figure(roles, 6, 12, colors)   # a plan: nothing is drawn yet
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from headprobe.report.drawing import Drawing, drawing, finish, new_figure, planned, seeded_jitter
from headprobe.report.heatmaps import draw_heatmap, thin_ticks
from headprobe.stats.roles import NONE


@planned
def role_map_figure(
    roles: pd.DataFrame, n_layers: int, n_heads: int, colors: dict[str, str], title: str = ""
) -> Drawing:
    """Layer x head grid coloured by role (`colors`: role -> colour, in the order roles are
    tried, `none` last), each cell labelled with the role's short detail."""
    fig = new_figure(max(4.0, 0.55 * n_heads + 1.2) + 1.8, max(2.6, 0.26 * n_layers + 1.1))
    ax = fig.subplots()
    _draw_role_map(ax, roles, n_layers, n_heads, colors)
    _role_legend(ax, roles, colors)
    ax.set_title(title or "Head-role map (first matching rule)", fontsize=10)
    fig.tight_layout()
    return drawing(fig)


@planned
def role_maps_figure(
    maps: list[tuple[str, pd.DataFrame, int, int]], colors: dict[str, str], title: str = ""
) -> Drawing:
    """Several role maps side by side, one per (title, roles, n_layers, n_heads), one legend."""
    most_layers = max(n_layers for _, _, n_layers, _ in maps)
    cell = min(
        0.5, 7.5 / most_layers, 10.0 / sum(n_heads for *_, n_heads in maps)
    )  # inches, square
    widths = [n_heads * cell + 0.9 for *_, n_heads in maps]
    height = most_layers * cell + 1.5
    fig = new_figure(sum(widths) + 1.5, height)
    axes = fig.subplots(1, len(maps), squeeze=False, gridspec_kw={"width_ratios": widths})[0]
    for ax, (name, roles, n_layers, n_heads) in zip(axes, maps):
        _draw_role_map(ax, roles, n_layers, n_heads, colors)
        ax.set_aspect("equal", anchor="N")  # square cells: a model's shape shows as it is
        ax.set_title(name, fontsize=9)
    _role_legend(axes[-1], pd.concat([m[1] for m in maps]), colors)
    finish(fig, title)
    return drawing(fig)


def _draw_role_map(ax, roles: pd.DataFrame, n_layers: int, n_heads: int, colors: dict[str, str]):
    order = list(colors)
    index = {r: i for i, r in enumerate(order)}
    mat = np.full((n_layers, n_heads), index[NONE], dtype=float)
    text = np.full((n_layers, n_heads), "", dtype=object)
    for r in roles.itertuples(index=False):
        if 0 <= r.layer < n_layers and 0 <= r.head < n_heads:
            mat[r.layer, r.head] = index[r.role]
            text[r.layer, r.head] = _short(r.short)
    annot = n_layers * n_heads <= 400
    draw_heatmap(
        ax,
        mat,
        cmap=ListedColormap([colors[r] for r in order]),
        vmin=-0.5,
        vmax=len(order) - 0.5,
        annot_text=text if annot else None,
        cbar_label=None,
        fontsize=7 if n_heads <= 12 else 5.5,
    )
    ax.set_xlabel("head (0-based)", fontsize=8)
    ax.set_ylabel("layer (0-based)", fontsize=8)
    ax.tick_params(labelsize=7)
    thin_ticks(ax, n_layers, n_heads)


def _role_legend(ax, roles: pd.DataFrame, colors: dict[str, str]):
    present = [r for r in colors if (roles["role"] == r).any()] or [NONE]
    ax.legend(
        handles=[Patch(facecolor=colors[r], edgecolor="#999999", label=r) for r in present],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        frameon=False,
        title="role",
        title_fontsize=8,
    )


def _short(text: str, limit: int = 7) -> str:
    text = str(text or "")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _role_shares(ax, shares: pd.DataFrame, colors: dict[str, str]):
    import seaborn as sns  # here: only the comparison draws it, and it takes a second to import

    order = [r for r in colors if r in set(shares["role"])]
    sns.barplot(data=shares, x="role", y="share", hue="model", ax=ax, order=order)
    ax.set_ylabel("share of heads", fontsize=8)
    ax.set_xlabel("")
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=7, title="model", title_fontsize=7)
    ax.set_title("Share of heads per role", fontsize=9)


def _role_depths(ax, heads: pd.DataFrame, order):
    sub = heads[heads["role"].isin(order)]
    if not len(sub):
        ax.text(0.5, 0.5, "no heads", ha="center", va="center", transform=ax.transAxes)
        return
    import seaborn as sns  # as in _role_shares

    with seeded_jitter():
        sns.stripplot(
            data=sub,
            x="role",
            y="relative_depth",
            hue="model",
            dodge=True,
            ax=ax,
            size=4,
            alpha=0.7,
            order=order,
            jitter=0.25,
        )
    ax.set_ylabel("relative depth (0 = first layer, 1 = last)", fontsize=8)
    ax.set_xlabel("")
    ax.set_ylim(-0.05, 1.05)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=7, title="model", title_fontsize=7)
    ax.set_title("Where each role's heads sit", fontsize=9)


@planned
def compare_roles_figure(
    shares: pd.DataFrame, heads: pd.DataFrame, colors: dict[str, str], title: str = ""
) -> Drawing:
    """Two panels for several models: share of heads per role (bars; columns `model`, `role`,
    `share`) and the relative depth of each role's heads (dots; columns `model`, `role`,
    `relative_depth`, one row per head; the 'none' role is left out). `colors` gives the roles'
    order."""
    order = [r for r in colors if r in set(shares["role"])]
    width = max(5.0, 1.0 * len(order) + 2.5)
    fig = new_figure(2 * width, 3.6)
    ax1, ax2 = fig.subplots(1, 2)
    _role_shares(ax1, shares, colors)
    _role_depths(ax2, heads, [r for r in order if r != NONE])
    finish(fig, title)
    return drawing(fig)
