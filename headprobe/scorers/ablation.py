"""Does a head matter? Ablation effects and importance as streamed analyses (SPEC 8).

    headprobe.run("smollm2", treebank=..., analyses=["ablation", "importance"])
    results.ablation_heads          # per head: mean delta per piece, folds, 95% interval
    results.importance_heads        # per head: mean |dL/dg| per piece, folds, 95% interval

These analyses need the model, not its attention: the engine calls `model_pass(model,
batch)` before the batch's attention pass (`engine.Engine`), outside inference mode,
and the run loads the model under its language-model head (`needs_lm_head`,
`models.load_lm`). Per example one row, (unit, objective kind), with n = the pieces the
objective is scored on (`headprobe.objectives`); the row's value per head is

- `ablation`: objective(head zeroed) - objective(intact), summed over the example
  (`ablation.ablation_rows`; several heads side by side in one forward pass, up to
  `ROWS_PER_PASS` rows: a batch of B examples costs about layers x heads x B / 64 passes);
- `importance`: |dL_x / dg_h| at g = 1 (Michel et al. 2019), one backward pass per batch
  (`ablation.importance_rows`); needs a language-model loss.

They add up per unit and fold like any mass, so the tables carry `sum / n` with the
streaming bootstrap's intervals. The label is the objective's kind; the tables name it
in full (`objective`). Zero ablation only here (mean ablation needs a pass over the
corpus first: `gates.head_means`, `ablation.ablation_rows(means=...)`).
"""

from __future__ import annotations

import torch

from headprobe.ablation import ablation_rows, importance_rows
from headprobe.objectives import DESCRIPTIONS, Objective
from headprobe.registry import Analysis, register
from headprobe.scorers.base import CountScorer
from headprobe.scorers.token_patterns import head_table

ROWS_PER_PASS = 64      # ablation: heads side by side in one forward pass, up to this many rows


class ModelScorer(CountScorer):
    """A scorer that runs the model itself (`model_pass`) and ignores the attention."""

    value = "mass"
    blocks = True                       # takes no attention, so never stops query blocks
    needs_lm_head = True

    def use_model(self, model, tokenizer) -> None:
        """Called by the engine before the run: the objective, from the model as loaded."""
        self.objective = Objective.for_model(model, tokenizer, seed=self.tally_.seed if self.tally_ else 0)

    def model_pass(self, model, batch) -> None:
        """Per example [row, layer, head] values and [row] pieces, kept for this batch's rows."""
        values, tokens = self.compute(model, batch)
        self._pass = (values, tokens)

    def compute(self, model, batch) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def rows(self, batch):
        _, tokens = self._pass
        return [(example.unit, self.objective.kind) for example in batch.examples], tokens.tolist()

    def prepare(self, batch):
        values, _ = self._pass                                       # [row, layer, head]
        self._values[:, 0] = values[:, self.layers].permute(1, 0, 2).to(self._values)   # [layer, row, head]

    def update(self, layer, att, batch) -> None:
        """Attention is not needed."""

    def end_batch(self, batch):
        super().end_batch(batch)
        self._pass = None


class AblationScorer(ModelScorer):
    analysis = "ablation"

    def compute(self, model, batch):
        n_heads = self.n_heads
        heads = [(layer, head) for layer in self.layers for head in range(n_heads)]
        delta, tokens = ablation_rows(model, batch, self.objective, heads,
                                      copies=max(1, ROWS_PER_PASS // len(batch)))
        values = torch.zeros(len(batch), self.n_layers, n_heads, dtype=delta.dtype, device=delta.device)
        values[:, self.layers] = delta.view(len(batch), len(self.layers), n_heads)   # [row, layer, head]
        return values, tokens


class ImportanceScorer(ModelScorer):
    analysis = "importance"

    def use_model(self, model, tokenizer) -> None:
        super().use_model(model, tokenizer)
        if self.objective.kind == "representation":
            raise ValueError("the importance analysis needs a language-model loss, and the model has no "
                             "trained language-model head (its representation change has zero gradient at g = 1)")

    def compute(self, model, batch):
        return importance_rows(model, batch, self.objective)          # [row, layer, head], [row]


def objective_table(results, analysis: str):
    """`token_patterns.head_table` (score = sum / n per head, folds, 95% interval) with the
    objective named in full."""
    table = head_table(results, analysis).drop(columns=["baseline_variant", "baseline_score", "gap", "gap_low",
                                                        "gap_high", "queries", "tl_mul"])
    table.insert(1, "objective", table["label"].map(DESCRIPTIONS))
    return table


ABLATION = register(Analysis(
    name="ablation", scorer=AblationScorer, input="sentences", selection=False, default=False,
    description="per head: objective(head zeroed) - objective(intact) per piece (SPEC 8): the LM loss where "
                "the model has a language-model head, else the last hidden state's 1 - cos",
    tables={"ablation_heads": lambda results: objective_table(results, "ablation")}))

IMPORTANCE = register(Analysis(
    name="importance", scorer=ImportanceScorer, input="sentences", selection=False, default=False,
    description="per head: |dL/dg| at g = 1 per piece, a gate per example and head, one backward pass "
                "(Michel et al. 2019; SPEC 8); needs a language-model head",
    tables={"importance_heads": lambda results: objective_table(results, "importance")}))
