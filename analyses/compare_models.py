"""Compare head roles across models, side by side: which roles each model has, and where.

Findings it puts next to each other: Clark et al. (2019) and Kovaleva et al. (2019)
describe BERT's heads as a mix of broad early heads, previous/next-token heads,
heads that dump attention on [CLS]/[SEP] and a few specialised (syntactic,
coreference) heads in the middle layers; Voita et al. (2019) find positional
heads in every model. Decoder LMs add an attention sink on BOS. This script
runs (or loads) two or more models on the same data, reads every head's role
from the results (`results.roles`: METHODS §6 rules, positional,
syntactic, coreference, sink, broad, none; see headprobe.stats.roles), and tabulates
per model how many heads take each role and at what relative depth
(layer / (layers - 1)), beside the best dependency and coreference heads, and
matches the heads of the models one to one on their profiles of per-label
scores (headprobe.results.comparison: which head of one model does what a head of the
other does, and whether it keeps its role).

    .venv/bin/python analyses/compare_models.py                      # MiniLM vs SmolLM2
    .venv/bin/python analyses/compare_models.py --models minilm smollm2 bert-base-uncased
    .venv/bin/python analyses/compare_models.py --results out/a/results out/b/results

Outputs under --out (default out/compare_models/): side_by_side.csv/.md (rows:
measures, columns: models), roles_per_head.csv (one row per model x head, with
each rule's evidence), compare/ (the page `headprobe compare` writes:
compare.html and .md, figures/ role maps side by side, role shares and depths,
matched heads, as PNG, SVG and PDF; tables/ role counts, best heads per label,
matched heads, roles kept), role_map_<model>.png/.svg/.pdf, results_<model>/.
"""

from __future__ import annotations

import argparse
import re
import sys

import _common as C

