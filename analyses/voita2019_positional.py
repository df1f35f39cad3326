"""Reproduce Voita et al. (2019), "Analyzing Multi-Head Self-Attention: Specialized
Heads Do the Heavy Lifting, the Rest Can Be Pruned", section 4.1: positional heads.

Finding: a few heads in every model are "positional": they point to an adjacent
token -- most often the previous or the next one -- for at least 90% of the
tokens, and these heads are among the most important ones (they survive
pruning). Here the rule is applied to word-level attention (METHODS §4): a
head is positional when a single non-zero offset in -2..+2 takes at least 0.9
of its words' attention argmaxes (self and special tokens included as targets).

This script prints the positional heads (`L-H`, 0-based) with their offset and
share, writes every head's shares, and draws the share heatmaps.

    .venv/bin/python analyses/voita2019_positional.py                # MiniLM, EWT dev
    .venv/bin/python analyses/voita2019_positional.py --model smollm2
    .venv/bin/python analyses/voita2019_positional.py --threshold 0.8

Outputs under --out (default out/voita2019_positional/): positional_heads.csv/.md
(every head), positional.png, results/.
"""

from __future__ import annotations

import sys

import _common as C


def main(argv=None) -> int:
    p = C.base_parser(__doc__, text=True)
    p.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="share of argmaxes at one non-zero offset (default: the role rule's, 0.9 as in Voita et al.)",
    )
    args = p.parse_args(argv)
    if args.threshold is None:
        from headprobe.studies.positional.analysis import POSITIONAL_SHARE

        args.threshold = POSITIONAL_SHARE
    if args.text:
        args.treebank = None
    out = C.out_dir(args, "voita2019_positional")
    results = C.get_results(args, ["positional"], out)

    from headprobe.report.rendered_tables import head_name
    from headprobe.studies.positional.report import positional_figure

    shares = (
        results.table("positional_heads").copy() if "positional_heads" in results.tables else None
    )
    if shares is None or not len(shares):
        print("no positional counts in the results", file=sys.stderr)
        return 1
    shares.insert(
        0, "head_name", [head_name(a, b) for a, b in zip(shares["layer"], shares["head"])]
    )
    shares["positional"] = shares["share"] >= args.threshold
    shares = shares.sort_values(
        ["share", "layer", "head"], ascending=[False, True, True], kind="stable"
    )
    model = C.model_name(results, args)
    C.write_table(shares, out, "positional_heads", f"Argmax shares per head ({model}; L-H 0-based)")
    C.write_png(positional_figure(shares, results.n_layers, results.n_heads), out, "positional")
    pos = shares[shares["positional"]]
    total = results.n_layers * results.n_heads
    print(f"\n{len(pos)} of {total} heads are positional (share >= {args.threshold:g}):")
    for r in pos.itertuples(index=False):
        print(f"  {r.head_name}: offset {r.offset}, share {r.share:.4f}")
    by_offset = pos["offset"].value_counts().to_dict()
    if by_offset:
        print("by offset: " + ", ".join(f"{k}: {v}" for k, v in by_offset.items()))
    C.maybe_report(args, results, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
