"""Per-head ablation effects and importance (METHODS §8; `analysis.py` registers them): the
scorers (`AblationScorer`, `ImportanceScorer`, and `WithKinds`, the kinds of ablation and
estimates every model scorer here counts) and the tables of one head at a time
(`objective_table`, `kinds_table`, `head_ranks`, the console lines).

    label = row_label("causal_lm", "mean", "atp")     # "causal_lm:mean:atp"
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.extend import UsageError, head_table
from headprobe.model.objectives import DESCRIPTIONS
from headprobe.scoring.model_scorer import ModelScorer
from headprobe.stats.estimates import paired_gap

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


def kind_used(results, analysis: str) -> str:
    """The kind of ablation a whole-model analysis gated by (the first of `--ablation`)."""
    return next(iter(results.summary.get(f"{analysis}_ablation") or {"zero": ""}))


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
