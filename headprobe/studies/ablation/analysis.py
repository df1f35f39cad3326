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
from headprobe.stats.estimates import estimate, paired_gap
from headprobe.stats.heads import head_table, tally_scores
from headprobe.studies.ablation import flags

ROWS_PER_PASS = 64  # ablation: heads side by side in one forward pass, up to this many rows
MODEL_LEVEL = -1  # the layer of a whole-model cell (the pruning curve), never a head


def row_label(objective: str, ablation: str = "zero", estimate: str = "michel") -> str:
    """A tally label: the objective's kind, then the kind of ablation and the estimate where they
    are not the defaults (`causal_lm`, `causal_lm:mean`, `causal_lm:zero:atp`)."""
    if estimate != "michel":
        return f"{objective}:{ablation}:{estimate}"
    return objective if ablation == "zero" else f"{objective}:{ablation}"


def label_parts(label: str) -> tuple[str, str, str]:
    """(objective, ablation, estimate) of a `row_label`."""
    parts = str(label).split(":")
    return (
        parts[0],
        parts[1] if len(parts) > 1 else "zero",
        parts[2] if len(parts) > 2 else "michel",
    )


class WithKinds(ModelScorer):
    """A model scorer that ablates by the kinds of `--ablation` (`kinds.Baselines`): it reads
    the run's options and, where a kind needs them, the pass's inputs once before scoring."""

    kinds_option = ("zero",)

    def use_options(self, options: dict) -> None:
        self.kinds_option = tuple(options.get("ablation") or ("zero",))

    def use_model(self, model, tokenizer, stack: str | None = None) -> None:
        from headprobe.studies.ablation.kinds import Baselines

        super().use_model(model, tokenizer, stack)
        self.model_, self.tokenizer_ = model, tokenizer
        self.baselines = Baselines(self.kinds_option, self.tally_.seed if self.tally_ else 0)

    def use_inputs(self, examples) -> None:
        if self.baselines.needs_inputs:
            self.baselines.read(self.model_, self.tokenizer_, examples, self.objective.stack)
            if "resample" in self.baselines.kinds and not self.baselines.partners:
                raise UsageError(
                    "--ablation resample: no input has a partner of its length in pieces "
                    f"({len(self.baselines.unpaired)} inputs, each alone at its length)"
                )

    def describe(self) -> dict:
        """What the summary keeps: the kinds of ablation and what they replaced (per analysis)."""
        from headprobe.studies.ablation.kinds import Baselines

        baselines = getattr(self, "baselines", None) or Baselines(self.kinds_option)
        return {f"{self.analysis}_ablation": baselines.describe()}

    def kind_rows(self, model, batch, kind: str):
        """(the rows of `batch` that `kind` scores, as a batch; their baseline; their examples)."""
        from headprobe.studies.ablation.kinds import rows_of

        kept = self.baselines.kept(kind, batch)
        sub = rows_of(batch, kept)
        means = self.baselines.of(kind, model, sub, self.objective.stack) if kept else None
        return sub, means, [batch.examples[i] for i in kept]

    def kinds_state(self, batch, parts: list):
        """The state of rows `parts`: [(label, examples, [row, layer, head] values, [row] n)]."""
        import torch

        keys = [(e.unit, label) for label, examples, _, _ in parts for e in examples]
        if not keys:
            return self.state_of(batch, [], [], torch.zeros(0, len(self.layers), self.n_heads))
        values = torch.cat([v.float().cpu() for _, ex, v, _ in parts if len(ex)])
        n = [float(t) for _, ex, _, tokens in parts if len(ex) for t in tokens.tolist()]
        return self.state_of(batch, keys, n, values[:, self.layers])


