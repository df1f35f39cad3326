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
    """The scorer contract in full: `prepare` returns the batch's state (rows, trials, baselines,
    and in `own` what `update` needs of the batch); `update` adds one layer's hits of every
    measure into it; the base's `end_batch` commits them. Nothing of a batch is kept on `self`."""

    analysis = "self_attention"
    variants = ("next",)

    def prepare(self, batch):
        rows = RowIndex()
        row_of = [
            rows.count(example.unit, "self", len(example.words)) for example in batch.examples
        ]
        q_b, q_i = batch.word_mask.nonzero(as_tuple=True)  # [query] batch row, word
        own = (q_b, q_i, torch.tensor(row_of, device=batch.device)[q_b])  # + each query's row
        return self.new_state(batch, rows.keys, rows.n, own)  # "next" never hits: 0 baselines

    def update(self, layer, att, state):
        q_b, q_i, rows = state.own
        scores = masked_word_attention(att, state.batch, drop_self=False)  # [m, b, h, w, w]
        top = scores.max(dim=-1).indices.permute(0, 1, 3, 2)[:, q_b, q_i]  # [m, query, head]
        hits = (top == q_i[None, :, None]).float()  # [measure, query, head]
        self.add(state, layer, 0, rows, hits)
        self.add_both(state, layer, 0, rows, hits, torch.zeros(len(q_b), 1, device=hits.device))


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
