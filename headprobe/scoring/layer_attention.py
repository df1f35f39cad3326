"""What a scorer is handed per layer: `LayerAttention`, a batch's attention at some layers, every
measure it reads stacked (piece level, and pooled to words once, `scoring.pooling`).

`measured_attention` builds one `LayerAttention` per view, (measures, reading) (`view_of`), from
what the capture handed on, shared by the scorers that read the same view; `stacked_views` stacks
each distinct matrix once; `without_rows` drops the decoder start token's query row
(cross-attention). The block API (query blocks) is `LayerAttention`'s docstring.
"""

from __future__ import annotations

from functools import cached_property

import torch

from headprobe.inputs.batching import Batch
from headprobe.model.capture import QueryBlock
from headprobe.model.head_quantities import Heads
from headprobe.scoring.measures import ARGMAX, WEIGHTS, MeasuredPieces
from headprobe.scoring.pooling import WordMaps, WordRows, pool_words


class LayerAttention:
    """A batch's attention at some of its layers (every layer where memory allows: a scorer then
    counts a batch in one call), every measure a scorer reads stacked on a second leading axis, at
    piece level and pooled to words (computed once, shared by the scorers that read the same view).

    `layers` names the first axis (consecutive layers of those scored), `measures` the second (the
    scorer's `measures`, in order): `pieces` is [layer, measure, batch, head, query piece, piece],
    `words` [layer, measure, batch, head, word, word + 2]. `LayerAttention(layer, pieces)` with one
    layer (an int) takes `pieces` [measure, batch, head, query, key] and adds the layer axis.

    Block API (for scorers that declare `blocks = True`): `pieces` holds the query piece rows
    `query_pieces = (start, stop)` (all keys) of one layer, `words` the word rows `query_words =
    (start, stop)` (all key columns); `first` / `last` mark a layer's first and last block. Without
    query blocks there is one block of every row: `(0, pieces)`, `(0, words)`, both True.

    On a model spread over devices `pieces` arrives on the layer's device: `words` is pooled
    there and moved to the batch's device; `pieces` is moved only if a scorer reads it.
    """

    def __init__(
        self,
        layers: int | tuple[int, ...],
        pieces: torch.Tensor,
        batch: Batch,
        *,
        words: torch.Tensor | None = None,
        query_pieces: tuple[int, int] | None = None,
        query_words: tuple[int, int] | None = None,
        first: bool = True,
        last: bool = True,
        measures: tuple[str, ...] = (WEIGHTS,),
    ):
        if isinstance(layers, int):
            layers, pieces = (layers,), pieces[None]
            words = None if words is None else words[None]
        self.layers = tuple(layers)
        self.measures = measures  # what the second axis holds (METHODS §7)
        self.local = pieces  # [layer, measure, batch, head, query piece, piece], layer's device
        self.batch = batch
        self.query_pieces = query_pieces or (0, pieces.shape[-2])
        self.query_words = query_words or (0, batch.max_words)
        self.first, self.last = first, last
        if words is not None:
            self.__dict__["words"] = words  # pooled already (query blocks, stacked views)
        if pieces.device == batch.device:
            self.__dict__["pieces"] = pieces

    @cached_property
    def pieces(self) -> torch.Tensor:
        """[layer, measure, batch, head, piece, piece] on the batch's device."""
        return self.local.to(self.batch.device)

    @cached_property
    def words(self) -> torch.Tensor:
        """[layer, measure, batch, head, word, word + 2]: to = sum over pieces; from =
        mean/first/max; + CLS-, SEP-like."""
        batch = self.batch
        if self.local.device == batch.device:
            return pool_words(self.local, batch, batch.from_mode, batch.max_words)
        words = pool_words(
            self.local, WordMaps.of(batch, self.local.device), batch.from_mode, batch.max_words
        )
        return words.to(batch.device)


