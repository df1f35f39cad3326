"""Head-role reports: HTML and Markdown from a results directory.

    from headprobe.report import build_report
    paths = build_report("results/minilm")          # -> results/minilm/report/
    paths["html"], paths["markdown"], paths["figures"]

Command line (wired as `headprobe report RESULTS_DIR [--out DIR]`):

    python -m headprobe.report RESULTS_DIR [--out DIR]

Every number in a report is read from the results tables (`counts`,
`best_heads`, `summary.json`); only the example pictures draw attention, from
`examples.json` when the pipeline wrote one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from headprobe.report import html as _html
from headprobe.report import markdown as _markdown
from headprobe.report.build import compose
from headprobe.report.roles import ROLE_ORDER, RoleRules, head_roles, role_summary
from headprobe.report.tables import ReportData, load

__all__ = ["build_report", "main_report", "compose", "load", "ReportData", "RoleRules",
           "head_roles", "role_summary", "ROLE_ORDER"]


def build_report(results_dir, out_dir=None, rules: RoleRules | None = None) -> dict:
    """Write `report.html`, `report.md` and `figures/*.png` for a results directory.

    `results_dir`: a directory holding `counts.parquet` (or `.csv`), `best_heads.parquet`,
    `summary.json` and optionally `examples.json`; or an in-memory `Results` object
    (then `out_dir` is required). `out_dir` defaults to `<results_dir>/report`.

    Returns {"out_dir", "html", "markdown", "figures_dir", "figures": [paths], "roles"}
    (all `pathlib.Path`; "roles" is `roles.csv`, the head-role map as a table).
    """
    if out_dir is None:
        if hasattr(results_dir, "counts"):
            raise ValueError("out_dir is required when results_dir is a Results object")
        out_dir = Path(results_dir) / "report"
    out = Path(out_dir)
    data = load(results_dir)
    doc = compose(data, rules or RoleRules())
    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    for old in fig_dir.glob("*.png"):          # figures of an earlier build of this report
        old.unlink()
    figure_paths = []
    for fig in doc.figures():
        path = fig_dir / fig.filename
        path.write_bytes(fig.png)
        figure_paths.append(path)
    html_path = out / "report.html"
    html_path.write_text(_html.render(doc), encoding="utf-8")
    md_path = out / "report.md"
    md_path.write_text(_markdown.render(doc, "figures"), encoding="utf-8")
    roles_path = out / "roles.csv"
    head_roles(data.counts, data.n_layers, data.n_heads, rules or RoleRules()) \
        .to_csv(roles_path, index=False)
    return {"out_dir": out, "html": html_path, "markdown": md_path, "figures_dir": fig_dir,
            "figures": figure_paths, "roles": roles_path}


def main_report(argv=None) -> int:
    """`headprobe report RESULTS_DIR [--out DIR]`; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="headprobe report",
        description="Build report.html, report.md and figures/*.png from a results directory.")
    parser.add_argument("results_dir", help="directory written by `headprobe run`")
    parser.add_argument("--out", default=None,
                        help="output directory (default: RESULTS_DIR/report)")
    args = parser.parse_args(argv)
    try:
        paths = build_report(args.results_dir, args.out)
    except FileNotFoundError as err:
        print(f"headprobe report: {err}", file=sys.stderr)
        return 2
    print(f"wrote {paths['html']}")
    print(f"wrote {paths['markdown']}")
    print(f"wrote {len(paths['figures'])} figures under {paths['figures_dir']}")
    return 0
