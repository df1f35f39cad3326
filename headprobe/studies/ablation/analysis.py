"""Does a head matter? Ablation effects and importance as streamed analyses (METHODS §8): the
registrations; the scorers and per-head tables are in `effects.py`, the groups of heads and the
pruning curve in `groups.py`.

    headprobe.run("smollm2", treebank=..., analyses=["ablation", "importance"])
    results.ablation_heads          # per head: mean delta per piece, folds, 95% interval
    results.importance_heads        # per head: mean |dL/dg| per piece, folds, 95% interval

These analyses need the model, not its attention: the engine calls `model_pass(model,
batch)` before the batch's attention pass (`engine.Engine`), outside inference mode,
and the run loads the model under its language-model head (`needs_lm_head`,
`models.load_lm`). Per example one row, (unit, objective kind), with n = the pieces the
objective is scored on (`headprobe.model.objectives`); the row's value per head is

- `ablation`: objective(head ablated) - objective(intact), summed over the example
  (`head_effects.ablation_rows`; several heads side by side in one forward pass, up to
  `effects.ROWS_PER_PASS` rows: a batch of B examples costs about layers x heads x B / 64
  passes);
- `importance`: |dL_x / dg_h| at g = 1 (Michel et al. 2019), one backward pass per batch
  (`head_effects.gate_gradients`); needs a language-model loss. `--estimate atp,atp*` adds
  attribution patching's first-order estimates of each kind's effect (`-dL/dg`, and GradDrop's
  `head_effects.graddrop_rows`).

They add up per unit and fold like any mass, so the tables carry `sum / n` with the
streaming bootstrap's intervals. The label is the objective's kind; the tables name it
in full (`objective`). The kinds of ablation are `--ablation` (zero, the default; mean and
resample read their baselines in one pass over the inputs first: `kinds.Baselines`); a kind
other than zero, or an estimate other than michel, is part of the label (`effects.row_label`).

`ablation` ablates every head of the scored layers, or the heads given (`run(heads=...)`,
`--heads 17-3,18-6`); heads not ablated hold NaN and are left out of `ablation_heads`.

`prune_curve` (`run(prune_curve=True)`, `--prune-curve`; Michel et al. 2019): the objective
as 0%, 10%, ... 100% of the heads are gated to 0 together, cumulatively, least important
first. It is a second pass over the sentences (`second_pass`): the order comes from the
first pass's `importance` (a language-model loss) or, where importance is undefined (no
language-model head), from `ablation` (every head), which the run adds. One row per
(unit, point) with n = pieces scored, a single cell (layer `MODEL_LEVEL`: the whole model),
so each point has an interval and the change from 0% a paired one (`prune_table`); the
order used is in the summary (`prune_curve`). `head_ranks`: every head's rank by the same
score (1 = most important), which the role map prints beside each role.

`group_ablation` (`--head-groups`; `groups.GroupScorer`, which the pruning curve extends) gates
named groups of heads together per example, e.g. induction heads vs as many other heads vs
intact; `groups.points_table` gives each group's objective and its paired difference from a
reference group. A model scorer's
objective may be restricted to some pieces (`scored`, `objectives.Objective`).
"""

from __future__ import annotations

from headprobe.extend import ANY, Analysis, register
from headprobe.studies.ablation import flags
from headprobe.studies.ablation.effects import (
    AblationScorer,
    ImportanceScorer,
    ablation_console,
    head_ranks,
    kinds_table,
    objective_table,
)
from headprobe.studies.ablation.groups import (
    GROUPS,
    GroupScorer,
    PruneScorer,
    groups_console,
    groups_table,
    prune_table,
    versus_table,
)

ABLATION = register(
    Analysis(
        name="ablation",
        order=110,
        scorer=AblationScorer,
        input=ANY,
        cross=True,
        selection=False,
        default=False,
        options=(flags.HEADS, flags.ABLATION),
        model_checks=(flags.heads_exist,),
        description="per head: objective(head zeroed) - objective(intact) per piece (METHODS §8): the LM loss where "
        "the model has a language-model head, else the last hidden state's 1 - cos",
        tables={
            "ablation_heads": lambda results: objective_table(results, "ablation"),
            "ablation_kinds": kinds_table,
            "head_ranks": head_ranks,
        },
        console=ablation_console,
        report="headprobe.studies.ablation.report:importance_section",
    )
)

IMPORTANCE = register(
    Analysis(
        name="importance",
        order=120,
        scorer=ImportanceScorer,
        input=ANY,
        cross=True,
        selection=False,
        default=False,
        options=("ablation", flags.ESTIMATE),
        model_checks=(flags.no_task_estimate,),
        description="per head: |dL/dg| at g = 1 per piece, a gate per example and head, one backward pass "
        "(Michel et al. 2019; METHODS §8); needs a language-model head",
        tables={
            "importance_heads": lambda results: objective_table(results, "importance"),
            "head_ranks": head_ranks,
        },
        report="headprobe.studies.ablation.report:importance_section",
    )
)

GROUP_ABLATION = register(
    Analysis(
        name=GROUPS,
        order=125,
        scorer=GroupScorer,
        input=ANY,
        cross=True,
        selection=False,
        default=False,
        added_by="head_groups",
        options=(flags.HEAD_GROUPS, "ablation"),
        model_checks=(flags.heads_exist,),
        description="the objective with each named group of heads gated to 0 together, against the intact "
        "model and against each other, with paired 95% intervals (METHODS §8; e.g. Olsson et al.'s "
        "induction heads against as many other heads)",
        tables={GROUPS: groups_table, f"{GROUPS}_versus": versus_table},
        console=groups_console,
        report="headprobe.studies.ablation.report:groups_section",
    )
)

PRUNE_CURVE = register(
    Analysis(
        name="prune_curve",
        order=130,
        scorer=PruneScorer,
        input=ANY,
        cross=True,
        selection=False,
        default=False,
        added_by="prune_curve",
        options=(flags.PRUNE_CURVE, "ablation"),
        description="the objective as 0%, 10%, ... 100% of the heads are gated to 0, cumulatively, least important "
        "first (Michel et al. 2019): ordered by importance, else by single-head ablation effect",
        tables={"prune_curve": prune_table},
        report="headprobe.studies.ablation.report:prune_section",
    )
)
