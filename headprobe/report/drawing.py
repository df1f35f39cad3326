"""How a report figure is made and written (seaborn / matplotlib): each figure function returns
a `Drawing`, drawn when first used; the figures themselves are in `heatmaps.py`,
`role_figures.py` and the analyses' report sections.

    drawing = role_map_figure(roles, 6, 12, colors)   # a plan (`role_figures`): nothing drawn yet
    drawing.png, drawing.svg, drawing.pdf              # bytes of each format (drawn on first use)
    drawing.save("figures/roles", ("png", "svg"))      # roles.png, roles.svg
    write_drawings([(drawing, "figures/roles")], ("png",))   # many, in worker processes

Every public figure function is `@planned`: calling it records the function and its arguments
(plain data: arrays, tables, strings), so a report's figures can be drawn by worker processes
(`write_drawings`, one per core) once its tables are saved. Figures are drawn on
`matplotlib.figure.Figure` objects with the Agg canvas, never through pyplot, so building a
report touches no global backend state (it works headless and inside a notebook with an inline
backend alike). Vector files carry no date and fixed ids (same figure, same bytes) and PDF fonts
are embedded as TrueType (Type 42), as journals ask.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import pickle
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from headprobe.core.processes import usable_cores, worker_pool

DPI = 100


ANNOTATE_MAX_SIDE = (
    16  # a heatmap's cells carry their value up to 16 x 16 cells; beyond, a colour bar
)


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


def jittered_dots(ax, x, y, *, size: float, alpha: float, color: str, jitter: float = 0.2):
    """One dot per value at x (a layer) plus a uniform jitter in [-jitter, jitter], drawn from a
    generator of its own with a fixed seed (the same figure, the same bytes): seaborn's
    `stripplot` look (dots of `size` points across, no edge).

    Hand-written rather than `seaborn.stripplot`: seaborn's import brings scipy.stats with it,
    2.3 s in each worker process that draws a report's figures (a figure of its own takes 0.1 s),
    and these dots need nothing of it."""
    x = np.asarray(x, dtype=float)
    offsets = np.random.default_rng(0).uniform(-jitter, jitter, size=x.shape)
    ax.scatter(x + offsets, y, s=size**2, alpha=alpha, color=color, linewidths=0, zorder=2)


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
        workers = usable_cores()
    return max(1, min(workers, n_jobs))


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
        with worker_pool(n) as pool:
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


def finish(fig: Figure, suptitle: str = "", right: float = 0.0):
    """Lay the panels out, leaving room for a figure title and `right` inches on the right
    (for a colour bar shared by every panel)."""
    top = 1.0
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
        top = 1 - 0.45 / fig.get_figheight()
    fig.tight_layout(rect=(0, 0, 1 - right / fig.get_figwidth(), top))