def view_of(scorer) -> tuple[tuple[str, ...], str]:
    """(measures, reading) of the attention a scorer gets; under `weights` alone every reading is
    the same matrix, so such scorers share one `LayerAttention`."""
    measures = tuple(scorer.measures)
    return (measures, ARGMAX) if measures == (WEIGHTS,) else (measures, scorer.reads)


def without_rows(heads, block: QueryBlock | None, offset: int):
    """The capture's payload (probs, or a `head_quantities.Heads`) without the first `offset` query rows
    (cross-attention: the decoder start token's row), and the block renumbered; (None, None)
    when a block holds none of the other rows. Key quantities (value_norms) stay whole."""
    probs = (
        heads if isinstance(heads, torch.Tensor) else heads["probs"]
    )  # [batch, head, query, key]
    if block is None:
        cut = probs[:, :, offset:]
    else:
        cut = probs[:, :, max(offset - block.start, 0) :]
        block = QueryBlock(max(block.start - offset, 0), block.stop - offset, block.total - offset)
        if block.stop <= block.start:
            return None, None
    return (cut if isinstance(heads, torch.Tensor) else Heads(heads, probs=cut)), block


def stacked_views(pieces: MeasuredPieces, views) -> tuple[torch.Tensor, dict]:
    """([layer, matrix, batch, head, query, key] every distinct matrix the views read, stacked
    once; {view: [index of each of its measures]}): under weights,norms the ARGMAX view reads
    (weights, N) and the MASS view (weights, N / row sum), three matrices for four slots.
    `pieces` holds layers on a leading axis."""
    matrices, slots = {}, {}
    for measures, reads in views:
        slots[measures, reads] = [
            matrices.setdefault(measure if measure == WEIGHTS else (measure, reads), len(matrices))
            for measure in measures
        ]
    order = sorted(matrices, key=matrices.get)
    every = [pieces.get(WEIGHTS, ARGMAX) if m == WEIGHTS else pieces.get(*m) for m in order]
    # one matrix (weights alone): a view, not a copy
    if len(every) == 1:
        return every[0].unsqueeze(1), slots  # [layer, 1, b, h, q, k]
    return torch.stack(every, dim=1), slots  # [layer, matrix, b, h, q, k]


def measured_attention(
    scorers,
    layers: tuple[int, ...],
    heads,
    batch: Batch,
    block: QueryBlock | None = None,
    pooling: dict | None = None,
):
    """(scorer, LayerAttention) for each scorer, in order: one `LayerAttention` per (measures,
    reading) that some scorer reads (`view_of`), built from what the capture handed on for
    `layers` (`heads`: the probabilities, or a `head_quantities.Heads`, each with a leading layer axis),
    shared by the scorers that read it. Every distinct matrix of every layer is pooled to words
    once, in one call over the leading axes. With a query `block` (one layer), `pooling`
    ({layer: WordRows}, kept across the layer's blocks) pools its rows."""
    views = list(dict.fromkeys(map(view_of, scorers)))
    stacked, slots = stacked_views(MeasuredPieces(heads), views)
    if block is None:
        local = stacked.device == batch.device
        words = pool_words(stacked, batch, batch.from_mode, batch.max_words) if local else None
        query_words = None
    else:
        layer = layers[0]
        if block.first:
            pooling[layer] = WordRows(batch, stacked.device)
        words, query_words = pooling[layer].add(stacked, block.start, block.stop)
        if block.last:
            del pooling[layer]
        words = words.to(batch.device)
    atts = {}
    n_matrices = stacked.shape[1]
    for view in views:
        index = slots[view]
        whole = index == list(range(n_matrices))
        pieces = stacked if whole else stacked[:, index]  # [layer, measure, b, h, query, key]
        view_words = words if words is None or whole else words[:, index]
        atts[view] = LayerAttention(
            layers,
            pieces,
            batch,
            words=view_words,
            query_words=query_words,
            query_pieces=None if block is None else (block.start, block.stop),
            first=True if block is None else block.first,
            last=True if block is None else block.last,
            measures=view[0],
        )
    for scorer in scorers:
        yield scorer, atts[view_of(scorer)]
