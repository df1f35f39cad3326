"""Report figures (seaborn / matplotlib), each returned as a `Drawing`, drawn when first used.

    drawing = role_map_figure(roles, 6, 12, colors)   # a plan: nothing is drawn yet
    drawing.png, drawing.svg, drawing.pdf              # bytes of each format (drawn on first use)
    drawing.save("figures/roles", ("png", "svg"))      # roles.png, roles.svg
    write_drawings([(drawing, "figures/roles")], ("png",))   # many, in worker processes

Every public figure function is `@planned`: calling it records the function and its arguments
(plain data: arrays, tables, strings), so a report's figures can be drawn by worker processes
(`write_drawings`, one per core) once its tables are saved. Figures are drawn on
`matplotlib.figure.Figure` objects with the Agg canvas, never through pyplot, so building a
report touches no global backend state (it works headless and inside a notebook with an inline
backend alike). Vector files carry no date and fixed ids (same figure, same bytes) and PDF fonts
are embedded as TrueType (Type 42), as journals ask. Layers and heads are 0-based on every axis.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import math
import multiprocessing
import os
import pickle
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from headprobe.stats.roles import NONE

DPI = 100
ANNOTATE_MAX_SIDE = (
    16  # a heatmap's cells carry their value up to 16 x 16 cells; beyond, a colour bar
)
EXAMPLE_MAX_WORDS = 40
FORMATS = ("png", "svg", "pdf")  # the formats a figure can be written in
DEFAULT_FORMATS = ("png",)  # what a report writes unless asked (the pages embed the PNG)
_METADATA = {
    "png": {"Software": None},
    "svg": {"Date": None, "Creator": None},
    "pdf": {"CreationDate": None, "ModDate": None, "Creator": None, "Producer": None},
}
_RC = {"svg.hashsalt": "headprobe", "pdf.fonttype": 42}


def parse_formats(text) -> tuple[str, ...]:
    """'png,svg,pdf' (or a list) -> ('png', 'svg', 'pdf'), in FORMATS order; ValueError naming an
    unknown or missing format."""
    names = text.split(",") if isinstance(text, str) else list(text or ())
    names = [str(name).strip().lower().lstrip(".") for name in names if str(name).strip()]
    unknown = [name for name in names if name not in FORMATS]
    if unknown or not names:
        raise ValueError(
            f"--figures: {', '.join(unknown) or 'no format'} is not a figure format "
            f"(give a comma list of {', '.join(FORMATS)})"
        )
    return tuple(fmt for fmt in FORMATS if fmt in names)


def legible(n_rows: int, n_cols: int) -> bool:
    """Whether a heatmap of this many rows and columns can carry text in its cells."""
    return n_rows <= ANNOTATE_MAX_SIDE and n_cols <= ANNOTATE_MAX_SIDE


@contextlib.contextmanager
def seeded_jitter(seed: int = 0):
    """seaborn's strip-plot jitter draws from numpy's global generator: seed it for one plot and
    put its state back, so the same figure has the same bytes and nothing else is disturbed."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def render(fig: Figure, fmt: str = "png") -> bytes:
    """The bytes of `fig` in `fmt` (one of FORMATS)."""
    buf = io.BytesIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format=fmt, dpi=DPI, metadata=_METADATA[fmt])
    return buf.getvalue()


class Drawing:
    """One figure: drawn (`figure`) on first use, from its plan when it has one.

    drawing.save("figures/roles")         # -> [roles.png]
    drawing.save("figures/roles", FORMATS)   # -> [roles.png, roles.svg, roles.pdf]
    display(drawing)                      # in a notebook: the PNG
    """

    def __init__(self, fig: Figure | None = None, plan: tuple | None = None):
        self._figure = fig
        self.plan = plan  # (module, function name, args, kwargs) of a `@planned` function
        self._bytes: dict[str, bytes] = {}

    @property
    def figure(self) -> Figure:
        if self._figure is None:
            module, name, args, kwargs = self.plan
            planned = getattr(importlib.import_module(module), name)
            self._figure = planned.__wrapped__(*args, **kwargs).figure
        return self._figure

    def data(self, fmt: str) -> bytes:
        if fmt not in self._bytes:
            self._bytes[fmt] = render(self.figure, fmt)
        return self._bytes[fmt]

    png = property(lambda self: self.data("png"))
    svg = property(lambda self: self.data("svg"))
    pdf = property(lambda self: self.data("pdf"))

    def _repr_png_(self) -> bytes:  # a notebook cell shows it: `display(drawing)`
        return self.png

    def save(self, stem, formats=DEFAULT_FORMATS) -> list[Path]:
        """Write `<stem>.<fmt>` for each format; returns the paths."""
        stem = Path(stem)
        paths = []
        for fmt in formats:
            path = stem.with_name(f"{stem.name}.{fmt}")
            path.write_bytes(self.data(fmt))
            paths.append(path)
        return paths

    def release(self) -> None:
        """Free the matplotlib figure (its files are written); the PNG bytes stay."""
        if self._figure is not None:
            self._figure.clear()
            self._figure = None
        self._bytes = {fmt: data for fmt, data in self._bytes.items() if fmt == "png"}


