"""Dependency arcs (SPEC section 2): per head, per relation, both directions.

For a dependent i with head h, on word-level attention A with self-attention
set to 0 and specials dropped:
- dep->head hit:  argmax_j A[i, j] == h
- head<-dep hit:  argmax_j A[j, i] == h
Ties go to the lowest index (torch.argmax returns the first maximum).
`root` and `punct` arcs are not scored per relation; `ALL` is every other arc.
Baseline rows: each fixed offset k in -5..5 (k != 0) predicting h = i + k.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from headprobe.scorers.base import CountScorer, RowIndex, masked_word_attention

UNSCORED = ("root", "punct")
OFFSETS = [k for k in range(-5, 6) if k != 0]
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

    def rows(self, batch):
        rows = RowIndex()
        arcs = []                                   # (batch row, dependent, head, row of rel, row of ALL)
        for b, example in enumerate(batch.examples):
            counts = defaultdict(int)
            offset_hits = defaultdict(lambda: [0] * len(OFFSETS))
            for i, h, rel in scored_arcs(example):
                for label in (rel, ALL):
                    counts[label] += 1
                    for slot, k in enumerate(OFFSETS):
                        offset_hits[label][slot] += int(h == i + k)
                arcs.append((b, i, h, rows.count(example.unit, rel), rows.count(example.unit, ALL)))
            for label, hits in offset_hits.items():
                for k, hit in zip(OFFSETS, hits):
                    self.add_baseline(example.unit, label, f"offset={k:+d}", counts[label], hit)
        self._arcs = arcs
        return rows.keys, rows.n

    def prepare(self, batch):
        arcs = torch.tensor(self._arcs, dtype=torch.long, device=batch.device).reshape(-1, 5)
        self._arc_b, self._arc_dep, self._arc_head = arcs[:, 0], arcs[:, 1], arcs[:, 2]   # [arc]
        self._arc_rows = torch.cat([arcs[:, 3], arcs[:, 4]])                               # [2 * arc]

    def update(self, layer, att, batch):
        if self._arc_b.numel() == 0:
            return
        scores = masked_word_attention(att, batch, drop_self=True)        # [batch, head, word, word]
        to_pred = scores.argmax(dim=-1)                                   # [batch, head, query]: attended word
        from_pred = scores.argmax(dim=-2)                                 # [batch, head, key]: attending word
        for direction, pred in enumerate((to_pred, from_pred)):
            chosen = pred.permute(0, 2, 1)[self._arc_b, self._arc_dep]    # [arc, head]
            hits = (chosen == self._arc_head[:, None]).float()            # [arc, head]
            self.add(layer, direction, self._arc_rows, torch.cat([hits, hits]))
