"""Command line: `headprobe run ...`, `headprobe report RESULTS_DIR` (or a timeline directory),
`headprobe compare RUN_DIR RUN_DIR ... [--out DIR]`,
`headprobe timeline CHECKPOINT... --out DIR [run options]` and `headprobe plugins`.

Only `run` and `timeline` import a run's modules (torch, transformers: `headprobe.config` for its options,
`headprobe.api` for the run); `report` and `compare` read results and import neither, `--help`
included (tests/test_light_imports.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from headprobe.core.atomic import OutInUse
from headprobe.core.errors import CaptureError, UsageError
from headprobe.inputs.corpora.base import CorpusError
from headprobe.results.findings import (
    model_line,
    role_findings,
    selection_analyses,
    skipped_counts,
)
from headprobe.results.store import ResultsError
from headprobe.scoring import registry

# a bad option, path or input: one line and exit status 2 (anything else unexpected: exit 1)
# (CaptureError: a model whose attention cannot be captured exactly, or a capture that delivered nothing)
USER_ERRORS = (
    UsageError,
    CorpusError,
    OutInUse,
    ResultsError,
    CaptureError,
    FileNotFoundError,
    ValueError,
)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: `headprobe: error: ...`, exit status 2."""

    def error(self, message):
        self.exit(2, f"headprobe: error: {message} (see `{self.prog} --help`)\n")


def run_parser(sub, options: bool = True):
    """`headprobe run`: one option per `RunConfig` field that has a flag (`config.cli_options`),
    and the command line's own: --verbose (what it prints) and --debug. Without `options`, the
    command alone: building its options imports `headprobe.config` and the run's modules behind
    it (torch, transformers), which a command line that is not `run` skips."""
    p = sub.add_parser("run", help="score every attention head of a model on a corpus")
    if not options:
        return
    add_run_options(p)
    # output control only: the run and its results are the same with or without it, so it is no
    # RunConfig field (Python has the table as `results.best_heads`; the report shows it)
    p.add_argument(
        "--verbose",
        action="store_true",
        help="also print the best head of every label, in-sample and held-out side by side",
    )
    p.add_argument("--debug", action="store_true", help="show the traceback of an unexpected error")


def timeline_parser(sub, options: bool = True):
    """`headprobe timeline CHECKPOINT... --out DIR`: the checkpoints, --revisions and --steps, and
    every option of `run` but --model (METHODS §17; `headprobe.training.runner.timeline`)."""
    p = sub.add_parser(
        "timeline",
        help="score a model's checkpoints alike and show when each head's role appears",
    )
    if not options:
        return
    p.add_argument(
        "checkpoints",
        nargs="+",
        metavar="CHECKPOINT",
        help="local directories, hub names or NAME@REVISION (e.g. google/multiberts-seed_0-step_20k, "
        "EleutherAI/pythia-70m@step1000), any order: the timeline is ordered by step",
    )
    p.add_argument(
        "--revisions",
        default=None,
        metavar="REVS",
        help="comma list of revisions of the one CHECKPOINT named (e.g. step0,step1000,step2000)",
    )
    p.add_argument(
        "--steps",
        default=None,
        metavar="STEPS",
        help="comma list of the checkpoints' training steps, in the order given (default: parsed from "
        "their names: step_01000, step1000, step_20k)",
    )
    add_run_options(p, skip=("model",))
    p.add_argument("--debug", action="store_true", help="show the traceback of an unexpected error")


def add_run_options(p, skip=()) -> None:
    """The options of `run` (`config.cli_options`) but those named in `skip`, on parser `p`."""
    from headprobe.config import cli_options

    groups = {}
    for name, flag, kwargs, group in cli_options():
        if name in skip:
            continue
        target = p
        if group is not None:
            target = groups.get(group) or groups.setdefault(group, p.add_mutually_exclusive_group())
        target.add_argument(flag, **kwargs)


