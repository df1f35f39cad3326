"""The timeline report: scores, roles and the objective over training steps (METHODS §17).

    paths = build_timeline_report("T")            # T/report/timeline.html, .md, figures/*.png
    headprobe report T                            # the same (a timeline directory is recognised)

Line plots over steps (each analysis's best score per label, role counts, the objective; 95%
intervals as bands; a log axis where the steps span decades), the role maps of the checkpoints
side by side, the onsets table, the list of figures, and the methods appendix (the sections
behind the checkpoints' tables and §17). Only renders the saved timeline tables.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from headprobe.report import html as _html
from headprobe.report import markdown as _markdown
from headprobe.report import methods
from headprobe.report.document import (
    BulletList,
    Cell,
    Details,
    Document,
    Figure,
    Paragraph,
    Section,
    Table,
)
from headprobe.report.drawing import (
    DEFAULT_FORMATS,
    Drawing,
    drawing,
    new_figure,
    parse_formats,
    planned,
)
from headprobe.report.role_figures import role_maps_figure
from headprobe.results import store
from headprobe.stats.roles import role_colors
from headprobe.training.timeline_tables import (
    CHECKPOINTS,
    RECORD,
    TABLES,
    objective_analysis,
    role_counts,
)

REPORT_HTML, REPORT_MARKDOWN = "timeline.html", "timeline.md"
MAPS_PER_FIGURE = 6  # role maps side by side in one figure
LABELS_PER_PANEL = 6  # best-score lines per analysis (most trials first)
TIMELINE_SECTION = "s17"


def is_timeline(directory) -> bool:
    """Whether `directory` holds a timeline (its record file)."""
    return (Path(directory) / RECORD).is_file()


def read_timeline(directory: Path) -> tuple[dict, dict]:
    """(record, {table name: DataFrame}) of a timeline directory; FileNotFoundError naming what
    is missing."""
    record = json.loads((directory / RECORD).read_text(encoding="utf-8"))
    tables = {}
    for name in TABLES:
        path = directory / store.table_file(name)
        if not path.is_file():
            raise FileNotFoundError(f"{directory}: timeline table {path.name} is missing")
        tables[name] = pd.read_parquet(path)
    return record, tables


def build_timeline_report(directory, out_dir=None, formats=None) -> dict:
    """Write `timeline.html`, `timeline.md` and `figures/*` of a timeline directory under
    `out_dir` (default `<directory>/report`); returns {"out_dir", "html", "markdown",
    "figures_dir", "figures", "vector_figures"}."""
    from headprobe.report import write_figures
    from headprobe.results.query import Results

    directory = Path(directory)
    record, tables = read_timeline(directory)
    first = record["checkpoints"][0]["checkpoint"]
    results = Results.load(directory / CHECKPOINTS / first)
    doc = compose_timeline(record, tables, results)
    out = Path(out_dir) if out_dir is not None else directory / store.REPORT_DIR
    paths = {"out_dir": out, "figures_dir": out / store.REPORT_FIGURES}
    formats = DEFAULT_FORMATS if formats is None else parse_formats(formats)
    paths["figures"], paths["vector_figures"] = write_figures(doc, paths["figures_dir"], formats)
    paths["html"] = out / REPORT_HTML
    paths["html"].write_text(_html.render(doc), encoding="utf-8")
    paths["markdown"] = out / REPORT_MARKDOWN
    paths["markdown"].write_text(_markdown.render(doc, store.REPORT_FIGURES), encoding="utf-8")
    return paths


def compose_timeline(record: dict, tables: dict, results) -> Document:
    """The report's document: checkpoints, onsets, scores, roles, objective, figures, methods."""
    steps = [c["step"] for c in record["checkpoints"]]
    doc = Document(
        "headprobe timeline: heads over training",
        f"{len(steps)} checkpoints, steps {steps[0]:,} to {steps[-1]:,}; "
        f"{', '.join(a for a in results.analyses if a != objective_analysis())}",
    )
    doc.sections += [
        checkpoints_section(record, tables),
        onsets_section(tables["timeline_onsets"]),
        scores_section(tables, steps),
        roles_section(tables, results, steps),
        objective_section(tables["timeline_objective"], steps),
    ]
    doc.sections.append(figures_section(doc))
    doc.sections.append(methods_section(results))
    return doc


def _interval(value, low, high, digits: int = 3, sign: str = "") -> str:
    if value is None or pd.isna(value):
        return "—"
    if pd.isna(low) or pd.isna(high):
        return f"{value:{sign}.{digits}f}"
    return f"{value:{sign}.{digits}f} [{low:{sign}.{digits}f}, {high:{sign}.{digits}f}]"


