"""The scorer kind that reads only a model's weights: computed once, no corpus, no pass.

    class OVCopyingScorer(WeightsScorer):
        analysis = "ov_copying"
        def compute(self, model, tokenizer, layers, stack, seed) -> dict: ...   # the record

    scorer.use_model(model, tokenizer, layers=[0, 1], stack=None, seed=0)
    summary.update(scorer.describe())        # {analysis: record}: its tables are made from it

An analysis of this kind declares `input=WEIGHTS` (`scoring.registry`): `headprobe.run` computes
it once the model is loaded, before and apart from the engine's passes (it needs no corpus, and
a run of such analyses alone reads none); it keeps no tally, and its numbers live in the run's
summary under its name, from which its declared tables are made.
"""

from __future__ import annotations

from headprobe.core.seeds import SEED
from headprobe.model.control import TRAINED
from headprobe.scoring.measures import WEIGHTS


class WeightsScorer:
    """Base of a weights-only analysis's scorer: configuration in attributes, the one result in
    `record_` (None until `use_model`)."""

    analysis = ""
    reads_attention = False  # no attention, no model pass
    needs_lm_head = False  # set True to get the model under its language-model head
    second_pass = False
    model = TRAINED
    measures: tuple[str, ...] = (WEIGHTS,)
    directions: tuple[str, ...] = ("",)
    variants: tuple[str, ...] = ()

    def __init__(self):
        self.record_: dict | None = None
        self.tallies_: dict = {}  # none: the numbers are in the record

    def tally_keys(self) -> list[str]:
        return []

    def use_model(self, model, tokenizer, *, layers=None, stack=None, seed: int = SEED) -> None:
        """Compute the analysis from the weights of `model` (its `layers` of attention stack
        `stack`; None: all, the default stack)."""
        self.record_ = self.compute(model, tokenizer, layers, stack, seed)

    def compute(self, model, tokenizer, layers, stack, seed: int) -> dict:
        raise NotImplementedError

    def describe(self) -> dict:
        """What the run's summary keeps: {analysis: record}."""
        return {} if self.record_ is None else {self.analysis: self.record_}

    def unit_counts(self):
        return None
