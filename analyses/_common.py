"""Shared plumbing for the analysis scripts: arguments, running or loading results, output.

Every script either runs the pipeline through the Python API

    headprobe.run(model=..., treebank=..., coref=..., text=..., out=..., analyses=[...],
                  batch_size=..., device=..., layers=...) -> Results

or, with `--results DIR`, reuses a results directory through
`headprobe.load_results(DIR)`. Arguments left unset are not passed to `run`,
so the API's own defaults apply (`model=None` is the bundled MiniLM; the alias
`smollm2` selects SmolLM2). The scripts then read the `Results` query layer
(`best_heads_wide`, `head_scores`, `roles`, derived tables) and draw with
`headprobe.report.heatmaps`, `role_figures`; they compute nothing the results already hold.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
EWT_DEV = SHARED_DATA / "en_ewt-ud-dev.conllu"
GUM_DEV = SHARED_DATA / "en_gum-ud-dev.conllu"

if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))


def default_path(path: Path) -> str | None:
    return str(path) if path.exists() else None


def model_arg(value: str | None):
    """CLI model name -> API value: 'default' / 'minilm' / '' mean None (the bundled MiniLM)."""
    if value is None or value.strip().lower() in ("", "default", "none", "minilm"):
        return None
    return value


def base_parser(
    description: str, *, treebank=True, coref=False, text=False
) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model",
        default=None,
        help="model name or path; default: the bundled all-MiniLM-L6-v2; "
        "'smollm2' selects the bundled SmolLM2",
    )
    if treebank:
        p.add_argument(
            "--treebank",
            default=default_path(EWT_DEV),
            help="CoNLL-U file with gold dependencies (default: UD English EWT dev "
            "from ../shared/data when present, else the API's default)",
        )
    if coref:
        p.add_argument(
            "--coref",
            default=default_path(GUM_DEV),
            help="CoNLL-U file with CorefUD Entity= annotation (default: UD English "
            "GUM dev from ../shared/data when present, else the API's default)",
        )
    if text:
        p.add_argument(
            "--text", default=None, help="plain-text file to parse with spaCy instead of a treebank"
        )
    add_run_args(p)
    return p


def add_run_args(p: argparse.ArgumentParser):
    p.add_argument(
        "--results",
        default=None,
        help="reuse a results directory (headprobe.load_results) instead of running",
    )
    p.add_argument("--out", default=None, help="output directory (default: out/<script name>)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--device", default=None, help="e.g. cpu, cuda, cuda:1 (default: API's)")
    p.add_argument(
        "--layers", default=None, help="comma-separated 0-based layers to score (default: all)"
    )
    p.add_argument(
        "--report",
        action="store_true",
        help="also build the full HTML/Markdown report of the results",
    )


def out_dir(args, script: str) -> Path:
    out = Path(args.out) if args.out else REPO / "out" / script
    out.mkdir(parents=True, exist_ok=True)
    return out


def parse_layers(value):
    if value is None:
        return None
    return [int(x) for x in str(value).split(",") if x.strip()]


def get_results(
    args, analyses: list[str], out: Path, *, model=None, name: str = "results", **options
):
    """Run the pipeline (or load `--results`); results are saved under out/<name>. `options` go to
    `headprobe.run` as they are (e.g. `measure="weights,norms"`)."""
    import headprobe

    if getattr(args, "results", None):
        return headprobe.load_results(args.results)
    kwargs = {
        "model": model_arg(getattr(args, "model", None) if model is None else model),
        "analyses": list(analyses),
    }
    for key in ("treebank", "coref", "text", "batch_size", "device"):
        value = getattr(args, key, None)
        if value is not None:
            kwargs[key] = value
    layers = parse_layers(getattr(args, "layers", None))
    if layers is not None:
        kwargs["layers"] = layers
    kwargs.update(options)
    target = out / name
    kwargs["out"] = str(target)
    results = headprobe.run(**kwargs)
    if not (target / "summary.json").exists():
        results.save(str(target))
    return results


def maybe_report(args, results, out: Path):
    if getattr(args, "report", False):
        from headprobe.report import build_report

        paths = build_report(results, out / "report")
        print(f"report: {paths['html']}")


def model_name(results, args) -> str:
    return results.summary.get("model") or getattr(args, "model", None) or "default model"


def write_table(df, out: Path, stem: str, title: str = "") -> None:
    """Write df as CSV and Markdown and print it."""
    import pandas as pd

    csv = out / f"{stem}.csv"
    df.to_csv(csv, index=False)
    df = df.copy()
    for column in df.columns:  # counts stored as floats print as whole numbers
        values = df[column]
        if (
            values.dtype.kind == "f"
            and values.notna().any()
            and values.max() > 1
            and (values.dropna() % 1 == 0).all()
        ):
            df[column] = values.astype("Int64")
    with pd.option_context(
        "display.width", 200, "display.max_columns", 50, "display.max_rows", 200
    ):
        text = df.to_string(index=False, float_format=_number)
    md = out / f"{stem}.md"
    md.write_text((f"# {title}\n\n" if title else "") + _markdown(df) + "\n", encoding="utf-8")
    if title:
        print(f"\n{title}")
    print(text)
    print(f"\nwrote {csv} and {md}")


def _markdown(df) -> str:
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        cells = [_cell(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(v) -> str:
    import pandas as pd

    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return "—"
    if isinstance(v, float):
        return _number(v)
    return str(v).replace("|", "\\|")


def _number(v: float) -> str:
    """4 decimals; small values (p-values) in 2 significant digits."""
    return f"{v:.2g}" if 0 < abs(v) < 1e-3 else f"{v:.4f}"


def write_png(data, out: Path, stem: str) -> Path:
    """Write a figure as `<stem>.png` and, for a `headprobe.report.drawing.Drawing`, also as
    `.svg` and `.pdf` beside it (figures for papers); returns the PNG's path."""
    if isinstance(data, bytes):
        path = out / f"{stem}.png"
        path.write_bytes(data)
    else:
        path = data.save(out / stem)[0]
    print(f"wrote {path}" + ("" if isinstance(data, bytes) else " (and .svg, .pdf)"))
    return path


def first_sentences(path, n: int | None, out: Path) -> str | None:
    """The first `n` sentences of a CoNLL-U file (comment lines such as `# newdoc id` kept), written
    to out/<name>.first<n>.conllu, for quick runs; the file itself when `n` is None."""
    if path is None or n is None:
        return None if path is None else str(path)
    blocks = Path(path).read_text(encoding="utf-8").split("\n\n")
    kept = [b.strip("\n") for b in blocks if b.strip()][:n]
    target = out / f"{Path(path).stem}.first{n}.conllu"
    target.write_text("\n\n".join(kept) + "\n\n", encoding="utf-8")
    return str(target)
