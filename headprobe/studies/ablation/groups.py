"""Groups of heads gated together (METHODS §8; `analysis.py` registers them): `GroupScorer`
(`group_ablation`, `--head-groups`) and `PruneScorer` (`prune_curve`, the objective as 0%,
10%, ... 100% of the heads are gated, least important first), and their tables: each group's
or point's objective with its interval and its paired change from a reference
(`points_table`, `groups_table`, `versus_table`, `prune_table`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.extend import UsageError
from headprobe.stats.estimates import estimate, paired_gap
from headprobe.stats.heads import tally_scores
from headprobe.studies.ablation.effects import MODEL_LEVEL, ROWS_PER_PASS, WithKinds, kind_used


class GroupScorer(WithKinds):
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
        super().use_options(options)
        if "head_groups" in options:
            self.use_groups(options["head_groups"] or {})

    def bind(self, n_layers, n_heads, layers=None, **options) -> None:
        super().bind(1, 1, [MODEL_LEVEL], **options)  # one cell: the whole model

    def describe(self) -> dict:
        """What the summary keeps: each group's heads, in order (the tables read it)."""
        groups = {g: [f"{l}-{h}" for l, h in heads] for g, heads in self.groups}
        return {**super().describe(), self.analysis: groups}

    def model_pass(self, model, batch):
        """Rows (unit, group) of every example and group: the objective with the group gated by
        the first kind of `--ablation` (resample: the examples with a partner only)."""
        from headprobe.model.head_effects import gated_rows

        sub, means, examples = self.kind_rows(model, batch, self.baselines.kinds[0])
        if not examples:
            return self.kinds_state(batch, [])
        targets = self.objective.targets(model, sub)
        values = gated_rows(
            model,
            targets,
            self.objective,
            [heads for _, heads in self.groups],
            means,
            copies=max(1, ROWS_PER_PASS // len(examples)),
        )  # [row, group]
        tokens = self.objective.pieces(targets).cpu().numpy()  # [row]
        keys = [(example.unit, label) for example in examples for label, _ in self.groups]
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

        exact = "ablation" in tallies and tally_scores(tallies["ablation"])["score"].notna().all()
        self.order_by = "ablation" if exact or "importance" not in tallies else "importance"
        self.order = prune_order(tally_scores(tallies[self.order_by]))
        self.use_groups(prune_steps(self.order))

    def describe(self) -> dict:
        """What the summary keeps of this pass (`prune_table` reads it)."""
        return {
            **WithKinds.describe(self),
            "prune_curve": {
                "order_by": self.order_by,
                "order": [f"{l}-{h}" for l, h in self.order],
                "points": {label: len(heads) for label, heads in self.groups},
            },
        }


INTACT = "intact"  # the group of no heads: the model as it is


GROUPS = "group_ablation"  # the analysis of named groups (`--head-groups`)


POINT_COLUMNS = ["label", "n", "value", "ci_low", "ci_high", "change", "change_low", "change_high"]


GROUP_COLUMNS = ["group", "heads", "n_heads", *POINT_COLUMNS[1:], "objective", "ablation"]


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
    table["ablation"] = kind_used(results, GROUPS)
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
    "ablation",
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
    table["ablation"] = kind_used(results, "prune_curve")
    return table[PRUNE_COLUMNS]


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
