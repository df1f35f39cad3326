"""A toy analysis in one module, as a user would write one (tests/test_registry.py).

`self_attention`: per head, how often a word's argmax over the words of its sentence
(self included, specials dropped) is the word itself. One label, `self`, one direction,
one baseline (`next`: the argmax is the next word, which never is the word itself, so its
accuracy is 0), a role rule and no report section of its own (the generic one).
"""

from __future__ import annotations

import numpy as np
import torch

from headprobe.scoring.registry import Analysis, RoleRule, register
from headprobe.scoring.scorer_base import CountScorer, RowIndex, masked_word_attention

SHARE = 0.5


class SelfScorer(CountScorer):
    """The scorer contract in full: `prepare` returns the batch's state (rows, trials, baselines,
    and in `own` what `update` needs of the batch, built on the host and copied once); `update`
    adds the hits of every layer it is handed and every measure into it, in one call, reading
    nothing back; the base's `end_batch` commits them. Nothing of a batch is kept on `self`."""

    analysis = "self_attention"
    variants = ("next",)

    def prepare(self, batch):
        rows = RowIndex()
        row_of = [
            rows.count(example.unit, "self", len(example.words)) for example in batch.examples
        ]
        q_b, q_i = batch.word_rows()  # [query] batch row, word (host)
        q_row = np.asarray(row_of, dtype=np.int64)[q_b]  # [query] each query's row
        state = self.new_state(batch, rows.keys, rows.n)
        put = lambda a: torch.from_numpy(a).to(batch.device)
        # "next" never hits: no (query, baseline) pair, 0 baselines
        both = self.both_index(state, q_row, np.zeros((len(q_b), 1), dtype=np.float32))
        state.own = (put(q_b), put(q_i), put(q_row), both)
        return state

    def update(self, att, state):
        q_b, q_i, rows, both = state.own
        scores = masked_word_attention(att, state.batch, drop_self=False)  # [l, m, b, h, w, w]
        top = scores.max(dim=-1).indices.transpose(-1, -2)[..., q_b, q_i, :]  # [l, m, query, h]
        hits = (top == q_i[:, None]).float()  # [layer, measure, query, head]
        self.add(state, att, 0, rows, hits)
        self.add_both(state, att, 0, both, hits)


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
