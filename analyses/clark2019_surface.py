"""Reproduce Clark et al. (2019), "What Does BERT Look At?", section 3, Figures 2 and 4:
surface-level attention patterns.

Findings: (1) heads in early layers spread attention broadly (row entropy near
that of uniform attention), while some later heads are very focused; (2) heads
attend heavily to the previous or the next word in the early layers; (3) in
the middle layers a large share of the attention goes to [SEP] (and [CLS] and
punctuation) -- which Clark et al. read as a "no-op" for heads whose function
does not apply. For decoder models the same role falls to BOS (the
"attention sink").

This script prints the per-layer means (mass to CLS/BOS, SEP/EOS, the first
position, punctuation, self, previous and next word; entropy and uniform
entropy in nats), writes the per-head values (with `sink_mass`, first position
+ SEP/EOS, and `entropy_ratio`), and draws the two figures.

    .venv/bin/python analyses/clark2019_surface.py                  # MiniLM, EWT dev
    .venv/bin/python analyses/clark2019_surface.py --model smollm2 --text notes.txt

Outputs under --out (default out/clark2019_surface/): surface_per_layer.csv/.md,
surface_per_head.csv/.md, surface_mass.png (Figure 2), surface_entropy.png
(Figure 4), results/.
"""

from __future__ import annotations

import sys

import _common as C


def main(argv=None) -> int:
    p = C.base_parser(__doc__, text=True)
    args = p.parse_args(argv)
    if args.text:
        args.treebank = None
    out = C.out_dir(args, "clark2019_surface")
    results = C.get_results(args, ["surface"], out)

    from headprobe.studies.surface import report as F

    per_head = results.mass_per_head("surface")
    per_layer = results.mass_per_layer("surface")
    if not len(per_head):
        print("no surface statistics in the results", file=sys.stderr)
        return 1
    model = C.model_name(results, args)
    C.write_table(
        per_layer,
        out,
        "surface_per_layer",
        f"Surface statistics per layer ({model}; layers 0-based)",
    )
    C.write_table(per_head, out, "surface_per_head", f"Surface statistics per head ({model})")
    if any(c in per_head.columns for c in F.SURFACE_TITLES):
        C.write_png(F.surface_figure(per_head, per_layer), out, "surface_mass")
    if "entropy" in per_head.columns:
        C.write_png(F.entropy_figure(per_head, per_layer), out, "surface_entropy")

    print()
    for label, what in (
        ("sep", "[SEP]/EOS"),
        ("cls", "[CLS]/BOS"),
        ("first", "the first position"),
        ("prev", "the previous word"),
        ("next", "the next word"),
        ("punct", "punctuation"),
    ):
        if label in per_layer.columns and per_layer[label].notna().any():
            i = per_layer[label].idxmax()
            print(
                f"most attention to {what}: layer {int(per_layer.loc[i, 'layer'])} "
                f"(mean {per_layer.loc[i, label]:.4f})"
            )
    if "entropy_ratio" in per_layer.columns:
        first, last = per_layer.iloc[0], per_layer.iloc[-1]
        print(
            f"entropy / uniform: first layer {first['entropy_ratio']:.4f}, "
            f"last layer {last['entropy_ratio']:.4f}"
        )
    C.maybe_report(args, results, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
