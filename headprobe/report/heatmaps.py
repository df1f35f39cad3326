"""The report's layer x head figures (each `@planned`, returned as a `Drawing`,
`headprobe.report.drawing`): heatmaps of a score per head (`layer_head_heatmap`,
`heatmap_grid_figure`), accuracy and gap panels (`accuracy_gap_figure`, `gap_grid_figure`), an
example sentence's attention with its gold arcs (`example_figure`) and two models' matched
heads (`matched_heads_figure`). Layers and heads are 0-based on every axis.

    drawing = heatmap_grid_figure(panels, "dependency")    # a plan: nothing is drawn yet
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib import colormaps
from matplotlib.patches import Rectangle

from headprobe.report.drawing import Drawing, drawing, finish, legible, new_figure, planned

EXAMPLE_MAX_WORDS = 40
GRID_CBAR_INCHES = 1.0  # room on the right of a grid of heatmaps for its one colour bar


def panel_size(n_layers: int, n_heads: int) -> tuple[float, float]:
    return max(3.2, 0.42 * n_heads + 1.6), max(2.4, 0.3 * n_layers + 1.2)


def draw_heatmap(
    ax,
    mat: np.ndarray,
    *,
    cmap="viridis",
    vmin=None,
    vmax=None,
    annot_text: np.ndarray | None = None,
    cbar_label: str | None = "",
    xticklabels=None,
    yticklabels=None,
    fontsize: float = 7,
    lines: bool = True,
):
    """A seaborn-style heatmap drawn with plain matplotlib (row 0 at the top).

    seaborn.heatmap redraws the whole figure to test tick-label overlap, which makes
    figures with many panels slow; this draws each panel once. NaN cells are grey.
    """
    n_rows, n_cols = mat.shape
    cm = (colormaps[cmap] if isinstance(cmap, str) else cmap).with_extremes(bad="#e8e8e8")
    finite = mat[np.isfinite(mat)]
    if vmin is None:
        vmin = float(finite.min()) if finite.size else 0.0
    if vmax is None:
        vmax = float(finite.max()) if finite.size else 1.0
    if vmax <= vmin:
        vmax = vmin + 1e-9
    mesh = ax.pcolormesh(
        np.arange(n_cols + 1),
        np.arange(n_rows + 1),
        np.ma.masked_invalid(mat),
        cmap=cm,
        vmin=vmin,
        vmax=vmax,
        edgecolors="white" if lines else "face",
        linewidth=0.5 if lines else 0,
    )
    ax.set_xlim(0, n_cols)
    ax.set_ylim(n_rows, 0)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    if cbar_label is not None:
        cb = ax.figure.colorbar(mesh, ax=ax, shrink=0.85, pad=0.02)
        cb.set_label(cbar_label, fontsize=fontsize + 1)
        cb.ax.tick_params(labelsize=fontsize)
        cb.outline.set_visible(False)
    if annot_text is not None:
        _annotate_cells(ax, mat, annot_text, cm, vmin, vmax, fontsize)
    if xticklabels is not None:
        ax.set_xticks([k + 0.5 for k in range(n_cols)])
        ax.set_xticklabels(xticklabels, rotation=90, fontsize=fontsize)
    if yticklabels is not None:
        ax.set_yticks([k + 0.5 for k in range(n_rows)])
        ax.set_yticklabels(yticklabels, fontsize=fontsize)
    ax.tick_params(length=2)
    return mesh


def _annotate_cells(ax, mat: np.ndarray, annot_text: np.ndarray, cm, vmin, vmax, fontsize):
    """Each cell's text of `annot_text` (`mat`'s shape) written in it, white on dark cells."""
    n_rows, n_cols = mat.shape
    for i in range(n_rows):
        for j in range(n_cols):
            text = annot_text[i, j]
            if text is None or text == "":
                continue
            v = mat[i, j]
            rgba = cm((v - vmin) / (vmax - vmin)) if np.isfinite(v) else (0.9, 0.9, 0.9, 1)
            lum = 0.2126 * rgba[0] + 0.7152 * rgba[1] + 0.0722 * rgba[2]
            ax.text(
                j + 0.5,
                i + 0.5,
                str(text),
                ha="center",
                va="center",
                fontsize=fontsize,
                color="white" if lum < 0.45 else "black",
                in_layout=False,  # inside its cell: the layout need not measure it (fast)
            )


def layer_head_heatmap(
    ax,
    mat: np.ndarray,
    title: str,
    cmap="viridis",
    center=None,
    vmin=None,
    vmax=None,
    annot: bool | None = None,
    fmt=".2f",
    cbar_label: str = "",
    annot_text: np.ndarray | None = None,
):
    """Draw one layer (rows) x head (columns) heatmap on `ax`."""
    n_layers, n_heads = mat.shape
    if annot is None:
        annot = legible(n_layers, n_heads)
    ax.set_title(title, fontsize=9)
    if not np.isfinite(mat).any():
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return ax
    if center is not None and (vmin is None or vmax is None):
        lim = float(np.nanmax(np.abs(mat - center))) or 1.0
        vmin, vmax = center - lim, center + lim
    text = None
    if annot:
        text = (
            annot_text
            if annot_text is not None
            else np.vectorize(
                lambda v: "" if not np.isfinite(v) else format(v, fmt), otypes=[object]
            )(mat)
        )
    draw_heatmap(ax, mat, cmap=cmap, vmin=vmin, vmax=vmax, annot_text=text, cbar_label=cbar_label)
    ax.set_xlabel("head (0-based)", fontsize=8)
    ax.set_ylabel("layer (0-based)", fontsize=8)
    ax.tick_params(labelsize=7)
    thin_ticks(ax, n_layers, n_heads)
    return ax


def thin_ticks(ax, n_layers, n_heads):
    step_y = max(1, math.ceil(n_layers / 16))
    step_x = max(1, math.ceil(n_heads / 16))
    ax.set_yticks([i + 0.5 for i in range(0, n_layers, step_y)])
    ax.set_yticklabels([str(i) for i in range(0, n_layers, step_y)], rotation=0)
    ax.set_xticks([i + 0.5 for i in range(0, n_heads, step_x)])
    ax.set_xticklabels([str(i) for i in range(0, n_heads, step_x)], rotation=0)


def _sym(*mats) -> float:
    vals = np.concatenate([np.abs(m[~np.isnan(m)]).ravel() for m in mats] + [np.array([0.05])])
    return float(max(0.05, np.nanmax(vals)))


@planned
def accuracy_gap_figure(
    panels: list[tuple[str, np.ndarray, np.ndarray | None, str]], suptitle: str = ""
) -> Drawing:
    """Rows of (accuracy heatmap, accuracy - baseline heatmap).

    `panels`: list of (row title, accuracy matrix, gap matrix or None, baseline text).
    """
    n_rows = len(panels)
    n_layers, n_heads = panels[0][1].shape
    w, h = panel_size(n_layers, n_heads)
    fig = new_figure(2 * w + 0.6, n_rows * h + 0.6)
    axes = fig.subplots(n_rows, 2, squeeze=False)
    gaps = [p[2] for p in panels if p[2] is not None]
    lim = _sym(*gaps) if gaps else 0.1
    for i, (title, acc, gap, base_text) in enumerate(panels):
        layer_head_heatmap(
            axes[i, 0],
            acc,
            f"{title}: accuracy",
            cmap="viridis",
            vmin=0,
            vmax=1,
            cbar_label="accuracy",
        )
        if gap is None:
            axes[i, 1].text(
                0.5,
                0.5,
                "no baseline in counts",
                ha="center",
                va="center",
                transform=axes[i, 1].transAxes,
            )
            axes[i, 1].set_axis_off()
        else:
            layer_head_heatmap(
                axes[i, 1],
                gap,
                f"{title}: accuracy − baseline ({base_text})",
                cmap="RdBu_r",
                center=0,
                vmin=-lim,
                vmax=lim,
                cbar_label="gap",
            )
    finish(fig, suptitle)
    return drawing(fig)


def small_panel_size(n_layers: int, n_heads: int) -> tuple[float, float]:
    return max(2.8, 0.22 * n_heads + 1.9), max(2.1, 0.17 * n_layers + 1.1)


def gap_grid_figure(
    items: list[tuple[str, np.ndarray]],
    title: str = "",
    cbar_label: str = "accuracy − baseline",
    ncols: int | None = None,
) -> Drawing:
    """Small multiples: one gap heatmap per label (shared symmetric colour scale)."""
    lim = _sym(*[m for _, m in items])
    return heatmap_grid_figure(
        items, title, cbar_label, ncols, cmap="RdBu_r", center=0, vmin=-lim, vmax=lim
    )


@planned
def heatmap_grid_figure(
    items: list[tuple[str, np.ndarray]],
    title: str = "",
    cbar_label: str = "",
    ncols: int | None = None,
    cmap="viridis",
    center=None,
    vmin=None,
    vmax=None,
) -> Drawing:
    """Small multiples: one layer x head heatmap per (title, [layer, head] matrix), one colour scale."""
    n = len(items)
    n_layers, n_heads = items[0][1].shape
    if ncols is None:
        ncols = 6 if n_layers > 2 * n_heads else (3 if n_heads > 8 else 4)
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    w, h = small_panel_size(n_layers, n_heads)
    fig = new_figure(ncols * w, nrows * h + 0.5)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    finite = np.concatenate([m[np.isfinite(m)].ravel() for _, m in items])
    if vmin is None:
        vmin = float(finite.min()) if finite.size else 0.0
    if vmax is None:
        vmax = float(finite.max()) if finite.size else 1.0
    for k, (label, mat) in enumerate(items):
        ax = axes[k // ncols, k % ncols]
        layer_head_heatmap(
            ax,
            mat,
            label,
            cmap=cmap,
            center=center,
            vmin=vmin,
            vmax=vmax,
            annot=False,
            cbar_label=None,  # one colour bar for the grid (below): one scale, half the axes
        )
    for k in range(n, nrows * ncols):
        axes[k // ncols, k % ncols].set_axis_off()
    finish(fig, title, right=GRID_CBAR_INCHES)
    meshes = [c for ax in axes.ravel() for c in ax.collections]
    if meshes:
        width = fig.get_figwidth()  # inches; the bar 0.12 in wide, its ticks and label after it
        left = 1 - (GRID_CBAR_INCHES - 0.1) / width
        bar = fig.add_axes((left, 0.2, 0.12 / width, 0.6 * fig.subplotpars.top))
        cb = fig.colorbar(meshes[0], cax=bar)
        cb.set_label(cbar_label, fontsize=8)
        cb.ax.tick_params(labelsize=7)
        cb.outline.set_visible(False)
    return drawing(fig)


def layer_ticks(ax, n_layers: int):
    step = max(1, math.ceil(n_layers / 16))
    ax.set_xticks(list(range(0, n_layers, step)))
    ax.set_xlim(-0.6, n_layers - 0.4)


@planned
def example_figure(
    words: list[str], attention, gold: list, title: str, direction: str = "dep->head"
) -> Drawing:
    """Word x word attention heatmap (rows attend to columns) of one head on one example.

    Gold pairs `[dep, head]` are outlined at (row dep, column head) for `dep->head`
    and coreference, and at (row head, column dep) for `head<-dep`. A dot marks
    each row's argmax (each column's for `head<-dep`), self excluded.
    """
    att = np.asarray(attention, dtype=float)
    n = len(words)
    lo, hi = 0, n
    if n > EXAMPLE_MAX_WORDS:  # crop to the gold arcs, padded
        idx = [int(i) for pair in gold for i in pair] or [0]
        centre = (min(idx) + max(idx)) // 2
        lo = max(0, min(centre - EXAMPLE_MAX_WORDS // 2, n - EXAMPLE_MAX_WORDS))
        hi = lo + EXAMPLE_MAX_WORDS
    sub = att[lo:hi, lo:hi]
    labels = [f"{w}" for w in words[lo:hi]]
    m = len(labels)
    size = max(3.5, 0.28 * m + 1.8)
    fig = new_figure(size + 0.8, size)
    ax = fig.subplots()
    draw_heatmap(
        ax,
        sub,
        cmap="Blues",
        vmin=0,
        vmax=max(float(np.nanmax(sub)) if sub.size else 1.0, 1e-6),
        cbar_label="attention",
        xticklabels=labels,
        yticklabels=labels,
        lines=False,
    )
    ax.set_aspect("equal")
    ax.set_xlabel("attends to (key word)", fontsize=8)
    ax.set_ylabel("attending word (query)", fontsize=8)
    _mark_argmax_and_gold(ax, sub, gold, direction, lo, hi)
    ax.set_title(title, fontsize=9)
    if lo or hi < n:
        ax.text(
            0,
            -0.02,
            f"words {lo}–{hi - 1} of {n} shown",
            transform=ax.transAxes,
            fontsize=7,
            va="top",
        )
    fig.tight_layout()
    return drawing(fig)


def _mark_argmax_and_gold(ax, sub: np.ndarray, gold: list, direction: str, lo: int, hi: int):
    """Dots at each row's (each column's for `head<-dep`) most attended word, self excluded, and
    the gold pairs outlined; `sub` is the words `lo`..`hi` of the example."""
    m = len(sub)
    noself = sub.copy()  # [query word, key word]
    if m > 1:
        np.fill_diagonal(noself, -np.inf)
        if direction == "head<-dep":  # the word attending most to each column
            points = [(int(np.argmax(noself[:, j])), j) for j in range(m)]
        else:  # each row's most attended word
            points = [(i, int(np.argmax(noself[i]))) for i in range(m)]
        for i, j in points:
            ax.plot(j + 0.5, i + 0.5, "o", color="#ff7f0e", ms=3)
    for pair in gold:
        a, b = int(pair[0]), int(pair[1])
        row, col = (b, a) if direction == "head<-dep" else (a, b)
        if lo <= row < hi and lo <= col < hi:
            ax.add_patch(
                Rectangle((col - lo, row - lo), 1, 1, fill=False, edgecolor="#d62728", lw=1.8)
            )


@planned
def matched_heads_figure(similarity: np.ndarray, names: np.ndarray, title: str) -> Drawing:
    """Layer x head grid of one model: each head coloured by the cosine similarity to the head of
    the other model it is matched with, and labelled with that head's L-H (`names`, '' for a
    head left unmatched)."""
    n_layers, n_heads = similarity.shape
    w, h = panel_size(n_layers, n_heads)
    fig = new_figure(w + 0.4, h + 0.3)
    ax = fig.subplots()
    layer_head_heatmap(
        ax,
        similarity,
        title,
        cmap="viridis",
        vmin=-1 if np.nanmin(similarity) < 0 else 0,
        vmax=1,
        cbar_label="similarity",
        annot_text=names,
    )
    fig.tight_layout()
    return drawing(fig)