ANALYSES = ("dependency", "coreference", "positional", "surface")


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", str(text)).strip("-").lower() or "model"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--models",
        nargs="+",
        default=["minilm", "smollm2"],
        help="models to run ('minilm' or 'default' = the bundled MiniLM, 'smollm2' = the "
        "bundled SmolLM2, or any Hugging Face name/path)",
    )
    p.add_argument(
        "--results",
        nargs="+",
        default=None,
        help="compare existing results directories instead of running",
    )
    p.add_argument(
        "--treebank",
        default=C.default_path(C.EWT_DEV),
        help="CoNLL-U treebank (default: UD English EWT dev when present)",
    )
    p.add_argument(
        "--coref",
        default=C.default_path(C.GUM_DEV),
        help="CorefUD CoNLL-U (default: UD English GUM dev when present)",
    )
    p.add_argument("--text", default=None, help="plain text to parse with spaCy instead")
    p.add_argument("--analyses", nargs="+", default=list(ANALYSES), choices=ANALYSES)
    p.add_argument("--out", default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--layers", default=None)
    args = p.parse_args(argv)
    if args.text:
        args.treebank = None
    out = C.out_dir(args, "compare_models")

    import pandas as pd

    import headprobe
    from headprobe.inputs.corpora.base import ALL
    from headprobe.report.role_figures import role_map_figure
    from headprobe.stats.roles import NONE, role_colors

    runs = []  # (label, Results)
    if args.results:
        for d in args.results:
            runs.append((None, headprobe.load_results(d)))
    else:
        if "coreference" not in args.analyses:
            args.coref = None
        run_args = argparse.Namespace(**{**vars(args), "results": None})
        for name in args.models:
            print(f"running {name} ...", flush=True)
            runs.append(
                (
                    name,
                    C.get_results(
                        run_args, args.analyses, out, model=name, name=f"results_{slug(name)}"
                    ),
                )
            )
    if len(runs) < 2:
        print("note: comparing fewer than two models", file=sys.stderr)

    from headprobe.report.comparison_page import build_comparison
    from headprobe.results.comparison import Run, compare_runs, unique_names

    colors, rules = {}, {}  # every model's roles, in the order they are tried
    for _, results in runs:
        colors.update({k: v for k, v in role_colors(results).items() if k != NONE})
        rules.update({rule.role: rule.description for rule in results.role_rules()})
    colors[NONE] = role_colors()[NONE]
    compared = unique_names(
        [
            Run(str(results.summary.get("model") or name or "model"), results)
            for name, results in runs
        ]
    )
    tables = compare_runs(compared)
    counts = tables["role_counts"]

    columns, per_head = {}, []
    for run in compared:
        label, results = run.name, run.results
        L, H = results.n_layers, results.n_heads
        roles = results.roles.copy()
        roles.insert(0, "model", label)
        roles["relative_depth"] = roles["layer"] / max(L - 1, 1)
        per_head.append(roles)
        summary = counts[counts["run"] == label]
        col = {
            "layers x heads": f"{L} x {H}",
            "heads": str(L * H),
            "decoder (causal)": "yes" if results.summary.get("causal") else "no",
        }
        for r in summary.itertuples(index=False):
            col[f"{r.role} heads"] = f"{r.heads} ({100 * r.share:.1f}%)"
        for r in summary.itertuples(index=False):
            if r.role != NONE:
                depth = roles.loc[roles["role"] == r.role, "relative_depth"]
                col[f"{r.role}: mean relative depth"] = f"{depth.mean():.2f}" if len(depth) else "—"
                col[f"{r.role}: layers"] = r.layers or "—"
        for pair in tables["pairs"].itertuples(index=False):
            if pair.run_a == label:
                col[f"heads matched with {pair.run_b}: mean similarity (chance)"] = (
                    f"{pair.mean_similarity:.3f} ({pair.mean_all_pairs:.3f})"
                )
                col[f"heads matched with {pair.run_b}: roles kept"] = f"{pair.roles_kept:.1%}"
        pos = roles[roles["role"] == "positional"]
        col["positional offsets"] = (
            ", ".join(f"{k}: {v}" for k, v in pos["short"].value_counts().items()) or "—"
        )
        syn = roles[roles["role"] == "syntactic"]
        col["syntactic relations (top per head)"] = (
            ", ".join(f"{k}: {v}" for k, v in syn["short"].str.rstrip("+").value_counts().items())
            or "—"
        )
        for analysis in ("dependency", "coreference"):
            key = f"best {analysis} head ({ALL})"
            col[key] = "—"
            if analysis not in results.analyses:
                continue
            best = results.best_head(analysis, ALL, "in-sample")
            held = results.best_head(analysis, ALL, "held-out")
            if best is None or best["note"]:
                col[key] = best["note"] if best is not None else "—"
                continue
            depth = best["layer"] / max(L - 1, 1)
            head = " ".join(x for x in (best["heads"], best["direction"]) if x)
            held_text = "—" if held is None else (held["note"] or f"{held['accuracy']:.4f}")
            col[key] = (
                f"{head} (depth {depth:.2f}) acc {best['accuracy']:.4f}, gap {best['gap']:.4f} vs "
                f"{best['baseline_variant']}, Holm p {best['p_holm']:.2g}, held-out {held_text}"
            )
        if "dependency" in results.analyses and results.summary.get("causal"):
            unreachable = results.unreachable_arcs("dependency")
            unreachable = unreachable[unreachable["label"] == ALL]
            col[f"unreachable {ALL} arcs"] = (
                ", ".join(
                    f"{d}: {int(u)} ({s:.1%})"
                    for d, u, s in zip(
                        unreachable["direction"], unreachable["unreachable"], unreachable["share"]
                    )
                )
                or "—"
            )
        bos = results.summary.get("bos")
        if bos is not None:
            col["BOS mode"] = (
                "; ".join(f"{k}: {v}" for k, v in bos.items())
                if isinstance(bos, dict)
                else str(bos)
            )
        surf = results.mass_per_head("surface")
        if len(surf):
            if "sink_mass" in surf.columns:
                col["mean mass to first position + SEP/EOS (over heads)"] = (
                    f"{surf['sink_mass'].mean():.4f}"
                )
            if "entropy_ratio" in surf.columns:
                col["mean entropy / uniform (over heads)"] = f"{surf['entropy_ratio'].mean():.4f}"
        columns[label] = col
        C.write_png(
            role_map_figure(roles, L, H, colors, f"Head roles: {label}"),
            out,
            f"role_map_{slug(label)}",
        )

    table = pd.DataFrame(columns).fillna("—")
    table.index.name = "measure"
    C.write_table(
        table.reset_index(),
        out,
        "side_by_side",
        "Head roles side by side (heads L-H, 0-based; rules: headprobe.stats.roles, METHODS §6)",
    )
    heads = pd.concat(per_head, ignore_index=True)
    heads.to_csv(out / "roles_per_head.csv", index=False)
    print(f"wrote {out / 'roles_per_head.csv'}")
    page = build_comparison(compared, out / "compare")
    print(
        f"wrote {page['html']} and {page['markdown']} ({len(page['figures'])} figures, {len(page['tables'])} tables)"
    )
    print("\nrules, first met wins (a head meeting none is 'none'):")
    for i, line in enumerate(rules.values(), 1):
        print(f"  {i}. {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