def best_table(results) -> str:
    """The best head of every label of every selection analysis as text, one row per label:
    in-sample head and accuracy [95% CI], held-out head(s) and accuracy, the in-sample best
    baseline, and the held-out gap [95% CI] (`--verbose`); '—' where no head is named (fewer
    trials than the label needs, METHODS §5)."""
    import pandas as pd

    frames = [results.best_heads_wide(name) for name in selection_analyses(results)]
    rows = pd.concat([f for f in frames if len(f)]) if any(len(f) for f in frames) else None
    if rows is None:
        return "(no best heads)"
    interval = lambda v, lo, hi, sign="": (  # noqa: E731
        "" if pd.isna(v) else f"{v:{sign}.4f} [{lo:{sign}.3f}, {hi:{sign}.3f}]"
    )
    table = pd.DataFrame(
        {
            "analysis": rows["analysis"],
            "label": rows["label"],
            "n": rows["n"].astype(int),
            "head": [
                " ".join(x for x in (h, d) if x) or "—"
                for h, d in zip(rows["heads"], rows["direction"])
            ],
            "accuracy": list(map(interval, rows["accuracy"], rows["ci_low"], rows["ci_high"])),
            "held-out head": rows["heldout_heads"].fillna("").replace("", "—"),
            "held-out": list(
                map(
                    interval,
                    rows["heldout_accuracy"],
                    rows["heldout_ci_low"],
                    rows["heldout_ci_high"],
                )
            ),
            "baseline": [
                f"{v:.4f} ({name})" if isinstance(name, str) and name else ""
                for v, name in zip(rows["baseline_accuracy"], rows["baseline_variant"])
            ],
            "held-out gap": [
                interval(v, lo, hi, "+")
                for v, lo, hi in zip(
                    rows["heldout_gap"], rows["heldout_gap_low"], rows["heldout_gap_high"]
                )
            ],
        }
    )
    return table.to_string(index=False)


def findings_text(results) -> str:
    """What a run found (`results.findings.role_findings`, the lines the report's summary
    prints too): the role counts, then each role's heads with their evidence in brief."""
    lines = []
    for line, items in role_findings(results.for_measure()):
        lines += [line] + [f"  {item}" for item in items]
    return "\n".join(lines)


def cmd_run(args) -> int:
    from headprobe.api import run  # a run's modules (torch, transformers): only for `run`
    from headprobe.config import from_cli

    results = run(from_cli(args))
    if results is None:  # torchrun: a rank other than 0 (rank 0 prints and writes)
        return 0
    print("\n" + (findings_text(results) or "roles: none (no role rule in use)"))
    texts = [
        text(results, name)
        for name in results.tallies
        if name in registry.names() and (text := registry.get(name).console_text()) is not None
    ]
    if any(texts):
        print("\n".join(t for t in texts if t))
    summary = results.summary
    print(f"\n{model_line(results)}\n(heads are named layer-head, both 0-based)")
    for note in summary["notes"]:
        print(f"note: {note}")
    skipped = skipped_counts(summary["skipped"])
    if skipped:
        print(f"skipped: {skipped}")
    if args.verbose:
        print(
            "\nbest heads (accuracy with 95% bootstrap interval; held-out: chosen on one half of "
            "the units, scored on the other; baseline = best fixed offset / best rule):"
        )
        print(best_table(results))
    out = Path(args.out)
    print(
        f"\nresults written to {out.resolve()}/ (counts, best_heads, baselines and each analysis's "
        f"tables as .parquet and .csv; summary.json)"
    )
    paths = getattr(results, "saved_paths", {})
    if "report_html" in paths:  # built inside the atomic save (a failure was warned about)
        print(f"report: {paths['report_html']}  {paths.get('report_markdown', '')}")
    return 0


def cmd_timeline(args) -> int:
    from headprobe.config import cli_options
    from headprobe.training.runner import timeline

    options = {name: getattr(args, name) for name, *_ in cli_options() if name != "model"}
    found = timeline(args.checkpoints, revisions=args.revisions, steps=args.steps, **options)
    print(timeline_text(found))
    return 0


def timeline_text(found) -> str:
    """The onsets beside the objective's steepest fall, one line each, and where things are."""
    lines = ["", "onsets (largest rise between consecutive checkpoints; paired 95% intervals):"]
    for r in found.onsets.itertuples(index=False):
        interval = "" if r.rise_low != r.rise_low else f" [{r.rise_low:+.3f}, {r.rise_high:+.3f}]"
        fall = (
            ""
            if r.objective_from_step != r.objective_from_step
            else f"; objective falls most {int(r.objective_from_step):,} -> "
            f"{int(r.objective_to_step):,} ({'same' if r.same_interval else 'another'} interval)"
        )
        lines.append(
            f"  {r.quantity} {r.analysis} {r.label}: steps {r.from_step:,} -> {r.to_step:,}, "
            f"{r.rise:+.3f}{interval}{fall}"
        )
    lines.append(
        f"\ntimeline written to {found.directory.resolve()}/ (timeline_*.parquet and .csv)"
    )
    report = found.directory / "report"
    if report.is_dir():
        lines.append(
            f"report: {report}/ ({', '.join(sorted(p.name for p in report.glob('timeline.*')))})"
        )
    return "\n".join(lines)


