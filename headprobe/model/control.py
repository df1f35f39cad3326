"""The random-init control: what the architecture gives for free, beside what was learned.

    results = headprobe.run("smollm2", treebank=..., control="random-init")
    results.best_heads[["label", "accuracy", "control_accuracy", "control_ci_low", "control_ci_high"]]
    results.control                      # the control's own Results: best heads, roles, ...
    results.control_best_heads           # the same table, saved beside the trained model's

The control is the same architecture re-initialised from its config with the run's seed
(`models.random_init`) and read through the same tokenizer. It is a dimension of the
counts, like a measure: every attention analysis of the run is scored on it too, by the
same scorers, into a second set of tallies whose `model` is "control" (tally key
`<analysis>~control`, `scoring.measures.tally_key`). `Results` computes the control's tables from those
exactly as for a run of that model alone, saves them prefixed `control_`, and

- gives every best-heads row the control's best head for the same analysis, label,
  selection and fold (`CONTROL_COLUMNS`: its name, accuracy and 95% interval), and
- makes the syntactic role (METHODS §6) also require the head's held-out accuracy to be above
  the control's held-out best for the relation (the rule `dependency.ROLE`, `control_bar`).

Analyses that run the model themselves (ablation, importance, the pruning curve) are not
repeated on the control: it has no loss worth ablating. Per-unit rows
(`keep_unit_counts`) are the trained model's only.
"""

from __future__ import annotations

import pandas as pd

CONTROLS = ("random-init",)
TRAINED, CONTROL = "trained", "control"
KEY_MARK = "~"
TABLE_PREFIX = "control_"
CONTROL_COLUMNS = ["control_heads", "control_accuracy", "control_ci_low", "control_ci_high"]
MATCH_ON = ["analysis", "label", "selection", "fold"]


def by_model(tallies: dict) -> tuple[dict, dict]:
    """({analysis: own tally}, {analysis: control tally}) of a run's tallies (any keys): the own
    are the trained model's, or the control's where there are only those (the control's own
    results, `Results.control`), which then have no control."""
    trained = {t.analysis: t for t in tallies.values() if t.model == TRAINED}
    control = {t.analysis: t for t in tallies.values() if t.model == CONTROL}
    return (trained, control) if trained or not control else (control, {})


def control_tables(tables: dict) -> dict:
    """The control's tables among saved ones (`control_<name>`), by their own names."""
    return {
        name[len(TABLE_PREFIX) :]: table
        for name, table in tables.items()
        if name.startswith(TABLE_PREFIX)
    }


def with_control(best: pd.DataFrame, control_best: pd.DataFrame) -> pd.DataFrame:
    """Best-heads rows with the control's best head of the same analysis, label, selection and fold
    beside them (`CONTROL_COLUMNS`; NaN where the control has no such row)."""
    theirs = control_best[MATCH_ON + ["heads", "accuracy", "ci_low", "ci_high"]].rename(
        columns=dict(zip(["heads", "accuracy", "ci_low", "ci_high"], CONTROL_COLUMNS))
    )
    merged = best.merge(theirs.drop_duplicates(MATCH_ON), on=MATCH_ON, how="left")
    merged["control_heads"] = merged["control_heads"].fillna("").astype(str)
    return merged


def control_bar(best: pd.DataFrame, analyses) -> dict:
    """{(analysis, label): the control's pooled held-out best accuracy} for `analyses`; empty
    without a control (best heads without `control_accuracy`)."""
    if "control_accuracy" not in best:
        return {}
    rows = best[
        best["analysis"].isin(list(analyses))
        & (best["selection"] == "held-out")
        & (best["fold"] == "")
    ]
    return {
        (a, l): float(v)
        for a, l, v in zip(rows["analysis"], rows["label"], rows["control_accuracy"])
    }
