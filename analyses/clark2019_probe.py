"""Reproduce Clark et al. (2019), "What Does BERT Look At?", section 6: an attention-only probe
that combines every head finds the dependency parse much better than any single head
(Clark et al.: UAS 61 for BERT-base's attention-only probe on PTB-SD); and Htut et al.
(2019): maximum spanning trees decoded from attention, per head and over the probe (UUAS).

The probe is fitted on one half of the units (METHODS §5 folds) and evaluated on the other,
both ways, so its accuracy is held-out; the best single head and the best offset baseline
are shown selected held-out and in-sample (as the papers did), on the same arcs (every arc
but root and punct). Differences are paired (same arcs, same Poisson bootstrap weights);
the finding is reproduced when the probe beats the best single head and the best offset
baseline with intervals of the difference above 0.

    .venv/bin/python analyses/clark2019_probe.py                      # MiniLM, EWT dev
    .venv/bin/python analyses/clark2019_probe.py --conventions clark2019-code
    .venv/bin/python analyses/clark2019_probe.py --results out/run1    # reuse results with `parsing`

Outputs under --out (default out/clark2019_probe/): parse_scores.csv/.md, parse_gaps.csv/.md,
parse_mst_heads.csv/.md (every head's MST UUAS), parsing_heads.png, results/.
"""

from __future__ import annotations

import sys

import _common as C


def main(argv=None) -> int:
    p = C.base_parser(__doc__)
    p.add_argument(
        "--conventions",
        default="headprobe",
        help="headprobe (default), clark2019-code or joanacero",
    )
    args = p.parse_args(argv)
    out = C.out_dir(args, "clark2019_probe")
    results = run_or_load(args, ["dependency", "parsing"], out)
    if "parse_scores" not in results.tables or not len(results.table("parse_scores")):
        print("no parsing rows in the results (run with the `parsing` analysis)", file=sys.stderr)
        return 1
    model = C.model_name(results, args)
    conventions = (results.summary.get("conventions") or {}).get("name", "headprobe")
    scores = results.table("parse_scores")
    C.write_table(
        scores,
        out,
        "parse_scores",
        f"{model}: attention-only probe, trees, best single head, baselines ({conventions} conventions)",
    )
    gaps = results.table("parse_gaps")
    C.write_table(
        gaps, out, "parse_gaps", "Paired differences (95% Poisson bootstrap intervals over units)"
    )
    heads = results.table("parse_heads")
    mst = heads[heads["direction"] == "mst"].sort_values("accuracy", ascending=False, kind="stable")
    C.write_table(
        mst.head(10).reset_index(drop=True),
        out,
        "parse_mst_heads",
        "Top 10 heads by MST UUAS (in-sample)",
    )
    mst.to_csv(out / "parse_mst_heads.csv", index=False)

    from headprobe.report.heatmaps import heatmap_grid_figure
    from headprobe.report.rendered_tables import to_matrix

    items = [
        (
            title,
            to_matrix(
                heads[heads["direction"] == d], "accuracy", results.n_layers, results.n_heads
            ),
        )
        for d, title in (
            ("dep->head", "argmax UAS dep->head"),
            ("head<-dep", "argmax UAS head<-dep"),
            ("mst", "MST UUAS"),
        )
    ]
    C.write_png(
        heatmap_grid_figure(items, cbar_label="accuracy", vmin=0, vmax=1), out, "parsing_heads"
    )

    verdict = reproduced(gaps)
    print("\nClark et al. section 6 (the probe beats every single head and the offset baselines):")
    for line, ok in verdict:
        print(f"  [{'yes' if ok else 'NO '}] {line}")
    C.maybe_report(args, results, out)
    return 0


def reproduced(gaps) -> list[tuple[str, bool]]:
    """One line per claim: its paired difference and whether the interval is above 0."""
    lines = []
    for metric, predictor, versus in (
        ("UAS", "probe", "best head"),
        ("UAS", "probe", "best baseline"),
        ("UUAS", "probe MST", "best head MST"),
        ("UUAS", "probe MST", "chain"),
    ):
        for selection in ("held-out", "in-sample"):
            row = gaps[
                (gaps["metric"] == metric)
                & (gaps["predictor"] == predictor)
                & (gaps["versus"] == versus)
                & (gaps["selection"] == selection)
            ]
            if not len(row):
                continue
            r = row.iloc[0]
            lines.append(
                (
                    f"{metric} {predictor} - {versus} ({selection}): {r.gap:+.4f} "
                    f"[{r.gap_low:+.4f}, {r.gap_high:+.4f}]",
                    bool(r.gap_low > 0),
                )
            )
    return lines


def run_or_load(args, analyses, out):
    """`C.get_results`, with the conventions preset passed to the run."""
    import headprobe

    if args.results:
        return headprobe.load_results(args.results)
    kwargs = {
        "model": C.model_arg(args.model),
        "analyses": analyses,
        "conventions": args.conventions,
        "out": str(out / "results"),
    }
    for key in ("treebank", "batch_size", "device"):
        if getattr(args, key, None) is not None:
            kwargs[key] = getattr(args, key)
    if C.parse_layers(args.layers) is not None:
        kwargs["layers"] = C.parse_layers(args.layers)
    return headprobe.run(**kwargs)


if __name__ == "__main__":
    sys.exit(main())
