"""Writing a report's files from results: `build_report` (report.html, report.md, tables,
figures), `staged_report` (inside a results save) and `main_report` (`python -m headprobe.report`).
The package `headprobe.report` exports these names (its docstring shows them in use).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import uuid
from pathlib import Path

from headprobe.core.atomic import replace_dir
from headprobe.report import html as _html
from headprobe.report import markdown as _markdown
from headprobe.report.build import compose
from headprobe.results import store
from headprobe.results.query import Results

REPORT_HELP = (
    "Build report.html, report.md, tables/*.csv and figures/* from a results directory, without "
    "scoring again; --figures svg,pdf adds vector figures to an existing report"
)


class UnreadableResults(ValueError):
    """A results directory that `Results.load` refuses or cannot read (incomplete, corrupt, foreign)."""


def read_results(source) -> tuple[Results, str]:
    """(`Results`, where they came from) for a `Results` or a results directory.

    Raises FileNotFoundError for a missing directory or one with no results in it, and
    `UnreadableResults` for one whose files are refused or cannot be read."""
    if isinstance(source, Results):
        return source, ""
    directory = Path(source)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such results directory")
    try:
        return Results.load(directory), str(directory)
    except FileNotFoundError:
        raise
    except Exception as err:  # refused, or corrupt JSON / Parquet / npz: many error types
        said = str(err)
        message = (
            said
            if said.startswith(str(directory))
            else f"{directory}: cannot read the results ({type(err).__name__}: {said})"
        )
        raise UnreadableResults(message) from err


def build_report(
    results_or_dir,
    out_dir=None,
    figures_only: bool = False,
    formats=None,
    workers: int | None = None,
) -> dict:
    """Write `report.html`, `report.md`, `roles.csv`, `tables/*.csv` and every figure as
    `figures/<name>.png` (names: `headprobe.results.store`).

    `formats`: the figure formats to write (a subset of `drawing.FORMATS`, or a comma list such as
    "png,svg,pdf"; default PNG only). Without PNG, or with `figures_only`, only the figures are
    written (the pages embed the PNG): `build_report(dir, formats="svg,pdf")` adds vector files to
    an existing report. Each build replaces the files of the formats it writes. Figures are drawn
    by `workers` processes (default: one per core) once the tables are written.

    `results_or_dir`: a `Results` (then `out_dir` is required) or a directory written by
    `headprobe run` / `Results.save` (`out_dir` defaults to `<dir>/report`).

    Returns {"out_dir", "html", "markdown", "figures_dir", "figures": [PNG paths],
    "vector_figures": [SVG and PDF paths], "tables": [CSV paths], "roles"} (all `pathlib.Path`;
    "roles" is the head-role map as a table; only the figure entries when only figures are written).
    """
    from headprobe.report.drawing import DEFAULT_FORMATS, parse_formats

    formats = DEFAULT_FORMATS if formats is None else parse_formats(formats)
    figures_only = figures_only or "png" not in formats
    if out_dir is None:
        if isinstance(results_or_dir, Results):
            raise ValueError("out_dir is required when building a report from a Results object")
        out_dir = Path(results_or_dir) / store.REPORT_DIR
    results, source = read_results(results_or_dir)
    out = Path(out_dir)
    doc = compose(results, source)
    if figures_only:  # figure files added beside an existing report
        return _write(doc, results, out, formats, workers, figures_only=True)
    # the whole report is written into a staging directory beside `out` and swapped in at the
    # end: a build that fails leaves `out` as it was, never a partial report (an earlier
    # report's files that this build does not write, such as vector figures, are carried over)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = out.parent / f".{out.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        if out.is_dir():
            shutil.copytree(out, stage)
        paths = _write(doc, results, stage, formats, workers, figures_only=False)
        replace_dir(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return {key: _moved(value, stage, out) for key, value in paths.items()}


def _moved(value, stage: Path, out: Path):
    """A path (or list of paths) under `stage`, as it is under `out` once swapped in."""
    if isinstance(value, list):
        return [_moved(v, stage, out) for v in value]
    return out / Path(value).relative_to(stage)


def _write(doc, results, out: Path, formats, workers, figures_only: bool) -> dict:
    """`build_report`'s files of `doc` under `out` (only the figures with `figures_only`)."""
    fig_dir = out / store.REPORT_FIGURES
    paths = {"out_dir": out, "figures_dir": fig_dir}
    if not figures_only:
        paths["roles"] = out / store.REPORT_ROLES
        out.mkdir(parents=True, exist_ok=True)
        results.roles.to_csv(paths["roles"], index=False)
        paths["tables"] = write_tables(
            results.for_measure(), out / store.REPORT_TABLES
        )  # several measures: the first
    paths["figures"], paths["vector_figures"] = write_figures(doc, fig_dir, formats, workers)
    if figures_only:
        return paths
    paths["html"] = out / store.REPORT_HTML
    paths["html"].write_text(_html.render(doc), encoding="utf-8")
    paths["markdown"] = out / store.REPORT_MARKDOWN
    paths["markdown"].write_text(_markdown.render(doc, store.REPORT_FIGURES), encoding="utf-8")
    return paths


