"""Kobayashi et al. (2020), "Attention is Not Only a Weight: Analyzing Transformers with
Vector Norms": what each head passes on, beside what it looks at (METHODS §7).

Finding: heads put much of their weight on [CLS] and [SEP], but the value vectors of those
keys are small after the output projection, so little of them reaches the head's output:
weighted by ||v W_O||, the share of attention on [CLS]/[SEP] drops sharply (their Figure 2,
BERT-base). Both measures are scored from one pass (`--measure weights,norms`): dependency,
positional and surface, with their role maps.

This script prints and writes, per layer, the share of a word's attention on [CLS]/BOS +
[SEP]/EOS under weights and norms with 95% Poisson-bootstrap intervals over units (the
change paired), the surface statistics per layer side by side, the heads whose role differs,
and draws the two role maps.

    .venv/bin/python analyses/kobayashi2020_norms.py                  # MiniLM, EWT dev
    .venv/bin/python analyses/kobayashi2020_norms.py --treebank headprobe/inputs/samples/sample.conllu

Outputs under --out (default out/kobayashi2020_norms/): special_share.csv/.md,
surface_by_measure.csv/.md, role_changes.csv/.md, role_maps.png, results/.
"""

from __future__ import annotations

import sys

import _common as C

ANALYSES = ["dependency", "positional", "surface"]


def main(argv=None) -> int:
    args = C.base_parser(__doc__).parse_args(argv)
    out = C.out_dir(args, "kobayashi2020_norms")
    results = C.get_results(args, ANALYSES, out, measure="weights,norms", keep_unit_counts=True)

    from headprobe.report.role_figures import role_maps_figure
    from headprobe.results.measure_views import role_changes
    from headprobe.stats.roles import role_colors
    from headprobe.studies.surface.surface_measures import special_share, surface_side_by_side

    if results.measures[:2] != ["weights", "norms"]:
        print(
            f"the results have measures {results.measures}; this script needs weights and norms",
            file=sys.stderr,
        )
        return 1
    model = C.model_name(results, args)
    share = special_share(results)
    C.write_table(
        share,
        out,
        "special_share",
        f"Share of a word's attention on [CLS]/BOS + [SEP]/EOS per layer, "
        f"mean over heads, weights vs norms, 95% intervals ({model}; layers 0-based)",
    )
    C.write_table(
        surface_side_by_side(results),
        out,
        "surface_by_measure",
        f"Surface statistics per layer, weights vs norms ({model})",
    )
    changed = role_changes(results)
    C.write_table(
        changed[["name", "role_weights", "detail_weights", "role_norms", "detail_norms"]],
        out,
        "role_changes",
        f"Heads whose role differs between weights and norms ({model})",
    )
    roles = results.roles
    maps = [
        (m, roles[roles["measure"] == m], results.n_layers, results.n_heads)
        for m in ("weights", "norms")
    ]
    C.write_png(
        role_maps_figure(maps, role_colors(results), f"{model}: roles by weights and by norms"),
        out,
        "role_maps",
    )
    print()
    if len(share):
        print(
            f"share on [CLS]/[SEP] per layer: weights {share['weights'].min():.2f}-{share['weights'].max():.2f}, "
            f"norms {share['norms'].min():.2f}-{share['norms'].max():.2f}"
        )
    print(f"heads whose role differs: {len(changed)} of {len(roles) // 2}")
    C.maybe_report(args, results, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
