"""Command line: `headprobe run ...`, `headprobe report RESULTS_DIR` and
`headprobe compare RUN_DIR RUN_DIR ... [--out DIR]`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from headprobe import registry
from headprobe.align import BOS_MODES
from headprobe.atomic import OutInUse
from headprobe.attention import CaptureError
from headprobe.checks import UsageError
from headprobe.control import CONTROLS
from headprobe.conventions import PRESETS
from headprobe.corpora.base import CorpusError
from headprobe.probe import PROBES, SPECIALS
from headprobe.store import ResultsError
from headprobe.sites import STACKS

# a bad option, path or input: one line and exit status 2 (anything else unexpected: exit 1)
# (CaptureError: a model whose attention cannot be captured exactly, or a capture that delivered nothing)
USER_ERRORS = (UsageError, CorpusError, OutInUse, ResultsError, CaptureError, FileNotFoundError, ValueError)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: `headprobe: error: ...`, exit status 2."""

    def error(self, message):
        self.exit(2, f"headprobe: error: {message} (see `{self.prog} --help`)\n")


def parse_layers(text: str | None):
    """'0,2,5' or '0-3' or '0-3,8' -> sorted list; None -> all layers (UsageError when malformed:
    '9-3', '-1', 'x')."""
    from headprobe.checks import parse_layers as parse
    return parse(text)


def run_parser(sub):
    p = sub.add_parser("run", help="score every attention head of a model on a corpus")
    p.add_argument("--model", default=None,
                   help="hub name or path; bundled aliases: minilm (default), smollm2")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--treebank", help="CoNLL-U file with gold dependencies (default: data/sample.conllu)")
    source.add_argument("--text", help="raw text file, parsed with the bundled spaCy en_core_web_sm (silver arcs)")
    source.add_argument("--hf-dataset", help="Hugging Face dataset NAME[:CONFIG[:SPLIT]] or a save_to_disk dir")
    p.add_argument("--coref", help="CorefUD CoNLL-U file (Entity= in MISC) for the coreference analysis")
    p.add_argument("--probe", choices=PROBES, default=None,
                   help="a synthetic probe for the token analyses (previous_token, duplicate_token, induction, "
                        "sink): repeated-random = random tokens repeated twice (Olsson et al. 2022); without "
                        "--analyses every token analysis runs on it. Without a probe, token analyses named in "
                        "--analyses read the sentence corpus at piece level")
    p.add_argument("--length", type=int, default=50, help="--probe: random tokens per half (default: 50)")
    p.add_argument("--n", type=int, default=500, dest="probe_n", help="--probe: sequences (default: 500)")
    p.add_argument("--probe-specials", choices=SPECIALS, default="auto",
                   help="--probe: special tokens around each sequence: auto (the tokenizer's own, as for text), "
                        "bos (BOS in front where the tokenizer has one), none (default: auto)")
    p.add_argument("--out", default="results", help="output directory (default: results)")
    p.add_argument("--analyses", default=None,
                   help="comma list of " + ",".join(registry.names()) + " (default: all that apply)")
    p.add_argument("--device", default=None, help="cuda, cpu (default: cuda when available)")
    p.add_argument("--device-map", default=None, metavar="MAP",
                   help="load a big model over several devices with accelerate's dispatch: auto, balanced, "
                        "balanced_low_0, sequential, or a JSON map of module -> device; each layer is scored "
                        "where it runs (not with torchrun)")
    p.add_argument("--max-memory", default=None, metavar="SIZES",
                   help="with --device-map: memory per device, e.g. 0=10GiB,cpu=30GiB")
    p.add_argument("--query-block", type=int, default=None, metavar="N",
                   help="capture attention N query pieces at a time: one layer needs O(N x keys) memory per "
                        "head instead of O(keys^2), for long inputs (e.g. --window 2048); same counts "
                        "(default: whole matrices)")
    p.add_argument("--stack", default=None, choices=STACKS,
                   help="attention stack of an encoder-decoder (T5, BART): encoder (default), decoder (its "
                        "self-attention; the decoder reads its start token, then the sentence), or cross "
                        "(decoder queries over encoder keys: " + ", ".join(a.name for a in registry.analyses() if a.cross)
                        + " only)")
    p.add_argument("--heads", default=None, metavar="HEADS",
                   help="the heads the ablation analysis ablates: LAYER-HEAD pairs like 17-3,18-6 (0-based), "
                        "or all (default: all)")
    p.add_argument("--control", default=None, choices=list(CONTROLS),
                   help="random-init: also score the attention analyses on the same architecture re-initialised "
                        "with --seed (same tokenizer); best heads gain the control's best, and the syntactic role "
                        "needs a head above the control's held-out best")
    p.add_argument("--prune-curve", action="store_true",
                   help="the objective as 0%%, 10%%, ... 100%% of the heads are gated to 0, least important first "
                        "(Michel et al. 2019): by importance, else (no language-model head) by ablation effect")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--layers", default=None, help="layers to score, e.g. 0-3,8 (default: all)")
    p.add_argument("--from-mode", default=None, choices=["mean", "first", "max"],
                   help="pooling of attention FROM a word over its pieces (default: the conventions'; "
                        "spec: mean)")
    p.add_argument("--conventions", default="spec", choices=list(PRESETS),
                   help="scoring conventions: spec (default), or those of the released code behind a "
                        "published number: clark2019-code (from = first piece, root and punct in ALL, "
                        "offsets -3..2 clipped, subtypes cut), joanacero (as clark2019-code with from = mean "
                        "and UD subtypes kept); see docs/CONVENTIONS.md")
    p.add_argument("--window", type=int, default=128, help="coreference window in pieces (default: 128)")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip malformed sentences, in --treebank/--text/--hf-dataset and --coref (warn and count)")
    p.add_argument("--coref-single-document", action="store_true",
                   help="read a --coref file without '# newdoc' lines as one document (refused otherwise)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (default: 1000)")
    p.add_argument("--bos", default="none", choices=BOS_MODES,
                   help="prepend the tokenizer's BOS token: none (inputs as the tokenizer makes them), add, or "
                        "auto (for a causal model whose tokenizer has one but does not add it) (default: none)")
    p.add_argument("--keep-unit-counts", action="store_true",
                   help="also keep per-unit rows (unit_counts.parquet): small corpora and debugging")
    p.add_argument("--no-report", action="store_true", help="do not write the HTML/Markdown report")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run to --out from its checkpoint (same inputs and options)")
    p.add_argument("--checkpoint-every", type=int, default=100, metavar="N",
                   help="checkpoint the counts every N batches, for --resume (default: 100; 0: never)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--debug", action="store_true", help="show the traceback of an unexpected error")