class AblationScorer(WithKinds):
    analysis = "ablation"
    heads = None  # None: every head of the scored layers; else [(layer, head)]

    def use_heads(self, heads) -> None:
        """Ablate only `heads` ([(layer, head)]; None: all); the others hold NaN."""
        self.heads = None if heads is None else [(int(layer), int(head)) for layer, head in heads]

    def ablated(self) -> list[tuple[int, int]]:
        every = [(layer, head) for layer in self.layers for head in range(self.n_heads)]
        return every if self.heads is None else [x for x in every if x in set(self.heads)]

    def model_pass(self, model, batch):
        """One row per (example, kind of ablation): every ablated head's effect of that kind."""
        parts = []
        for kind in self.baselines.kinds:
            sub, means, examples = self.kind_rows(model, batch, kind)
            if examples:
                values, tokens = self.compute(model, sub, means)
                parts.append((row_label(self.objective.kind, kind), examples, values, tokens))
        return self.kinds_state(batch, parts)

    def compute(self, model, batch, means=None):
        import torch

        from headprobe.model.head_effects import ablation_rows

        heads = self.ablated()
        delta, tokens = ablation_rows(
            model,
            batch,
            self.objective,
            heads,
            means,
            copies=max(1, ROWS_PER_PASS // len(batch.examples)),
        )
        values = torch.full(
            (len(batch.examples), self.n_layers, self.n_heads),
            float("nan"),
            dtype=delta.dtype,
            device=delta.device,
        )  # [row, layer, head]
        layer, head = (torch.tensor(x, dtype=torch.long) for x in zip(*heads))
        values[:, layer, head] = delta  # [row, ablated]
        return values, tokens


class ImportanceScorer(WithKinds):
    analysis = "importance"
    estimates = ("michel",)

    def use_options(self, options: dict) -> None:
        super().use_options(options)
        self.estimates = tuple(options.get("estimate") or ("michel",))

    def use_inputs(self, examples) -> None:
        if set(self.estimates) - {"michel"}:  # michel reads no baseline
            super().use_inputs(examples)

    def use_model(self, model, tokenizer, stack: str | None = None) -> None:
        super().use_model(model, tokenizer, stack)
        if self.objective.kind == "representation":
            raise ValueError(
                "the importance analysis needs a language-model loss, and the model has no "
                "trained language-model head (its representation change has zero gradient at g = 1)"
            )

    def model_pass(self, model, batch):
        """One row per (example, estimate[, kind]): michel |dL/dg| (zero gate); atp -dL/dg with
        the kind's baseline; atp* the GradDrop estimate of the kind's effect."""
        from headprobe.model.head_effects import gate_gradients, graddrop_rows

        kind, parts = self.objective.kind, []
        zero = None
        if "michel" in self.estimates:
            zero = gate_gradients(model, batch, self.objective)
            parts.append((row_label(kind), batch.examples, zero[0].abs(), zero[1]))
        for ablation in self.baselines.kinds if set(self.estimates) - {"michel"} else ():
            sub, means, examples = self.kind_rows(model, batch, ablation)
            if not examples:
                continue
            if "atp" in self.estimates:
                grad, tokens = (
                    zero
                    if ablation == "zero" and zero is not None
                    else gate_gradients(model, sub, self.objective, means)
                )
                parts.append((row_label(kind, ablation, "atp"), examples, -grad, tokens))
            if "atp*" in self.estimates:
                values, tokens = graddrop_rows(model, sub, self.objective, means)
                parts.append((row_label(kind, ablation, "atp*"), examples, values, tokens))
        return self.kinds_state(batch, parts)


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


def kind_used(results, analysis: str) -> str:
    """The kind of ablation a whole-model analysis gated by (the first of `--ablation`)."""
    return next(iter(results.summary.get(f"{analysis}_ablation") or {"zero": ""}))


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
    parts = [label_parts(label) for label in table["label"]]
    table["label"] = [p[0] for p in parts]
    table.insert(1, "objective", table["label"].map(DESCRIPTIONS))
    table.insert(2, "ablation", [p[1] for p in parts])
    if analysis == "importance":
        table.insert(2, "estimate", [p[2] for p in parts])
    return table[table["score"].notna()].reset_index(drop=True)


def first_kind(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a per-head table's first (ablation, estimate): the one the ranks and the
    pruning order read (zero ablation, Michel's importance, where the run has them)."""
    if not len(table):
        return table
    keys = [c for c in ("ablation", "estimate") if c in table]
    first = table.iloc[0][keys]
    return table[(table[keys] == first).all(axis=1)].reset_index(drop=True)


RANK_COLUMNS = ["layer", "head", "by", "score", "rank", "of", "objective"]


def head_ranks(results) -> pd.DataFrame:
    """Every head ranked by importance (where the run has it) else by its ablation effect: rank 1
    is the most important (ties share the best rank), `of` the heads ranked, `by` the score."""
    by = "importance" if "importance" in results.tallies else "ablation"
    table = first_kind(objective_table(results, by))
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


def ablation_console(results, analysis: str, top: int = 5) -> str:
    """The heads whose ablation changes the objective most (at most `top`), with intervals."""
    table = results.tables.get(f"{analysis}_heads")
    if table is None or not len(table):
        return ""
    lines = []
    for kind, sub in table.groupby("ablation", sort=False):
        sub = sub.sort_values("score", ascending=False, kind="stable").head(top)
        lines.append(
            f"\n{analysis}: largest effects, {kind} ablation ({sub['objective'].iloc[0]}; 95% intervals):"
        )
        for r in sub.itertuples(index=False):
            lines.append(
                f"  {r.layer}-{r.head}  {r.score:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]"
            )
    return "\n".join(lines) + kinds_console(results)


KINDS_COLUMNS = ["ablation", "versus", "layer", "head", "n", "difference", "diff_low", "diff_high"]


def kinds_table(results, analysis: str = "ablation") -> pd.DataFrame:
    """Per head and each kind of ablation after the first: its effect minus the first kind's,
    with a paired 95% interval (the same units' bootstrap weights on both sides)."""
    tally = results.tallies.get(analysis)
    if tally is None:
        return pd.DataFrame(columns=KINDS_COLUMNS)
    labels = tally.sorted_labels()
    kinds = {label_parts(label)[1]: label for label in labels}
    order = [k for k in (results.summary.get("options") or {}).get("ablation", "").split(",") if k]
    order = [k for k in order if k in kinds] or sorted(kinds)
    if len(order) < 2:
        return pd.DataFrame(columns=KINDS_COLUMNS)
    first = tally.arrays(kinds[order[0]])
    rows = []
    for kind in order[1:]:
        other = tally.arrays(kinds[kind])
        gap, low, high = paired_gap(
            other["hits"][..., 0].sum(0),
            first["hits"][..., 0].sum(0),
            other["n"][..., 0].sum(0)[:, None, None],
            first["n"][..., 0].sum(0)[:, None, None],
        )  # [layer, head]
        for i, layer in enumerate(tally.layers):
            for head in range(gap.shape[1]):
                if np.isfinite(gap[i, head]):
                    rows.append(
                        {
                            "ablation": kind,
                            "versus": order[0],
                            "layer": int(layer),
                            "head": head,
                            "n": float(other["n"][..., 0].sum(0)[0]),
                            "difference": float(gap[i, head]),
                            "diff_low": float(low[i, head]),
                            "diff_high": float(high[i, head]),
                        }
                    )
    return pd.DataFrame(rows, columns=KINDS_COLUMNS)


def kinds_console(results, top: int = 5) -> str:
    """The heads whose effect changes most between two kinds of ablation."""
    table = results.tables.get("ablation_kinds")
    if table is None or not len(table):
        return ""
    lines = []
    for (kind, versus), sub in table.groupby(["ablation", "versus"], sort=False):
        sub = sub.reindex(sub["difference"].abs().sort_values(ascending=False).index).head(top)
        lines.append(f"\nablation: {kind} - {versus}, the heads that change most (paired 95%):")
        for r in sub.itertuples(index=False):
            lines.append(
                f"  {r.layer}-{r.head}  {r.difference:+.3f} [{r.diff_low:+.3f}, {r.diff_high:+.3f}]"
            )
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
        options=(flags.HEADS, flags.ABLATION),
        model_checks=(flags.heads_exist,),
        homes=HOMES,
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
        options=(flags.HEAD_GROUPS, "ablation"),
        model_checks=(flags.heads_exist,),
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
        options=(flags.PRUNE_CURVE, "ablation"),
        homes=HOMES,
        description="the objective as 0%, 10%, ... 100% of the heads are gated to 0, cumulatively, least important "
        "first (Michel et al. 2019): ordered by importance, else by single-head ablation effect",
        tables={"prune_curve": prune_table},
        report="headprobe.studies.ablation.report:prune_section",
    )
)
