"""Reproduce Wu et al. (2024), "Retrieval Head Mechanistically Explains Long-Context
Factuality": (1) few attention heads are retrieval heads, and (2) ablating them hurts retrieval
more than ablating as many random heads.

Everything goes through `headprobe.run`, with the options a CLI user gives:

    headprobe run --model smollm2 --probe needle --needle-lengths 500,1000 --needle-depths 5 \\
        --analyses retrieval --retrieval-check 10 --out out/wu2024_retrieval/run

Probe (METHODS §16): the four built-in needles (or `--needles FILE.jsonl`) hidden in the bundled
Walden haystack at every (length, depth) of the grid; the model answers greedily. A head copies
at a decoding step when the key it attends to most is the answer's token it is writing; its
score is the share of the answer's tokens it copies, mean over the probes the model recalls
(response holds more than half of the answer's words), with a 95% bootstrap interval over probes.
A retrieval head: mean >= 0.1 and interval above 0 (on at least 30 recalled probes).

Claims checked:
1. few heads are retrieval heads: the share of heads with the role is below `--few` (0.05: Wu et
   al. find fewer than 5% of heads);
2. the top k retrieval heads ablated (gated to 0) lower the answers' teacher-forced
   log-probability more than k random heads (the mean of 5 seeded draws among the other heads):
   the paired 95% interval of (retrieval - random) lies below 0. The success rates under each
   condition are printed beside it (Wu et al.: masking retrieval heads breaks retrieval, random
   heads do not).

    .venv/bin/python analyses/wu2024_retrieval.py                         # SmolLM2, 500,1000 x 5
    .venv/bin/python analyses/wu2024_retrieval.py --results out/wu2024_retrieval/run   # reuse
    OMP_NUM_THREADS=1 .venv/bin/python analyses/wu2024_retrieval.py --k 5

Outputs under --out (default out/wu2024_retrieval/): run/ (the results directory),
retrieval_heads.csv/.md (the heads with the role, and the top 10), retrieval_check.csv/.md,
claims.md. Exit status 0 when both claims hold, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys

import _common as C


def claims(results, few: float) -> list[tuple[str, bool, str]]:
    """(claim, holds, the numbers) of the two claims, read from the results' tables."""
    heads = results.retrieval_heads
    success = results.retrieval_success
    got, probes = int(success["recalled"].sum()), int(success["probes"].sum())
    n_role = int(heads["passes"].sum())
    share = n_role / len(heads)
    out = [
        (
            f"few heads are retrieval heads (share below {few:g})",
            bool(share < few and n_role > 0),
            f"{n_role} of {len(heads)} heads ({share:.1%}) have the role, on {got} of {probes} "
            "recalled probes",
        )
    ]
    versus = results.tables.get("retrieval_check_versus")
    check = results.tables.get("retrieval_check")
    if versus is None or not len(versus):
        note = (results.summary.get("retrieval_check") or {}).get("note", "not run")
        return out + [("retrieval heads matter more than random heads", False, note)]
    v = versus.set_index("what")
    c = check.set_index("condition")
    numbers = (
        f"answer log p per token: none {c.loc['none', 'logprob']:.3f}, top-k "
        f"{c.loc['retrieval', 'logprob']:.3f}, random (mean) {c.loc['random (mean)', 'logprob']:.3f}; "
        f"top-k - random {v.loc['logprob', 'change']:+.3f} [{v.loc['logprob', 'change_low']:+.3f}, "
        f"{v.loc['logprob', 'change_high']:+.3f}]; success none {c.loc['none', 'success']:.3f}, "
        f"top-k {c.loc['retrieval', 'success']:.3f}, random (mean) "
        f"{c.loc['random (mean)', 'success']:.3f}"
    )
    holds = bool(v.loc["logprob", "change_high"] < 0)
    return out + [("ablating the top-k lowers the answers' log p more than random", holds, numbers)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2", help="a causal LM (default: the bundled SmolLM2)")
    p.add_argument("--lengths", default="500,1000", help="context lengths (default 500,1000)")
    p.add_argument("--depths", type=int, default=5, help="needle depths (default 5)")
    p.add_argument("--needles", default=None, help="a JSONL file of needles (default: built-in)")
    p.add_argument("--k", type=int, default=10, help="heads ablated in the check (default 10)")
    p.add_argument("--few", type=float, default=0.05, help="claim 1's share (default 0.05)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--results", default=None, help="reuse a results directory")
    p.add_argument("--out", default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    out = C.out_dir(args, "wu2024_retrieval")

    import headprobe

    if args.results:
        results = headprobe.load_results(args.results)
    else:
        options = {} if args.device is None else {"device": args.device}
        results = headprobe.run(
            C.model_arg(args.model),
            probe="needle",
            needles=args.needles,
            needle_lengths=args.lengths,
            needle_depths=args.depths,
            analyses=["retrieval"],
            retrieval_check=args.k,
            seed=args.seed,
            n_boot=args.bootstrap,
            progress=not args.quiet,
            out=str(out / "run"),
            **options,
        )
    name = C.model_name(results, args)
    heads = results.retrieval_heads.sort_values("score", ascending=False, kind="stable")
    heads.insert(0, "head_name", [f"{a}-{b}" for a, b in zip(heads["layer"], heads["head"])])
    shown = heads[heads["passes"].astype(bool) | (heads.index.isin(heads.index[:10]))]
    C.write_table(
        shown.drop(columns=["layer", "head"]),
        out,
        "retrieval_heads",
        f"{name}: retrieval heads and the top 10 by mean copy score (L-H 0-based), 95% intervals",
    )
    C.write_table(
        results.retrieval_check.drop(columns=["objective"]),
        out,
        "retrieval_check",
        f"{name}: heads ablated together; success rate and answer log p per token, paired "
        "changes from none",
    )
    found = claims(results, args.few)
    lines = [f"# {name}: Wu et al. (2024) on the needle probe", ""]
    lines += [
        f"- {'holds' if ok else 'does not hold'}: {claim}. {numbers}."
        for claim, ok, numbers in found
    ]
    (out / "claims.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n" + "\n".join(lines[2:]))
    return 0 if all(ok for _, ok, _ in found) else 1


if __name__ == "__main__":
    sys.exit(main())
