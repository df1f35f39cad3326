"""The composition graph (METHODS §18): the significant edges of `composition_edges`, layers up
the page, each head a node, edges coloured by channel (q, k, v) and as wide as their effect.

    drawing = composition_graph(edges, n_layers=30, n_heads=9)   # a report `figures.Drawing`
    drawing.save("figures/composition_graph", ("png", "svg", "pdf"))

Rendering only: the edges given are drawn as they are; `graph_edges` picks them (significant
after Holm, the strongest `LIMIT` by output effect, so a large model's graph stays legible).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.report import drawing as F

CHANNEL_COLORS = {"q": "#4c72b0", "k": "#dd8452", "v": "#55a868"}
CHANNEL_NAMES = {"q": "query", "k": "key", "v": "value"}
LIMIT = 60  # edges drawn at most
ALPHA = 0.05


def graph_edges(edges: pd.DataFrame, limit: int = LIMIT, alpha: float = ALPHA) -> pd.DataFrame:
    """The edges the graph draws: p_holm < alpha, the `limit` largest output effects."""
    if edges is None or not len(edges):
        return pd.DataFrame(columns=[] if edges is None else edges.columns)
    shown = edges[(edges["p_holm"] < alpha) & edges["output_effect"].notna()]
    return shown.nlargest(limit, "output_effect").reset_index(drop=True)


@F.planned
def composition_graph(
    edges: pd.DataFrame, n_layers: int, n_heads: int, roles: dict | None = None, title: str = ""
) -> F.Drawing:
    """Heads as nodes (layer up the page, head across), `edges` as curves from sender to receiver,
    coloured by channel, width by output effect; heads named in `roles` ({(l, h): role}) labelled."""
    roles = roles or {}
    width = min(12.0, max(6.0, 0.55 * n_heads + 2.5))
    height = min(14.0, max(4.0, 0.42 * n_layers + 1.6))
    fig = F.new_figure(width, height)
    ax = fig.subplots()
    lx, ly = np.meshgrid(np.arange(n_heads), np.arange(n_layers))
    ax.scatter(lx.ravel(), ly.ravel(), s=10, color="#d0d0d0", zorder=1, linewidths=0)
    top = float(edges["output_effect"].max()) if len(edges) else 1.0
    used = set()
    for r in edges.itertuples(index=False):
        x0, y0, x1, y1 = r.sender_head, r.sender_layer, r.head, r.layer
        color = CHANNEL_COLORS.get(r.channel, "#333333")
        bend = 0.15 * (1 if (x1 - x0) >= 0 else -1)
        ax.annotate(
            "",
            xy=(x1, y1),
            xytext=(x0, y0),
            arrowprops=dict(
                arrowstyle="-|>",
                color=color,
                lw=0.6 + 3.4 * float(r.output_effect) / (top or 1.0),
                alpha=0.8,
                shrinkA=3,
                shrinkB=3,
                connectionstyle=f"arc3,rad={bend}",
            ),
            zorder=2,
        )
        used |= {(x0, y0), (x1, y1)}
    for x, y in used:
        ax.scatter([x], [y], s=36, color="#333333", zorder=3, linewidths=0)
        role = roles.get((int(y), int(x)))
        label = f"{int(y)}-{int(x)}" + (f" {role}" if role else "")
        ax.annotate(label, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points", zorder=4)
    for channel, color in CHANNEL_COLORS.items():
        ax.plot([], [], color=color, lw=2, label=f"{channel}: {CHANNEL_NAMES[channel]}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_xlim(-0.7, n_heads - 0.3)
    ax.set_ylim(-0.7, n_layers - 0.3)
    ax.set_xlabel("head", fontsize=8)
    ax.set_ylabel("layer (input at the bottom)", fontsize=8)
    ax.set_xticks(range(0, n_heads, max(1, -(-n_heads // 16))))
    ax.set_yticks(range(0, n_layers, max(1, -(-n_layers // 16))))
    ax.tick_params(labelsize=7)
    if not len(edges):
        ax.text(0.5, 0.5, "no significant edge", ha="center", va="center", transform=ax.transAxes)
    if title:
        ax.set_title(title, fontsize=9)
    F.finish(fig)
    return F.drawing(fig)
