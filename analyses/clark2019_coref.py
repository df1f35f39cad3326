"""Reproduce Clark et al. (2019), "What Does BERT Look At?", section 5 / Table 2:
an attention head does coreference resolution.

Finding: one head (5-4 in BERT-base, in their 1-based naming) links a mention's
head word to the head of an antecedent of its own cluster far more often than
the nearest-mention baseline and more often than head-word string matching,
approaching a rule-based coreference system -- with no coreference supervision.
Accuracy is reported for all mentions and per kind (pronoun, proper, nominal).

This script prints, per mention kind, the best head (`L-H`, 0-based) with its
accuracy and 95% bootstrap interval (over documents), every baseline in the
results (nearest, head_match, rules), the gap to the in-sample best baseline
with the one-sided McNemar p-value (raw and Holm-adjusted), and the held-out
(2-fold by document) accuracy.

    .venv/bin/python analyses/clark2019_coref.py                    # MiniLM, GUM dev
    .venv/bin/python analyses/clark2019_coref.py --model smollm2
    .venv/bin/python analyses/clark2019_coref.py --results out/run1

Outputs under --out (default out/clark2019_coref/): coref_table.csv/.md,
coref_heads.png (accuracy and gap heatmaps per kind), results/.
"""

from __future__ import annotations

import sys

import _common as C


def main(argv=None) -> int:
    p = C.base_parser(__doc__, treebank=False, coref=True)
    args = p.parse_args(argv)
    out = C.out_dir(args, "clark2019_coref")
    results = C.get_results(args, ["coreference"], out)

    from headprobe.inputs.corpora.base import ALL
    from headprobe.report.heatmaps import accuracy_gap_figure
    from headprobe.report.selection import accuracy_panels

    table = results.best_heads_wide("coreference")
    if not len(table):
        print("no coreference best heads in the results", file=sys.stderr)
        return 1
    baselines = results.baselines[results.baselines["analysis"] == "coreference"]
    variants = list(dict.fromkeys(baselines["variant"]))
    wide = baselines.pivot(index="label", columns="variant", values="accuracy")[variants]
    table = table.merge(wide.add_suffix("_accuracy"), left_on="label", right_index=True, how="left")
    cols = (
        ["label", "n", "heads", "accuracy", "ci_low", "ci_high"]
        + [f"{v}_accuracy" for v in variants]
        + [
            "baseline_variant",
            "gap",
            "gap_low",
            "gap_high",
            "p_value",
            "p_holm",
            "tied",
            "heldout_heads",
            "heldout_accuracy",
            "heldout_ci_low",
            "heldout_ci_high",
            "heldout_gap",
            "heldout_folds_agree",
            "note",
        ]
    )
    model = C.model_name(results, args)
    C.write_table(
        table[cols].rename(
            columns={
                "label": "kind",
                "n": "mentions",
                "heads": "head",
                "heldout_heads": "heldout_head",
            }
        ),
        out,
        "coref_table",
        f"Best coreference head per mention kind ({model}; L-H 0-based)",
    )

    panels = [
        p for kind in table["label"] for p in accuracy_panels(results, "coreference", kind, [""])
    ]
    if panels:
        C.write_png(accuracy_gap_figure(panels, f"{model}: coreference heads"), out, "coref_heads")

    row = table[table["label"] == ALL]
    if len(row) and row.iloc[0]["layer"] >= 0:
        r = row.iloc[0]
        beaten = [v for v in variants if r["accuracy"] > r[f"{v}_accuracy"]]
        print(
            f"\nbest head for ALL mentions: {r['heads']} at {r['accuracy']:.4f} "
            f"(held-out {r['heldout_accuracy']:.4f}; McNemar vs {r['baseline_variant']} p = {r['p_value']:.2g}, "
            f"Holm {r['p_holm']:.2g}); above the baselines: {', '.join(beaten) or 'none'}"
        )
    elif len(row):
        print(f"\nALL mentions: {row.iloc[0]['note']}")
    C.maybe_report(args, results, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
