"""Reproduce Clark et al. (2019), "What Does BERT Look At?", section 5 / Figure 6: heads cluster
by behaviour, and heads of the same layer behave alike.

The distance between two heads is the Jensen-Shannon divergence between their word-level
attention distributions, averaged over every word of the corpus (the `head_similarity`
analysis); the heads are embedded in the plane by MDS of those distances and clustered by
average linkage. The figures colour the heads by role (the role map, from the dependency,
positional and surface analyses run alongside) and by layer. "Heads of the same layer
behave alike" is tested: mean divergence within vs between layers (permutation test over
layer labels), the share of heads whose nearest head is in their layer against chance, and
the adjusted Rand index of the clusters with the layers.

    .venv/bin/python analyses/clark2019_clusters.py                   # MiniLM, EWT dev
    .venv/bin/python analyses/clark2019_clusters.py --results out/run1 # reuse results with head_similarity

Outputs under --out (default out/clark2019_clusters/): head_distances.csv, head_clusters.csv/.md,
layer_cohesion.csv/.md, clusters_roles.png, clusters_layers.png, clusters_dendrogram.png, results/.
"""

from __future__ import annotations

import sys

import _common as C

ANALYSES = ["dependency", "positional", "surface", "head_similarity"]


def main(argv=None) -> int:
    p = C.base_parser(__doc__)
    args = p.parse_args(argv)
    out = C.out_dir(args, "clark2019_clusters")
    results = C.get_results(args, ANALYSES, out)
    if "head_distances" not in results.tables or not len(results.table("head_distances")):
        print(
            "no head distances in the results (run with the `head_similarity` analysis)",
            file=sys.stderr,
        )
        return 1

    import pandas as pd

    from headprobe.report.document import Figure
    from headprobe.studies.head_similarity.analysis import layer_cohesion
    from headprobe.studies.head_similarity.report import head_clusters_section

    distances, clusters = results.table("head_distances"), results.table("head_clusters")
    distances.to_csv(out / "head_distances.csv", index=False)
    print(f"wrote {out / 'head_distances.csv'}")
    roles = results.roles[["layer", "head", "role"]] if "roles" in results.tables else None
    table = clusters if roles is None else clusters.merge(roles, on=["layer", "head"], how="left")
    C.write_table(
        table,
        out,
        "head_clusters",
        f"{C.model_name(results, args)}: heads, MDS position, "
        "cluster (average linkage, as many clusters as layers), nearest head",
    )
    cohesion = layer_cohesion(distances, clusters, seed=int(results.summary.get("seed", 0) or 0))
    C.write_table(
        pd.DataFrame([cohesion]), out, "layer_cohesion", "Do heads of the same layer behave alike?"
    )
    section = head_clusters_section(results, "head_similarity")
    names = {
        "head_clusters_roles": "clusters_roles",
        "head_clusters_layers": "clusters_layers",
        "head_clusters_dendrogram": "clusters_dendrogram",
    }
    for block in section.blocks:
        if isinstance(block, Figure) and block.name in names:
            C.write_png(block.png, out, names[block.name])
    alike = cohesion.get("p_value", 1.0) < 0.05 and cohesion.get("gap", 0.0) > 0
    print(
        f"\nClark et al. section 5 (heads of the same layer behave alike): {'yes' if alike else 'NO'} "
        f"(within {cohesion.get('within_layer_js', float('nan')):.4f} vs between "
        f"{cohesion.get('between_layer_js', float('nan')):.4f}, permutation p = {cohesion.get('p_value', 1):.3g})"
    )
    C.maybe_report(args, results, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