def best_table(best_heads, analyses=("dependency", "coreference"), max_rows=12) -> str:
    import pandas as pd

    rows = best_heads[(best_heads["fold"] == "") & best_heads["analysis"].isin(analyses)].copy()
    if rows.empty:
        return "(no dependency or coreference rows)"
    rows = rows.sort_values(["analysis", "n"], ascending=[True, False])
    keep = []
    for analysis, group in rows.groupby("analysis", sort=False):
        labels = list(dict.fromkeys(group["label"]))[: max_rows // 2]
        keep.append(group[group["label"].isin(labels)])
    table = pd.concat(keep)
    table = table.assign(
        accuracy=table["accuracy"].map("{:.4f}".format),
        interval=[f"[{a:.3f}, {b:.3f}]" for a, b in zip(table["ci_low"], table["ci_high"])],
        baseline=[f"{v:.4f} ({name})" if isinstance(name, str) else "" for v, name in
                  zip(table["baseline_accuracy"], table["baseline_variant"])],
        n=table["n"].astype(int),
    )
    cols = ["analysis", "label", "selection", "heads", "direction", "n", "accuracy", "interval", "baseline"]
    return table[cols].to_string(index=False)


def cmd_run(args) -> int:
    import headprobe

    analyses = [a.strip() for a in args.analyses.split(",")] if args.analyses else None
    results = headprobe.run(
        args.model, treebank=args.treebank, text=args.text, hf_dataset=args.hf_dataset, coref=args.coref,
        out=args.out, analyses=analyses, layers=parse_layers(args.layers), batch_size=args.batch_size,
        device=args.device, dtype=args.dtype, from_mode=args.from_mode, window=args.window,
        skip_bad=args.skip_bad, progress=not args.quiet, seed=args.seed, n_boot=args.bootstrap,
        keep_unit_counts=args.keep_unit_counts, bos=args.bos, conventions=args.conventions,
        report=not args.no_report,
        resume=args.resume, checkpoint_every=args.checkpoint_every,
        probe=args.probe, probe_length=args.length, probe_n=args.probe_n, probe_specials=args.probe_specials,
        device_map=args.device_map, max_memory=args.max_memory, query_block=args.query_block,
        coref_single_document=args.coref_single_document, stack=args.stack, heads=args.heads,
        control=args.control, prune_curve=args.prune_curve)
    if results is None:                     # torchrun: a rank other than 0 (rank 0 prints and writes)
        return 0
    summary = results.summary
    print(f"\nmodel: {summary['model']}  ({summary['n_layers']} layers x {summary['n_heads']} heads; "
          f"layers and heads are 0-based, shown as layer-head)")
    for note in summary["notes"]:
        print(f"note: {note}")
    skipped = {k: v for k, v in summary["skipped"].items() if v and not k.endswith("_sources")}
    if skipped:
        print(f"skipped: {skipped}")
    print("\nbest heads (accuracy with 95% bootstrap interval; baseline = best fixed offset / best rule):")
    print(best_table(results.best_heads))
    if any(registry.get(a).input == "probe" for a in results.tallies if a in registry.names()):
        from headprobe.scorers.token_patterns import top_heads_text
        print(top_heads_text(results))
    out = Path(args.out)
    paths = getattr(results, "saved_paths", {})
    if "report_html" in paths:              # built inside the atomic save (a failure was warned about)
        print(f"\nreport: {paths['report_html']}  {paths.get('report_markdown', '')}")
    print(f"\nresults written to {out.resolve()}/ (counts, best_heads, baselines, positional_heads, surface "
          f"as .parquet and .csv; summary.json)")
    return 0


def cmd_report(args) -> int:
    from headprobe.report import UnreadableResults, build_report

    try:
        paths = build_report(Path(args.results), Path(args.out) if args.out else None,
                             figures_only=args.figures_only)
    except (FileNotFoundError, UnreadableResults) as exc:     # empty, foreign or corrupt: one line
        print(f"headprobe: error: {one_line(exc)}", file=sys.stderr)
        return 2
    _print_paths(paths)
    return 0


def _print_paths(paths: dict) -> None:
    for kind, path in paths.items():
        if isinstance(path, list):
            print(f"{kind}: {len(path)} files" + (f" under {path[0].parent}" if path else ""))
        else:
            print(f"{kind}: {path}")


def cmd_compare(args) -> int:
    from headprobe.report import UnreadableResults
    from headprobe.report.compare import build_comparison

    if len(args.runs) < 2:
        print("headprobe: error: compare needs at least two results directories (the same one twice compares "
              "a run with itself)", file=sys.stderr)
        return 2
    try:
        paths = build_comparison(args.runs, Path(args.out))
    except (FileNotFoundError, UnreadableResults) as exc:
        print(f"headprobe: error: {one_line(exc)}", file=sys.stderr)
        return 2
    _print_paths(paths)
    return 0


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 1000 else text[:997] + "..."


def main(argv=None) -> int:
    """The `headprobe` command. Never a traceback: a bad option, path or input is one line
    and exit status 2; anything unexpected is one line and exit status 1 (its traceback with
    --debug or HEADPROBE_DEBUG=1)."""
    parser = Parser(prog="headprobe", description="What do the attention heads of a Transformer do?")
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser(sub)
    rep = sub.add_parser("report", help="HTML + Markdown report of a results directory")
    rep.add_argument("results", help="results directory written by `headprobe run`")
    rep.add_argument("--out", default=None, help="report directory (default: RESULTS/report)")
    rep.add_argument("--figures-only", action="store_true",
                     help="write only the figures (PNG, SVG and PDF) under OUT/figures")
    rep.add_argument("--debug", action="store_true", help="show the traceback of an unexpected error")
    cmp = sub.add_parser("compare", help="one HTML + Markdown page comparing runs: role maps, role counts, best "
                                         "heads per label, heads matched across models")
    cmp.add_argument("runs", nargs="+", metavar="RUN_DIR", help="results directories written by `headprobe run`")
    cmp.add_argument("--out", default="compare", help="output directory (default: compare)")
    cmp.add_argument("--debug", action="store_true", help="show the traceback of an unexpected error")
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get("HEADPROBE_DEBUG", "") not in ("", "0")
    commands = {"run": cmd_run, "report": cmd_report, "compare": cmd_compare}
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
        print(f"headprobe: error: {type(exc).__name__}: {one_line(exc)} "
              "(unexpected; --debug or HEADPROBE_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