def write_figures(
    doc, fig_dir: Path, formats=None, workers: int | None = None
) -> tuple[list[Path], list[Path]]:
    """Every figure of `doc` under `fig_dir` in each of `formats` (default PNG only; the files of
    those formats from an earlier build removed first), drawn by `workers` processes (default:
    one per core); returns (PNG paths, SVG and PDF paths)."""
    from headprobe.report.drawing import DEFAULT_FORMATS, write_drawings

    formats = DEFAULT_FORMATS if formats is None else tuple(formats)
    fig_dir.mkdir(parents=True, exist_ok=True)
    for fmt in formats:
        for old in fig_dir.glob(f"*.{fmt}"):
            old.unlink()
    pngs, drawings = [], []
    for fig in doc.figures():
        if isinstance(fig.image, bytes):  # a section that drew PNG bytes itself
            if "png" in formats:
                (fig_dir / fig.filename).write_bytes(fig.image)
                pngs.append(fig_dir / fig.filename)
            continue
        drawings.append((fig.image, fig_dir / fig.name))
    written = [p for paths in write_drawings(drawings, formats, workers) for p in paths]
    pngs += [p for p in written if p.suffix == ".png"]
    return pngs, [p for p in written if p.suffix != ".png"]


def write_tables(results, table_dir: Path) -> list[Path]:
    """The columns a narrow report table leaves out: per selection analysis every best-heads
    column, each baseline and the next best heads (`<analysis>_best_heads.csv`), and the key
    findings (`key_findings.csv`)."""
    from headprobe.results import findings

    table_dir.mkdir(parents=True, exist_ok=True)
    paths = [table_dir / "key_findings.csv"]
    findings.key_findings(results).to_csv(paths[0], index=False)
    for analysis in findings.selection_analyses(results):
        path = table_dir / f"{analysis}_best_heads.csv"
        findings.best_heads_export(results, analysis).to_csv(path, index=False)
        paths.append(path)
    return paths


def staged_report(results, formats=None):
    """For `store.save(results, out, extra=staged_report(results))`: a function that builds
    report/ inside the save's staging directory, so the report is swapped in with the results
    it shows. If building it fails, the results are still saved, without a report: a warning
    on stderr, and no partial report/ left. Returns {"report_html", "report_markdown"} paths."""

    def build(stage: Path) -> dict:
        try:
            built = build_report(results, stage / store.REPORT_DIR, formats=formats)
        except Exception as exc:  # the tables matter more than their rendering
            shutil.rmtree(stage / store.REPORT_DIR, ignore_errors=True)
            print(
                f"headprobe: warning: report not written: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
            return {}
        return {f"report_{key}": built[key] for key in ("html", "markdown")}

    return build


def main_report(argv=None) -> int:
    """`python -m headprobe.report RESULTS_DIR [--out DIR] [--figures png,svg,pdf] [--figures-only]`
    (as `headprobe report`); returns the exit status (2: unreadable, or a bad format)."""
    parser = argparse.ArgumentParser(prog="headprobe report", description=REPORT_HELP)
    parser.add_argument("results_dir", help="directory written by `headprobe run`")
    parser.add_argument(
        "--out", default=None, help="output directory (default: RESULTS_DIR/report)"
    )
    parser.add_argument("--figures", default="png", help="figure formats: png (default), svg, pdf")
    parser.add_argument("--figures-only", action="store_true", help="write only figures/")
    args = parser.parse_args(argv)
    try:
        paths = build_report(
            args.results_dir, args.out, figures_only=args.figures_only, formats=args.figures
        )
    except (FileNotFoundError, UnreadableResults, ValueError) as err:
        print(f"headprobe report: {err}", file=sys.stderr)
        return 2
    for key in ("html", "markdown"):
        if key in paths:
            print(f"wrote {paths[key]}")
    print(
        f"wrote {len(paths['figures']) + len(paths['vector_figures'])} figure files under "
        f"{paths['figures_dir']}"
    )
    return 0
