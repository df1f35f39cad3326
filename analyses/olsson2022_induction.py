"""Reproduce Olsson et al. (2022), "In-context Learning and Induction Heads": a trained
decoder has induction heads, and the same architecture with random weights has none.

Probe: `--n` sequences of `--length` random tokens repeated twice (`headprobe.inputs.probes`,
specials as the run's tokenizer puts them around text). On the second half a head that
attends to the token *after* the earlier occurrence of the current token is an induction
head. Score per head (`headprobe.studies.induction.analysis`): the share of each second-half
row's attention on that key, averaged over the rows (TransformerLens's "mul" pattern,
per row; `mul_all_rows` is TransformerLens's whole-matrix normalisation, about half of it
here), with a 95% bootstrap interval over sequences and the score on each half of them.

The trained model is `--model` (default: the bundled SmolLM2-135M-Instruct), loaded under
its language-model head; the control is the same config with random weights
(`headprobe.model.loading.random_init`: seeded, the config's own initializer). The finding holds
when the trained model has at least one head with score >= `--threshold` (0.4) and the
random one has none above `--control` (0.1); the script says so and exits 0, else 1.

Do the induction heads matter? (METHODS §8; needs a language-model head.) On the same probe:
- the induction heads (score >= `--threshold`, or `--induction-heads 18-6,17-3,...`) ablated
  together (gated to 0), as many other heads drawn from the same layers (per layer as many
  as it has induction heads; a seeded choice) ablated together, and the intact model, through
  `headprobe.run` with `--head-groups` (the `group_ablation` analysis);
- every head of `--ablate-layers` (default 17-23) ablated alone, through `headprobe.run` with
  the options a CLI user gives (`headprobe run --probe repeated-random --analyses ablation
  --heads ...`).
The objective is the next-token loss on the repeated half only: a target piece counts when
it is a word of the second half after its first word (the probe's examples name those words,
`headprobe.inputs.probes`; the labels of every other piece are ignored, the model still reads
the whole sequence), i.e. exactly the tokens an induction head can predict by copying. Per-sequence sums stream into tallies,
so each number has a 95% bootstrap interval over sequences and every difference (induction
vs intact, induction vs other heads, one head vs intact) is paired.

    .venv/bin/python analyses/olsson2022_induction.py                       # SmolLM2, 500 x 50
    .venv/bin/python analyses/olsson2022_induction.py --n 20 --length 25    # quick
    .venv/bin/python analyses/olsson2022_induction.py --n 100 --length 25 --device cuda

Outputs under --out (default out/olsson2022_induction/): induction_heads.csv/.md (both
models, every head), trained/ and random/ (results directories), induction_ablation.csv/.md
(intact, induction heads, other heads) and single_head_ablation.csv/.md (layers ablated).
"""

from __future__ import annotations

import argparse
import sys

import _common as C


def parse_heads(text) -> list[tuple[int, int]]:
    from headprobe.studies.ablation.flags import parse_heads as parse

    return parse(text) or []


def other_heads(induction, n_heads: int, seed: int) -> list[tuple[int, int]]:
    """Per layer as many non-induction heads of that layer as it has induction heads, drawn with a
    generator keyed by the seed (METHODS §5's keyed hash); fewer where a layer has too few."""
    import numpy as np

    from headprobe.core.seeds import keyed_hash

    rng = np.random.Generator(np.random.PCG64(keyed_hash(seed, "other-heads", "olsson2022")))
    chosen = []
    for layer in sorted({l for l, _ in induction}):
        mine = {h for l, h in induction if l == layer}
        pool = [h for h in range(n_heads) if h not in mine]
        take = rng.choice(pool, size=min(len(mine), len(pool)), replace=False)
        chosen += [(layer, int(h)) for h in sorted(take)]
    return chosen


def single_heads(net, tokenizer, name, args, induction, out) -> None:
    """Every head of --ablate-layers gated to 0 alone, through `headprobe.run` with the options of

        headprobe run --model smollm2 --probe repeated-random --probe-length L --n N \\
            --analyses ablation --heads 17-0,17-1,...

    (the probe's loss counts its repeated half: `headprobe.inputs.probes`)."""
    import headprobe
    from headprobe.checks import parse_layers
    from headprobe.model.capture import n_layers_heads

    n_heads = n_layers_heads(net)[1]
    heads = [(layer, head) for layer in parse_layers(args.ablate_layers) for head in range(n_heads)]
    results = headprobe.run(
        loaded=(net, tokenizer, name),
        probe="repeated-random",
        probe_length=args.length,
        probe_n=args.n,
        seed=args.seed,
        n_boot=args.bootstrap,
        batch_size=args.batch_size,
        analyses=["ablation"],
        heads=heads,
        progress=not args.quiet,
        out=str(out / "ablation"),
    )
    single = results.ablation_heads
    single.insert(0, "head_name", [f"{l}-{h}" for l, h in zip(single["layer"], single["head"])])
    single["induction"] = [
        (l, h) in set(induction) for l, h in zip(single["layer"], single["head"])
    ]
    C.write_table(
        single[
            ["head_name", "induction", "n", "score", "ci_low", "ci_high", "fold0", "fold1"]
        ].sort_values("score", ascending=False, kind="stable"),
        out,
        "single_head_ablation",
        f"{name}: one head gated to 0, change in the repeated half's loss (layers {args.ablate_layers})",
    )