def drawing(fig: Figure) -> Drawing:
    """The finished `fig` as a `Drawing`. Its layout is done: the placeholder layout engine
    `tight_layout` leaves would make every save draw the whole figure twice."""
    fig.set_layout_engine(None)
    return Drawing(fig)


def planned(function):
    """Decorate a figure function (module level, returning `drawing(fig)`): a call records the
    function and its arguments and returns a `Drawing` drawn on first use, in this process or
    in a worker (`write_drawings`)."""

    @functools.wraps(function)
    def plan(*args, **kwargs) -> Drawing:
        return Drawing(plan=(function.__module__, function.__name__, args, kwargs))

    return plan


# ---------------------------------------------------------------- drawing in worker processes


def _draw_and_save(job: tuple) -> list[str]:
    """Worker: draw one planned figure and write it in each format; returns the paths written."""
    plan, stem, formats = job
    figure = Drawing(plan=plan)
    try:
        return [str(path) for path in figure.save(stem, formats)]
    finally:
        figure.release()


def _workers(n_jobs: int, workers: int | None) -> int:
    if workers is None:
        cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        workers = len(cores) if cores else (os.cpu_count() or 1)
    return max(1, min(workers, n_jobs))


def _context():
    """fork where the platform has it (the workers start with everything imported); spawn
    elsewhere (the worker function and the plans are importable and picklable)."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context(
        "fork" if sys.platform == "linux" and "fork" in methods else "spawn"
    )


def write_drawings(items, formats=DEFAULT_FORMATS, workers: int | None = None) -> list[list[Path]]:
    """Write each (drawing, stem) of `items` as `<stem>.<fmt>` for every format in `formats`;
    returns the paths of each, in order. Planned drawings are drawn by worker processes (`workers`,
    default: one per core, at most one per drawing); the others here. The PNG bytes are kept on
    each drawing (the HTML page embeds them)."""
    items = list(items)
    jobs = {
        k: (d.plan, str(stem), tuple(formats)) for k, (d, stem) in enumerate(items) if _portable(d)
    }
    written: dict[int, list[Path]] = {}
    n = _workers(len(jobs), workers)
    if n > 1:
        with warnings.catch_warnings():  # 3.12+: fork of a process that ran threads (torch)
            warnings.simplefilter("ignore", DeprecationWarning)
            with ProcessPoolExecutor(n, mp_context=_context()) as pool:
                done = pool.map(_draw_and_save, jobs.values())
                written = {k: [Path(p) for p in paths] for k, paths in zip(jobs, done)}
    for k, (d, stem) in enumerate(items):
        if k in written:
            if "png" in formats:
                d._bytes["png"] = written[k][list(formats).index("png")].read_bytes()
            continue
        written[k] = d.save(stem, formats)
        d.release()
    return [written[k] for k in range(len(items))]


def _portable(d: Drawing) -> bool:
    """Whether a worker process can draw `d`: a plan that pickles."""
    if d.plan is None or d._figure is not None:
        return False
    try:
        pickle.dumps(d.plan)
    except Exception:  # a plan holding a live matplotlib object: drawn here instead
        return False
    return True


def finish(fig: Figure, suptitle: str = ""):
    """Lay the panels out, leaving room for a figure title."""
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
        top = 1 - 0.45 / fig.get_figheight()
        fig.tight_layout(rect=(0, 0, 1, top))
    else:
        fig.tight_layout()


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
    _thin_ticks(ax, n_layers, n_heads)
    return ax


def _thin_ticks(ax, n_layers, n_heads):
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
            cbar_label=cbar_label,
        )
    for k in range(n, nrows * ncols):
        axes[k // ncols, k % ncols].set_axis_off()
    finish(fig, title)
    return drawing(fig)


def layer_ticks(ax, n_layers: int):
    step = max(1, math.ceil(n_layers / 16))
    ax.set_xticks(list(range(0, n_layers, step)))
    ax.set_xlim(-0.6, n_layers - 0.4)


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
    _thin_ticks(ax, n_layers, n_heads)


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


def _role_shares(ax, shares: pd.DataFrame, colors: dict[str, str]):
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
