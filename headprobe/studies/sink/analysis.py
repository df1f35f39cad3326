"""Attention sinks at the first position (Xiao et al. 2023; Gu et al. 2024), per token.

Per head, on every input (sentence, probe sequence):

- label `first`: attention mass to position 0 (the BOS / CLS where the tokenizer puts
  one first, else the first token), summed over the queries after the first (every
  position 1..T-1, specials included) and averaged over them: score = mass / n with
  n = T - 1 per input. Same idea as the word-level `surface` label `first`, but on
  tokens and over every position;
- label `sink_rate`: the share of inputs whose mean attention to position 0 (over the
  queries after the first) is at least `EPSILON` = 0.3, Gu et al.'s threshold (their
  alpha also counts the first token's own row, which in a causal model is 1, and uses
  ">"; here the first row is left out, as it cannot attend anywhere else, and ">=" is used).

An input of one token has no query after the first and is not scored.

Baseline `uniform`, a head that attends uniformly to every key it can see (keys 0..i
in a causal model, all in an encoder): for `first`, a random visible key drawn per query
(seeded by the run's seed and the input, as the token patterns' `random`) is position 0,
whose expectation is uniform attention's mass on it; for `sink_rate`, whether uniform
attention's mean mass on position 0 is at least `EPSILON` (in a causal model it is, on
inputs of up to 5 tokens: short inputs make every head look like a sink). Inputs where
the head and the baseline are both sinks are counted, so `head_tests` has the exact McNemar
test for `sink_rate` (for `first`, a mass, it does not apply: NaN).

Role `sink (Gu)` (order 4.5, after the word-level `sink` role of `surface`, which also
counts SEP/EOS mass; the two names differ on purpose): sink rate >= 0.5 on each fold
(a sink on most inputs, found on one half and confirmed on the other), 95% lower end
>= 0.4, the paired interval of its gap to the uniform baseline above 0, at least 30 inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from headprobe.core.seeds import example_key
from headprobe.extend import (
    PROBE,
    Analysis,
    BatchState,
    BothIndex,
    CountScorer,
    RowIndex,
    head_table,
    register,
)
from headprobe.extend.pattern_rules import pattern_rule
from headprobe.extend.patterns import CONSOLE
from headprobe.scoring.measures import MASS
from headprobe.stats.head_selection import MIN_N
from headprobe.stats.heads import group_table

if TYPE_CHECKING:
    import torch

NAME = "sink"
EPSILON = 0.3
FIRST, RATE = "first", "sink_rate"
THRESHOLD, LOWER = 0.5, 0.4


class SinkScorer(CountScorer):
    analysis = NAME
    value = "mass"
    reads = MASS  # norms: row-normalised N (METHODS §7)
    variants = ("uniform",)

    def prepare(self, batch) -> BatchState:

        from headprobe.inputs.batching import on_device

        rows = RowIndex()
        scored, first_rows, rate_rows, lengths, base = [], [], [], [], []
        for b, (example, alignment) in enumerate(zip(batch.examples, batch.alignments)):
            t = len(alignment)
            if t < 2:
                continue
            scored.append(b)
            first_rows.append(rows.count(example.unit, FIRST, t - 1))
            rate_rows.append(rows.count(example.unit, RATE, 1))
            lengths.append(t)
            visible = np.arange(2, t + 1) if self.causal else np.full(t - 1, t)  # queries 1..T-1
            drawn = np.random.Generator(np.random.PCG64(example_key(self.seed, example))).integers(
                0, visible
            )
            base.append((int(np.sum(drawn == 0)), float(np.mean(1.0 / visible) >= EPSILON)))
        state = self.new_state(batch, rows.keys, rows.n)
        for first_row, rate_row, (first_hits, rate_hit) in zip(first_rows, rate_rows, base):
            state.baseline_hits[first_row, 0] = first_hits
            state.baseline_hits[rate_row, 0] = rate_hit
        put = lambda a: on_device(np.asarray(a), batch.device)
        b = put(np.array(scored, dtype=np.int64))
        state.own = Sinks(
            b=b,
            first_row=put(np.array(first_rows, dtype=np.int64)),
            rate_row=put(np.array(rate_rows, dtype=np.int64)),
            after_first=batch.attention_mask[:, 1:].float()[b][
                :, None, :
            ],  # [scored, 1, query - 1]
            queries=put(np.array(lengths, dtype=np.float64) - 1)[:, None],  # [scored, 1]
            rate_base=put(np.array([r for _, r in base], dtype=np.float32).reshape(-1, 1)),
            both=self.both_index(
                state,
                np.array(rate_rows, dtype=np.int64),
                np.array([r for _, r in base], dtype=np.float32).reshape(-1, 1),
            ),
            n=len(scored),
        )
        return state

    def update(self, att, state) -> None:
        own = state.own
        if own.n == 0:
            return
        # [layer, measure, scored, head, query - 1]
        to_first = att.pieces[..., 1:, 0].index_select(2, own.b)
        mass = (to_first.double() * own.after_first).sum(-1)  # [layer, measure, scored, head]
        self.add(state, att, 0, own.first_row, mass)
        sink = (mass / own.queries >= EPSILON).float()  # [layer, measure, scored, head]
        self.add(state, att, 0, own.rate_row, sink)
        self.add_both(state, att, 0, own.both, sink)  # McNemar vs uniform


@dataclass
class Sinks:
    """A batch's scored inputs (two pieces or more) on the device (`SinkScorer.prepare`)."""

    b: torch.Tensor  # [scored] batch row
    first_row: torch.Tensor  # [scored] its `first` row
    rate_row: torch.Tensor  # [scored] its `sink_rate` row
    after_first: torch.Tensor  # [scored, 1, query - 1] the real queries after position 0
    queries: torch.Tensor  # [scored, 1] how many
    rate_base: torch.Tensor  # [scored, 1] the uniform baseline's sink hit
    both: BothIndex  # the scored inputs where the uniform baseline is a sink (`add_both`)
    n: int  # scored inputs


ROLE = pattern_rule(
    "sink (Gu)",
    NAME,
    4.5,
    "#4d4d4d",
    "sink@0",
    THRESHOLD,
    LOWER,
    f"mean attention to position 0 is at least {EPSILON:g} on most inputs (Gu et al. 2024 sink rate)",
    label=RATE,
    min_n=MIN_N,
)

ANALYSIS = register(
    Analysis(
        name=NAME,
        order=80,
        scorer=SinkScorer,
        input=PROBE,
        selection=True,
        default=False,
        description=f"attention to position 0 per head, at piece level (Xiao et al. 2023), and the share of inputs where "
        f"its mean over the queries after the first is at least {EPSILON:g} (Gu et al. 2024 sink rate)",
        roles=(ROLE,),
        tables={
            f"{NAME}_heads": lambda results: head_table(results, NAME),
            f"{NAME}_kv_groups": lambda results: group_table(results, NAME),
        },
        console=CONSOLE,
        homes=("headprobe.extend.patterns", "headprobe.extend.pattern_rules"),
    )
)
