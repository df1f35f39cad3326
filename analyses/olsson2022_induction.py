"""Reproduce Olsson et al. (2022), "In-context Learning and Induction Heads": a trained
decoder has induction heads, and the same architecture with random weights has none.

Probe: `--n` sequences of `--length` random tokens repeated twice (`headprobe.probe`,
specials as the run's tokenizer puts them around text). On the second half a head that
attends to the token *after* the earlier occurrence of the current token is an induction
head. Score per head (`headprobe.scorers.induction`): the share of each second-half
row's attention on that key, averaged over the rows (TransformerLens's "mul" pattern,
per row; `tl_mul` is TransformerLens's whole-matrix normalisation, about half of it
here), with a 95% bootstrap interval over sequences and the score on each half of them.

The trained model is `--model` (default: the bundled SmolLM2-135M-Instruct); the
control is the same config with random weights (`AutoModel.from_config`, seeded, the
config's own initializer). The finding holds when the trained model has at least one
head with score >= `--threshold` (0.4) and the random one has none above `--control`
(0.1); the script says so and exits 0, else 1.

    .venv/bin/python analyses/olsson2022_induction.py                       # SmolLM2, 500 x 50
    .venv/bin/python analyses/olsson2022_induction.py --n 100 --length 25 --device cuda

Outputs under --out (default out/olsson2022_induction/): induction_heads.csv/.md (both
models, every head), trained/ and random/ (results directories).
"""

from __future__ import annotations

import argparse
import copy
import sys

import _common as C


def random_twin(model, seed: int):
    """The same architecture and config with freshly initialised weights."""
    import torch
    from transformers import AutoModel

    config = copy.deepcopy(model.config)
    for attr in ("quantization_config", "_name_or_path"):
        if hasattr(config, attr):
            try:
                delattr(config, attr)
            except AttributeError:
                pass
    torch.manual_seed(seed)
    twin = AutoModel.from_config(config, attn_implementation="sdpa", dtype=next(model.parameters()).dtype)
    return twin.eval().to(next(model.parameters()).device)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="trained decoder (default: the bundled SmolLM2)")
    p.add_argument("--length", type=int, default=50, help="random tokens per half (default 50)")
    p.add_argument("--n", type=int, default=500, help="sequences (default 500)")
    p.add_argument("--seed", type=int, default=0, help="probe, folds, bootstrap and random weights (default 0)")
    p.add_argument("--threshold", type=float, default=0.4, help="induction score of a trained head (default 0.4)")
    p.add_argument("--control", type=float, default=0.1, help="no random-weight head above this (default 0.1)")
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--out", default=None)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default=None)
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    out = C.out_dir(args, "olsson2022_induction")

    import pandas as pd

    import headprobe
    from headprobe import models

    net, tokenizer, name = models.load(C.model_arg(args.model), device=args.device)
    runs = {"trained": (net, tokenizer, name),
            "random": (random_twin(net, args.seed), tokenizer, f"{name}, random weights (seed {args.seed})")}
    frames = []
    for kind, loaded in runs.items():
        results = headprobe.run(loaded=loaded, probe="repeated-random", probe_length=args.length, probe_n=args.n,
                                seed=args.seed, n_boot=args.bootstrap, batch_size=args.batch_size,
                                analyses=["induction", "previous_token", "duplicate_token", "sink"],
                                progress=not args.quiet, out=str(out / kind))
        heads = results.table("induction_heads")
        heads = heads[heads["label"] == "mul"].assign(model=kind)
        frames.append(heads)
        print(f"\n{loaded[2]}: {results.summary['corpora']['probe']}, "
              f"{results.summary['runs']['probe']['seconds']} s")
    table = pd.concat(frames, ignore_index=True)
    table.insert(0, "head_name", [f"{a}-{b}" for a, b in zip(table["layer"], table["head"])])
    table = table.sort_values(["model", "score"], ascending=[False, False], kind="stable")
    cols = ["model", "head_name", "kv_group", "n", "score", "ci_low", "ci_high", "fold0", "fold1", "tl_mul",
            "baseline_variant", "baseline_score"]
    C.write_table(table[cols].groupby("model", sort=False).head(10), out, "induction_top",
                  f"Top induction heads (mul score; L-H 0-based), {args.n} x {args.length} repeated random tokens")
    table[cols].to_csv(out / "induction_heads.csv", index=False)
    trained = table[table["model"] == "trained"]
    control = table[table["model"] == "random"]
    strong = trained[trained["score"] >= args.threshold]
    above = control[control["score"] > args.control]
    print(f"\ntrained: {len(strong)} of {len(trained)} heads with induction score >= {args.threshold:g}: "
          + ", ".join(f"{h} {s:.3f}" for h, s in zip(strong["head_name"], strong["score"])))
    print(f"random weights: max induction score {control['score'].max():.4f} "
          f"(head {control.iloc[0]['head_name']}); {len(above)} heads above {args.control:g}")
    ok = len(strong) > 0 and len(above) == 0
    print("finding reproduced" if ok else "finding NOT reproduced")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
