"""Examples -> length-bucketed, padded batches with piece->word maps on the device.

Every example is tokenized once (one batched call to the fast tokenizer). An
example that does not fit the model's maximum length, or that has a word the
tokenizer turns into no piece, is skipped and counted (METHODS §1).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from headprobe.inputs.align import CLS_LIKE, PAD, SEP_LIKE, WORD, Alignment, align_examples
from headprobe.inputs.corpora.base import Example


@dataclass
class Prepared:
    """Examples ready for batching, plus what was skipped and why."""

    examples: list[Example]
    alignments: list[Alignment]
    skipped: Counter = field(default_factory=Counter)
    skipped_sources: list[str] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)  # each kept example's index in the input list


def prepare(examples: list[Example], tokenizer, max_length: int, alignments=None) -> Prepared:
    """`examples` tokenized (one batched call; an example's pieces do not depend on the others)
    and checked: those that fit, with their alignments and their indices in `examples`, and the
    skipped ones counted by reason. `alignments`: the examples' alignments made already (by a
    worker process, `align.align_in_worker`), else they are made here."""
    kept, aligned, skipped, sources, indices = [], [], Counter(), [], []
    if alignments is None:
        alignments = align_examples(tokenizer, examples)  # words, or a probe's own token ids
    for index, (example, alignment) in enumerate(zip(examples, alignments)):
        if len(alignment) > max_length:
            skipped["too_long"] += 1
            sources.append(f"{example.source}: {len(alignment)} pieces > {max_length}")
        elif alignment.empty_words():
            skipped["word_without_piece"] += 1
            sources.append(f"{example.source}: words {alignment.empty_words()} have no piece")
        else:
            kept.append(example)
            aligned.append(alignment)
            indices.append(index)
    return Prepared(kept, aligned, skipped, sources, indices)


def bucket(prepared: Prepared, batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of examples with exactly the same number of pieces.

    No padding means a sentence's attention is bit-for-bit what it is alone: counts do not
    depend on the batch size (padding shifts float rounding, enough to flip a near-tie
    argmax). Longest first, corpus order within a length.
    """
    by_length: dict[int, list[int]] = {}
    for i, alignment in enumerate(prepared.alignments):
        by_length.setdefault(len(alignment), []).append(i)
    batches = []
    for length in sorted(by_length, reverse=True):
        same = by_length[length]
        batches += [same[start : start + batch_size] for start in range(0, len(same), batch_size)]
    return batches


def on_device(array: np.ndarray, device) -> torch.Tensor:
    """A host array as a tensor on `device`: on the CPU the array's own memory (nothing is
    dispatched); on a GPU one copy from pinned memory that does not wait for the device (a copy
    from pageable memory would wait for every kernel queued before it). What a batch's scorers
    need of it is built on the host and moved with this, once per batch."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    device = torch.device(device)
    if device.type == "cpu":
        return tensor
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


class Batch:
    """Padded model inputs and word maps for a list of examples (tensors on `device`)."""

    def __init__(
        self,
        examples: list[Example],
        alignments: list[Alignment],
        pad_id: int,
        device="cpu",
        from_mode: str = "mean",
    ):
        self.examples = examples
        self.alignments = alignments
        self.pad_id = int(pad_id)  # the id of its padding pieces (a batch of some rows reuses it)
        self.device = torch.device(device)
        self.from_mode = from_mode
        b = len(examples)
        n_pieces = max(len(a) for a in alignments)
        n_words = max(a.n_words for a in alignments)
        self.n_pieces, self.max_words = n_pieces, n_words

        input_ids = np.full((b, n_pieces), pad_id, dtype=np.int64)
        piece_word = np.full((b, n_pieces), -2, dtype=np.int64)
        piece_kind = np.full((b, n_pieces), PAD, dtype=np.int64)
        for row, a in enumerate(alignments):
            t = len(a)
            input_ids[row, :t] = a.input_ids
            piece_word[row, :t] = a.piece_word
            piece_kind[row, :t] = a.piece_kind
        # sum pooling: a word piece -> its word's column; CLS-like -> column W; SEP-like -> W + 1
        column = np.where(
            piece_kind == WORD,
            piece_word,
            np.where(
                piece_kind == CLS_LIKE, n_words, np.where(piece_kind == SEP_LIKE, n_words + 1, -1)
            ),
        )
        to_words = np.zeros((b, n_pieces, n_words + 2), dtype=np.float32)
        rows, pieces = np.nonzero(column >= 0)
        to_words[rows, pieces, column[rows, pieces]] = 1.0

        # every mask is made here on the host and copied once: nothing in the batch loop reads a
        # device value back
        put = lambda array: on_device(array, self.device)
        self.words_each = np.array([a.n_words for a in alignments], dtype=np.int64)  # [batch], host
        self.word_mask_host = np.arange(n_words)[None, :] < self.words_each[:, None]  # [b, word]
        self.piece_kind_host = piece_kind  # [batch, piece], host
        self.piece_word_host = piece_word  # [batch, piece], host
        mask = (piece_kind != PAD).astype(np.int64)
        # exact-length batches have no padding: the model is then fed no mask (`Sites.model_inputs`)
        self.padded = not mask.all()
        # [batch, piece] each: one copy for the four
        self.input_ids, self.attention_mask, self.piece_word, self.piece_kind = put(
            np.stack([input_ids, mask, piece_word, piece_kind])
        ).unbind(0)
        self.n_words = put(self.words_each)  # [batch]
        self.word_mask = put(self.word_mask_host)  # [batch, word]
        self.to_words = put(to_words)  # [batch, piece, word + 2]
        # which of the two special key columns (CLS-like, SEP-like) exist in each example
        self.special_present = put(to_words[:, :, n_words:].max(axis=1) > 0)  # [batch, 2]
        self.from_words = self._from_weights(
            piece_word, piece_kind, n_words
        )  # [batch, word, piece]

    def _from_weights(self, piece_word, piece_kind, n_words):
        b, t = piece_word.shape
        weights = np.zeros((b, n_words, t), dtype=np.float32)
        rows, pieces = np.nonzero(piece_kind == WORD)
        words = piece_word[rows, pieces]
        if self.from_mode == "mean":
            counts = np.zeros((b, n_words), dtype=np.float32)
            np.add.at(counts, (rows, words), 1.0)
            weights[rows, words, pieces] = 1.0 / counts[rows, words]
        else:  # "first" (and the index map used by "max")
            first = {}
            for r, p, w in zip(rows, pieces, words):
                first.setdefault((r, w), p)
            for (r, w), p in first.items():
                weights[r, w, p] = 1.0
        return on_device(weights, self.device)

    def __len__(self) -> int:
        return len(self.examples)

    def word_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(batch row [query], word [query]) of every real word, example by example, in order:
        host arrays, so a scorer indexes the device without reading a mask back."""
        counts = self.words_each
        row = np.repeat(np.arange(len(counts)), counts)
        return row, np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)

    @property
    def n_real_words(self) -> int:
        return int(sum(a.n_words for a in self.alignments))