def together(net, tokenizer, name, args, induction, out) -> None:
    """Induction heads vs as many other heads vs intact, each group gated to 0 together, through
    `headprobe.run` with the options of

        headprobe run --model smollm2 --probe repeated-random --probe-length L --n N \\
            --head-groups "induction=18-6,17-3,...;other=18-1,17-5,..."

    on the same probe and objective (the repeated half's loss, named by the probe's examples)."""
    import headprobe
    from headprobe.model.capture import n_layers_heads

    others = other_heads(induction, n_layers_heads(net)[1], args.seed)
    names = lambda heads: ",".join(f"{l}-{h}" for l, h in heads)
    results = headprobe.run(
        loaded=(net, tokenizer, name),
        probe="repeated-random",
        probe_length=args.length,
        probe_n=args.n,
        seed=args.seed,
        n_boot=args.bootstrap,
        batch_size=args.batch_size,
        analyses=["induction"],
        head_groups=f"induction={names(induction)};other={names(others)}",
        progress=not args.quiet,
        out=str(out / "groups"),
    )
    table = results.group_ablation.copy()
    versus = results.group_ablation_versus.set_index(["group", "versus"])
    for column, source in (
        ("vs_other", "change"),
        ("vs_other_low", "change_low"),
        ("vs_other_high", "change_high"),
    ):
        table[column] = [versus[source].get((g, "other"), float("nan")) for g in table["group"]]
    C.write_table(
        table,
        out,
        "induction_ablation",
        f"{name}: next-token loss on the repeated half (nats per piece), heads gated to 0 together; "
        f"change vs intact and vs the other heads, paired 95% intervals over {args.n} sequences",
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model", default="smollm2", help="trained decoder (default: the bundled SmolLM2)"
    )
    p.add_argument("--length", type=int, default=50, help="random tokens per half (default 50)")
    p.add_argument("--n", type=int, default=500, help="sequences (default 500)")
    p.add_argument(
        "--seed", type=int, default=0, help="probe, folds, bootstrap and random weights (default 0)"
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=0.4,
        help="induction score of a trained head (default 0.4)",
    )
    p.add_argument(
        "--control", type=float, default=0.1, help="no random-weight head above this (default 0.1)"
    )
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--out", default=None)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default=None)
    p.add_argument("--quiet", action="store_true")
    p.add_argument(
        "--induction-heads",
        default=None,
        metavar="HEADS",
        help="heads to ablate as induction heads, e.g. 18-6,17-3 (default: trained heads with "
        "score >= --threshold)",
    )
    p.add_argument(
        "--ablate-layers",
        default="17-23",
        help="layers whose heads are ablated one at a time "
        "(default 17-23, SmolLM2's induction layers)",
    )
    p.add_argument(
        "--no-ablation", action="store_true", help="skip the ablation of the induction heads"
    )
    args = p.parse_args(argv)
    out = C.out_dir(args, "olsson2022_induction")

    import pandas as pd

    import headprobe
    from headprobe.model import loading as models

    net, tokenizer, name, kind = models.load_lm(C.model_arg(args.model), device=args.device)
    runs = {
        "trained": (net, tokenizer, name),
        "random": (
            models.random_init(net, args.seed),
            tokenizer,
            f"{name}, random weights (seed {args.seed})",
        ),
    }
    frames = []
    for kind, loaded in runs.items():
        results = headprobe.run(
            loaded=loaded,
            probe="repeated-random",
            probe_length=args.length,
            probe_n=args.n,
            seed=args.seed,
            n_boot=args.bootstrap,
            batch_size=args.batch_size,
            analyses=["induction", "previous_token", "duplicate_token", "sink"],
            progress=not args.quiet,
            out=str(out / kind),
        )
        heads = results.table("induction_heads")
        heads = heads[heads["label"] == "mul"].assign(model=kind)
        frames.append(heads)
        print(
            f"\n{loaded[2]}: {results.summary['corpora']['probe']}, "
            f"{results.summary['runs']['probe']['seconds']} s"
        )
    table = pd.concat(frames, ignore_index=True)
    table.insert(0, "head_name", [f"{a}-{b}" for a, b in zip(table["layer"], table["head"])])
    table = table.sort_values(["model", "score"], ascending=[False, False], kind="stable")
    cols = [
        "model",
        "head_name",
        "kv_group",
        "n",
        "score",
        "ci_low",
        "ci_high",
        "fold0",
        "fold1",
        "mul_all_rows",
        "baseline_variant",
        "baseline_score",
    ]
    C.write_table(
        table[cols].groupby("model", sort=False).head(10),
        out,
        "induction_top",
        f"Top induction heads (mul score; L-H 0-based), {args.n} x {args.length} repeated random tokens",
    )
    table[cols].to_csv(out / "induction_heads.csv", index=False)
    trained = table[table["model"] == "trained"]
    control = table[table["model"] == "random"]
    strong = trained[trained["score"] >= args.threshold]
    above = control[control["score"] > args.control]
    print(
        f"\ntrained: {len(strong)} of {len(trained)} heads with induction score >= {args.threshold:g}: "
        + ", ".join(f"{h} {s:.3f}" for h, s in zip(strong["head_name"], strong["score"]))
    )
    print(
        f"random weights: max induction score {control['score'].max():.4f} "
        f"(head {control.iloc[0]['head_name']}); {len(above)} heads above {args.control:g}"
    )
    ok = len(strong) > 0 and len(above) == 0
    print("finding reproduced" if ok else "finding NOT reproduced")
    induction = parse_heads(args.induction_heads) or [
        tuple(int(x) for x in head.split("-")) for head in strong["head_name"]
    ]
    if args.no_ablation:
        pass
    elif kind == "representation" or not induction:
        print(
            f"\nno ablation: {'the model has no language-model head' if induction else 'no induction heads'}"
        )
    else:
        single_heads(net, tokenizer, name, args, induction, out)
        together(net, tokenizer, name, args, induction, out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
