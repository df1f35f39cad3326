"""Compare head roles across models, side by side: which roles each model has, and where.

Findings it puts next to each other: Clark et al. (2019) and Kovaleva et al. (2019)
describe BERT's heads as a mix of broad early heads, previous/next-token heads,
heads that dump attention on [CLS]/[SEP] and a few specialised (syntactic,
coreference) heads in the middle layers; Voita et al. (2019) find positional
heads in every model. Decoder LMs add an attention sink on BOS. This script
runs (or loads) two or more models on the same data, assigns every head a role
with the report's stated rules (positional, syntactic, coreference, sink,
broad, none; see headprobe.report.roles), and tabulates per model how many
heads take each role and at what relative depth (layer / (layers - 1)), beside
the best dependency and coreference heads.

    .venv/bin/python analyses/compare_models.py                      # MiniLM vs SmolLM2
    .venv/bin/python analyses/compare_models.py --models default smollm2 bert-base-uncased
    .venv/bin/python analyses/compare_models.py --results out/a/results out/b/results

Outputs under --out (default out/compare_models/): side_by_side.csv/.md (rows:
measures, columns: models), roles_per_head.csv (one row per model x head),
compare_roles.png (role shares and depths), role_map_<model>.png, results_<model>/.
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
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["default", "smollm2"],
                   help="models to run ('default' = the bundled MiniLM, 'smollm2' = the "
                        "bundled SmolLM2, or any Hugging Face name/path)")
    p.add_argument("--results", nargs="+", default=None,
                   help="compare existing results directories instead of running")
    p.add_argument("--treebank", default=C.default_path(C.EWT_DEV),
                   help="CoNLL-U treebank (default: UD English EWT dev when present)")
    p.add_argument("--coref", default=C.default_path(C.GUM_DEV),
                   help="CorefUD CoNLL-U (default: UD English GUM dev when present)")
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
    from headprobe.report import figures as F
    from headprobe.report import tables as T
    from headprobe.report.roles import RoleRules, head_roles, role_summary

    runs = []                                    # (label, Results)
    if args.results:
        for d in args.results:
            runs.append((None, headprobe.load_results(d)))
    else:
        if "coreference" not in args.analyses:
            args.coref = None
        run_args = argparse.Namespace(**{**vars(args), "results": None})
        for name in args.models:
            print(f"running {name} ...", flush=True)
            runs.append((name, C.get_results(run_args, args.analyses, out, model=name,
                                             name=f"results_{slug(name)}")))
    if len(runs) < 2:
        print("note: comparing fewer than two models", file=sys.stderr)

    rules = RoleRules()
    columns, per_head, shares = {}, [], []
    seen = set()
    for name, results in runs:
        data = C.report_data(results)
        label = str(data.summary.get("model") or name or "model")
        while label in seen:
            label += "'"
        seen.add(label)
        L, H = data.n_layers, data.n_heads
        roles = head_roles(data.counts, L, H, rules)
        roles.insert(0, "model", label)
        roles["relative_depth"] = roles["layer"] / max(L - 1, 1)
        per_head.append(roles)
        summ = role_summary(roles, L)
        for r in summ.itertuples(index=False):
            shares.append({"model": label, "role": r.role, "share": r.share, "heads": r.heads})
        col = {"layers x heads": f"{L} x {H}", "heads": str(L * H)}
        for r in summ.itertuples(index=False):
            col[f"{r.role} heads"] = f"{r.heads} ({100 * r.share:.1f}%)"
        for r in summ.itertuples(index=False):
            if r.role != "none":
                col[f"{r.role}: mean relative depth"] = ("—" if r.heads == 0 else
                                                         f"{r.mean_relative_depth:.2f}")
                col[f"{r.role}: layers"] = r.layers or "—"
        pos = roles[roles["role"] == "positional"]
        col["positional offsets"] = ", ".join(
            f"{k}: {v}" for k, v in pos["positional_offset"].value_counts().items()) or "—"
        syn = roles[roles["role"] == "syntactic"]
        col["syntactic relations (top per head)"] = ", ".join(
            f"{k}: {v}" for k, v in syn["short"].str.rstrip("+").value_counts().items()) or "—"
        for analysis, lab in (("dependency", "ALL"), ("coreference", "ALL")):
            bt = T.best_heads_table(data, analysis, [lab])
            key = f"best {analysis} head ({lab})"
            if len(bt):
                b = bt.iloc[0]
                depth = (b["layer"] / max(L - 1, 1)) if b["layer"] >= 0 else float("nan")
                col[key] = (f"{b['head']} (depth {depth:.2f}) acc {b['accuracy']:.4f}, "
                            f"gap {b['gap']:.4f}, held-out {b['heldout_accuracy']:.4f}")
            else:
                col[key] = "—"
        surf = T.surface_per_head(data.counts)
        if len(surf):
            if "cls_sep" in surf.columns:
                col["mean mass to CLS+SEP (over heads)"] = f"{surf['cls_sep'].mean():.4f}"
            if "entropy_ratio" in surf.columns:
                col["mean entropy / uniform (over heads)"] = f"{surf['entropy_ratio'].mean():.4f}"
        columns[label] = col
        C.write_png(F.role_map_figure(roles, L, H, f"Head roles: {label}"), out,
                    f"role_map_{slug(label)}")

    table = pd.DataFrame(columns).fillna("—")
    table.index.name = "measure"
    C.write_table(table.reset_index(), out, "side_by_side",
                  "Head roles side by side (heads L-H, 0-based; rules: headprobe.report.roles)")
    heads = pd.concat(per_head, ignore_index=True)
    heads.to_csv(out / "roles_per_head.csv", index=False)
    print(f"wrote {out / 'roles_per_head.csv'}")
    share_df = pd.DataFrame(shares)
    C.write_png(F.compare_roles_figure(share_df, heads, "Head roles per model"), out,
                "compare_roles")
    print("\nrules, first match wins:")
    for i, line in enumerate(rules.describe(), 1):
        print(f"  {i}. {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
