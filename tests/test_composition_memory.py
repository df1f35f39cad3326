"""The composition scorer keeps nothing per batch in memory: what it holds when the corpus ends
does not grow with the corpus.

A deterministic check in the style of `test_pass_memory` (no timing, no resident-memory
reading): a tiny random GPT-2 scores the repeated-random probe's N sequences, then the same N
sequences four times over (4N examples of the same N units, so the per-unit sums and the tally
have the same size). When the corpus ends, its tally flushed and before the check runs
(`finish`), what the scorer holds is measured: the bytes of every object reachable from it
(Python objects by `sys.getsizeof`, tensors and arrays by their data; the model, tokenizer and
objective left out), and the tensors among them. The batches the check reads again are kept on
disk (`analysis.SpilledBatches`), so the 4N pass holds no more than the N pass; kept in memory
(a list of `Batch`es) they made the scorer hold 8.3 kB more per batch (49,712 B more over the
6 more batches; tiny GPT-2, batches of 4). (The process's allocations as a whole, `tracemalloc`, also grow a little
here with the number of batches, in torch's and Python's own caches, outside the scorer.)
"""

from __future__ import annotations

import gc
import sys
import types

import numpy as np
import torch
from test_gates import with_lm_head

from headprobe.config import RunConfig
from headprobe.inputs.probes import make_probe
from headprobe.scoring import engine as engine_module
from headprobe.scoring.engine import Engine
from headprobe.scoring.tally import UnitDraws
from headprobe.studies.composition.analysis import CompositionScorer

N, LENGTH, BATCH = 8, 5, 4
SLACK = 1024  # bytes the 4N pass may hold beyond the N pass (larger counts, nothing per batch)
SHARED = ("model_", "tokenizer_", "objective")  # the scorer's references to what it is given


def reachable(root) -> tuple[int, int]:
    """(bytes, tensors) of every object reachable from `root`'s attributes but `SHARED`:
    modules, classes and functions are not entered."""
    seen, size, tensors = set(), 0, 0
    todo = [v for k, v in vars(root).items() if k not in SHARED]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(
            obj, (type, types.ModuleType, types.FunctionType, torch.nn.Module)
        ):
            continue
        seen.add(id(obj))
        if torch.is_tensor(obj):
            size, tensors = size + obj.nelement() * obj.element_size(), tensors + 1
            continue
        size += obj.nbytes if isinstance(obj, np.ndarray) else sys.getsizeof(obj)
        todo.extend(gc.get_referents(obj))
    return size, tensors


class Held(CompositionScorer):
    """The scorer, measuring what it holds when the corpus ends (its tally flushed) instead of
    running the check."""

    def finish(self) -> None:
        super(CompositionScorer, self).finish()  # the tally flushed, as before the check
        self.held = reachable(self)


def held_at_the_end(family, model, copies: int) -> tuple[int, int]:
    """(bytes the scorer holds when the corpus ends, tensors among them)."""
    examples = list(
        make_probe("repeated-random", family.tokenizer, length=LENGTH, n=N, seed=0, vocab_size=None)
    )
    scorer = Held()
    scorer.use_options({})
    engine = Engine(
        model, family.tokenizer, [scorer], RunConfig(batch_size=BATCH, progress=False, n_boot=20)
    )
    engine.run(examples * copies)
    return scorer.held


def test_the_composition_scorer_keeps_nothing_per_batch(monkeypatch):
    # the engine's own caches, as in `test_pass_memory`: each unit's resample weights for the
    # most recent `UnitDraws.SIZE` units, and the corpus read a chunk at a time
    monkeypatch.setattr(UnitDraws, "SIZE", 4)
    monkeypatch.setattr(UnitDraws, "_shared", {})
    monkeypatch.setattr(engine_module, "CHUNK", BATCH)
    family, model = with_lm_head("gpt2")
    small = held_at_the_end(family, model, 1)
    large = held_at_the_end(family, model, 4)
    batches = 3 * N // BATCH  # the 4N pass's extra batches
    grown = large[0] - small[0]
    assert grown <= SLACK, (
        f"the scorer held {small[0]:,} B after {N} sequences and {large[0]:,} B after {4 * N}: "
        f"{grown / batches:,.0f} B more per batch"
    )
    assert large[1] <= small[1], f"tensors held: {small[1]} after {N}, {large[1]} after {4 * N}"
