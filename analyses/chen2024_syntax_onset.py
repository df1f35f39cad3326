"""Chen et al. (ICLR 2024), "Sudden Drops in the Loss": syntactic attention structure appears
abruptly in masked-LM pretraining, together with a steep drop of the loss. Over a user's series
of checkpoints (METHODS §17), side by side per step:

- the best dependency head's held-out accuracy on all relations (`dependency`, label ALL: the
  head and direction chosen on one half of the units, scored on the other, pooled; [§5]);
- the parsing UAS of the attention-only classifier over every head (`parsing`, held out where
  the table has it; Clark et al. 2019 §6);
- the model's own masked-LM loss on the scored sentences (15% of word pieces, a fixed keyed
  mask; METHODS §17), each with its 95% interval;

then the onset of the best dependency score (the consecutive checkpoints where it rises most,
with its paired interval) beside the interval where the MLM loss falls most.

    .venv/bin/python analyses/chen2024_syntax_onset.py \\
        google/multiberts-seed_0-step_0k google/multiberts-seed_0-step_20k \\
        google/multiberts-seed_0-step_40k google/multiberts-seed_0-step_100k \\
        google/multiberts-seed_0-step_200k google/multiberts-seed_0-step_2000k
    .venv/bin/python analyses/chen2024_syntax_onset.py ckpt/step_* --treebank my.conllu
    .venv/bin/python analyses/chen2024_syntax_onset.py EleutherAI/pythia-70m \\
        --revisions step0,step1000,step8000 --steps 0,1000,8000   # any series, NAME@REVISION

The MultiBERTs (Sellam et al. 2022) release one repository per step (`step_20k`: 20,000 steps);
any series of masked LMs with their tokenizers works. Outputs under --out (default
out/chen2024_syntax_onset/): the timeline directory (timeline/, with its report) and
syntax_onset.csv / .md (one row per step). Exit 0 when the table is written.
"""

from __future__ import annotations

import argparse
import sys

import _common as C

SCRIPT = "chen2024_syntax_onset"


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "checkpoints",
        nargs="+",
        help="checkpoints: directories, hub names (google/multiberts-seed_0-step_20k) or NAME@REVISION",
    )
    p.add_argument("--revisions", default=None, help="comma list of revisions of one name")
    p.add_argument("--steps", default=None, help="comma list of steps (default: from the names)")
    p.add_argument(
        "--treebank",
        default=C.default_path(C.EWT_DEV),
        help="CoNLL-U file with gold dependencies (default: UD English EWT dev)",
    )
    p.add_argument("--out", default=None, help="output directory (default: out/<script name>)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--no-report", action="store_true", help="no timeline report")
    return p.parse_args(argv)


def step_rows(tl) -> list[dict]:
    """One row per checkpoint: best dependency head (held out), parsing UAS, MLM loss."""
    objective = tl.objective.set_index("checkpoint")
    rows = []
    for record in tl.checkpoints:
        results = tl.results(record["checkpoint"])
        best = results.best_head("dependency", "ALL", selection="held-out")
        uas = parsing_uas(results)
        loss = (
            objective.loc[record["checkpoint"]] if record["checkpoint"] in objective.index else None
        )
        rows.append(
            {
                "step": record["step"],
                "checkpoint": record["checkpoint"],
                "dependency_heads": None if best is None else best["heads"],
                "dependency_heldout": None if best is None else best["accuracy"],
                "dependency_low": None if best is None else best["ci_low"],
                "dependency_high": None if best is None else best["ci_high"],
                **uas,
                "mlm_loss": None if loss is None else loss["value"],
                "mlm_low": None if loss is None else loss["ci_low"],
                "mlm_high": None if loss is None else loss["ci_high"],
            }
        )
    return rows


def parsing_uas(results) -> dict:
    """The classifier's UAS (held out where the table has it) with its interval."""
    scores = results.tables.get("parse_scores")
    empty = {"uas": None, "uas_low": None, "uas_high": None, "uas_selection": ""}
    if scores is None or not len(scores):
        return empty
    rows = scores[(scores["metric"] == "UAS") & (scores["predictor"] == "probe")]
    if not len(rows):
        return empty
    held = rows[rows["selection"].astype(str).str.contains("held")]
    row = (held if len(held) else rows).iloc[0]
    return {
        "uas": row["accuracy"],
        "uas_low": row["ci_low"],
        "uas_high": row["ci_high"],
        "uas_selection": row["selection"],
    }


def onset_lines(tl) -> list[str]:
    onsets = tl.onsets
    rows = onsets[(onsets["analysis"] == "dependency") & (onsets["label"] == "ALL")]
    if not len(rows):
        return ["no onset of the dependency score (fewer than two checkpoints with a best head)"]
    r = rows.iloc[0]
    lines = [
        f"dependency ALL best score rises most between steps {r.from_step:,} and {r.to_step:,}: "
        f"{r.rise:+.3f} [{r.rise_low:+.3f}, {r.rise_high:+.3f}] (paired 95% interval)"
    ]
    if r.objective_from_step == r.objective_from_step:  # not NaN
        lines.append(
            f"MLM loss falls most between steps {int(r.objective_from_step):,} and "
            f"{int(r.objective_to_step):,}: {r.objective_fall:+.3f} "
            f"[{r.objective_fall_low:+.3f}, {r.objective_fall_high:+.3f}]; "
            f"{'the same interval' if r.same_interval else 'another interval'}"
        )
    return lines


def main(argv=None) -> int:
    import pandas as pd

    import headprobe

    args = parse_args(argv)
    out = C.out_dir(args, SCRIPT)
    options = {"treebank": args.treebank, "analyses": ["dependency", "parsing"]}
    options.update(
        {k: v for k, v in (("batch_size", args.batch_size), ("device", args.device)) if v}
    )
    tl = headprobe.timeline(
        args.checkpoints,
        revisions=args.revisions,
        steps=args.steps,
        out=str(out / "timeline"),
        report=not args.no_report,
        **options,
    )
    table = pd.DataFrame(step_rows(tl))
    C.write_table(
        table, out, "syntax_onset", "Syntax onset: dependency, parsing and MLM loss per step"
    )
    print("\n".join(["", *onset_lines(tl)]))
    print(f"\nwritten: {out / 'syntax_onset.csv'}, {out / 'timeline'}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
