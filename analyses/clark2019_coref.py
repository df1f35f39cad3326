"""Reproduce Clark et al. (2019), "What Does BERT Look At?", section 5 / Table 2:
an attention head does coreference resolution.

Finding: one head (5-4 in BERT-base, in their 1-based naming) links a mention's
head word to the head of an antecedent of its own cluster far more often than
the nearest-mention baseline and more often than head-word string matching,
approaching a rule-based coreference system -- with no coreference supervision.
Accuracy is reported for all mentions and per kind (pronoun, proper, nominal).

This script prints, per mention kind, the best head (`L-H`, 0-based) with its
accuracy and 95% bootstrap interval (over documents), every baseline in the
results (nearest, head_match, rules), the gap to the baseline the best-heads
table compares with, and the held-out (2-fold by document) accuracy.

    .venv/bin/python analyses/clark2019_coref.py                    # MiniLM, GUM dev
    .venv/bin/python analyses/clark2019_coref.py --model smollm2
    .venv/bin/python analyses/clark2019_coref.py --results out/run1

Outputs under --out (default out/clark2019_coref/): coref_table.csv/.md,
coref_heads.png (accuracy and gap heatmaps per kind), results/.
"""

from __future__ import annotations

import sys

import _common as C

KINDS = ("ALL", "pronoun", "proper", "nominal")


def main(argv=None) -> int:
    p = C.base_parser(__doc__, treebank=False, coref=True)
    args = p.parse_args(argv)
    out = C.out_dir(args, "clark2019_coref")
    results = C.get_results(args, ["coreference"], out)

    from headprobe.report import figures as F
    from headprobe.report import tables as T

    data = C.report_data(results)
    present = T.labels_by_size(data.counts, "coreference")
    kinds = [k for k in KINDS if k in present] + [k for k in present if k not in KINDS]
    table = T.best_heads_table(data, "coreference", kinds)
    if not len(table):
        print("no coreference best heads in the results", file=sys.stderr)
        return 1
    variants = sorted(data.counts.loc[(data.counts["analysis"] == "coreference")
                                      & (data.counts["variant"] != ""), "variant"].unique())

    def baseline_accuracy(kind, variant):
        bl = T.baselines(data.counts, "coreference", kind)
        hit = bl[bl["variant"] == variant]
        return float(hit["accuracy"].iloc[0]) if len(hit) else float("nan")

    for v in variants:
        table[f"{v}_accuracy"] = [baseline_accuracy(k, v) for k in table["label"]]
    cols = (["label", "n", "head", "accuracy", "ci_low", "ci_high"]
            + [f"{v}_accuracy" for v in variants]
            + ["baseline_variant", "gap", "gap_low", "gap_high", "heldout_head",
               "heldout_accuracy", "heldout_ci_low", "heldout_ci_high", "heldout_gap"])
    model = data.summary.get("model", args.model or "default model")
    C.write_table(table[cols].rename(columns={"label": "kind", "n": "mentions"}), out,
                  "coref_table", f"Best coreference head per mention kind ({model}; L-H 0-based)")

    panels = []
    for kind in kinds:
        sc = T.head_scores(data.counts, "coreference", kind)
        if not len(sc):
            continue
        variant, base = T.reference_baseline(data, "coreference", kind)
        acc = T.to_matrix(sc, "accuracy", data.n_layers, data.n_heads)
        panels.append((kind, acc, None if variant is None else acc - base,
                       f"{variant}: {base:.4f}" if variant else "none"))
    if panels:
        C.write_png(F.accuracy_gap_figure(panels, f"{model}: coreference heads"), out,
                    "coref_heads")

    row = table[table["label"] == "ALL"]
    if len(row):
        r = row.iloc[0]
        beaten = [v for v in variants if r["accuracy"] > r[f"{v}_accuracy"]]
        print(f"\nbest head for ALL mentions: {r['head']} at {r['accuracy']:.4f} "
              f"(held-out {r['heldout_accuracy']:.4f}); above the baselines: "
              f"{', '.join(beaten) or 'none'}")
    C.maybe_report(args, results, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
