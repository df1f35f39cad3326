"""Word pooling: a batch's piece-level attention pooled to word level (METHODS §1).

`pool_words` pools every row at once (to = sum over a word's key pieces, from = mean, first or
max over its query pieces, plus the CLS- and SEP-like columns); `WordRows` pools query blocks
(`capture.QueryBlock`, `--query-block`) and hands on each word row once all its pieces are seen.
`WordMaps` holds a batch's piece -> word maps on one device (a copy where a layer of a model over
several devices runs). `scoring.layer_attention` and the pass (`scoring.engine`) call these.
"""

from __future__ import annotations

import numpy as np
import torch

from headprobe.inputs.align import WORD
from headprobe.inputs.batching import Batch


class WordMaps:
    """A batch's piece -> word maps on one device: the batch's own, or a copy (made once per
    batch) where a layer of a model spread over devices runs."""

    def __init__(self, batch: Batch, device: torch.device):
        same = device == batch.device
        move = (lambda t: t) if same else (lambda t: t.to(device))
        self.device = device
        self.to_words = move(batch.to_words)  # [batch, piece, word + 2]
        self.from_words = move(batch.from_words)  # [batch, word, piece]
        self.piece_kind = move(batch.piece_kind)  # [batch, piece]
        self.piece_word = move(batch.piece_word)  # [batch, piece]

    @staticmethod
    def of(batch: Batch, device: torch.device) -> WordMaps:
        cache = batch.__dict__.setdefault("_headprobe_maps", {})
        maps = cache.get(device)
        if maps is None:
            maps = cache[device] = WordMaps(batch, device)
        return maps


def pool_words(pieces: torch.Tensor, maps, from_mode: str, max_words: int) -> torch.Tensor:
    """[..., batch, head, word, word + 2] word-level attention of piece-level `pieces`
    [..., batch, head, piece, piece] (every row; leading axes, e.g. one per measure, pooled
    in the same calls)."""
    to = torch.matmul(pieces, maps.to_words[:, None])  # [..., batch, head, piece, word + 2]
    if from_mode != "max":
        return torch.matmul(maps.from_words[:, None], to)  # [..., batch, head, word, word + 2]
    *lead, t, k = to.shape
    w = max_words
    row = torch.where(maps.piece_kind == WORD, maps.piece_word, torch.full_like(maps.piece_word, w))
    index = row[:, None, :, None].expand(*lead, t, k)  # [..., batch, head, piece, word + 2]
    out = to.new_full((*lead, w + 1, k), float("-inf"))
    out.scatter_reduce_(-2, index, to, reduce="amax", include_self=True)
    return out[..., :w, :].clamp_min(0)  # [..., batch, head, word, word + 2]


class WordRows:
    """Word-level rows of one layer of one batch from its query blocks (piece rows, in order).

    A word's row is complete once all its pieces' rows have been seen; rows are handed on
    as soon as they are complete in every example of the batch, so only the rows of words
    cut by a block boundary (or ahead in another example) wait here. To = sum over the
    key pieces (every key is in each block); from = mean/first (weights, added up over the
    blocks) or max (a running maximum)."""

    def __init__(self, batch: Batch, device: torch.device):
        self.maps = WordMaps.of(batch, device)
        self.from_mode = batch.from_mode
        self.w = batch.max_words
        spans = batch.__dict__.get("_headprobe_spans")
        if spans is None:  # each word's first and last piece
            kind, word = batch.piece_kind_host, batch.piece_word_host  # [batch, piece] each, host
            b, t = kind.shape
            first = np.full(
                (b, self.w), t, dtype=np.int64
            )  # words an example lacks: never touched,
            last = np.full((b, self.w), -1, dtype=np.int64)  # always complete
            rows, pieces = np.nonzero(kind == WORD)
            np.minimum.at(first, (rows, word[rows, pieces]), pieces)
            np.maximum.at(last, (rows, word[rows, pieces]), pieces)
            spans = batch.__dict__["_headprobe_spans"] = (first, last)
        self.first_piece, self.last_piece = spans
        self.done = 0  # rows handed on: words [0, done)
        self.acc = None  # [..., batch, head, rows, word + 2]: words [done, ...)

    def add(
        self, probs: torch.Tensor, start: int, stop: int
    ) -> tuple[torch.Tensor, tuple[int, int]]:
        """Pool query piece rows `start:stop` of `probs` [..., batch, head, rows, key] (leading
        axes, e.g. the measures, pooled together); (complete word rows [..., batch, head, n,
        word + 2], (w0, w1))."""
        *lead, b, h = probs.shape[:-2]
        k = self.w + 2
        maps = self.maps
        to = torch.matmul(probs, maps.to_words[:, None])  # [..., batch, head, rows, word + 2]
        touched = ((self.first_piece < stop) & (self.last_piece >= start)).any(axis=0)  # [word]
        if touched.any():
            cols = np.flatnonzero(touched)
            lo, hi = int(cols[0]), int(cols[-1]) + 1
            assert lo >= self.done, "query blocks must come in row order"
            fill = float("-inf") if self.from_mode == "max" else 0.0
            have = 0 if self.acc is None else self.acc.shape[-2]
            if self.done + have < hi:  # rows for newly touched words
                more = to.new_full((*lead, b, h, hi - self.done - have, k), fill)
                self.acc = more if self.acc is None else torch.cat([self.acc, more], dim=-2)
            if self.from_mode != "max":
                part = torch.matmul(
                    maps.from_words[:, None, lo:hi, start:stop], to
                )  # [..., batch, head, hi - lo, k]
                self.acc[..., lo - self.done : hi - self.done, :] += part
            else:
                n = self.acc.shape[-2]
                kind, word = maps.piece_kind[:, start:stop], maps.piece_word[:, start:stop]
                row = torch.where(kind == WORD, word - self.done, torch.full_like(word, n))
                index = row[:, None, :, None].expand(*lead, b, h, stop - start, k)
                target = torch.cat(
                    [self.acc, self.acc.new_full((*lead, b, h, 1, k), float("-inf"))], dim=-2
                )
                target.scatter_reduce_(-2, index, to, reduce="amax", include_self=True)
                self.acc = target[..., :n, :]
        incomplete = self.last_piece >= stop  # [batch, word]
        ready = np.where(incomplete.any(axis=1), incomplete.argmax(axis=1), self.w)  # [batch]
        upto = int(ready.min()) if len(ready) else self.w
        w0 = self.done
        if upto <= w0:
            return to.new_zeros((*lead, b, h, 0, k)), (w0, w0)
        out, self.acc = self.acc[..., : upto - w0, :], self.acc[..., upto - w0 :, :]
        self.done = upto
        if self.from_mode == "max":
            out = out.clamp_min(0)
        return out, (w0, upto)
