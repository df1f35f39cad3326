"""Reproduce Clark et al. (2019), "What Does BERT Look At?", section 4 / Table 1:
particular attention heads track particular syntactic relations.

Finding: no single head does dependency parsing as a whole well, but for many
relations one head predicts the dependent's head (or the head its dependent)
far better than the best fixed-offset baseline -- e.g. in BERT-base, heads for
direct objects, determiners, possessives and auxiliaries that reach 80-90%+
accuracy. This script prints, per relation, the best head (paper-style `L-H`,
0-based), its direction, accuracy with 95% bootstrap interval, the best
baseline (fixed offsets and the first word), the gap with its paired interval,
the one-sided McNemar p-value against that baseline (raw and Holm-adjusted),
ties, unreachable arcs, and the held-out (2-fold) accuracy that corrects for
choosing the head on the evaluation data (with whether both folds agreed).

With the defaults (bundled all-MiniLM-L6-v2, UD English EWT dev) the table
also carries the reference values of METHODS §2, so a run checks itself.

    .venv/bin/python analyses/clark2019_syntax.py                   # MiniLM, EWT dev
    .venv/bin/python analyses/clark2019_syntax.py --model smollm2
    .venv/bin/python analyses/clark2019_syntax.py --results out/run1  # reuse results

Outputs under --out (default out/clark2019_syntax/): syntax_table.csv/.md,
syntax_gaps.png (per-relation gap heatmaps), results/ (the run's tables).
"""

from __future__ import annotations

import sys

import _common as C

# METHODS §2: bundled all-MiniLM-L6-v2 on UD English EWT dev, in-sample.
REFERENCE_MINILM_EWT_DEV = {
    # relation: (arcs, best head, direction, accuracy, baseline)
    "ALL": (20085, "2-1", "dep->head", 0.4542, 0.3451),
    "nsubj": (2137, "2-8", "dep->head", 0.5559, 0.3388),
    "det": (1841, "2-8", "dep->head", 0.8061, 0.5888),
    "obj": (1211, "2-0", "dep->head", 0.7399, 0.3576),
    "amod": (1326, "2-8", "dep->head", 0.7903, 0.7466),
    "aux": (911, "1-4", "dep->head", 0.7003, 0.5434),
}


def main(argv=None) -> int:
    p = C.base_parser(__doc__)
    p.add_argument(
        "--min-arcs",
        type=int,
        default=100,
        help="leave out relations with fewer arcs (default 100; ALL always shown)",
    )
    args = p.parse_args(argv)
    out = C.out_dir(args, "clark2019_syntax")
    results = C.get_results(args, ["dependency"], out)

    from headprobe.inputs.corpora.base import ALL
    from headprobe.report.heatmaps import gap_grid_figure
    from headprobe.report.selection import gap_items
    from headprobe.stats.head_selection import ALPHA
    from headprobe.studies.dependency.analysis import NOT_PER_RELATION

    table = results.best_heads_wide("dependency")
    if not len(table):
        print("no dependency best heads in the results", file=sys.stderr)
        return 1
    table = table[(table["label"] == ALL) | (table["n"] >= args.min_arcs)]
    table = table[~table["label"].isin(["root", "punct"])].reset_index(drop=True)

    with_reference = (
        C.model_arg(args.model) is None
        and not args.results
        and getattr(args, "treebank", None) == C.default_path(C.EWT_DEV)
        and C.EWT_DEV.exists()
    )
    if with_reference:
        ref = table["label"].map(REFERENCE_MINILM_EWT_DEV)
        table["ref_head"] = ref.map(lambda r: r[1] if isinstance(r, tuple) else "")
        table["ref_accuracy"] = ref.map(lambda r: r[3] if isinstance(r, tuple) else float("nan"))
        table["ref_baseline"] = ref.map(lambda r: r[4] if isinstance(r, tuple) else float("nan"))

    cols = [
        "label",
        "n",
        "heads",
        "direction",
        "accuracy",
        "ci_low",
        "ci_high",
        "baseline_variant",
        "baseline_accuracy",
        "gap",
        "gap_low",
        "gap_high",
        "p_value",
        "p_holm",
        "tied",
        "unreachable",
        "heldout_heads",
        "heldout_accuracy",
        "heldout_ci_low",
        "heldout_ci_high",
        "heldout_gap",
        "heldout_folds_agree",
        "note",
    ] + [c for c in ("ref_head", "ref_accuracy", "ref_baseline") if c in table.columns]
    model = C.model_name(results, args)
    C.write_table(
        table[cols].rename(
            columns={
                "label": "relation",
                "n": "arcs",
                "heads": "head",
                "heldout_heads": "heldout_head",
            }
        ),
        out,
        "syntax_table",
        f"Best head per relation ({model}; heads L-H, 0-based)",
    )

    # per-relation gap heatmaps (better direction per head, minus the in-sample best baseline)
    relations = [x for x in table["label"] if x not in NOT_PER_RELATION][:12]
    items = gap_items(results, "dependency", relations)
    if items:
        C.write_png(
            gap_grid_figure(items, f"{model}: accuracy minus the best baseline"),
            out,
            "syntax_gaps",
        )

    named = table[(table["label"] != ALL) & (table["layer"] >= 0)]
    beat = named[named["p_holm"] < ALPHA]
    print(
        f"\n{len(beat)} of {len(named)} relations have a best head that beats the in-sample best baseline "
        f"(one-sided McNemar, Holm-adjusted p < {ALPHA:g})."
    )
    if with_reference:
        diff = (table["accuracy"] - table["ref_accuracy"]).abs()
        ok = table["ref_accuracy"].notna()
        print(
            f"reference check (METHODS §2): max |accuracy - reference| = "
            f"{diff[ok].max():.4f} over {int(ok.sum())} relations; heads agree: "
            f"{bool((table.loc[ok, 'heads'] == table.loc[ok, 'ref_head']).all())}"
        )
    C.maybe_report(args, results, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
