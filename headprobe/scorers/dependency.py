"""Dependency arcs (SPEC section 2): per head, per relation, both directions.

For a dependent i with head h, on word-level attention A with self-attention
set to 0 and specials dropped:
- dep->head hit:  argmax_j A[i, j] == h
- head<-dep hit:  argmax_j A[j, i] == h
Ties go to the lowest index (`first_argmax`).
`root` and `punct` arcs are not scored per relation; `ALL` is every other arc.
Baseline rows: each fixed offset k in -5..5 (k != 0) predicting h = i + k.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from headprobe.scorers.base import CountScorer, RowIndex, first_argmax, masked_word_attention, word_fill

UNSCORED = ("root", "punct")
OFFSETS = [k for k in range(-5, 6) if k != 0]        # sorted
ALL = "ALL"


def scored_arcs(example):
    """(dependent, head, relation) for every scored arc of an example."""
    if example.heads is None:
        return []
    return [(i, h, rel) for i, (h, rel) in enumerate(zip(example.heads, example.deprels))
            if h >= 0 and rel not in UNSCORED]


class DependencyScorer(CountScorer):
    analysis = "dependency"
    directions = ("dep->head", "head<-dep")
    variants = tuple(f"offset={k:+d}" for k in OFFSETS)

    def rows(self, batch):
        rows = RowIndex()
        arcs = []                                   # (batch row, dependent, head, row of rel, row of ALL)
        for b, example in enumerate(batch.examples):
            scored = scored_arcs(example)
            if not scored:
                continue
            all_row = rows.count(example.unit, ALL, len(scored))
            by_relation = defaultdict(list)
            for i, h, rel in scored:
                by_relation[rel].append((i, h))
            for rel, pairs in by_relation.items():
                row = rows.count(example.unit, rel, len(pairs))
                arcs.extend((b, i, h, row, all_row) for i, h in pairs)
        self._arcs = arcs
        return rows.keys, rows.n

    def prepare(self, batch):
        self._fill = word_fill(batch)
        table = np.array(self._arcs, dtype=np.int64).reshape(-1, 5)
        slot = np.searchsorted(OFFSETS, table[:, 2] - table[:, 1])         # fixed offsets: no attention needed
        hit = np.isin(table[:, 2] - table[:, 1], OFFSETS)
        for column in (3, 4):                                              # the arc's relation row, its ALL row
            np.add.at(self.baseline_hits, (table[hit, column], slot[hit]), 1.0)
        arcs = torch.from_numpy(table).to(batch.device)
        self._arc_b, self._arc_dep, self._arc_head = arcs[:, 0], arcs[:, 1], arcs[:, 2]   # [arc]
        self._arc_rows = torch.cat([arcs[:, 3], arcs[:, 4]])                               # [2 * arc]

    def update(self, layer, att, batch):
        if self._arc_b.numel() == 0:
            return
        scores = masked_word_attention(att, batch, prepared=self._fill)            # [batch, head, word, word]
        to_pred = first_argmax(scores, -1)                                   # [batch, head, query]: attended word
        from_pred = first_argmax(scores, -2)                                 # [batch, head, key]: attending word
        for direction, pred in enumerate((to_pred, from_pred)):
            chosen = pred.permute(0, 2, 1)[self._arc_b, self._arc_dep]    # [arc, head]
            hits = (chosen == self._arc_head[:, None]).float()            # [arc, head]
            self.add(layer, direction, self._arc_rows, torch.cat([hits, hits]))
