"""Reproduce the copying side of the induction story (Elhage et al. 2021; Olsson et al. 2022):
an induction head attends to the token after an earlier occurrence of the current token, and
its OV circuit *copies* that token into the next-token prediction.

On the repeated-random probe (`--n` sequences of `--length` random tokens repeated twice), with
the bundled SmolLM2 (`--model`) under its language-model head:
- `induction`: each head's induction score (TransformerLens's "mul"); the induction heads are
  those with score >= `--threshold` (or `--induction-heads 18-6,...`);
- `logit_attribution`: each head's direct logit attribution to the next token on the repeated
  half (METHODS §9), with its 95% interval over sequences and the share of positions > 0;
- `ov_copying`: each head's OV copying score and copy rate, from the weights alone;
- the induction heads ablated one at a time (gated to 0): the change in the repeated half's
  next-token loss, with a paired 95% interval (METHODS §8).
The expectation: induction heads write the next token (DLA > 0), copy (positive copying score,
copy rate well above other heads') and matter (loss rises when ablated).

    .venv/bin/python analyses/elhage2021_copying.py                       # SmolLM2, 100 x 50
    .venv/bin/python analyses/elhage2021_copying.py --n 20 --length 25    # quick

Outputs under --out (default out/elhage2021_copying/): run/ (the results directory, with its
report), induction_copying.csv/.md (the induction heads side by side) and
copying_by_group.csv/.md (induction heads against all other heads: mean DLA, copying score
and copy rate).
"""

from __future__ import annotations

import argparse
import sys

import _common as C


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2", help="a causal LM (default: the bundled SmolLM2)")
    p.add_argument("--length", type=int, default=50, help="random tokens per half (default 50)")
    p.add_argument("--n", type=int, default=100, help="sequences (default 100)")
    p.add_argument("--seed", type=int, default=0, help="probe, folds and bootstrap (default 0)")
    p.add_argument("--threshold", type=float, default=0.4, help="induction score (default 0.4)")
    p.add_argument("--induction-heads", default=None, metavar="HEADS", help="e.g. 18-6,17-3")
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def induction_heads(results, args) -> list[tuple[int, int]]:
    if args.induction_heads:
        from olsson2022_induction import parse_heads

        return parse_heads(args.induction_heads)
    heads = results.table("induction_heads")
    chosen = heads[(heads["label"] == "mul") & (heads["score"] >= args.threshold)]
    return [(int(l), int(h)) for l, h in zip(chosen["layer"], chosen["head"])]


def ablation_effects(net, tokenizer, args, heads):
    """Each of `heads` gated to 0 alone: change in the repeated half's loss (`ablation_heads`)."""
    from headprobe.config import RunConfig
    from headprobe.inputs.probes import make_probe
    from headprobe.model.sites import text_config
    from headprobe.results.query import Results
    from headprobe.scoring import registry
    from headprobe.scoring.engine import Engine
    from headprobe.studies.logit_attribution.analysis import repeated_half

    scorer = registry.get("ablation").make_scorer()
    scorer.scored = repeated_half
    scorer.use_heads(heads)
    examples = make_probe(
        "repeated-random",
        tokenizer,
        length=args.length,
        n=args.n,
        seed=args.seed,
        vocab_size=getattr(text_config(net), "vocab_size", None),
    )
    config = RunConfig(
        batch_size=args.batch_size, seed=args.seed, n_boot=args.bootstrap, progress=not args.quiet
    )
    Engine(net, tokenizer, [scorer], config, desc="ablation").run(examples)
    return Results({"ablation": scorer.tally_}).ablation_heads


def side_by_side(results, ablation, heads):
    """One row per induction head: induction score, DLA, copying, ablation effect."""
    induction = results.table("induction_heads")
    induction = induction[induction["label"] == "mul"][["layer", "head", "score"]]
    table = (
        induction.rename(columns={"score": "induction"})
        .merge(results.table("logit_attribution_heads"), on=["layer", "head"])
        .merge(results.table("ov_copying_heads"), on=["layer", "head"], suffixes=("", "_ov"))
    )
    table["is_induction"] = [(l, h) in set(heads) for l, h in zip(table["layer"], table["head"])]
    effect = ablation[["layer", "head", "score", "ci_low", "ci_high"]].rename(
        columns={"score": "ablation", "ci_low": "ablation_low", "ci_high": "ablation_high"}
    )
    table = table.merge(effect, on=["layer", "head"], how="left")
    table.insert(0, "head_name", [f"{l}-{h}" for l, h in zip(table["layer"], table["head"])])
    return table


def main(argv=None) -> int:
    args = parse_args(argv)
    out = C.out_dir(args, "elhage2021_copying")

    import headprobe
    from headprobe.model import loading as models

    net, tokenizer, name, _ = models.load_lm(C.model_arg(args.model), device=args.device)
    results = headprobe.run(
        loaded=(net, tokenizer, name),
        probe="repeated-random",
        probe_length=args.length,
        probe_n=args.n,
        seed=args.seed,
        n_boot=args.bootstrap,
        batch_size=args.batch_size,
        analyses=["induction", "logit_attribution", "ov_copying"],
        progress=not args.quiet,
        out=str(out / "run"),
    )
    heads = induction_heads(results, args)
    if not heads:
        print(f"{name}: no head with induction score >= {args.threshold}", file=sys.stderr)
        return 1
    table = side_by_side(results, ablation_effects(net, tokenizer, args, heads), heads)
    columns = ["head_name", "induction", "dla", "dla_low", "dla_high", "share_positive",
               "copying", "copy_rate", "copy_low", "copy_high", "ablation", "ablation_low",
               "ablation_high"]  # fmt: skip
    C.write_table(
        table[table["is_induction"]][columns].sort_values("induction", ascending=False),
        out,
        "induction_copying",
        f"{name}: induction heads (score >= {args.threshold}) with their direct logit attribution "
        f"on the repeated half, OV copying score and copy rate, and the change in the repeated "
        f"half's loss when ablated alone (95% intervals; {args.n} sequences of {args.length})",
    )
    groups = table.groupby("is_induction")[["dla", "copying", "copy_rate"]].mean().reset_index()
    groups.insert(0, "heads", groups.pop("is_induction").map({True: "induction", False: "other"}))
    C.write_table(groups, out, "copying_by_group", f"{name}: means over heads")
    print(groups.to_string(index=False))
    copies = groups.set_index("heads")
    ok = len(copies) == 2 and copies.loc["induction", "copying"] > copies.loc["other", "copying"]
    print(f"induction heads copy more than the other heads: {'yes' if ok else 'no'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
