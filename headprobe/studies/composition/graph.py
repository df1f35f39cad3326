"""The composition graph (METHODS §18): the significant edges of `composition_edges`, layers up
the page, each head a node, edges coloured by channel (q, k, v) and as wide as their effect.
MLP senders (`--senders mlp`) are nodes "MLP L" in a column right of the heads, at their layer;
the embeddings (`--senders embed`) one node "embed" below the first layer.

    drawing = composition_graph(edges, n_layers=30, n_heads=9)   # a report `figures.Drawing`
    drawing.save("figures/composition_graph", ("png", "svg", "pdf"))

Rendering only: the edges given are drawn as they are; `graph_edges` picks them (significant
after Holm, the strongest `LIMIT` by output effect, so a large model's graph stays legible).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.report import drawing as F
from headprobe.studies.composition.run_options import sender_kind, sender_name

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


def node(layer: int, head: int, n_heads: int) -> tuple[float, float]:
    """(x, y) of a sender or receiver: a head at (head, layer), an MLP at (n_heads, layer), the
    embeddings at (the middle, -1)."""
    kind = sender_kind(layer, head)
    if kind == "embed":
        return (n_heads - 1) / 2, -1.0
    return (float(n_heads) if kind == "mlp" else float(head)), float(layer)


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
    used = {}  # (x, y) -> its label
    for r in edges.itertuples(index=False):
        (x0, y0), (x1, y1) = node(r.sender_layer, r.sender_head, n_heads), (r.head, r.layer)
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
        used[(x0, y0)] = sender_name(r.sender_layer, r.sender_head)
        used[(x1, y1)] = f"{int(r.layer)}-{int(r.head)}"
    for (x, y), name in used.items():
        ax.scatter([x], [y], s=36, color="#333333", zorder=3, linewidths=0)
        role = roles.get((int(y), int(x))) if "-" in name else None
        label = name + (f" {role}" if role else "")
        ax.annotate(label, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points", zorder=4)
    for channel, color in CHANNEL_COLORS.items():
        ax.plot([], [], color=color, lw=2, label=f"{channel}: {CHANNEL_NAMES[channel]}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    pairs = zip(edges["sender_layer"], edges["sender_head"]) if len(edges) else ()
    kinds = {sender_kind(l, h) for l, h in pairs}
    ax.set_xlim(-0.7, n_heads + (0.7 if "mlp" in kinds else -0.3))
    ax.set_ylim(-1.7 if "embed" in kinds else -0.7, n_layers - 0.3)
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
