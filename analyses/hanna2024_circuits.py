"""Hanna et al. (2024), "Have Faith in Faithfulness" (EAP-IG), scored as MIB's circuit track
does (Mueller et al. 2025): every edge between the embeddings, heads, MLPs and the logits ranked
by EAP-IG, circuits of the top 0.1% ... 100% evaluated exactly, CPR and CMD. Beyond both: the
curve is also measured held out (ranked on one fold, evaluated on the other), with intervals
(METHODS §20).

Ground truth first: the 2-layer model of `olsson2022_phase_change.py` on an induction task
(random tokens, then a repeat of their first j + 1: the answer is token j + 1). The induction
circuit is known: layer 0's previous-token head writes "the token before me" into each position,
and layer 1's induction head finds the earlier occurrence's successor through its key. So the
corrupted prompt changes token j in the first half (to a token seen nowhere else, the
distractor): the previous-token head then writes something else at the successor's position,
and the induction head's key there no longer matches. (`wang2022_ioi.py` changes the successor
instead, which the induction head reads through its value: a patching task for the head, not for
this edge.) The script finds both heads by their own analyses (`previous_token`, `induction` on
the repeated-random probe) and states that the edge from the previous-token head into the
induction head's key is in the smallest faithful circuit; it exits 1 if not.

Then `--task ioi` on SmolLM2: CPR and CMD in-sample and held out, the curve, the smallest
faithful circuit's heads with their patching roles.

    .venv/bin/python analyses/hanna2024_circuits.py                  # ground truth, then SmolLM2
    .venv/bin/python analyses/hanna2024_circuits.py --skip-smollm2   # the ground truth only
    .venv/bin/python analyses/hanna2024_circuits.py --n 64           # fewer IOI prompts

Outputs under --out (default out/hanna2024_circuits/): induction_circuit/ and ioi/ (results
directories), induction_curve.csv/.md, ioi_curve.csv/.md and ioi_nodes.csv/.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

import _common as C
import olsson2022_phase_change as olsson
import wang2022_ioi as wang

SCRIPT = "hanna2024_circuits"
INDUCTION_N = 96
# the 2-layer model's graph has 110 edges: MIB's budgets jump from 20% to 50% to 100% there, so
# its curve is read every 10% as well
SMALL_BUDGETS = "1,2,5,10,20,30,40,50,60,70,80,90,100"


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=1200, help="training steps, 2-layer model")
    p.add_argument("--n", type=int, default=64, help="IOI prompts on SmolLM2 (default 64)")
    p.add_argument("--skip-smollm2", action="store_true", help="the ground truth only")
    p.add_argument("--out", default=None, help="output directory (default: out/<script name>)")
    return p.parse_args(argv)


def key_items(n: int, seed: int = 0) -> list[dict]:
    """The induction task of the module docstring: `wang.HALF` distinct random tokens, then their
    first j + 1 again; the corrupted prompt changes token j of the first half to a spare token,
    the distractor; the answer is token j + 1."""
    return wang.induction_items(n, seed, changed=0, name="induction-key")


def best_head(results, analysis: str) -> tuple[int, int]:
    scores = results.head_scores(analysis, "mul")
    scores = scores.assign(score=scores["mass"] / scores["n"]).sort_values("score", ascending=False)
    return int(scores.iloc[0]["layer"]), int(scores.iloc[0]["head"])


def print_scores(results) -> None:
    scores = results.tables["circuit_scores"]
    for r in scores.itertuples(index=False):
        parts = [f"in-sample {r.in_sample:.3f} [{r.in_sample_low:.3f}, {r.in_sample_high:.3f}]"]
        if "held_out" in scores:
            parts.insert(
                0, f"held out {r.held_out:.3f} [{r.held_out_low:.3f}, {r.held_out_high:.3f}]"
            )
        print(f"  {r.score} ({r.ranking} ranking): " + "; ".join(parts))


def ground_truth(args, out) -> bool:
    from transformers import AutoModelForCausalLM

    import headprobe

    root = out / "checkpoints"
    path = olsson.train(SimpleNamespace(steps=args.steps, checkpoints=2, lr=1e-3), root)[-1]
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    loaded = (model, olsson.tokenizer(), "olsson-2layer")
    probe = headprobe.run(
        loaded=loaded, probe="repeated-random", probe_length=olsson.PROBE, probe_n=100,
        analyses="induction,previous_token", progress=False,
    )  # fmt: skip
    induction, previous = best_head(probe, "induction"), best_head(probe, "previous_token")
    results = headprobe.run(
        loaded=loaded, task=key_items(INDUCTION_N), analyses="patching,circuit",
        circuit_budgets=SMALL_BUDGETS,
        out=str(out / "induction_circuit"), progress=False,
    )  # fmt: skip
    edges = results.tables["circuit_edges"]
    C.write_table(results.tables["circuit_curve"], out, "induction_curve", "Induction: the curve")
    info = results.summary["circuit"]
    print(f"induction task on the 2-layer model: {info['units']} prompts, {info['edges']} edges")
    print(f"  previous-token head {previous[0]}-{previous[1]}, induction head "
          f"{induction[0]}-{induction[1]} (their analyses' best heads)")  # fmt: skip
    print_scores(results)
    smallest = info.get("smallest_faithful")
    key = edges[
        (edges["sender"] == f"{previous[0]}-{previous[1]}")
        & (edges["receiver"] == f"{induction[0]}-{induction[1]}")
        & (edges["channel"] == "k")
    ].iloc[0]
    rank = int((edges["eap_ig"] > key["eap_ig"]).sum()) + 1
    print(f"  edge {previous[0]}-{previous[1]} -> {induction[0]}-{induction[1]}.k: EAP-IG "
          f"{key['eap_ig']:+.3f} (rank {rank} of {len(edges)}), exact {key['exact']:+.3f}")  # fmt: skip
    if smallest:
        print(f"  smallest faithful circuit: {smallest[1]} edges ({100 * smallest[0]:g}%)")
    found = bool(smallest) and bool(key["in_circuit"]) and previous[0] < induction[0]
    print(f"the previous-token -> induction key edge is in the smallest faithful circuit: "
          f"{'yes' if found else 'no'}")  # fmt: skip
    return found


def smollm2(args, out) -> bool:
    import headprobe

    results = headprobe.run(
        "smollm2", task="ioi", probe_n=args.n, analyses="patching,circuit", out=str(out / "ioi")
    )
    info = results.summary["circuit"]
    print(f"\nIOI on SmolLM2-135M-Instruct: {info['units']} prompts, {info['edges']:,} edges")
    if not info.get("does_task"):
        print("the model does not do the task: no circuit is evaluated")
        return False
    print_scores(results)
    C.write_table(results.tables["circuit_curve"], out, "ioi_curve", "IOI: the faithfulness curve")
    nodes = results.tables["circuit_nodes"]
    if len(nodes):
        C.write_table(nodes, out, "ioi_nodes", "IOI: the smallest faithful circuit's nodes")
        heads = nodes[nodes["head"] >= 0]
        print(f"smallest faithful circuit: {info['smallest_faithful'][1]:,} edges, "
              f"{len(heads)} heads")  # fmt: skip
        for r in heads.head(12).itertuples(index=False):
            print(f"  {r.node}: {r.in_edges} in, {r.out_edges} out, role {r.role or '-'}")
    for r in results.tables["circuit_check"].itertuples(index=False):
        print(f"{r.estimate} vs exact path patching: Spearman {r.spearman:+.2f} "
              f"[{r.ci_low:+.2f}, {r.ci_high:+.2f}] over {r.edges} edges")  # fmt: skip
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