def iter_batches(prepared: Prepared, batch_size: int, pad_id: int, device="cpu", from_mode="mean"):
    for indices in bucket(prepared, batch_size):
        yield Batch(
            [prepared.examples[i] for i in indices],
            [prepared.alignments[i] for i in indices],
            pad_id,
            device=device,
            from_mode=from_mode,
        )


class Pool:
    """Examples waiting for a batch, by exact length, kept across chunks of the corpus.

        pool = Pool(batch_size=64, budget=64 * 64, bound=16 * 64 * 64)
        for item, length in items:              # in corpus order; an item is anything
            for batch in pool.add(item, length):    # batches: lists of items of one length
                score(batch)
        for batch in pool.drain():              # at the end of the corpus: the rest
            score(batch)

    A length's batch goes out when its waiting items reach `size(length)` = the batch size, or
    fewer where `budget` (pieces x examples) is reached first, so long inputs make smaller
    batches: a batch holds at most max(budget, length) pieces. The pool as a whole holds at
    most `bound` pieces: past it, the fullest length (most pieces waiting; the longer on a tie)
    goes out as it is, until the pool is back within the bound. What goes out depends only on
    what the pool holds, never on when it was added: refilling an empty pool with the items
    `waiting()` lists (in any order that keeps each length's items in theirs, e.g. corpus
    order) gives back the same pool, and so the same batches (`restore`: a resumed run).
    Within a length, items stay in the order they came.
    """

    def __init__(self, batch_size: int, budget: int, bound: int):
        self.batch_size, self.budget, self.bound = int(batch_size), int(budget), int(bound)
        self.by_length: dict[int, list] = {}  # length -> its waiting items, in order
        self.pieces = 0  # sum of the waiting items' lengths

    def size(self, length: int) -> int:
        """Examples of `length` pieces in a full batch: the batch size, or fewer within the budget."""
        return max(1, min(self.batch_size, self.budget // max(1, length)))

    def add(self, item, length: int) -> list[list]:
        """Add one item of `length` pieces; the batches that are due now (often none)."""
        waiting = self.by_length.setdefault(length, [])
        waiting.append(item)
        self.pieces += length
        out = [self._take(length)] if len(waiting) >= self.size(length) else []
        while self.pieces > self.bound:
            out.append(self._take(self._fullest()))
        return out

    def drain(self) -> list[list]:
        """Every waiting item, as batches of one length each (longest first); the pool is empty."""
        return [self._take(length) for length in sorted(self.by_length, reverse=True)]

    def waiting(self) -> list[tuple]:
        """(item, length) of every waiting item, in an order that `restore` rebuilds the pool from."""
        return [(item, n) for n, items in self.by_length.items() for item in items]

    def restore(self, waiting) -> None:
        """Refill an empty pool with what `waiting()` listed (no batch is due on the way)."""
        assert not self.by_length, "restore fills an empty pool"
        for item, length in waiting:
            self.by_length.setdefault(length, []).append(item)
            self.pieces += length

    def __len__(self) -> int:
        return sum(map(len, self.by_length.values()))

    def _fullest(self) -> int:
        """The length with the most pieces waiting (the longer on a tie)."""
        return max(self.by_length, key=lambda n: (len(self.by_length[n]) * n, n))

    def _take(self, length: int) -> list:
        items = self.by_length.pop(length)
        self.pieces -= length * len(items)
        return items
