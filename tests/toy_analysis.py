"""A toy analysis in one module, as a user would write one (tests/test_registry.py).

`self_attention`: per head, how often a word's argmax over the words of its sentence
(self included, specials dropped) is the word itself. One label, `self`, one direction,
one baseline (`next`: the argmax is the next word, which never is the word itself, so its
accuracy is 0), a role rule and no report section of its own (the generic one).
"""

from __future__ import annotations

import torch

from headprobe.scoring.base import CountScorer, RowIndex, masked_word_attention
from headprobe.scoring.registry import Analysis, RoleRule, register

SHARE = 0.5


class SelfScorer(CountScorer):
    analysis = "self_attention"
    variants = ("next",)

    def rows(self, batch):
        rows = RowIndex()
        self._row = [
            rows.count(example.unit, "self", len(example.words)) for example in batch.examples
        ]
        return rows.keys, rows.n

    def prepare(self, batch):
        self._q_b, self._q_i = batch.word_mask.nonzero(as_tuple=True)  # [query]
        self._rows = torch.tensor(self._row, device=batch.device)[self._q_b]  # [query]

    def update(self, layer, att, batch):
        scores = masked_word_attention(att, batch, drop_self=False)  # [batch, head, word, word]
        top = scores.max(dim=-1).indices.permute(0, 2, 1)[self._q_b, self._q_i]  # [query, head]
        hits = (top == self._q_i[:, None]).float()  # [query, head]
        self.add(layer, 0, self._rows, hits)
        self.add_both(layer, 0, self._rows, hits, torch.zeros(len(hits), 1, device=hits.device))


def selfish(results):
    import pandas as pd

    scores = results.head_scores("self_attention", "self")
    hit = scores[scores["accuracy"] >= SHARE]
    return pd.DataFrame(
        {
            "layer": hit["layer"],
            "head": hit["head"],
            "detail": "attends to itself",
            "short": "self",
            "evidence": [f"self argmax share {a:.4f}" for a in hit["accuracy"]],
        }
    )


ANALYSIS = register(
    Analysis(
        name="self_attention",
        scorer=SelfScorer,
        input="sentences",
        selection=True,
        description="how often a word attends most to itself (a toy analysis)",
        roles=(
            RoleRule(
                "selfish",
                1.5,
                "#9467bd",
                f"selfish: a word's argmax is itself in at least {SHARE:g} of its rows.",
                selfish,
            ),
        ),
        default=False,
    )
)
