"""The streaming accumulator every scorer builds on.

A scorer turns one layer's attention into counts and keeps nothing else. For
each batch it declares its *rows*, one per (unit, label), with the number of
trials `n` of each row; `update` adds per-head hits (or attention mass) to those
rows on the device; `end_batch` moves the batch's counts to the CPU. Rows of two
runs add up, so shards merge by concatenating `unit_counts()` and summing.

Baselines need no attention: a scorer adds them as rows with `variant` set and
`layer = head = -1` through `add_baseline`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

UNIT_COLUMNS = ["analysis", "label", "unit", "layer", "head", "direction", "variant", "n", "hits", "mass"]


class CountScorer:
    analysis = ""
    directions: tuple[str, ...] = ("",)
    value = "hits"                      # "hits" (counts) or "mass" (summed attention)

    def __init__(self):
        self.chunks_: list[pd.DataFrame] = []
        self.baseline_rows_: list[dict] = []
        self.n_layers = self.n_heads = None

    # -- the engine calls these -------------------------------------------------------
    def bind(self, n_layers: int, n_heads: int, layers=None) -> None:
        self.n_layers, self.n_heads = n_layers, n_heads
        self.layers = list(range(n_layers)) if layers is None else sorted(int(x) for x in layers)
        self.layer_slot = {layer: slot for slot, layer in enumerate(self.layers)}

    def begin_batch(self, batch) -> None:
        self._baselines: list[dict] = []
        keys, n = self.rows(batch)                       # [(unit, label)], trials per row
        self._keys = keys
        self._n = np.asarray(n, dtype=np.float64)        # [row] or [row, direction]
        if self._n.ndim == 1:
            self._n = np.repeat(self._n[:, None], len(self.directions), axis=1)
        self._values = torch.zeros(len(self.layers), len(self.directions), len(keys), self.n_heads,
                                   dtype=torch.float64 if self.value == "mass" else torch.float32,
                                   device=batch.device)  # [layer, direction, row, head]
        self.prepare(batch)

    def update(self, layer: int, att, batch) -> None:
        raise NotImplementedError

    def end_batch(self, batch) -> None:
        if self._keys:
            self.chunks_.append(self._frame(self._values.cpu().numpy()))
        self.baseline_rows_.extend(self._baselines)
        del self._values

    # -- subclasses implement ---------------------------------------------------------
    def rows(self, batch) -> tuple[list[tuple[str, str]], list]:
        raise NotImplementedError

    def prepare(self, batch) -> None:
        """Build per-batch tensors (arcs, masks) on the device."""

    # -- helpers for subclasses -------------------------------------------------------
    def add(self, layer: int, direction: int, row: torch.Tensor, values: torch.Tensor) -> None:
        """Add `values` [item, head] to rows `row` [item] of this layer and direction."""
        target = self._values[self.layer_slot[layer], direction]                  # [row, head]
        target.index_add_(0, row, values.to(target.dtype))

    def add_baseline(self, unit: str, label: str, variant: str, n: float, hits: float) -> None:
        self._baselines.append(dict(analysis=self.analysis, label=label, unit=unit, layer=-1, head=-1,
                                    direction="", variant=variant, n=n, hits=hits, mass=np.nan))

    def _frame(self, values: np.ndarray) -> pd.DataFrame:
        n_layers, n_dirs, n_rows, n_heads = values.shape
        shape = values.shape
        layer = np.broadcast_to(np.asarray(self.layers)[:, None, None, None], shape).ravel()
        direction = np.broadcast_to(np.arange(n_dirs)[None, :, None, None], shape).ravel()
        row = np.broadcast_to(np.arange(n_rows)[None, None, :, None], shape).ravel()
        head = np.broadcast_to(np.arange(n_heads)[None, None, None, :], shape).ravel()
        units = np.array([k[0] for k in self._keys], dtype=object)
        labels = np.array([k[1] for k in self._keys], dtype=object)
        flat = values.ravel()
        return pd.DataFrame({
            "analysis": self.analysis,
            "label": labels[row],
            "unit": units[row],
            "layer": layer,
            "head": head,
            "direction": np.array(self.directions, dtype=object)[direction],
            "variant": "",
            "n": self._n[row, direction],
            "hits": flat if self.value == "hits" else np.nan,
            "mass": flat if self.value == "mass" else np.nan,
        })

    # -- results ----------------------------------------------------------------------
    def unit_counts(self) -> pd.DataFrame:
        frames = [f for f in self.chunks_ if len(f)]
        if self.baseline_rows_:
            frames.append(pd.DataFrame(self.baseline_rows_, columns=UNIT_COLUMNS))
        if not frames:
            return pd.DataFrame(columns=UNIT_COLUMNS)
        return pd.concat(frames, ignore_index=True)[UNIT_COLUMNS]


def masked_word_attention(att, batch, drop_self: bool) -> torch.Tensor:
    """[batch, head, word, word]: word-to-word attention, specials dropped, padding = -1.

    With `drop_self`, the attention a word pays to itself is set to 0 (SPEC 1).
    Rows are not renormalised.
    """
    w = batch.max_words
    scores = att.words[..., :w].clone()                                   # [batch, head, word, word]
    if drop_self:
        scores.diagonal(dim1=-2, dim2=-1).zero_()
    valid = batch.word_mask[:, None, :, None] & batch.word_mask[:, None, None, :]   # [batch, 1, word, word]
    return scores.masked_fill_(~valid, -1.0)
