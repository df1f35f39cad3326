"""Head-role reports: HTML and Markdown, rendered from `Results`.

    from headprobe.report import build_report
    paths = build_report("results/minilm")          # a results directory -> results/minilm/report/
    paths = build_report(results, "out/report")     # or an in-memory `headprobe.Results`
    paths["html"], paths["markdown"], paths["figures"], paths["roles"]
    store.save(results, "out/", extra=staged_report(results))   # results + report/, one atomic save

Command line (wired as `headprobe report RESULTS_DIR [--out DIR]`):

    python -m headprobe.report RESULTS_DIR [--out DIR]

The report only renders: every number is a stored value of the `Results` tables
(`counts`, `best_heads`, `head_tests`, `roles`, derived tables) or a `Results`
view; sections come from the analysis registry (`headprobe.registry`); only the
example pictures draw attention, from `examples.json`.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from headprobe import store
from headprobe.report import html as _html
from headprobe.report import markdown as _markdown
from headprobe.report.build import compose
from headprobe.results import Results

__all__ = ["build_report", "staged_report", "main_report", "compose", "read_results", "UnreadableResults"]


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
    except Exception as err:          # refused, or corrupt JSON / Parquet / npz: many error types
        said = str(err)
        message = said if said.startswith(str(directory)) else \
            f"{directory}: cannot read the results ({type(err).__name__}: {said})"
        raise UnreadableResults(message) from err


def build_report(results_or_dir, out_dir=None) -> dict:
    """Write `report.html`, `report.md`, `roles.csv` and `figures/*.png` (names: `headprobe.store`).

    `results_or_dir`: a `Results` (then `out_dir` is required) or a directory written by
    `headprobe run` / `Results.save` (`out_dir` defaults to `<dir>/report`).

    Returns {"out_dir", "html", "markdown", "figures_dir", "figures": [paths], "roles"}
    (all `pathlib.Path`; "roles" is the head-role map as a table).
    """
    if out_dir is None:
        if isinstance(results_or_dir, Results):
            raise ValueError("out_dir is required when building a report from a Results object")
        out_dir = Path(results_or_dir) / store.REPORT_DIR
    results, source = read_results(results_or_dir)
    out = Path(out_dir)
    doc = compose(results, source)
    fig_dir = out / store.REPORT_FIGURES
    fig_dir.mkdir(parents=True, exist_ok=True)
    for old in fig_dir.glob("*.png"):          # figures of an earlier build of this report
        old.unlink()
    figure_paths = []
    for fig in doc.figures():
        path = fig_dir / fig.filename
        path.write_bytes(fig.png)
        figure_paths.append(path)
    html_path = out / store.REPORT_HTML
    html_path.write_text(_html.render(doc), encoding="utf-8")
    md_path = out / store.REPORT_MARKDOWN
    md_path.write_text(_markdown.render(doc, store.REPORT_FIGURES), encoding="utf-8")
    roles_path = out / store.REPORT_ROLES
    results.roles.to_csv(roles_path, index=False)
    return {"out_dir": out, "html": html_path, "markdown": md_path, "figures_dir": fig_dir,
            "figures": figure_paths, "roles": roles_path}


def staged_report(results):
    """For `store.save(results, out, extra=staged_report(results))`: a function that builds
    report/ inside the save's staging directory, so the report is swapped in with the results
    it shows. If building it fails, the results are still saved, without a report: a warning
    on stderr, and no partial report/ left. Returns {"report_html", "report_markdown"} paths."""
    def build(stage: Path) -> dict:
        try:
            built = build_report(results, stage / store.REPORT_DIR)
        except Exception as exc:         # the tables matter more than their rendering
            shutil.rmtree(stage / store.REPORT_DIR, ignore_errors=True)
            print(f"headprobe: warning: report not written: {type(exc).__name__}: {exc}", file=sys.stderr)
            return {}
        return {f"report_{key}": built[key] for key in ("html", "markdown")}
    return build


def main_report(argv=None) -> int:
    """`python -m headprobe.report RESULTS_DIR [--out DIR]`; returns the exit status (2: unreadable)."""
    parser = argparse.ArgumentParser(
        prog="headprobe report",
        description="Build report.html, report.md and figures/*.png from a results directory.")
    parser.add_argument("results_dir", help="directory written by `headprobe run`")
    parser.add_argument("--out", default=None, help="output directory (default: RESULTS_DIR/report)")
    args = parser.parse_args(argv)
    try:
        paths = build_report(args.results_dir, args.out)
    except (FileNotFoundError, UnreadableResults) as err:
        print(f"headprobe report: {err}", file=sys.stderr)
        return 2
    print(f"wrote {paths['html']}")
    print(f"wrote {paths['markdown']}")
    print(f"wrote {len(paths['figures'])} figures under {paths['figures_dir']}")
    return 0
