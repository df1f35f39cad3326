"""Head-role reports: HTML and Markdown, rendered from `Results`.

    from headprobe.report import build_report
    paths = build_report("results/minilm")          # a results directory -> results/minilm/report/
    paths = build_report(results, "out/report")     # or an in-memory `headprobe.Results`
    paths["html"], paths["markdown"], paths["figures"], paths["roles"]
    build_report("results/minilm", formats="png,svg,pdf")   # figures/*.png, .svg, .pdf too
    build_report("results/minilm", formats="svg,pdf")   # only adds figures/*.svg, .pdf
    store.save(results, "out/", extra=staged_report(results))   # results + report/, one atomic save

Command line (wired as `headprobe report RESULTS_DIR [--out DIR] [--figures png,svg,pdf]
[--figures-only]`):

    python -m headprobe.report RESULTS_DIR [--out DIR] [--figures png,svg,pdf] [--figures-only]

The report only renders: every number is a stored value of the `Results` tables
(`counts`, `best_heads`, `head_tests`, `roles`, derived tables) or a `Results`
view; sections come from the analysis registry (`headprobe.scoring.registry`); only the
example pictures draw attention, from `examples.json`.

The exports are imported on first use (PEP 562), so `headprobe.report.document` (the document
types a section builds, `headprobe.extend` re-exports them) is imported without the renderers,
the figures or the results layer.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for type checkers and the import graph (tests/test_imports.py): as _EXPORTS
    from headprobe.report.build import compose  # noqa: F401
    from headprobe.report.writer import (  # noqa: F401
        UnreadableResults,
        build_report,
        main_report,
        read_results,
        staged_report,
        write_figures,
        write_tables,
    )

_EXPORTS = {
    "build_report": "headprobe.report.writer",
    "staged_report": "headprobe.report.writer",
    "main_report": "headprobe.report.writer",
    "read_results": "headprobe.report.writer",
    "write_figures": "headprobe.report.writer",
    "write_tables": "headprobe.report.writer",
    "UnreadableResults": "headprobe.report.writer",
    "REPORT_HELP": "headprobe.report.writer",
    "compose": "headprobe.report.build",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'headprobe.report' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


__all__ = list(_EXPORTS)
