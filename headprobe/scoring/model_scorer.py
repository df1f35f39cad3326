"""The scorer kind that runs the model itself instead of reading its attention.

    class AblationScorer(ModelScorer):
        analysis = "ablation"
        def compute(self, model, batch): ...   # -> ([row, layer, head] values, [row] pieces)

Head ablation, importance, the pruning curve and logit attribution are of this kind: the
engine calls `use_model` once and `model_pass` per batch, before the attention pass.
"""

from __future__ import annotations

import torch

from headprobe.model.objectives import Objective
from headprobe.scoring.base import CountScorer


class ModelScorer(CountScorer):
    """A scorer that runs the model itself (`model_pass`) and ignores the attention."""

    value = "mass"
    blocks = True  # takes no attention, so never stops query blocks
    needs_lm_head = True
    scored = None  # `objectives.Objective`'s restriction to some pieces (None: all)

    def use_model(self, model, tokenizer, stack: str | None = None) -> None:
        """Called by the engine before the run: the objective, from the model as loaded, gating
        the heads of attention stack `stack` (None: the model's default)."""
        self.objective = Objective.for_model(
            model,
            tokenizer,
            seed=self.tally_.seed if self.tally_ else 0,
            scored=self.scored,
            stack=stack,
        )

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
        values, _ = self._pass  # [row, layer, head]
        self._values[:, 0] = (
            values[:, self.layers].permute(1, 0, 2).to(self._values)
        )  # [layer, row, head]

    def update(self, layer, att, batch) -> None:
        """Attention is not needed."""

    def end_batch(self, batch):
        super().end_batch(batch)
        self._pass = None