def checkpoints_section(record: dict, tables: dict) -> Section:
    s = Section("checkpoints", "Checkpoints")
    s.add(
        Paragraph(
            "Every checkpoint was scored with the same options, inputs, seeds, folds and bootstrap "
            "draws (METHODS §17), so two checkpoints differ only in their weights. Each one's whole "
            "results directory is under checkpoints/<checkpoint>/ (headprobe report renders it)."
        )
    )
    objective = tables["timeline_objective"].set_index("checkpoint")
    rows = []
    for c in record["checkpoints"]:
        o = objective.loc[c["checkpoint"]] if c["checkpoint"] in objective.index else None
        loss = "—" if o is None else _interval(o["value"], o["ci_low"], o["ci_high"])
        rows.append(
            [
                Cell(f"{c['step']:,}", numeric=True),
                Cell(c["checkpoint"]),
                Cell(c["model"], wrap=True),
                Cell(loss, numeric=True),
            ]
        )
    kind = objective["objective"].iloc[0] if len(objective) else "no objective"
    s.add(
        Table(
            "checkpoints",
            f"Checkpoints by step; objective: {kind} (95% interval)",
            ["Step", "Checkpoint", "Model", "Objective"],
            rows,
        )
    )
    return s


def onsets_section(onsets: pd.DataFrame) -> Section:
    s = Section("onsets", "Onsets")
    s.add(
        Paragraph(
            "For each role (the number of heads with it) and each analysis's best score per label, "
            "the consecutive checkpoints between which it rises most, with the rise and its paired "
            "95% bootstrap interval (the same units weigh the same at every checkpoint); beside it, "
            "the checkpoints between which the objective falls most. A role count is a count of "
            "tests' verdicts: it has no resampled interval."
        )
    )
    rows = []
    for r in onsets.itertuples(index=False):
        rows.append(
            [
                Cell(
                    f"{r.quantity}: {r.analysis} {r.label}"
                    + (f" ({r.measure})" if r.measure != "weights" else ""),
                    wrap=True,
                ),
                Cell(f"{r.from_step:,} → {r.to_step:,}", keep=True),
                Cell(_interval(r.rise, r.rise_low, r.rise_high, sign="+"), numeric=True),
                Cell(
                    "—"
                    if pd.isna(r.objective_from_step)
                    else f"{int(r.objective_from_step):,} → {int(r.objective_to_step):,}",
                    keep=True,
                ),
                Cell(
                    _interval(
                        r.objective_fall, r.objective_fall_low, r.objective_fall_high, sign="+"
                    ),
                    numeric=True,
                ),
                Cell("yes" if r.same_interval else "no"),
            ]
        )
    if not rows:
        s.add(Paragraph("No onset: fewer than two checkpoints with a value.", note=True))
        return s
    columns = [
        "Quantity",
        "Rises most",
        "Rise [95%]",
        "Objective falls most",
        "Fall [95%]",
        "Same interval",
    ]
    s.add(
        Table(
            "onsets",
            "Onsets (steps of the two checkpoints)",
            columns,
            rows,
            collapsed=len(rows) > 40,
        )
    )
    return s


# ------------------------------------------------------------------------------- line plots
def log_steps(steps) -> bool:
    """A log axis (symmetric log, linear below the first positive step) where the positive steps
    span two decades or more."""
    positive = [s for s in steps if s > 0]
    return len(positive) > 1 and max(positive) / min(positive) >= 100


