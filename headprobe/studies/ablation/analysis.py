"""Does a head matter? Ablation effects and importance as streamed analyses (METHODS §8).

    headprobe.run("smollm2", treebank=..., analyses=["ablation", "importance"])
    results.ablation_heads          # per head: mean delta per piece, folds, 95% interval
    results.importance_heads        # per head: mean |dL/dg| per piece, folds, 95% interval

These analyses need the model, not its attention: the engine calls `model_pass(model,
batch)` before the batch's attention pass (`engine.Engine`), outside inference mode,
and the run loads the model under its language-model head (`needs_lm_head`,
`models.load_lm`). Per example one row, (unit, objective kind), with n = the pieces the
objective is scored on (`headprobe.model.objectives`); the row's value per head is

- `ablation`: objective(head zeroed) - objective(intact), summed over the example
  (`ablation.ablation_rows`; several heads side by side in one forward pass, up to
  `ROWS_PER_PASS` rows: a batch of B examples costs about layers x heads x B / 64 passes);
- `importance`: |dL_x / dg_h| at g = 1 (Michel et al. 2019), one backward pass per batch
  (`ablation.importance_rows`); needs a language-model loss.

They add up per unit and fold like any mass, so the tables carry `sum / n` with the
streaming bootstrap's intervals. The label is the objective's kind; the tables name it
in full (`objective`). Zero ablation only here (mean ablation needs a pass over the
corpus first: `gates.head_means`, `ablation.ablation_rows(means=...)`).

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

`GroupScorer` (not registered; the pruning curve is one) gates named groups of heads together
per example, e.g. induction heads vs as many other heads vs intact; `points_table` gives each
group's objective and its paired difference from a reference group. A model scorer's
objective may be restricted to some pieces (`scored`, `objectives.Objective`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.core.errors import UsageError
from headprobe.model.objectives import DESCRIPTIONS
from headprobe.scoring.model_scorer import ModelScorer
from headprobe.scoring.registry import ANY, Analysis, register
from headprobe.stats.engine import estimate, paired_gap
from headprobe.stats.heads import head_table, tally_scores

ROWS_PER_PASS = 64  # ablation: heads side by side in one forward pass, up to this many rows
MODEL_LEVEL = -1  # the layer of a whole-model cell (the pruning curve), never a head


class AblationScorer(ModelScorer):
    analysis = "ablation"
    heads = None  # None: every head of the scored layers; else [(layer, head)]

    def use_heads(self, heads) -> None:
        """Ablate only `heads` ([(layer, head)]; None: all); the others hold NaN."""
        self.heads = None if heads is None else [(int(layer), int(head)) for layer, head in heads]

    def ablated(self) -> list[tuple[int, int]]:
        every = [(layer, head) for layer in self.layers for head in range(self.n_heads)]
        return every if self.heads is None else [x for x in every if x in set(self.heads)]

    def compute(self, model, batch):
        import torch

        from headprobe.model.head_effects import ablation_rows

        heads = self.ablated()
        delta, tokens = ablation_rows(
            model, batch, self.objective, heads, copies=max(1, ROWS_PER_PASS // len(batch))
        )
        values = torch.full(
            (len(batch), self.n_layers, self.n_heads),
            float("nan"),
            dtype=delta.dtype,
            device=delta.device,
        )  # [row, layer, head]
        layer, head = (torch.tensor(x, dtype=torch.long) for x in zip(*heads))
        values[:, layer, head] = delta  # [row, ablated]
        return values, tokens


class ImportanceScorer(ModelScorer):
    analysis = "importance"

    def use_model(self, model, tokenizer, stack: str | None = None) -> None:
        super().use_model(model, tokenizer, stack)
        if self.objective.kind == "representation":
            raise ValueError(
                "the importance analysis needs a language-model loss, and the model has no "
                "trained language-model head (its representation change has zero gradient at g = 1)"
            )

    def compute(self, model, batch):
        from headprobe.model.head_effects import importance_rows

        return importance_rows(model, batch, self.objective)  # [row, layer, head], [row]


class GroupScorer(ModelScorer):
    """Per example, the objective with each named group of heads gated to 0 together (`use_groups`):
    one row per (unit, group) with n = pieces scored, a single whole-model cell (layer
    `MODEL_LEVEL`), so every group's objective has an interval and any two groups a paired
    difference (`points_table`). The `head_groups` analysis (`--head-groups`, the intact model
    always first); the pruning curve is one too."""

    analysis = "group_ablation"

    def __init__(self):
        super().__init__()
        self.groups: list[tuple[str, list]] = []

    def use_groups(self, groups) -> None:
        """groups: {label: [(layer, head), ...]} (or pairs); an empty list of heads is the intact
        model, which comes first whether named or not."""
        pairs = list(groups.items()) if isinstance(groups, dict) else list(groups)
        named = [(str(label), [(int(l), int(h)) for l, h in heads]) for label, heads in pairs]
        self.groups = ([] if any(not h for _, h in named) else [(INTACT, [])]) + named

    def use_options(self, options: dict) -> None:
        """The groups of `--head-groups` (the run's `head_groups` option), where the analysis
        reads it (the pruning curve makes its own groups: `use_tallies`)."""
        if "head_groups" in options:
            self.use_groups(options["head_groups"] or {})

    def bind(self, n_layers, n_heads, layers=None, **options) -> None:
        super().bind(1, 1, [MODEL_LEVEL], **options)  # one cell: the whole model

    def describe(self) -> dict:
        """What the summary keeps: each group's heads, in order (the tables read it)."""
        return {self.analysis: {g: [f"{l}-{h}" for l, h in heads] for g, heads in self.groups}}

    def model_pass(self, model, batch):
        """Rows (unit, group) of every example and group: the objective with the group gated."""
        from headprobe.model.head_effects import gated_rows

        targets = self.objective.targets(model, batch)
        values = gated_rows(
            model,
            targets,
            self.objective,
            [heads for _, heads in self.groups],
            copies=max(1, ROWS_PER_PASS // len(batch)),
        )  # [row, group]
        tokens = self.objective.pieces(targets).cpu().numpy()  # [row]
        keys = [(example.unit, label) for example in batch.examples for label, _ in self.groups]
        n = np.repeat(tokens, len(self.groups))  # [row x group]
        return self.state_of(batch, keys, n, values.reshape(-1, 1, 1))  # [row x group, 1, 1]


class PruneScorer(GroupScorer):
    """The pruning curve: the groups are 0%, 10%, ... 100% of the heads, least important first."""

    analysis = "prune_curve"
    second_pass = True  # scored after the first pass, whose tallies give the order

    def __init__(self):
        super().__init__()
        self.order_by, self.order = "", []

    @staticmethod
    def prerequisites(kind: str, heads=None) -> list[str]:
        """The analyses the order needs on a model whose objective is `kind`; `heads`: the heads
        the `ablation` analysis is asked to ablate (None: all), which the order by ablation needs."""
        if kind != "representation":
            return ["importance"]
        if heads is not None:
            raise UsageError(
                "--prune-curve: without a language-model head the heads are ordered by their "
                "ablation effect, which needs every head ablated (--heads all)"
            )
        return ["ablation"]

    def use_tallies(self, tallies: dict) -> None:
        """Order the heads by the first pass's `importance` (else `ablation`) tally, least first."""
        from headprobe.model.head_effects import prune_order, prune_steps

        self.order_by = "importance" if "importance" in tallies else "ablation"
        self.order = prune_order(tally_scores(tallies[self.order_by]))
        self.use_groups(prune_steps(self.order))

    def describe(self) -> dict:
        """What the summary keeps of this pass (`prune_table` reads it)."""
        return {
            "prune_curve": {
                "order_by": self.order_by,
                "order": [f"{l}-{h}" for l, h in self.order],
                "points": {label: len(heads) for label, heads in self.groups},
            }
        }


INTACT = "intact"  # the group of no heads: the model as it is
GROUPS = "group_ablation"  # the analysis of named groups (`--head-groups`)
POINT_COLUMNS = ["label", "n", "value", "ci_low", "ci_high", "change", "change_low", "change_high"]
GROUP_COLUMNS = ["group", "heads", "n_heads", *POINT_COLUMNS[1:], "objective"]
VERSUS_COLUMNS = ["group", "versus", "n", "change", "change_low", "change_high"]


def groups_table(results) -> pd.DataFrame:
    """One row per group of `--head-groups` (the intact model first): the objective with the group
    gated to 0 (value, 95% interval) and its paired change from intact."""
    tally = results.tallies.get(GROUPS)
    groups = results.summary.get(GROUPS) or {}
    if tally is None or not tally.labels or not groups:
        return pd.DataFrame(columns=GROUP_COLUMNS)
    labels = [label for label in groups if label in tally.labels]
    table = points_table(tally, labels, INTACT).rename(columns={"label": "group"})
    table.insert(1, "heads", [" ".join(groups[label]) for label in labels])
    table.insert(2, "n_heads", [len(groups[label]) for label in labels])
    table["objective"] = (results.summary.get("objectives") or {}).get(GROUPS, "")
    return table[GROUP_COLUMNS]


def versus_table(results) -> pd.DataFrame:
    """Every ordered pair of named groups: the paired change of the objective from gating the
    second to gating the first (same units, same resamples), e.g. induction heads vs others."""
    tally = results.tallies.get(GROUPS)
    groups = [g for g in (results.summary.get(GROUPS) or {}) if g != INTACT]
    rows = []
    for versus in groups:
        if tally is None or versus not in tally.labels:
            continue
        points = points_table(tally, groups, versus)
        for r in points.itertuples(index=False):
            if r.label != versus:
                rows.append(
                    {
                        "group": r.label,
                        "versus": versus,
                        "n": r.n,
                        "change": r.change,
                        "change_low": r.change_low,
                        "change_high": r.change_high,
                    }
                )
    return pd.DataFrame(rows, columns=VERSUS_COLUMNS)


def model_level_totals(tally, label: str) -> tuple[np.ndarray, np.ndarray]:
    """(mass, n), each [resample], summed over folds, of one label of a whole-model tally (one
    cell, layer `MODEL_LEVEL`: the group ablations, the retrieval check)."""
    a = tally.arrays(label)
    return a["hits"][..., 0, 0, 0].sum(0), a["n"][..., 0].sum(0)


def points_table(tally, labels: list[str], reference: str) -> pd.DataFrame:
    """Per label of a whole-model tally (`GroupScorer`), in `labels` order: the objective (mass / n)
    with its 95% interval, and its change from `reference`'s with a paired interval (same
    bootstrap weights: the same units)."""
    mass = {label: model_level_totals(tally, label)[0] for label in labels}  # [resample]
    n = model_level_totals(tally, labels[0])[1]  # [resample]
    rows = []
    for label in labels:
        value, low, high = estimate(mass[label], n)
        change, c_low, c_high = paired_gap(mass[label], mass[reference], n)
        rows.append(
            {
                "label": label,
                "n": float(n[0]),
                "value": float(value),
                "ci_low": float(low),
                "ci_high": float(high),
                "change": float(change),
                "change_low": float(c_low),
                "change_high": float(c_high),
            }
        )
    return pd.DataFrame(rows, columns=POINT_COLUMNS)


def objective_table(results, analysis: str):
    """`stats.heads.head_table` (score = sum / n per head, folds, 95% interval) with the
    objective named in full; heads not scored (NaN: not ablated) left out."""
    table = head_table(results, analysis).drop(
        columns=[
            "baseline_variant",
            "baseline_score",
            "gap",
            "gap_low",
            "gap_high",
            "queries",
            "mul_all_rows",
        ]
    )
    table.insert(1, "objective", table["label"].map(DESCRIPTIONS))
    return table[table["score"].notna()].reset_index(drop=True)


RANK_COLUMNS = ["layer", "head", "by", "score", "rank", "of", "objective"]


def head_ranks(results) -> pd.DataFrame:
    """Every head ranked by importance (where the run has it) else by its ablation effect: rank 1
    is the most important (ties share the best rank), `of` the heads ranked, `by` the score."""
    by = "importance" if "importance" in results.tallies else "ablation"
    table = objective_table(results, by)
    if not len(table):
        return pd.DataFrame(columns=RANK_COLUMNS)
    rank = table["score"].rank(method="min", ascending=False).astype(int)
    return pd.DataFrame(
        {
            "layer": table["layer"],
            "head": table["head"],
            "by": by,
            "score": table["score"],
            "rank": rank,
            "of": len(table),
            "objective": table["objective"],
        }
    )[RANK_COLUMNS]


PRUNE_COLUMNS = [
    "percent",
    "fraction",
    "heads_removed",
    "heads_total",
    "removed",
    "objective",
    "n",
    "value",
    "ci_low",
    "ci_high",
    "change",
    "change_low",
    "change_high",
    "order_by",
]


def prune_table(results) -> pd.DataFrame:
    """One row per point of the curve: the objective with that share of heads removed (value, 95%
    interval) and its paired change from 0% (`points_table`); `removed`: the heads removed at this
    point beyond the previous one, from the order the run used (`summary["prune_curve"]`)."""
    tally = results.tallies.get("prune_curve")
    if tally is None or not tally.labels:
        return pd.DataFrame(columns=PRUNE_COLUMNS)
    info = results.summary.get("prune_curve", {})
    order, points = info.get("order", []), info.get("points", {})
    labels = sorted(tally.sorted_labels(), key=lambda label: int(label.rstrip("%")))
    table = points_table(tally, labels, labels[0]).rename(columns={"label": "percent"})
    table["fraction"] = [int(label.rstrip("%")) / 100 for label in labels]
    removed = [points.get(label) for label in labels]
    table["heads_removed"] = [np.nan if k is None else k for k in removed]
    before = [0] + [k or 0 for k in removed[:-1]]
    table["removed"] = [
        " ".join(order[b:k]) if k is not None else "" for b, k in zip(before, removed)
    ]
    table["heads_total"] = len(order) or np.nan
    table["objective"] = (results.summary.get("objectives") or {}).get("prune_curve", "")
    table["order_by"] = info.get("order_by", "")
    return table[PRUNE_COLUMNS]


def ablation_console(results, analysis: str, top: int = 5) -> str:
    """The heads whose ablation changes the objective most (at most `top`), with intervals."""
    table = results.tables.get(f"{analysis}_heads")
    if table is None or not len(table):
        return ""
    table = table.sort_values("score", ascending=False, kind="stable").head(top)
    lines = [f"\n{analysis}: largest effects ({table['objective'].iloc[0]}; 95% intervals):"]
    for r in table.itertuples(index=False):
        lines.append(f"  {r.layer}-{r.head}  {r.score:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]")
    return "\n".join(lines)


def groups_console(results, analysis: str) -> str:
    """Each group's objective and its paired change from intact, then group against group."""
    table = results.tables.get(analysis)
    if table is None or not len(table):
        return ""
    lines = [f"\n{analysis} ({table['objective'].iloc[0]}; paired 95% intervals):"]
    for r in table.itertuples(index=False):
        heads, change = "", ""
        if r.n_heads:  # a group, not the intact model
            heads = f" ({r.heads})"
            change = f", change {r.change:+.3f} [{r.change_low:+.3f}, {r.change_high:+.3f}]"
        lines.append(f"  {r.group}{heads}: {r.value:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]{change}")
    versus = results.tables.get(f"{analysis}_versus")
    pairs = set()
    for r in versus.itertuples(index=False) if versus is not None else []:
        if frozenset((r.group, r.versus)) in pairs:
            continue  # one direction of each pair
        pairs.add(frozenset((r.group, r.versus)))
        lines.append(
            f"  {r.group} - {r.versus}: {r.change:+.3f} [{r.change_low:+.3f}, {r.change_high:+.3f}]"
        )
    return "\n".join(lines)


# their own module beside this one: headprobe.model.head_effects computes the rows they count (ablation_rows,
# importance_rows, gated_rows), and its head_importance names its column and progress bar `importance`
# (a public table users and tests read), so it spells their names as its own
HOMES = ("headprobe.model.head_effects",)

ABLATION = register(
    Analysis(
        name="ablation",
        order=110,
        scorer=AblationScorer,
        input=ANY,
        cross=True,
        selection=False,
        default=False,
        options=("heads",),
        homes=HOMES,
        description="per head: objective(head zeroed) - objective(intact) per piece (METHODS §8): the LM loss where "
        "the model has a language-model head, else the last hidden state's 1 - cos",
        tables={
            "ablation_heads": lambda results: objective_table(results, "ablation"),
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
        homes=HOMES,
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
        options=("head_groups",),
        homes=HOMES,
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
        homes=HOMES,
        description="the objective as 0%, 10%, ... 100% of the heads are gated to 0, cumulatively, least important "
        "first (Michel et al. 2019): ordered by importance, else by single-head ablation effect",
        tables={"prune_curve": prune_table},
        report="headprobe.studies.ablation.report:prune_section",
    )
)
