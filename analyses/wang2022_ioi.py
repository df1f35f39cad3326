"""Wang et al. (2022), "Interpretability in the Wild: a Circuit for Indirect Object
Identification in GPT-2 small": which heads does a model use to say "Mary" after "When Mary and
John went to the store, John gave a drink to"? Activation patching on prompt pairs (METHODS §19).

Ground truth first. The script trains the 2-layer model of `olsson2022_phase_change.py` (its own
training function, 1,200 steps on the CPU, deterministic) and builds an induction task on it:
each clean prompt is random tokens followed by a repeat of their first j + 1, so the next token
is predictable (the one after the earlier occurrence of the last); the corrupted prompt replaces
that earlier occurrence's successor by another token, which is the distractor. The model's
induction head (the best head of the `induction` analysis on the repeated-random probe) must be
the top head by noising (the embeddings, which carry the changed token itself, are a node
apart, and so are the MLPs); the script exits 1 if not.

Then `--task ioi` on SmolLM2 (`headprobe.run("smollm2", task="ioi", ...)`: the built-in
generator, ABBA and BABA templates, the ABC corruption): the metric with its interval, the nodes
with the largest effects, and the heads' task roles with their evidence (movers, suppressors,
negative movers). The script exits 1 when the model does not do the task.

    .venv/bin/python analyses/wang2022_ioi.py                   # ground truth, then SmolLM2 (256 prompts)
    .venv/bin/python analyses/wang2022_ioi.py --skip-smollm2    # the ground truth only (~2 min)
    .venv/bin/python analyses/wang2022_ioi.py --n 64            # fewer IOI prompts

Outputs under --out (default out/wang2022_ioi/): induction_task/ and ioi/ (results directories),
induction_nodes.csv/.md and ioi_heads.csv/.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

import _common as C
import olsson2022_phase_change as olsson

SCRIPT = "wang2022_ioi"
INDUCTION_N, HALF = 200, 16  # induction prompts; random tokens before the repeat


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=1200, help="training steps, 2-layer model")
    p.add_argument("--n", type=int, default=256, help="IOI prompts on SmolLM2 (default 256)")
    p.add_argument("--estimate", default="atp,ig", help="estimates beside the exact values")
    p.add_argument("--skip-smollm2", action="store_true", help="the ground truth only")
    p.add_argument("--out", default=None, help="output directory (default: out/<script name>)")
    return p.parse_args(argv)


def induction_items(n: int, seed: int = 0, changed: int = 1, name: str = "induction") -> list[dict]:
    """The induction task (module docstring): `HALF` random tokens t0..t63, then their first
    j + 1 again; the answer is token j + 1. The corrupted prompt changes token j + `changed` of
    the first half to a spare token, the distractor: the answer itself (1, here), or the token
    before it (0: `hanna2024_circuits`, the previous-token head's input). Ids `name:k`."""
    import numpy as np

    rng = np.random.default_rng(seed)
    items = []
    for k in range(n):
        tokens = rng.choice(olsson.VOCAB, HALF + 1, replace=False)  # all distinct, one spare
        seq, spare = tokens[:HALF], int(tokens[HALF])
        j = int(rng.integers(3, HALF - 2))
        corrupted = seq.copy()
        corrupted[j + changed] = spare
        repeat = [f"t{t}" for t in seq[: j + 1]]
        clean = " ".join([f"t{t}" for t in seq] + repeat)
        text = " ".join([f"t{t}" for t in corrupted] + repeat)
        items.append(
            {"clean": clean, "corrupted": text, "answer": f"t{seq[j + 1]}",
             "distractor": f"t{spare}", "id": f"{name}:{k}"}
        )  # fmt: skip
    return items


def ground_truth(args, out) -> bool:
    from transformers import AutoModelForCausalLM

    import headprobe

    root = out / "checkpoints"
    path = olsson.train(SimpleNamespace(steps=args.steps, checkpoints=2, lr=1e-3), root)[-1]
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    tok = olsson.tokenizer()
    loaded = (model, tok, "olsson-2layer")
    probe = headprobe.run(
        loaded=loaded, probe="repeated-random", probe_length=olsson.PROBE, probe_n=100,
        analyses="induction", progress=False,
    )  # fmt: skip
    scores = probe.head_scores("induction", "mul")
    scores = scores.assign(score=scores["mass"] / scores["n"]).sort_values("score", ascending=False)
    best = scores.iloc[0]
    induction = (int(best["layer"]), int(best["head"]))
    task = headprobe.run(
        loaded=loaded, task=induction_items(INDUCTION_N), estimate=args.estimate,
        out=str(out / "induction_task"), progress=False,
    )  # fmt: skip
    nodes = task.tables["patching_nodes"]
    C.write_table(nodes, out, "induction_nodes", "Induction task: every node patched")
    heads = nodes[nodes["head"] >= 0].sort_values("noise", ascending=False)
    top = (int(heads.iloc[0]["layer"]), int(heads.iloc[0]["head"]))
    summary = task.task_summary()
    print(f"induction task on the 2-layer model: {summary['examples']} prompts; difference "
          f"{summary['difference'][0]:+.2f} [{summary['difference'][1]:+.2f}, "
          f"{summary['difference'][2]:+.2f}]")  # fmt: skip
    print(f"  the induction head (best of the induction analysis, score {best['score']:.2f}): "
          f"{induction[0]}-{induction[1]}")  # fmt: skip
    for r in heads.head(4).itertuples(index=False):
        print(f"  noising {r.node}: {r.noise_share:+.3f} of the difference "
              f"[{r.noise_share_low:+.3f}, {r.noise_share_high:+.3f}]")  # fmt: skip
    found = top == induction and summary["does_task"]
    print(f"the induction head is the top head by noising: {'yes' if found else 'no'}")
    return found


def smollm2(args, out) -> bool:
    import headprobe

    results = headprobe.run(
        "smollm2", task="ioi", probe_n=args.n, estimate=args.estimate, out=str(out / "ioi")
    )
    summary = results.task_summary()
    metric = results.tables["patching_metric"].set_index("metric")
    print(f"\nIOI on SmolLM2-135M-Instruct ({summary['examples']} prompts, ABBA and BABA, ABC "
          "corruption): logit difference (indirect object - subject)")  # fmt: skip
    for name in ("clean", "corrupted", "difference"):
        r = metric.loc[name]
        print(f"  {name}: {r.value:+.3f} [{r.low:+.3f}, {r.high:+.3f}]")
    if not summary["does_task"]:
        print("the model does not do the task: no head is named")
        return False
    heads = results.tables["patching_heads"]
    C.write_table(heads, out, "ioi_heads", "IOI: the heads with a significant direct effect")
    for role, names in summary["roles"].items():
        print(f"\n{role} heads ({len(names)}):")
        for r in heads[heads["role"] == role].head(8).itertuples(index=False):
            print(f"  {r.layer}-{r.head}: {r.evidence}")
    check = results.tables["patching_check"]
    for r in check.itertuples(index=False):
        print(f"estimate {r.estimate} vs exact {r.effect}: Spearman {r.spearman:+.2f} "
              f"[{r.ci_low:+.2f}, {r.ci_high:+.2f}] over {r.nodes} nodes")  # fmt: skip
    return True


def main(argv=None) -> int:
    args = parse_args(argv)
    out = C.out_dir(args, SCRIPT)
    started = time.perf_counter()
    found = ground_truth(args, out)
    done = True
    if not args.skip_smollm2:
        done = smollm2(args, out)
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0 if found and done else 1


if __name__ == "__main__":
    sys.exit(main())
