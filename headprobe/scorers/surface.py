"""Surface statistics (SPEC section 4; Clark et al. 2019 Figures 2 and 4).

Per head, summed over word queries (specials are not queries), on word-level
attention: mass to `self`, `prev` (words with a previous word), `next` (words
with a next word), `cls` (CLS/BOS-like specials), `sep` (SEP/EOS-like) and
`punct` (punctuation words). Over word pieces as queries: `entropy` of the
piece-level row in nats, and `entropy_uniform`, the entropy of uniform
attention over the keys that query can see. mean = mass / n.
"""

from __future__ import annotations

import re

import torch

from headprobe.align import WORD
from headprobe.scorers.base import CountScorer
from headprobe.scorers.positional import UnitLabelRows

LABELS = ["self", "prev", "next", "cls", "sep", "punct", "entropy", "entropy_uniform"]
_PUNCT = re.compile(r"^[^\w\s]+$")


def is_punct(word: str, upos: str | None) -> bool:
    return upos == "PUNCT" if upos is not None else bool(_PUNCT.match(word))


def n_pieces(example, alignment) -> int:
    return sum(1 for k in alignment.piece_kind if k == WORD)


class SurfaceScorer(UnitLabelRows, CountScorer):
    analysis = "surface"
    labels = LABELS
    value = "mass"

    def rows(self, batch):
        pieces = {id(ex): n_pieces(ex, a) for ex, a in zip(batch.examples, batch.alignments)}

        def n_for(example, label):
            words = len(example.words)
            if label in ("prev", "next"):
                return words - 1
            if label.startswith("entropy"):
                return pieces[id(example)]
            return words
        return self.unit_rows(batch, n_for)

    def prepare(self, batch):
        device = batch.device
        w = batch.max_words
        self._q_b, self._q_i = batch.word_mask.nonzero(as_tuple=True)                  # [query]
        punct = torch.zeros(len(batch), w, dtype=torch.float32, device=device)
        for b, example in enumerate(batch.examples):
            upos = example.upos or [None] * len(example.words)
            for i, (word, tag) in enumerate(zip(example.words, upos)):
                punct[b, i] = float(is_punct(word, tag))
        self._punct = punct[:, None, None, :]                                          # [batch, 1, 1, word]
        self._p_b, self._p_t = (batch.piece_kind == WORD).nonzero(as_tuple=True)       # [query piece]
        keys = batch.attention_mask.float()
        visible = keys.cumsum(dim=1) if batch.causal else keys.sum(dim=1, keepdim=True).expand_as(keys)
        self._uniform = visible.clamp_min(1).log()[self._p_b, self._p_t]               # [query piece]
        n_words = batch.n_words[self._q_b]
        self._has_prev = (self._q_i > 0).float()[:, None]                              # [query, 1]
        self._has_next = (self._q_i < n_words - 1).float()[:, None]
        self._prev = (self._q_i - 1).clamp_min(0)
        self._next = torch.minimum(self._q_i + 1, (n_words - 1).clamp_min(0))
        self._label_row = {label: slot for slot, label in enumerate(LABELS)}

    def _add(self, layer, label, batch_index, values):
        rows = self._first_row[batch_index] + self._label_row[label]
        self.add(layer, 0, rows, values)

    def update(self, layer, att, batch):
        w = batch.max_words
        words = att.words                                                # [batch, head, word, word + 2]
        rows = words.permute(0, 2, 1, 3)[self._q_b, self._q_i]          # [query, head, word + 2]
        take = lambda col: rows.gather(2, col[:, None, None].expand(-1, rows.shape[1], 1))[..., 0]
        self._add(layer, "self", self._q_b, take(self._q_i))
        self._add(layer, "prev", self._q_b, take(self._prev) * self._has_prev)
        self._add(layer, "next", self._q_b, take(self._next) * self._has_next)
        self._add(layer, "cls", self._q_b, rows[..., w])
        self._add(layer, "sep", self._q_b, rows[..., w + 1])
        punct = (words[..., :w] * self._punct).sum(-1)                  # [batch, head, word]
        self._add(layer, "punct", self._q_b, punct.permute(0, 2, 1)[self._q_b, self._q_i])
        entropy = torch.special.entr(att.pieces).sum(-1)                # [batch, head, piece], nats
        entropy = entropy.permute(0, 2, 1)[self._p_b, self._p_t]        # [query piece, head]
        self._add(layer, "entropy", self._p_b, entropy)
        self._add(layer, "entropy_uniform", self._p_b, self._uniform[:, None].expand_as(entropy))