def cmd_report(args) -> int:
    from headprobe.report import UnreadableResults, build_report
    from headprobe.training.page import build_timeline_report, is_timeline

    if is_timeline(args.results):
        _print_paths(
            build_timeline_report(
                Path(args.results), Path(args.out) if args.out else None, args.figures
            )
        )
        return 0
    try:
        paths = build_report(
            Path(args.results),
            Path(args.out) if args.out else None,
            figures_only=args.figures_only,
            formats=args.figures,
        )
    except (FileNotFoundError, UnreadableResults, ValueError) as exc:  # one line, exit 2
        print(f"headprobe: error: {one_line(exc)}", file=sys.stderr)
        return 2
    _print_paths(paths)
    return 0


def report_arguments(rep) -> None:
    """The options of `headprobe report` (and `python -m headprobe.report`)."""
    rep.add_argument("results", help="results directory written by `headprobe run`")
    rep.add_argument("--out", default=None, help="report directory (default: RESULTS/report)")
    rep.add_argument(
        "--figures",
        default="png",
        metavar="FORMATS",
        help="figure formats, a comma list of png, svg, pdf (default: png). Without png only "
        "those figure files are written, beside an existing report: --figures svg,pdf",
    )
    rep.add_argument(
        "--figures-only",
        action="store_true",
        help="write only the figures (in the --figures formats) under OUT/figures",
    )


def _print_paths(paths: dict) -> None:
    for kind, path in paths.items():
        if isinstance(path, list):
            print(f"{kind}: {len(path)} files" + (f" under {path[0].parent}" if path else ""))
        else:
            print(f"{kind}: {path}")


def cmd_compare(args) -> int:
    from headprobe.report import UnreadableResults
    from headprobe.report.comparison_page import build_comparison

    if len(args.runs) < 2:
        print(
            "headprobe: error: compare needs at least two results directories (the same one twice compares "
            "a run with itself)",
            file=sys.stderr,
        )
        return 2
    try:
        paths = build_comparison(args.runs, Path(args.out))
    except (FileNotFoundError, UnreadableResults) as exc:
        print(f"headprobe: error: {one_line(exc)}", file=sys.stderr)
        return 2
    _print_paths(paths)
    return 0


def cmd_plugins(args) -> int:
    print(plugins_text())
    return 0


def plugins_text() -> str:
    """`headprobe plugins`: one row per analysis and probe (built-in or another package's) with
    its package, version, origin, status and options; one row per plugin that failed to import
    or is switched off, with the reason."""
    from headprobe.inputs.probes import PROBES
    from headprobe.version import __version__

    def flags(options) -> str:
        shown = [
            " ".join(x for x in (o.flag, o.metavar) if x)
            for o in options
            if not isinstance(o, str) and o.flag
        ]
        read = [o for o in options if isinstance(o, str)]  # declared elsewhere, read too
        parts = [", ".join(shown)] if shown else []
        parts += [f"reads {', '.join(read)}"] if read else []
        return "; ".join(parts) or "-"

    sources = registry.sources()
    of = {name: s for s in sources for name in (*s.analyses, *s.probes)}
    here = registry.Source("", "", "headprobe", __version__, "loaded")  # registered in-process

    def row(name, kind, options):
        source = of.get(name, here)
        origin = "built-in" if source.builtin or source is here else "plugin"
        package = f"{source.package} {source.version}"
        return (name, kind, package, origin, "loaded", flags(options))

    rows = [row(a.name, "analysis", a.options) for a in registry.analyses()]
    rows += [row(p.name, "probe", p.options) for p in registry.probes()]
    for name in PROBES:  # the inputs' own probe (`headprobe.inputs.probes`)
        rows.append(
            (name, "probe", f"headprobe {__version__}", "built-in", "loaded",
             "--length N, --n N, --probe-specials MODE, --seed N")
        )  # fmt: skip
    for source in sources:
        package = f"{source.package} {source.version}"
        if source.status != "loaded":
            why = source.error.partition(" failed to import: ")[2] or f"off ({registry.DISABLE})"
            rows.append((source.entry, "?", package, "plugin", source.status, why))
        elif not (source.builtin or source.analyses or source.probes or source.entry in of):
            rows.append((source.entry, "-", package, "plugin", "loaded", "registers nothing"))
    header = ("name", "kind", "package", "origin", "status", "options (or why not loaded)")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(5)]
    lines = [
        "  ".join(str(cell).ljust(w) for cell, w in zip(row[:5], widths)) + "  " + row[5]
        for row in [header, *rows]
    ]
    lines.append(
        f"(entry points of the {registry.PLUGINS!r} group; {registry.DISABLE}=name,... or all "
        "switches plugins off)"
    )
    return "\n".join(lines)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 1000 else text[:997] + "..."


