"""The parsing analysis's attention-only classifier (Clark et al. 2019's "Attn" probe; the
scorer is in `analysis.py`): the pair features of a sentence (every head's A[i, j] and A[j, i]),
written to disk per fold as float16 and read back in chunks, and the L-BFGS fit of w on one
fold's gold heads, scored on the other.

    phi = pair_features(attention, n)       # attention [K, n, n] -> [n (n - 1), 2K]
    chunks, n_items = training_chunks(fold)  # the fold's scored dependents, read from disk
    w = fit_classifier(chunks, n_features, n_items)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


L2 = 1e-6
MAX_ITER = 200


CHUNK_ROWS = 1 << 16  # feature rows read back at a time


CACHE_BYTES = 256 * 2**20  # training features kept in memory up to this size, else re-read


@dataclass
class SentenceRecord:
    unit: str
    n: int  # words
    offset: int  # first feature row (pair (0, 1)) in its fold's file
    dependents: np.ndarray  # scored arcs
    heads: np.ndarray


@dataclass
class FoldFeatures:
    """One fold's pair features: rows (i, j), i != j, per sentence, i-major, j ascending."""

    path: str
    n_features: int
    rows: int = 0
    sentences: list[SentenceRecord] = field(default_factory=list)

    def append(self, record: SentenceRecord, features: np.ndarray) -> None:
        with open(self.path, "ab") as handle:
            handle.write(np.ascontiguousarray(features, dtype=np.float16).tobytes())
        record.offset = self.rows
        self.rows += len(features)
        self.sentences.append(record)

    def matrix(self) -> np.ndarray:
        if self.rows == 0:
            return np.zeros((0, self.n_features), dtype=np.float16)
        return np.memmap(self.path, dtype=np.float16, mode="r", shape=(self.rows, self.n_features))

    @property
    def arcs(self) -> int:
        return int(sum(len(s.dependents) for s in self.sentences))


def pair_features(attention: torch.Tensor, n: int) -> torch.Tensor:
    """[n (n - 1), 2K]: for each pair (i, j), i != j (i-major), every head's A[i, j] then A[j, i].
    attention: [K, n, n] word-level attention of one sentence."""
    import torch

    a = attention[:, :n, :n]
    forward = a.permute(1, 2, 0)  # [i, j, K]: A[i, j]
    backward = a.transpose(1, 2).permute(1, 2, 0)  # [i, j, K]: A[j, i]
    both = torch.cat([forward, backward], dim=-1)  # [i, j, 2K]
    off = ~torch.eye(n, dtype=torch.bool, device=a.device)
    return both[off]  # row-major: (0,1), (0,2), ..., (1,0), ...


def candidate_index(n: int, dependent: int) -> np.ndarray:
    """The words j != dependent, in the order of the dependent's feature rows."""
    return np.array([j for j in range(n) if j != dependent])


def fit_classifier(
    chunks, n_features: int, n_items: int, l2: float = L2, max_iter: int = MAX_ITER, device="cpu"
) -> np.ndarray:
    """Weights [n_features] minimising mean_i -log softmax_j(w . phi_ij)[gold] + l2 |w|^2 / 2.

    chunks(): an iterable of (features [row, feature] float tensor, group [row] (item index
    within the chunk), n_groups, gold [group] (the gold candidate's row)), covering
    `n_items` items in all; read again for every evaluation of the loss (L-BFGS)."""
    import torch

    w = torch.zeros(n_features, dtype=torch.float64, device=device, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [w],
        lr=1.0,
        max_iter=max_iter,
        history_size=20,
        line_search_fn="strong_wolfe",
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
    )

    def closure():
        optimizer.zero_grad()
        total = 0.0
        for x, group, n_groups, gold in chunks():
            s = x.to(device, torch.float64) @ w  # [row]
            top = torch.full((n_groups,), float("-inf"), dtype=s.dtype, device=device)
            top = top.scatter_reduce(0, group, s.detach(), reduce="amax")
            summed = torch.zeros(n_groups, dtype=s.dtype, device=device).index_add(
                0, group, (s - top[group]).exp()
            )
            loss = (summed.log() + top - s[gold]).sum() / max(n_items, 1)
            loss.backward()
            total += loss.detach().item()
        penalty = l2 * (w * w).sum() / 2
        penalty.backward()
        return torch.tensor(total + penalty.detach().item())

    optimizer.step(closure)
    return w.detach().cpu().numpy()


def training_chunks(
    fold: FoldFeatures, rows_per_chunk: int = CHUNK_ROWS, cache_bytes: int = CACHE_BYTES
):
    """A `fit_classifier` chunk source over a fold's scored dependents (their candidate rows), and the
    number of dependents. Chunks are read from the fold's file; when all of them fit in
    `cache_bytes` (as float64) they are read once and kept, else read again on every pass."""
    import torch

    spans = []  # (first row, candidates, gold position) per item
    for s in fold.sentences:
        for d, h in zip(s.dependents, s.heads):
            spans.append((s.offset + d * (s.n - 1), s.n - 1, h if h < d else h - 1))
    plan = []  # (row index, group, n_groups, gold) per chunk
    start = 0
    while start < len(spans):
        stop, rows = start, 0
        while stop < len(spans) and (rows == 0 or rows + spans[stop][1] <= rows_per_chunk):
            rows += spans[stop][1]
            stop += 1
        part = spans[start:stop]
        sizes = np.array([size for _, size, _ in part])
        firsts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        plan.append(
            (
                np.concatenate([np.arange(first, first + size) for first, size, _ in part]),
                torch.from_numpy(np.repeat(np.arange(len(part)), sizes)),
                len(part),
                torch.from_numpy(firsts + np.array([g for _, _, g in part])),
            )
        )
        start = stop
    total = sum(len(index) for index, *_ in plan) * fold.n_features * 8
    kept = []

    def chunks():
        if kept:
            yield from kept
            return
        matrix, loaded = fold.matrix(), []
        for index, group, n_groups, gold in plan:
            item = (
                torch.from_numpy(np.asarray(matrix[index], dtype=np.float64)),
                group,
                n_groups,
                gold,
            )
            if total <= cache_bytes:
                loaded.append(item)
            yield item
        kept.extend(loaded)

    return chunks, len(spans)


def sentence_scores(fold: FoldFeatures, weights: np.ndarray, rows_per_chunk: int = CHUNK_ROWS):
    """(record, scores [n, n]) per sentence of a fold: scores[d, h] = w . phi(d, h), -inf on the diagonal."""
    matrix = fold.matrix()
    w = weights.astype(np.float64)
    sentences = fold.sentences
    start = 0
    while start < len(sentences):
        stop, rows = start, 0
        while stop < len(sentences) and (
            rows == 0 or rows + sentences[stop].n * (sentences[stop].n - 1) <= rows_per_chunk
        ):
            rows += sentences[stop].n * (sentences[stop].n - 1)
            stop += 1
        first = sentences[start].offset
        block = np.asarray(matrix[first : first + rows], dtype=np.float64) @ w
        for record in sentences[start:stop]:
            n = record.n
            scores = np.full((n, n), -np.inf)
            scores[~np.eye(n, dtype=bool)] = block[
                record.offset - first : record.offset - first + n * (n - 1)
            ]
            yield record, scores
        start = stop


def log_softmax_rows(scores: np.ndarray) -> np.ndarray:
    top = scores.max(axis=1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return scores - top - np.log(np.exp(scores - top).sum(axis=1, keepdims=True))
