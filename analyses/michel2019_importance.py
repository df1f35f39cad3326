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

Estimates beside the exact effect (`--side-by-side`): SmolLM2 on the repeated-random probe
(20 sequences of 50 tokens), `importance` with `--estimate michel,atp` (and `atp*` with
`--graddrop`), each beside the exact zero-ablation effect of all 270 heads computed here by
independent code (forward pre-hooks on each layer's `o_proj` of this script's own, the head's
slice set to 0, the repeated half's summed NLL) on other sequences of the same probe (seed 1).
Writes smollm2_side_by_side.csv/.md (layer, head, exact, each estimate) and
smollm2_estimates.md (each estimate's Spearman with the exact effects, top-10 overlap, the rank
it gives the exact top head).

    .venv/bin/python analyses/michel2019_importance.py --side-by-side [--graddrop]

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
    p.add_argument(
        "--side-by-side",
        action="store_true",
        help="SmolLM2 on the repeated-random probe: importance, AtP and exact ablation per head",
    )
    p.add_argument("--graddrop", action="store_true", help="with --side-by-side: also atp*")
    p.add_argument(
        "--exact-n",
        type=int,
        default=20,
        help="with --side-by-side: probe sequences of the exact computation (default: 20; "
        "270 heads x one forward pass each)",
    )
    args = p.parse_args(argv)
    out = C.out_dir(args, "michel2019_importance")
    if args.side_by_side:
        return side_by_side(args, out)

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


def exact_zero_effects(seed: int = 1, n: int = 20, length: int = 50):
    """[layer, head] the exact zero-ablation effect (nats per scored piece) of every SmolLM2 head
    on the repeated-random probe drawn with `seed`, by this script's own hooks and loss."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from tqdm.auto import tqdm

    from headprobe.inputs.batching import prepare
    from headprobe.inputs.probes import make_probe
    from headprobe.model.loading import load_lm

    model, tok, _, _ = load_lm("smollm2")  # the bundled GGUF, under its (tied) LM head
    model.eval()
    examples = list(
        make_probe(
            "repeated-random",
            tok,
            length=length,
            n=n,
            seed=seed,
            vocab_size=model.config.vocab_size,
        )
    )
    prepared = prepare(examples, tok, 4096)
    ids = torch.tensor([a.input_ids for a in prepared.alignments])  # one length: a probe
    keep = torch.zeros_like(ids, dtype=torch.bool)
    for i, (e, a) in enumerate(zip(prepared.examples, prepared.alignments)):
        first, stop = e.meta["loss_words"]
        keep[i] = torch.tensor([first <= w < stop for w in a.piece_word])
    scored = keep[:, 1:]
    layers = model.model.layers
    n_heads = model.config.num_attention_heads
    d = model.config.hidden_size // n_heads

    @torch.no_grad()
    def loss(layer=None, head=None):
        hooks = []
        if layer is not None:

            def zero(module, args):
                x = args[0].clone()
                x[..., head * d : (head + 1) * d] = 0
                return (x,)

            hooks.append(layers[layer].self_attn.o_proj.register_forward_pre_hook(zero))
        logits = model(input_ids=ids).logits[:, :-1].float()
        for h in hooks:
            h.remove()
        nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        return float((nll * scored).sum())

    intact = loss()
    pieces = float(scored.sum())
    out = np.zeros((len(layers), n_heads))
    for layer in tqdm(range(len(layers)), desc="exact zero ablation", unit="layer"):
        for head in range(n_heads):
            out[layer, head] = (loss(layer, head) - intact) / pieces
    return out, intact / pieces


def side_by_side(args, out: Path) -> int:
    """Each estimate of importance beside the exact effects (`exact_zero_effects`)."""
    import pandas as pd

    import headprobe

    estimates = "michel,atp,atp*" if args.graddrop else "michel,atp"
    if args.results:
        results = headprobe.load_results(f"{args.results}/smollm2_probe")
    else:
        results = headprobe.run(
            "smollm2",
            probe="repeated-random",
            probe_n=20,
            probe_length=50,
            analyses=["importance"],
            estimate=estimates,
            seed=args.seed,
            n_boot=args.bootstrap,
            out=str(out / "smollm2_probe"),
        )
    exact, intact = exact_zero_effects(seed=args.seed + 1, n=args.exact_n)
    table = results.importance_heads
    table = table[table["ablation"] == "zero"]
    wide = pd.DataFrame(
        [(l, h, exact[l, h]) for l in range(exact.shape[0]) for h in range(exact.shape[1])],
        columns=["layer", "head", "exact"],
    )
    summary = []
    top_exact = set(wide.nlargest(10, "exact").set_index(["layer", "head"]).index)
    best = wide.loc[wide["exact"].idxmax()]
    for by in dict.fromkeys(table["estimate"]):
        scores = table[table["estimate"] == by].set_index(["layer", "head"])["score"]
        wide[by] = [scores.get((l, h)) for l, h in zip(wide["layer"], wide["head"])]
        rank = wide[by].rank(ascending=False)
        top = set(wide.nlargest(10, by).set_index(["layer", "head"]).index)
        summary.append(
            {
                "estimate": by,
                "spearman_vs_exact": wide[by].corr(wide["exact"], method="spearman"),
                "top10_overlap": len(top & top_exact),
                "rank_of_exact_top": int(rank[wide["exact"].idxmax()]),
            }
        )
    C.write_table(wide, out, "smollm2_side_by_side", "SmolLM2: exact zero ablation and estimates")
    C.write_table(
        pd.DataFrame(summary),
        out,
        "smollm2_estimates",
        f"SmolLM2, repeated-random probe: each estimate against the exact zero-ablation effect of "
        f"all heads on other sequences (intact loss {intact:.2f} nats; exact top head "
        f"{int(best['layer'])}-{int(best['head'])} {best['exact']:+.2f})",
    )
    print(pd.DataFrame(summary).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
