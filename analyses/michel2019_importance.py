"""Reproduce Michel et al. (2019), "Are Sixteen Heads Really Better than One?": head importance
and the pruning curve, on an encoder without a language-model head and on a decoder with one.

Importance of head h: |dL/dg_h| at g = 1 (a gate per example and head, one backward pass),
summed over examples and divided by the pieces scored (`headprobe.model.head_effects`, METHODS §8), with
95% bootstrap intervals over units. Pruning: the objective as 0%, 10%, ... 100% of the heads
are gated to 0 together, cumulatively, least important first (`run(prune_curve=True)`).

- MiniLM (`minilm`, bundled): a sentence encoder without a trained language-model head. Its
  objective is the representation change 1 - cos(h_L', h_L) of the last hidden state, whose
  gradient at g = 1 is zero, so importance is undefined there: heads are ranked and pruned by
  their single-head ablation effect (`ablation`) instead, and the tables say so (`by`,
  `order_by`).
- SmolLM2 (`smollm2`, bundled GGUF): the causal language-model loss (mean next-token NLL);
  importance is defined and orders the pruning.

Every run also scores dependency, positional and surface, so the role map carries each
head's rank ("syntactic (nsubj), importance rank 3 of 72"); `--control` adds the
random-init control.

    .venv/bin/python analyses/michel2019_importance.py --n 20            # quick: 20 EWT dev sentences
    .venv/bin/python analyses/michel2019_importance.py                   # both models, all of EWT dev
    .venv/bin/python analyses/michel2019_importance.py --models smollm2 --device cuda --control

Outputs under --out (default out/michel2019_importance/): per model a results directory
(<model>/, with the report when --report), <model>_ranks.csv/.md (every head by rank),
<model>_prune_curve.csv/.md and .png, <model>_roles.csv/.md (heads with a role, beside their rank).
"""

from __future__ import annotations

import sys
from pathlib import Path

import _common as C


def main(argv=None) -> int:
    p = C.base_parser(__doc__)
    p.add_argument(
        "--models", default="minilm,smollm2", help="comma list of models (default: minilm,smollm2)"
    )
    p.add_argument(
        "--n",
        "--sentences",
        dest="n",
        type=int,
        default=None,
        help="score only the first N sentences of the treebank (default: all)",
    )
    p.add_argument("--control", action="store_true", help="also score the random-init control")
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    out = C.out_dir(args, "michel2019_importance")

    import headprobe
    from headprobe.studies.ablation.report import prune_figure, role_with_importance

    treebank = C.first_sentences(args.treebank, args.n, out)
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        key = Path(model).name or model  # a local path: its folder's name
        options = {
            k: v
            for k, v in (
                ("batch_size", args.batch_size),
                ("device", args.device),
                ("layers", C.parse_layers(args.layers)),
            )
            if v is not None
        }
        if args.results:  # reuse: --results DIR holds DIR/<model>/ from an earlier run
            results = headprobe.load_results(f"{args.results}/{key}")
        else:
            results = headprobe.run(
                C.model_arg(model),
                treebank=treebank,
                analyses=["dependency", "positional", "surface"],
                prune_curve=True,
                control="random-init" if args.control else None,
                seed=args.seed,
                n_boot=args.bootstrap,
                out=str(out / key),
                report=args.report,
                **options,
            )
        name = results.summary["model"]
        ranks = results.head_ranks.sort_values(["rank", "layer", "head"], kind="stable")
        by = ranks["by"].iloc[0]
        ranks = ranks.assign(head_name=[f"{l}-{h}" for l, h in zip(ranks["layer"], ranks["head"])])
        C.write_table(
            ranks[["head_name", "by", "score", "rank", "of"]].head(15),
            out,
            f"{key}_ranks",
            f"{name}: the 15 most important heads by {by} ({ranks['objective'].iloc[0]})",
        )
        ranks.to_csv(out / f"{key}_ranks.csv", index=False)
        curve = results.prune_curve
        C.write_table(
            curve.drop(columns=["objective", "removed"]),
            out,
            f"{key}_prune_curve",
            f"{name}: pruning curve, heads removed least important first by {by}",
        )
        C.write_png(
            prune_figure(curve, f"{name}: pruning curve (order: {by})"), out, f"{key}_prune_curve"
        )
        roles = results.roles
        with_role = roles[roles["role"] != "none"]
        C.write_table(
            with_role.assign(
                role_and_importance=[role_with_importance(r) for _, r in with_role.iterrows()]
            )[["name", "role_and_importance", "importance_score", "score"]],
            out,
            f"{key}_roles",
            f"{name}: heads with a role, beside their rank by {by}",
        )
        print(
            f"\n{name}: {results.summary['runs']['sentences']['examples']} sentences; order by {by}; "
            f"objective at 0% {curve['value'].iloc[0]:.4f}, at 50% {curve['value'].iloc[5]:.4f}, "
            f"at 100% {curve['value'].iloc[-1]:.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
