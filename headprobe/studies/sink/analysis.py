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

import numpy as np
import torch

from headprobe.core.seeds import example_key
from headprobe.scoring.base import CountScorer, RowIndex
from headprobe.scoring.measures import MASS
from headprobe.scoring.registry import PROBE, Analysis, register
from headprobe.stats.engine import MIN_N
from headprobe.stats.heads import group_table, head_table
from headprobe.studies.token_patterns.patterns import CONSOLE, pattern_rule

NAME = "sink"
EPSILON = 0.3
FIRST, RATE = "first", "sink_rate"
THRESHOLD, LOWER = 0.5, 0.4


class SinkScorer(CountScorer):
    analysis = NAME
    value = "mass"
    reads = MASS  # norms: row-normalised N (METHODS §7)
    variants = ("uniform",)

    def rows(self, batch):
        rows = RowIndex()
        scored, first_rows, rate_rows, lengths, base = [], [], [], [], []
        seed = self.tally_.seed if self.tally_ is not None else 0
        for b, (example, alignment) in enumerate(zip(batch.examples, batch.alignments)):
            t = len(alignment)
            if t < 2:
                continue
            scored.append(b)
            first_rows.append(rows.count(example.unit, FIRST, t - 1))
            rate_rows.append(rows.count(example.unit, RATE, 1))
            lengths.append(t)
            visible = np.arange(2, t + 1) if batch.causal else np.full(t - 1, t)  # queries 1..T-1
            drawn = np.random.Generator(np.random.PCG64(example_key(seed, example))).integers(
                0, visible
            )
            base.append((int(np.sum(drawn == 0)), float(np.mean(1.0 / visible) >= EPSILON)))
        self._base = base
        self._scored = np.array(scored, dtype=np.int64)
        self._first_rows, self._rate_rows = (
            np.array(first_rows, dtype=np.int64),
            np.array(rate_rows, dtype=np.int64),
        )
        self._lengths = np.array(lengths, dtype=np.float64)
        return rows.keys, rows.n

    def prepare(self, batch):
        for first_row, rate_row, (first_hits, rate_hit) in zip(
            self._first_rows, self._rate_rows, self._base
        ):
            self.baseline_hits[first_row, 0] = first_hits
            self.baseline_hits[rate_row, 0] = rate_hit
        put = lambda a: torch.from_numpy(a).to(batch.device)
        self._b, self._first_row, self._rate_row = (
            put(self._scored),
            put(self._first_rows),
            put(self._rate_rows),
        )
        self._after_first = batch.attention_mask[:, 1:].float()[self._b][
            :, None, :
        ]  # [scored, 1, query - 1]
        self._queries = put(self._lengths - 1)[:, None]  # [scored, 1]
        self._rate_base = put(
            np.array([[r] for _, r in self._base], dtype=np.float32).reshape(-1, 1)
        )  # [scored, 1]

    def update(self, layer, att, batch):
        if self._b.numel() == 0:
            return
        to_first = att.pieces[self._b, :, 1:, 0]  # [scored, head, query - 1]
        mass = (to_first.double() * self._after_first).sum(-1)  # [scored, head]
        self.add(layer, 0, self._first_row, mass)
        sink = (mass / self._queries >= EPSILON).float()  # [scored, head]
        self.add(layer, 0, self._rate_row, sink)
        self.add_both(layer, 0, self._rate_row, sink, self._rate_base)  # McNemar vs uniform

    def end_batch(self, batch):
        super().end_batch(batch)
        self._b = self._first_row = self._rate_row = self._after_first = self._queries = (
            self._base
        ) = None
        self._rate_base = None


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
        homes=("headprobe.studies.token_patterns.patterns",),
    )
)
