"""Report section of the surface analysis (`headprobe.studies.surface.analysis`; Clark et al. 2019 section
3, Figures 2 and 4).

    section = surface_section(results, "surface")   # registered as the analysis's report

Attention mass per label and entropy, per head and per layer; rendering only.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from headprobe.extend import Cell, Figure, Paragraph, Section, Table
from headprobe.report.document import slug
from headprobe.report.drawing import Drawing, drawing, finish, jittered_dots, new_figure, planned
from headprobe.report.heatmaps import layer_ticks
from headprobe.report.rendered_tables import LEGEND, fmt, fmt_ci, head_name
from headprobe.results.findings import repeated_columns
from headprobe.studies.surface.surface_measures import special_share, surface_side_by_side

SURFACE_COLUMNS = [
    ("cls", "CLS/BOS"),
    ("sep", "SEP/EOS"),
    ("first", "first position"),
    ("sink_mass", "first + SEP/EOS"),
    ("punct", "punct"),
    ("self", "self"),
    ("prev", "prev"),
    ("next", "next"),
    ("entropy", "entropy"),
    ("entropy_uniform", "uniform entropy"),
    ("entropy_ratio", "entropy / uniform"),
]


def surface_section(results, analysis: str) -> Section:
    """Attention mass per label and entropy, per head and per layer (`Results.mass_per_head`)."""
    key = slug(analysis)
    s = Section(key, "Surface statistics (Clark et al. 2019, section 3)")
    s.add(
        Paragraph(
            "Mean attention mass a word pays to [CLS]/BOS, [SEP]/EOS, the first position of the input, "
            "punctuation words, itself, the previous and the next word (Clark et al. Figure 2), and the mean "
            "entropy of the attention rows in nats over pieces, beside the entropy of uniform attention (their "
            "Figure 4). Per-layer values are the layer's summed mass over its summed counts."
        )
    )
    per_head, per_layer = results.mass_per_head(analysis), results.mass_per_layer(analysis)
    if not len(per_head):
        s.add(Paragraph(f"No {analysis} rows for attention heads.", note=True))
        return s
    same = repeated_columns(per_head, [k for k, _ in SURFACE_COLUMNS])  # an encoder: first = [CLS]
    if same:
        s.add(
            Paragraph(
                "Measures holding the same numbers on every head are shown once: "
                + "; ".join(f"{_surface_name(k)} = {_surface_name(v)}" for k, v in same.items())
                + " (every input starts with that special token)."
            )
        )
    for figure in _surface_figures(key, per_head, per_layer, same):
        s.add(figure)
    for table in _surface_tables(key, per_head, per_layer, same):
        s.add(table)
    return s


def _surface_figures(key: str, per_head, per_layer, same: dict) -> list[Figure]:
    """The mass per head and layer, and the entropy, as figures (the columns in `same` dropped)."""
    figures = []
    if any(c in per_head.columns for c in SURFACE_TITLES):
        figures.append(
            Figure(
                f"{key}_mass",
                surface_figure(per_head.drop(columns=list(same)), per_layer),
                "Mean attention mass per head (dots) and per layer (line), by layer (0-based).",
                alt="surface statistics",
            )
        )
    if "entropy" in per_head.columns:
        figures.append(
            Figure(
                f"{key}_entropy",
                entropy_figure(per_head, per_layer),
                "Mean entropy of the attention rows per head (dots) and per layer (line), with the entropy "
                "of uniform attention (dashed).",
                alt="entropy",
            )
        )
    return figures


def _surface_tables(key: str, per_head, per_layer, same: dict) -> list[Table]:
    """The surface statistics per layer and per head (a column in `same` shown once)."""
    names = {k: name for k, name in SURFACE_COLUMNS}
    for dropped, kept in same.items():
        names[kept] = f"{names[kept]} = {names[dropped]}"
    keys = [k for k, _ in SURFACE_COLUMNS if k not in same]
    cols = [(k, names[k]) for k in keys if k in per_layer.columns]
    rows = [
        [Cell(str(int(r["layer"])))] + [Cell(fmt(r[k]), {"col": k}, True) for k, _ in cols]
        for r in per_layer.to_dict("records")
    ]
    tables = [
        Table(
            f"{key}-per-layer",
            "Surface statistics per layer (summed over the layer's heads; mass in "
            "[0, 1], entropy in nats)",
            ["Layer"] + [n for _, n in cols],
            rows,
            [{"layer": int(x)} for x in per_layer["layer"]],
        )
    ]
    cols = [(k, names[k]) for k in keys if k in per_head.columns]
    rows = [
        [Cell(head_name(r["layer"], r["head"]))]
        + [Cell(fmt(r[k]), {"col": k}, True) for k, _ in cols]
        for r in per_head.to_dict("records")
    ]
    tables.append(
        Table(
            f"{key}-per-head",
            "Surface statistics per head. " + LEGEND,
            ["Head"] + [n for _, n in cols],
            rows,
            [
                {"layer": int(l), "head": int(h)}
                for l, h in zip(per_head["layer"], per_head["head"])
            ],
            collapsed=True,
        )
    )
    return tables


def _surface_name(key: str) -> str:
    return dict(SURFACE_COLUMNS).get(key, key)


SURFACE_TITLES = {
    "cls": "[CLS] / BOS",
    "sep": "[SEP] / EOS",
    "punct": "punctuation",
    "self": "self (same word)",
    "prev": "previous word",
    "next": "next word",
    "first": "the first position",
}


@planned
def surface_figure(per_head: pd.DataFrame, per_layer: pd.DataFrame) -> Drawing:
    """Clark et al. (2019) Figure 2 style: mean attention mass per head, by layer."""
    labels = [lab for lab in SURFACE_TITLES if lab in per_head.columns]
    ncols = 3
    nrows = math.ceil(len(labels) / ncols)
    n_layers = int(per_head["layer"].max()) + 1
    width = max(3.2, 0.22 * n_layers + 1.8)
    fig = new_figure(ncols * width, nrows * 2.6 + 0.4)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for k, lab in enumerate(labels):
        ax = axes[k // ncols, k % ncols]
        jittered_dots(ax, per_head["layer"], per_head[lab], size=3.5, alpha=0.7, color="#4c72b0")
        ax.plot(per_layer["layer"], per_layer[lab], color="#c44e52", lw=1.5, label="layer mean")
        ax.set_title(f"attention to {SURFACE_TITLES.get(lab, lab)}", fontsize=9)
        ax.set_ylabel("mean mass", fontsize=8)
        ax.set_xlabel("layer (0-based)", fontsize=8)
        ax.set_ylim(-0.02, 1.02)
        layer_ticks(ax, n_layers)
        ax.tick_params(labelsize=7)
        if k == 0:
            ax.legend(fontsize=7, loc="upper right")
    for k in range(len(labels), nrows * ncols):
        axes[k // ncols, k % ncols].set_axis_off()
    finish(fig, "Mean attention mass per head (dots) and per layer (line)")
    return drawing(fig)


@planned
def entropy_figure(per_head: pd.DataFrame, per_layer: pd.DataFrame) -> Drawing:
    """Clark et al. (2019) Figure 4 style: mean row entropy per head, by layer, with the
    uniform-attention entropy."""
    n_layers = int(per_head["layer"].max()) + 1
    fig = new_figure(max(4.5, 0.25 * n_layers + 2.5), 3.2)
    ax = fig.subplots()
    jittered_dots(ax, per_head["layer"], per_head["entropy"], size=4, alpha=0.75, color="#4c72b0")
    if "entropy_uniform" in per_layer.columns:
        ax.plot(
            per_layer["layer"],
            per_layer["entropy_uniform"],
            ls="--",
            color="black",
            lw=1.2,
            label="uniform attention",
        )
    ax.plot(per_layer["layer"], per_layer["entropy"], color="#c44e52", lw=1.5, label="layer mean")
    ax.set_xlabel("layer (0-based)", fontsize=8)
    ax.set_ylabel("mean entropy (nats)", fontsize=8)
    ax.set_title("Entropy of attention rows (over pieces)", fontsize=9)
    layer_ticks(ax, n_layers)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return drawing(fig)


# ---------------------------------------------------------------- under two measures (METHODS §7)

SURFACE_NAMES = {
    "cls": "[CLS]/BOS",
    "sep": "[SEP]/EOS",
    "first": "first position",
    "punct": "punctuation",
    "self": "self",
    "prev": "previous word",
    "next": "next word",
    "entropy_ratio": "entropy / uniform",
}


def measures_blocks(results, analysis: str, first: str, second: str) -> list:
    """The surface analysis in the report's weights-beside-norms section: the share of attention
    on the specials per layer, and the statistics per layer, under `first` and `second`."""
    blocks = []
    share = special_share(results)
    if len(share):
        blocks.append(_special_share_table(share, first, second))
    side = surface_side_by_side(results)
    if len(side):
        blocks.append(_side_by_side_table(side, first, second))
    return blocks


def _special_share_table(share, first: str, second: str) -> Table:
    """The share of attention on the special tokens per layer under each measure, and its change."""
    has_ci = share[f"{first}_low"].notna().any()
    rows = [
        [
            Cell(str(int(r["layer"]))),
            *[
                Cell(
                    fmt(r[m]) + (" " + fmt_ci(r[f"{m}_low"], r[f"{m}_high"]) if has_ci else ""),
                    numeric=True,
                )
                for m in (first, second)
            ],
            Cell(
                fmt(r.get("change", np.nan))
                + (
                    " " + fmt_ci(r["change_low"], r["change_high"])
                    if has_ci and "change_low" in r
                    else ""
                ),
                numeric=True,
            ),
        ]
        for _, r in share.iterrows()
    ]
    note = (
        "95% intervals: Poisson bootstrap over units, the change paired"
        if has_ci
        else "no intervals: they need per-unit counts (--keep-unit-counts)"
    )
    return Table(
        "measures-special-share",
        f"Share of a word's attention on [CLS]/BOS + [SEP]/EOS per layer, "
        f"mean over heads ({note}). Layers 0-based.",
        ["Layer", first, second, f"{second} - {first}"],
        rows,
    )


def _side_by_side_table(side, first: str, second: str) -> Table:
    """The surface statistics per layer under each measure, and their change."""
    rows = [
        [
            Cell(SURFACE_NAMES.get(r.label, r.label)),
            Cell(str(int(r.layer))),
            Cell(fmt(getattr(r, first)), numeric=True),
            Cell(fmt(getattr(r, second)), numeric=True),
            Cell(fmt(r.change), numeric=True),
        ]
        for r in side.itertuples(index=False)
    ]
    return Table(
        "measures-surface",
        "Surface statistics per layer (mean over heads) under each measure",
        ["Statistic", "Layer", first, second, "Change"],
        rows,
        collapsed=len(rows) > 40,
    )
