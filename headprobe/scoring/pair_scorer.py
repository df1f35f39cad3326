"""A scorer whose counts are keyed by a pair of heads: (receiver head, sender head, channel).

    class MyPairs(PairScorer):                       # head_similarity's scorer is one
        def update(self, att, state):
            pairs = pair_values(self, state)         # [measure, layer, channel, row, head, s_layer, s_head]
            ...

The scorer contract is `CountScorer`'s (`prepare` -> state, `update`, `end_batch`); only the head
axis differs: each receiver head (layer, head) holds every sender head of the scored layers,
(sender layer, sender head) flat after it, and the scorer's directions are the pair's channels.
Its tallies are pair tallies (`Tally.senders`, `headprobe.scoring.pair_tally`), so they stream,
checkpoint, merge across shards and give tables with intervals and Holm through
`headprobe.stats.pair_estimates.pair_table`. Per-unit rows (`keep_units`) are not kept for pairs:
the tallies are their record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headprobe.scoring.scorer_base import BatchState, CountScorer

if TYPE_CHECKING:
    import torch


class PairScorer(CountScorer):
    """`CountScorer` with one cell per (receiver head, sender layer, sender head): the senders
    are the scored layers (`self.layers`), every head of each."""

    pairs = True

    def bind(self, n_layers: int, n_heads: int, layers=None, **options) -> None:
        """As `CountScorer.bind`, with pair tallies; per-unit rows are never kept."""
        super().bind(n_layers, n_heads, layers, **{**options, "keep_units": False})


def pair_values(scorer: PairScorer, state: BatchState) -> torch.Tensor:
    """The batch's counts as a view [measure, layer, channel, row, head, sender layer, sender
    head] (writing to it writes the state)."""
    measures, layers, channels, rows, _ = state.values.shape
    heads = scorer.n_heads
    return state.values.view(measures, layers, channels, rows, heads, len(scorer.layers), heads)
