"""A toy pair-of-heads analysis in one module, as a user would write one (tests/test_pair_roles.py).

`argmax_agreement`: for a receiver head and a sender head (any scored layer), the share of a
sentence's words whose argmax over the sentence's words (self included, specials dropped) is the
same word for both heads. One label, `agree`, one channel. Its table is the pair table (intervals,
Holm), its role rule reads that table (`stats.roles.pairs_of`), and its report section shows its
significant pairs (`report.rendered_tables.pair_table_block`).
"""

from __future__ import annotations

import numpy as np
import torch

from headprobe.report.document import Paragraph, Section, slug
from headprobe.report.rendered_tables import pair_table_block
from headprobe.scoring.pair_scorer import PairScorer, pair_values
from headprobe.scoring.registry import Analysis, RoleRule, register
from headprobe.scoring.scorer_base import RowIndex, masked_word_attention
from headprobe.stats.pair_estimates import pair_table, receiver_matches, significant_pairs
from headprobe.stats.roles import pairs_of

NAME = "argmax_agreement"
SHARE = 0.25  # a receiver "follows" a sender (another head) it agrees with this often


class AgreementScorer(PairScorer):
    analysis = NAME
    directions = ("argmax",)

    def prepare(self, batch):
        rows = RowIndex()
        row_of = [rows.count(ex.unit, "agree", len(ex.words)) for ex in batch.examples]
        q_b, q_i = batch.word_rows()  # [query] batch row, word (host)
        q_row = np.asarray(row_of, dtype=np.int64)[q_b]  # [query] each query's row
        put = lambda a: torch.from_numpy(a).to(batch.device)
        return self.new_state(batch, rows.keys, rows.n, (put(q_b), put(q_i), put(q_row), []))

    def update(self, att, state):
        q_b, q_i, _, tops = state.own
        scores = masked_word_attention(att, state.batch, drop_self=False)  # [l, m, b, h, w, w]
        top = scores.max(dim=-1).indices.transpose(-1, -2)[..., q_b, q_i, :]  # [l, m, query, h]
        tops.append(top)

    def end_batch(self, state):
        _, _, q_row, tops = state.own
        if state.keys and tops:
            top = torch.cat(tops).transpose(0, 1)  # [measure, layer, query, head]
            same = (
                top[:, :, :, :, None, None] == top.permute(0, 2, 1, 3)[:, None, :, None, :, :]
            )  # [measure, layer, query, head, sender layer, sender head]
            pairs = pair_values(self, state)  # [measure, layer, channel, row, head, sl, sh]
            pairs[:, :, 0].index_add_(2, q_row, same.to(pairs.dtype))
        super().end_batch(state)


def agreement_table(results):
    return pair_table(results.tallies[NAME])


def follows(results):
    pairs = pairs_of(results, FOLLOWS)
    pairs = pairs[
        (pairs["layer"] != pairs["sender_layer"]) | (pairs["head"] != pairs["sender_head"])
    ]
    return receiver_matches(
        significant_pairs(pairs[pairs["ci_low"] >= SHARE]), "agrees with another head", "follows"
    )


def agreement_section(results, analysis):
    s = Section(slug(analysis), "Heads that agree")
    pairs = significant_pairs(results.table(f"{NAME}_pairs"))
    s.add(Paragraph(f"{len(pairs)} significant pairs."))
    s.add(pair_table_block(pairs.head(20), "agreement-pairs", "Pairs that agree.", "share"))
    return s


FOLLOWS = RoleRule(
    "follows",
    1.6,
    "#17becf",
    f"follows: its argmax agrees with another head's in at least {SHARE:g} of the words (the "
    "interval's lower end), Holm-adjusted p below 0.05.",
    follows,
)

ANALYSIS = register(
    Analysis(
        name=NAME,
        scorer=AgreementScorer,
        input="sentences",
        selection=False,
        description="how often two heads' argmax words agree (a toy pair analysis)",
        tables={f"{NAME}_pairs": agreement_table},
        roles=(FOLLOWS,),
        report=agreement_section,
        default=False,
    )
)
