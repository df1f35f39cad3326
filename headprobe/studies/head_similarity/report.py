"""Report section of the head_similarity analysis (Clark et al. 2019 section 5, Figure 6).

    section = head_clusters_section(results, "head_similarity")   # registered as the analysis's report

Renders the stored `head_distances` and `head_clusters` tables: the heads embedded in
the plane by MDS of their Jensen-Shannon divergences, coloured by head role and by layer,
the average-linkage dendrogram, and the numbers behind "heads of the same layer behave
alike" (`head_similarity.layer_cohesion`), and the closest pairs of heads with their 95%
bootstrap intervals (`head_distances` is a pair table: `report.rendered_tables.pair_table_block`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.lines import Line2D

from headprobe.extend import BulletList, Cell, Figure, Paragraph, Section, Table
from headprobe.report import drawing as F
from headprobe.report.document import slug
from headprobe.report.rendered_tables import LEGEND, fmt, pair_table_block
from headprobe.stats.roles import NONE, role_colors
from headprobe.studies.head_similarity.analysis import distance_matrix, layer_cohesion, linkage

MAX_LABELS = 160  # heads named on the plots up to this many
CLOSEST = 15  # pairs of heads in the table of the closest pairs


def _roles_of(results, clusters: pd.DataFrame) -> tuple[list[str], dict[str, str]]:
    roles = (
        results.roles
        if "roles" in results.tables
        else pd.DataFrame(columns=["layer", "head", "role"])
    )
    by_head = {
        (int(l), int(h)): r
        for l, h, r in zip(roles.get("layer", []), roles.get("head", []), roles.get("role", []))
    }
    names = [
        by_head.get((int(l), int(h)), NONE) for l, h in zip(clusters["layer"], clusters["head"])
    ]
    return names, role_colors(results)


@F.planned
def mds_figure(
    clusters: pd.DataFrame,
    colors: list,
    legend: list[tuple[str, str]],
    title: str,
    colorbar: tuple | None = None,
) -> F.Drawing:
    """The heads in the MDS plane, one dot each, named L-H when there are few enough."""
    fig = F.new_figure(7.0, 5.6)
    ax = fig.add_subplot(1, 1, 1)
    ax.scatter(
        clusters["mds_x"], clusters["mds_y"], c=colors, s=36, edgecolors="#333333", linewidths=0.4
    )
    if len(clusters) <= MAX_LABELS:
        for x, y, name in zip(clusters["mds_x"], clusters["mds_y"], clusters["name"]):
            ax.annotate(
                name, (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points", color="#333333"
            )
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel("MDS 1")
    ax.set_ylabel("MDS 2")
    ax.set_title(title, fontsize=10)
    if legend:
        handles = [
            Line2D(
                [0],
                [0],
                marker="o",
                linestyle="",
                markerfacecolor=c,
                markeredgecolor="#333333",
                label=name,
            )
            for name, c in legend
        ]
        ax.legend(handles=handles, fontsize=7, loc="best", frameon=False)
    if colorbar is not None:
        mappable, label = colorbar
        fig.colorbar(mappable, ax=ax, label=label, fraction=0.04)
    F.finish(fig)
    return F.drawing(fig)


@F.planned
def dendrogram_figure(
    matrix: np.ndarray, heads: list[tuple[int, int]], colors: list[str]
) -> F.Drawing:
    from scipy.cluster.hierarchy import dendrogram

    fig = F.new_figure(max(7.0, 0.11 * len(heads) + 1.5), 4.2)
    ax = fig.add_subplot(1, 1, 1)
    tree = dendrogram(
        linkage(matrix),
        ax=ax,
        labels=[f"{l}-{h}" for l, h in heads],
        leaf_font_size=6,
        color_threshold=0,
        above_threshold_color="#555555",
    )
    for tick, leaf in zip(ax.get_xticklabels(), tree["leaves"]):
        tick.set_color(colors[leaf])
    ax.set_ylabel("mean JS divergence (average linkage)")
    ax.set_title(
        "Hierarchical clustering of the heads (leaf labels coloured by layer)", fontsize=10
    )
    F.finish(fig)
    return F.drawing(fig)


def head_clusters_section(results, analysis: str) -> Section:
    """Heads embedded and clustered by their mean JS divergence (the analysis's tables)."""
    s = Section(slug(analysis), "Head clusters (Clark et al. 2019, section 5)")
    s.add(
        Paragraph(
            "Distance between two heads: the Jensen-Shannon divergence (nats; 0 to ln 2 = 0.693) between their "
            "word-level attention distributions (keys: the words and the [CLS]/[SEP]-like specials), averaged over "
            "every word of the corpus. The heads are placed in the plane by metric MDS (scikit-learn) of these "
            "divergences, as in Clark et al. Figure 6, and clustered by average linkage (scipy)."
        )
    )
    distances = (
        results.table("head_distances") if "head_distances" in results.tables else pd.DataFrame()
    )
    clusters = (
        results.table("head_clusters") if "head_clusters" in results.tables else pd.DataFrame()
    )
    if not len(distances) or not len(clusters):
        s.add(Paragraph("No head distances in the results.", note=True))
        return s
    roles, palette = _roles_of(results, clusters)
    for figure in _cluster_figures(clusters, distances, roles, palette):
        s.add(figure)
    cohesion = layer_cohesion(distances, clusters, seed=int(results.summary.get("seed", 0) or 0))
    if cohesion:
        s.add(Paragraph("Do heads of the same layer behave alike?"))
        s.add(BulletList(_cohesion_items(cohesion)))
    s.add(_clusters_table(clusters, roles))
    s.add(_closest_pairs(distances))
    return s


def _closest_pairs(distances: pd.DataFrame) -> Table:
    """The `CLOSEST` pairs of distinct heads with the smallest mean JS, each pair once (the
    receiver before the sender), with their intervals."""
    first = distances["layer"] * 10**6 + distances["head"]
    second = distances["sender_layer"] * 10**6 + distances["sender_head"]
    pairs = distances[first < second].sort_values("score", kind="stable").head(CLOSEST)
    return pair_table_block(
        pairs,
        "head-closest-pairs",
        f"The {len(pairs)} closest pairs of heads: mean JS divergence (nats) over the word rows, "
        "with its 95% bootstrap interval over units; p / Holm tests that the divergence is above "
        "0 (Holm over every pair). " + LEGEND,
        "mean JS",
    )


def _cluster_figures(clusters, distances, roles: list[str], palette: dict) -> list[Figure]:
    """The heads' MDS embedding coloured by role and by layer, and their dendrogram."""
    present = [r for r in palette if r in set(roles)]
    figures = [
        Figure(
            "head_clusters_roles",
            mds_figure(
                clusters,
                [palette.get(r, "#999999") for r in roles],
                [(r, palette[r]) for r in present],
                "Heads by behaviour, coloured by role",
            ),
            "MDS of the heads' mean JS divergences, coloured by head role (see the role map). "
            + LEGEND,
            alt="MDS of heads by role",
        )
    ]
    layers = clusters["layer"].to_numpy()
    cmap = colormaps["viridis"]
    top = max(1, int(layers.max()))
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    norm = Normalize(vmin=0, vmax=top)
    figures.append(
        Figure(
            "head_clusters_layers",
            mds_figure(
                clusters,
                [cmap(norm(l)) for l in layers],
                [],
                "Heads by behaviour, coloured by layer",
                colorbar=(ScalarMappable(norm=norm, cmap=cmap), "layer (0-based)"),
            ),
            "The same embedding coloured by layer: heads of one layer tend to sit together. "
            + LEGEND,
            alt="MDS of heads by layer",
        )
    )
    matrix, heads = distance_matrix(distances)
    figures.append(
        Figure(
            "head_clusters_dendrogram",
            dendrogram_figure(
                matrix, heads, [cmap(0.85 * norm(l)) for l, _ in heads]
            ),  # no pale yellow text
            "Average-linkage clustering of the heads on their mean JS divergence. " + LEGEND,
            alt="dendrogram",
        )
    )
    return figures


def _cohesion_items(cohesion: dict) -> list[str]:
    """Whether heads of one layer behave alike (`layer_cohesion`), as bullet items."""
    items = [
        f"mean JS within a layer {cohesion['within_layer_js']:.4f}, between layers "
        f"{cohesion['between_layer_js']:.4f} (gap {cohesion['gap']:+.4f}; permutation test, layer labels "
        f"shuffled {cohesion['permutations']} times: p = {cohesion['p_value']:.3g})",
        f"heads whose nearest head (smallest divergence) is in the same layer: "
        f"{cohesion.get('nearest_same_layer', float('nan')):.3f} "
        f"(chance {cohesion['chance_nearest_same_layer']:.3f})",
        f"adjusted Rand index between the clusters (tree cut into as many clusters as layers) and the layers: "
        f"{cohesion.get('adjusted_rand_clusters_layers', float('nan')):.3f}",
    ]
    if "fold_correlation" in cohesion:
        items.append(
            f"stability: correlation of the divergences measured on each half of the units: "
            f"{cohesion['fold_correlation']:.4f}"
        )
    return items


def _clusters_table(clusters, roles: list[str]) -> Table:
    """Per head: its cluster, nearest head and the divergence to it, and its role."""
    rows = [
        [
            Cell(r.name),
            Cell(str(int(r.cluster)), numeric=True),
            Cell(r.nearest),
            Cell(fmt(r.nearest_js), numeric=True),
            Cell("yes" if r.nearest_same_layer else "no"),
            Cell(role),
        ]
        for r, role in zip(clusters.itertuples(index=False), roles)
    ]
    return Table(
        "head-clusters",
        "Per head: cluster, nearest head and its divergence, role. " + LEGEND,
        ["Head", "Cluster", "Nearest head", "JS to nearest", "Same layer", "Role"],
        rows,
        [{"layer": int(l), "head": int(h)} for l, h in zip(clusters["layer"], clusters["head"])],
        collapsed=len(rows) > 40,
    )
