"""The scorer kind that runs the model itself instead of reading its attention.

    class AblationScorer(ModelScorer):
        analysis = "ablation"
        def compute(self, model, batch): ...   # -> ([row, layer, head] values, [row] pieces)

Head ablation, importance, the pruning curve and logit attribution are of this kind: the
engine calls `use_model` once and `model_pass` per batch, before the attention pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headprobe.scoring.scorer_base import BatchState, CountScorer

if TYPE_CHECKING:
    import torch


class ModelScorer(CountScorer):
    """A scorer that runs the model itself and ignores the attention: `model_pass(model, batch)`
    computes the batch's values and returns its state (the engine calls it in place of
    `prepare`); `update` is never called."""

    value = "mass"
    blocks = True  # takes no attention, so never stops query blocks
    reads_attention = False
    needs_lm_head = True
    scored = None  # `objectives.Objective`'s restriction to some pieces (None: all)

    def use_model(self, model, tokenizer, stack: str | None = None) -> None:
        """Called by the engine before the run: the objective, from the model as loaded, gating
        the heads of attention stack `stack` (None: the model's default)."""
        from headprobe.model.objectives import Objective

        self.objective = Objective.for_model(
            model,
            tokenizer,
            seed=self.tally_.seed if self.tally_ else 0,
            scored=self.scored,
            stack=stack,
        )

    def model_pass(self, model, batch) -> BatchState:
        """The batch's state: one row per example, its [layer, head] values and pieces scored."""
        values, tokens = self.compute(model, batch)  # [row, layer, head], [row]
        keys = [(example.unit, self.objective.kind) for example in batch.examples]
        return self.state_of(batch, keys, tokens.tolist(), values[:, self.layers])

    def state_of(self, batch, keys, n, values: torch.Tensor) -> BatchState:
        """A state whose rows `keys` (trials `n`) hold `values` [row, layer, head] (one measure,
        one direction)."""
        state = self.new_state(batch, keys, n)
        state.values[0, :, 0] = values.permute(1, 0, 2).to(state.values)  # [layer, row, head]
        return state

    def compute(self, model, batch) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def prepare(self, batch) -> BatchState:
        raise TypeError(f"{type(self).__name__} runs the model: the engine calls model_pass")

    def update(self, att, state) -> None:
        raise TypeError(f"{type(self).__name__} reads no attention")