def build_parser(run_options: bool | str = True) -> Parser:
    """`headprobe run ...`, `headprobe report ...`, `headprobe compare ...`, `headprobe timeline ...`:
    `build_parser().parse_args(argv)`. `run_options=False` leaves out the options of `run` and
    `timeline` (they import torch); "run" or "timeline" builds them for that command alone (what
    `main` does for a command line that names it)."""
    parser = Parser(
        prog="headprobe", description="What do the attention heads of a Transformer do?"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser(sub, options=run_options == "run" or run_options is True)
    timeline_parser(sub, options=run_options == "timeline" or run_options is True)
    rep = sub.add_parser("report", help="HTML + Markdown report of a results directory")
    report_arguments(rep)
    rep.add_argument(
        "--debug", action="store_true", help="show the traceback of an unexpected error"
    )
    cmp = sub.add_parser(
        "compare",
        help="one HTML + Markdown page comparing runs: role maps, role counts, best "
        "heads per label, heads matched across models",
    )
    cmp.add_argument(
        "runs", nargs="+", metavar="RUN_DIR", help="results directories written by `headprobe run`"
    )
    cmp.add_argument("--out", default="compare", help="output directory (default: compare)")
    cmp.add_argument(
        "--debug", action="store_true", help="show the traceback of an unexpected error"
    )
    plug = sub.add_parser(
        "plugins",
        help="every analysis and probe, built-in or from another package: its package, version "
        "and options, and whether it loaded",
    )
    plug.add_argument(
        "--debug", action="store_true", help="show the traceback of an unexpected error"
    )
    return parser


def command_of(argv) -> str | None:
    """The command a command line names: its first word that is not an option (`headprobe` has
    no options of its own before the command but --help), or None."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv=None) -> int:
    """The `headprobe` command. Never a traceback: a bad option, path or input is one line
    and exit status 2; anything unexpected is one line and exit status 1 (its traceback with
    --debug or HEADPROBE_DEBUG=1). An analysis plugin that fails to import is one warning line
    each (`registry.plugin_errors`), printed by any command that loaded the analyses (`run`,
    its --help, `report`, `plugins`); the command goes on without it, and a run that names it in
    --analyses is refused in one line, exit status 2."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = command_of(argv)
    parser = build_parser(run_options=command if command in ("run", "timeline") else False)
    if command in ("run", "timeline"):
        refused = _unavailable_asked(argv)
        if refused:
            print(f"headprobe: error: {refused}", file=sys.stderr)
            return 2
    warned = _warn_plugins(set())
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get("HEADPROBE_DEBUG", "") not in ("", "0")
    commands = {
        "run": cmd_run,
        "report": cmd_report,
        "compare": cmd_compare,
        "timeline": cmd_timeline,
        "plugins": cmd_plugins,
    }
    try:
        return commands[args.command](args)
    except USER_ERRORS as exc:
        if debug:
            raise
        print(f"headprobe: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("headprobe: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if debug:
            raise
        print(
            f"headprobe: error: {type(exc).__name__}: {one_line(exc)} "
            "(unexpected; --debug or HEADPROBE_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1
    finally:
        _warn_plugins(warned)


def _warn_plugins(warned: set) -> set:
    """Print each plugin failure not yet in `warned` as one warning line, if the analyses have
    been loaded (nothing is loaded here); returns the lines printed so far."""
    for line in registry.loaded_errors():
        if line not in warned:
            print(f"headprobe: warning: {line}", file=sys.stderr)
            warned.add(line)
    return warned


def _unavailable_asked(argv) -> str | None:
    """The one line refusing a run whose --analyses names a plugin that failed to import or is
    switched off (`registry.unavailable`), else None."""
    asked = []
    for k, word in enumerate(argv):
        if word == "--analyses" and k + 1 < len(argv):
            asked += argv[k + 1].split(",")
        elif word.startswith("--analyses="):
            asked += word.partition("=")[2].split(",")
    for name in (a.strip() for a in asked):
        if name and name not in registry.names() and registry.unavailable(name):
            return f"analysis {name!r} is not available: {registry.unavailable(name)}"
    return None


if __name__ == "__main__":
    sys.exit(main())