@planned
def over_steps_figure(panels: list, ylabel: str, log: bool, colors: dict | None = None) -> Drawing:
    """One panel per (title, frame of step, line, value, low, high): a line per `line` over the
    steps, its 95% interval as a band (where it has one); two panels a row."""
    n_cols = min(2, len(panels))
    n_rows = -(-len(panels) // n_cols)
    fig = new_figure(5.2 * n_cols, 3.0 * n_rows)
    axes = np.atleast_1d(fig.subplots(n_rows, n_cols, squeeze=False)).ravel()
    for ax, (title, frame) in zip(axes, panels):
        for line, sub in frame.groupby("line", sort=False):
            sub = sub.sort_values("step")
            color = (colors or {}).get(line)
            ax.plot(
                sub["step"], sub["value"], marker="o", markersize=3, label=str(line), color=color
            )
            if sub["low"].notna().any():
                ax.fill_between(
                    sub["step"], sub["low"], sub["high"], alpha=0.2, color=ax.lines[-1].get_color()
                )
        if log:
            positive = frame.loc[frame["step"] > 0, "step"]
            ax.set_xscale("symlog", linthresh=float(positive.min()) if len(positive) else 1.0)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("training step" + (" (log)" if log else ""), fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, frameon=False)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return drawing(fig)


def best_panels(best: pd.DataFrame) -> list:
    """Per analysis (and measure): its labels' in-sample best score per step, most trials first."""
    rows = best[(best["selection"] == "in-sample") & (best["fold"] == "")] if len(best) else best
    panels = []
    for (analysis, measure), sub in rows.groupby(["analysis", "measure"], sort=False):
        sizes = sub.groupby("label")["n"].max().sort_values(ascending=False, kind="stable")
        labels = list(sizes.index[:LABELS_PER_PANEL])
        sub = sub[sub["label"].isin(labels)]
        frame = pd.DataFrame(
            {
                "step": sub["step"],
                "line": sub["label"],
                "value": sub["accuracy"],
                "low": sub["ci_low"],
                "high": sub["ci_high"],
            }
        )
        title = analysis if measure == "weights" else f"{analysis} ({measure})"
        panels.append((title, frame))
    return panels


def scores_section(tables: dict, steps) -> Section:
    s = Section("scores", "Best scores over training")
    panels = best_panels(tables["timeline_best"])
    if not panels:
        s.add(Paragraph("No analysis with best heads was scored.", note=True))
        return s
    s.add(
        Figure(
            "timeline_best",
            over_steps_figure(panels, "best head's score", log_steps(steps)),
            "Each analysis's best head per label at every checkpoint (in-sample: the head may differ "
            f"from step to step; at most {LABELS_PER_PANEL} labels, most trials first), with 95% "
            "bootstrap intervals. timeline_best holds every label; timeline_heads every head.",
            alt="best score per label over training steps",
        )
    )
    return s


def roles_section(tables: dict, results, steps) -> Section:
    s = Section("roles", "Head roles over training")
    roles = tables["timeline_roles"]
    colors = role_colors(results)
    counts = role_counts(roles)
    if len(counts):
        measure = counts["measure"].iloc[0]
        counts = counts[counts["measure"] == measure]
        grid = pd.MultiIndex.from_product(
            [steps, sorted(set(counts["role"]))], names=["step", "role"]
        )
        full = counts.set_index(["step", "role"])["heads"].reindex(grid, fill_value=0).reset_index()
        frame = pd.DataFrame(
            {
                "step": full["step"],
                "line": full["role"],
                "value": full["heads"],
                "low": np.nan,
                "high": np.nan,
            }
        )
        s.add(
            Figure(
                "timeline_roles",
                over_steps_figure(
                    [(f"heads per role ({measure})", frame)], "heads", log_steps(steps), colors
                ),
                "How many heads have each role (their first role, METHODS §6) at every checkpoint.",
                alt="role counts over training steps",
            )
        )
    else:
        s.add(Paragraph("No head has a role at any checkpoint.", note=True))
    for k, chunk in enumerate(_role_map_chunks(roles, results)):
        s.add(
            Figure(
                f"timeline_role_maps_{k + 1}",
                role_maps_figure(chunk, colors),
                "The role map of each checkpoint (layer x head; first role), side by side.",
                alt="role maps of the checkpoints",
            )
        )
    return s


def _role_map_chunks(roles: pd.DataFrame, results) -> list:
    """(title, roles, layers, heads) per checkpoint (the first measure), `MAPS_PER_FIGURE` a chunk."""
    if not len(roles) or "role" not in roles:
        return []
    measure = roles["measure"].iloc[0]
    maps = [
        (f"step {step:,}", sub, results.n_layers, results.n_heads)
        for step, sub in roles[roles["measure"] == measure].groupby("step", sort=True)
    ]
    figures = -(-len(maps) // MAPS_PER_FIGURE)
    size = -(-len(maps) // figures) if maps else 1  # as even as can be: 13 maps -> 5, 5, 3
    return [maps[k : k + size] for k in range(0, len(maps), size)]


def objective_section(objective: pd.DataFrame, steps) -> Section:
    s = Section("objective", "The model's own objective")
    if not len(objective):
        s.add(Paragraph("No objective was scored.", note=True))
        return s
    kind = objective["objective"].iloc[0]
    frame = pd.DataFrame(
        {
            "step": objective["step"],
            "line": "objective",
            "value": objective["value"],
            "low": objective["ci_low"],
            "high": objective["ci_high"],
        }
    )
    s.add(Paragraph(f"{kind}, on the inputs scored, at every checkpoint (METHODS §17)."))
    s.add(
        Figure(
            "timeline_objective",
            over_steps_figure([("objective", frame)], "loss (nats)", log_steps(steps)),
            "The objective with its 95% bootstrap interval over units.",
            alt="objective over training steps",
        )
    )
    return s


def figures_section(doc: Document) -> Section:
    s = Section("figures", "Figures")
    s.add(
        Paragraph("The figures of this report, under figures/ (PNG; SVG and PDF with --figures):")
    )
    s.add(BulletList([f"{fig.filename}: {fig.alt}" for fig in doc.figures()]))
    return s


def methods_section(results) -> Section:
    """The timeline's section of METHODS and the sections behind the checkpoints' tables."""
    s = Section("methods", "Methods")
    part = methods.sections().get(TIMELINE_SECTION)
    if part is not None:
        blocks = [Paragraph(f"METHODS §{part.number}. {part.title}", note=True)]
        blocks += methods._blocks(part.number, part.markdown)
        s.add(Details(f"Methods: heads over training (METHODS §{part.number})", blocks))
    s.add(methods.appendix(results))
    s.add(methods.citation_block())
    return s
