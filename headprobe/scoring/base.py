"""The streaming accumulator every scorer builds on.

A scorer turns one layer's attention into counts and keeps nothing else. For
each batch it declares its *rows*, one per (unit, label), with the number of
trials `n` of each row; `update` adds per-head hits (or attention mass) to those
rows on the device; `end_batch` adds the batch into the scorer's `Tally`
(per fold and bootstrap resample, METHODS §5) and forgets the rows. With
`keep_units` the per-unit rows are also kept (`unit_counts()`), for small corpora,
debugging and the exact multinomial bootstrap.

Baselines need no attention: a scorer names them in `variants` and fills
`self.baseline_hits` ([row, variant], allocated per batch; the trials are the
row's `n`) in `prepare`; they come out as rows with `variant` set and
`layer = head = -1`.

Optional hooks are declared as protocols (`RunsModel`, `ReadsConventions`, `TakesHeads`): the
engine and the run ask `isinstance(scorer, RunsModel)` (`issubclass` of a scorer class), never
`hasattr`. A scorer that runs a second pass over the sentences says so in `second_pass`, and one
that scores the language-model loss in `needs_lm_head`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd
import torch

from headprobe.core.seeds import SEED
from headprobe.model.control import TRAINED
from headprobe.scoring.measures import ARGMAX, WEIGHTS, tally_key
from headprobe.scoring.tally import N_BOOT, Tally

UNIT_COLUMNS = [
    "analysis",
    "measure",
    "label",
    "unit",
    "layer",
    "head",
    "direction",
    "variant",
    "n",
    "hits",
    "mass",
]
UNIT_KEYS = UNIT_COLUMNS[:8]  # one row per key (duplicates are summed)


def smallest_dtype(values: np.ndarray, whole: bool):
    """Counts are small whole numbers: keep per-unit memory small (float32 for masses)."""
    if not whole:
        return np.float32
    top = values.max(initial=0)
    return np.uint8 if top < 256 else np.uint16 if top < 65536 else np.float32


class RowIndex:
    """(unit, label) rows of one batch, in order of first use, with their trial counts."""

    def __init__(self):
        self.keys: list[tuple[str, str]] = []
        self.n: list[float] = []
        self._index: dict[tuple[str, str], int] = {}

    def count(self, unit: str, label: str, trials: float = 1) -> int:
        """Add `trials` to the row of (unit, label), creating it if needed; its row index."""
        key = (unit, label)
        row = self._index.get(key)
        if row is None:
            row = self._index[key] = len(self.keys)
            self.keys.append(key)
            self.n.append(0)
        self.n[row] += trials
        return row


class UnitLabelRows:
    """(unit, label) rows for scorers whose labels are a fixed list per unit."""

    labels: list[str] = []

    def unit_rows(self, batch, n_for):
        """Rows for every unit in the batch; `n_for(example, label)` gives the trials.

        A unit's labels get consecutive rows, so label k of an example sits at its first row + k.
        """
        rows, first_row = RowIndex(), []
        for example in batch.examples:
            first_row.append(
                rows.count(example.unit, self.labels[0], n_for(example, self.labels[0]))
            )
            for label in self.labels[1:]:
                rows.count(example.unit, label, n_for(example, label))
        self._first_row = torch.tensor(first_row, dtype=torch.long, device=batch.device)  # [batch]
        return rows.keys, rows.n


class CountScorer:
    """Base of every scorer: per-batch (unit, label) rows, streamed into a `Tally`.

    Class attributes a scorer declares (its analysis's registry entry reads them):
    `analysis`, `directions`, `value` ("hits" or "mass"), `variants` (baselines),
    `extras` (per-label counts that do not depend on a head, e.g. `unreachable`).
    """

    analysis = ""
    directions: tuple[str, ...] = ("",)
    value = "hits"  # "hits" (counts) or "mass" (summed attention)
    variants: tuple[str, ...] = ()  # baseline names (rows with layer = head = -1)
    extras: tuple[str, ...] = ()  # per-label counts without a head, [row, direction]
    bootstrap = True  # resampled totals (for selection and intervals)
    # Query blocks (`headprobe run --query-block N`): True when `update` accepts a layer in
    # blocks of query rows (see `query_rows`): `att.words` holds only the word rows
    # `att.query_words`, `att.pieces` only the piece rows `att.query_pieces`, `att.first` /
    # `att.last` mark the layer's first and last block, and every row comes exactly once.
    # A scorer that leaves it False always gets whole matrices (the engine then does not block).
    blocks = False
    # The model this instance counts (`headprobe.model.control`): "trained", or "control" for the
    # random-init control's instance (its tally is kept apart: `key`).
    model = TRAINED
    # Measures (METHODS §7, `headprobe.scoring.measures`): the measure this scorer instance counts (set per
    # instance; one instance per measure asked for) and how it reads one: ARGMAX (N = a * ||v W_O||)
    # or MASS (N with each row normalised to sum 1). Under `weights` both are the weights.
    measure = WEIGHTS
    reads = ARGMAX
    # Run shape (`headprobe.api`): scored in a second pass over the sentences, after the first
    # pass's tallies (the pruning curve's order); scores the loss under a language-model head.
    second_pass = False
    needs_lm_head = False

    def __init__(self):
        self.chunks_: list[tuple] = []  # per-unit rows, only with keep_units
        self.baseline_chunks_: list[tuple] = []
        self.n_layers = self.n_heads = None
        self.tally_ = None

    # -- the engine calls these -------------------------------------------------------
    def bind(
        self,
        n_layers: int,
        n_heads: int,
        layers=None,
        *,
        seed: int = SEED,
        n_boot: int = N_BOOT,
        keep_units: bool = False,
        device="cpu",
    ) -> None:
        self.n_layers, self.n_heads = n_layers, n_heads
        self.layers = list(range(n_layers)) if layers is None else sorted(int(x) for x in layers)
        self.layer_slot = {layer: slot for slot, layer in enumerate(self.layers)}
        self.keep_units = keep_units
        if self.tally_ is None:
            self.tally_ = Tally(
                self.analysis,
                directions=self.directions,
                variants=self.variants,
                layers=self.layers,
                n_heads=n_heads,
                value=self.value,
                resamples=n_boot,
                bootstrap=self.bootstrap,
                seed=seed,
                extras=self.extras,
                device=device,
                model=self.model,
                measure=self.measure,
            )

    @property
    def key(self) -> str:
        """The name of this scorer's tally (`measures.tally_key`): the analysis, `@<measure>`
        beyond weights, `~control` for the control's."""
        return tally_key(self.analysis, self.measure, self.model)

    def begin_batch(self, batch) -> None:
        keys, n = self.rows(batch)  # [(unit, label)], trials per row
        self._keys = keys
        self._n = np.asarray(n, dtype=np.float64)  # [row] or [row, direction]
        if self._n.ndim == 1:
            self._n = np.repeat(self._n[:, None], len(self.directions), axis=1)
        self._values = torch.zeros(
            len(self.layers),
            len(self.directions),
            len(keys),
            self.n_heads,
            dtype=torch.float64 if self.value == "mass" else torch.float32,
            device=batch.device,
        )  # [layer, direction, row, head]
        self.baseline_hits = np.zeros(
            (len(keys), len(self.variants)), dtype=np.float32
        )  # [row, variant]
        self._both = None  # [layer, direction, label * variant, head]
        names = [k[1] for k in keys]
        self._labels = list(dict.fromkeys(names))  # this batch's labels, in order of first use
        slot = {name: i for i, name in enumerate(self._labels)}
        self._label_of_row = torch.tensor(
            [slot[name] for name in names], dtype=torch.long, device=batch.device
        )  # [row]
        self._extra = {
            name: np.zeros((len(keys), len(self.directions)), dtype=np.int64)
            for name in self.extras
        }
        self.prepare(batch)

    def update(self, layer: int, att, batch) -> None:
        raise NotImplementedError

    def end_batch(self, batch) -> None:
        if self._keys:
            values = self._values.permute(2, 0, 3, 1)  # [row, layer, head, direction]
            self.tally_.add(
                [k[0] for k in self._keys],
                [k[1] for k in self._keys],
                values,
                self._n,
                self.baseline_hits,
                self._extra,
            )
            if self._both is not None:  # -> [label, layer, head, direction, variant]
                both = self._both.reshape(
                    len(self.layers),
                    len(self.directions),
                    len(self._labels),
                    len(self.variants),
                    self.n_heads,
                )
                self.tally_.add_both(self._labels, both.permute(2, 0, 4, 1, 3))
            if self.keep_units:
                kept = self._values.cpu().numpy()  # [layer, direction, row, head]
                kept = np.ascontiguousarray(kept.astype(smallest_dtype(kept, self.value == "hits")))
                self.chunks_.append((self._keys, kept, self._n.astype(np.float32)))
                if self.variants:  # (keys, trials [row], hits [row, variant])
                    self.baseline_chunks_.append(
                        (self._keys, self._n[:, 0].astype(np.float32), self.baseline_hits)
                    )
        del self._values, self._both

    def finish(self) -> None:
        """The corpus is done: add what is still buffered into the totals."""
        self.tally_.flush()

    # -- subclasses implement ---------------------------------------------------------
    def rows(self, batch) -> tuple[list[tuple[str, str]], list]:
        raise NotImplementedError

    def prepare(self, batch) -> None:
        """Build per-batch tensors (arcs, masks) on the device."""

    # -- helpers for subclasses -------------------------------------------------------
    def add(self, layer: int, direction: int, row: torch.Tensor, values: torch.Tensor) -> None:
        """Add `values` [item, head] to rows `row` [item] of this layer and direction."""
        target = self._values[self.layer_slot[layer], direction]  # [row, head]
        target.index_add_(0, row, values.to(target.dtype))

    def add_both(
        self, layer: int, direction: int, row: torch.Tensor, hits: torch.Tensor, base: torch.Tensor
    ) -> None:
        """Count items hit by a head and by a baseline: `hits` [item, head] (0/1), `base`
        [item, variant] (0/1), for the labels of rows `row` [item]; McNemar's discordant
        counts follow (head only = hits - both, baseline only = baseline hits - both).
        Baseline hits are sparse (an arc's head sits at one offset), so only the
        (item, variant) pairs that hit are added."""
        n_variants = len(self.variants)
        if self._both is None:
            self._both = torch.zeros(
                len(self.layers),
                len(self.directions),
                len(self._labels) * n_variants,
                self.n_heads,
                dtype=torch.float32,
                device=hits.device,
            )
        item, variant = base.nonzero(as_tuple=True)  # [pair]
        target = self._both[self.layer_slot[layer], direction]  # [label * variant, head]
        target.index_add_(
            0, self._label_of_row[row[item]] * n_variants + variant, hits[item].float()
        )

    # -- results ----------------------------------------------------------------------
    def unit_counts(self) -> pd.DataFrame:
        """Per-unit counts as a tidy frame (categorical keys, float32 values); duplicate keys summed."""
        frames = [self._frame(*chunk) for chunk in self.chunks_]
        if self.baseline_chunks_:
            frames.append(self._baseline_frame())
        if not frames:
            return pd.DataFrame(columns=UNIT_COLUMNS)
        return sum_duplicates(concat_compact(frames))

    def _baseline_frame(self) -> pd.DataFrame:
        keys = [key for chunk in self.baseline_chunks_ for key in chunk[0]]
        n = np.concatenate([chunk[1] for chunk in self.baseline_chunks_])  # [row]
        hits = np.concatenate([chunk[2] for chunk in self.baseline_chunks_])  # [row, variant]
        n_variants = len(self.variants)
        row = np.repeat(np.arange(len(keys)), n_variants)
        size = row.size
        return pd.DataFrame(
            {
                "analysis": pd.Categorical.from_codes(
                    np.zeros(size, dtype=np.int8), [self.analysis]
                ),
                "measure": pd.Categorical.from_codes(np.zeros(size, dtype=np.int8), [self.measure]),
                "label": pd.Categorical([k[1] for k in keys])[row],
                "unit": pd.Categorical([k[0] for k in keys])[row],
                "layer": np.full(size, -1, dtype=np.int16),
                "head": np.full(size, -1, dtype=np.int16),
                "direction": pd.Categorical.from_codes(np.zeros(size, dtype=np.int8), [""]),
                "variant": pd.Categorical.from_codes(
                    np.tile(np.arange(n_variants), len(keys)), list(self.variants)
                ),
                "n": n[row],
                "hits": hits.ravel(),
                "mass": np.full(size, np.nan, dtype=np.float32),
            }
        )

    def _frame(self, keys, values: np.ndarray, n: np.ndarray) -> pd.DataFrame:
        shape = values.shape  # [layer, direction, row, head]
        n_layers, n_dirs, n_rows, n_heads = shape
        layer = np.broadcast_to(
            np.asarray(self.layers, dtype=np.int16)[:, None, None, None], shape
        ).ravel()
        direction = np.broadcast_to(
            np.arange(n_dirs, dtype=np.int8)[None, :, None, None], shape
        ).ravel()
        row = np.broadcast_to(np.arange(n_rows)[None, None, :, None], shape).ravel()
        head = np.broadcast_to(
            np.arange(n_heads, dtype=np.int16)[None, None, None, :], shape
        ).ravel()
        units = pd.Categorical([k[0] for k in keys])
        labels = pd.Categorical([k[1] for k in keys])
        flat = values.ravel().astype(np.float32)
        nan = np.full(flat.shape, np.nan, dtype=np.float32)
        return pd.DataFrame(
            {
                "analysis": pd.Categorical.from_codes(
                    np.zeros(flat.size, dtype=np.int8), [self.analysis]
                ),
                "measure": pd.Categorical.from_codes(
                    np.zeros(flat.size, dtype=np.int8), [self.measure]
                ),
                "label": labels[row],
                "unit": units[row],
                "layer": layer,
                "head": head,
                "direction": pd.Categorical.from_codes(direction, list(self.directions)),
                "variant": pd.Categorical.from_codes(np.zeros(flat.size, dtype=np.int8), [""]),
                "n": n[row, direction],
                "hits": flat if self.value == "hits" else nan,
                "mass": flat if self.value == "mass" else nan,
            }
        )


CATEGORICAL = ["analysis", "measure", "label", "unit", "direction", "variant"]


def compact(frame: pd.DataFrame) -> pd.DataFrame:
    """Unit counts with categorical keys, int16 layer/head and float32 values (frames saved
    before measures existed are `weights`)."""
    frame = frame.copy()
    if "measure" not in frame:
        frame["measure"] = WEIGHTS
    for column in CATEGORICAL:
        frame[column] = frame[column].astype(str).astype("category")
    for column in ("layer", "head"):
        frame[column] = frame[column].astype(np.int16)
    for column in ("n", "hits", "mass"):
        frame[column] = frame[column].astype(np.float32)
    return frame[UNIT_COLUMNS]


def concat_compact(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate unit-count frames keeping the key columns categorical."""
    from pandas.api.types import union_categoricals

    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=UNIT_COLUMNS)
    out = {}
    for column in UNIT_COLUMNS:
        if column in CATEGORICAL:
            out[column] = union_categoricals([pd.Categorical(f[column]) for f in frames])
        else:
            out[column] = np.concatenate([f[column].to_numpy() for f in frames])
    return pd.DataFrame(out)


def sum_duplicates(frame: pd.DataFrame) -> pd.DataFrame:
    """Sum rows that share (analysis, measure, label, unit, layer, head, direction, variant)."""
    keys = UNIT_KEYS
    if not frame.duplicated(keys).any():
        return frame.reset_index(drop=True)
    summed = frame.groupby(keys, observed=True, sort=False)[["n", "hits", "mass"]].sum(min_count=1)
    return summed.reset_index()[UNIT_COLUMNS]


def query_rows(att, batch) -> tuple[int, int, int, int, bool, bool]:
    """(w0, w1, p0, p1, first, last): the word rows `w0:w1` in `att.words` and the piece rows
    `p0:p1` in `att.pieces` of this block (the block API), first / last block of the layer.
    An attention object without block attributes (unblocked, or a test's stand-in) is one
    block of every row."""
    w0, w1 = getattr(att, "query_words", None) or (0, batch.max_words)
    p0, p1 = getattr(att, "query_pieces", None) or (0, getattr(batch, "n_pieces", 0))
    return w0, w1, p0, p1, getattr(att, "first", True), getattr(att, "last", True)


def first_argmax(scores: torch.Tensor, dim: int) -> torch.Tensor:
    """Index of the maximum along `dim`; ties go to the lowest index (METHODS §2).

    `max(dim).indices` is documented to return the first maximal value, like argmax,
    and is the faster of the two on CPU (2-5x on attention blocks).
    """
    return scores.max(dim=dim).indices


def word_fill(batch, drop_self: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(keep, fill), each [batch, 1, word, word], built once per batch: where `keep` is False
    the attention is replaced by `fill` before an argmax over words: 0 for self-attention
    (METHODS §1, with `drop_self`), -1 for padding (never chosen). Cached on the batch: every
    scorer and measure of the batch shares them."""
    cache = batch.__dict__.setdefault("_headprobe_fill", {})
    if drop_self not in cache:
        cache[drop_self] = _word_fill(batch, drop_self)
    return cache[drop_self]


def _word_fill(batch, drop_self: bool) -> tuple[torch.Tensor, torch.Tensor]:
    valid = (
        batch.word_mask[:, None, :, None] & batch.word_mask[:, None, None, :]
    )  # [batch, 1, word, word]
    keep = valid.clone()
    if drop_self:
        keep &= ~torch.eye(batch.max_words, dtype=torch.bool, device=batch.device)
    fill = torch.where(valid, 0.0, -1.0)
    return keep, fill


def masked_word_attention(att, batch, drop_self: bool = True, prepared=None) -> torch.Tensor:
    """[batch, head, word, word]: word-to-word attention, specials dropped, padding = -1,
    and with `drop_self` the attention a word pays to itself set to 0. Rows are not
    renormalised. `prepared` is `word_fill(batch, drop_self)`, to build it once per batch."""
    keep, fill = prepared if prepared is not None else word_fill(batch, drop_self)
    return torch.where(keep, att.words[..., : batch.max_words], fill)


# ------------------------------------------------------------------ optional hooks


@runtime_checkable
class RunsModel(Protocol):
    """A scorer that runs the model itself and ignores the attention (head ablation, importance):
    the engine hands it the model before the run (`use_model`) and calls `model_pass(model,
    batch)` for every batch; `objective` says what it scores (`headprobe.model.objectives`)."""

    def use_model(self, model, tokenizer, stack: str | None = None) -> None: ...

    def model_pass(self, model, batch) -> None: ...


@runtime_checkable
class ReadsConventions(Protocol):
    """A scorer whose labels or baselines follow the run's conventions
    (`headprobe.inputs.conventions`): the engine hands the preset over before binding it."""

    def use_conventions(self, conventions) -> None: ...


@runtime_checkable
class TakesHeads(Protocol):
    """A scorer that scores some heads only (`--heads`): the run hands them over, None for all."""

    def use_heads(self, heads) -> None: ...


@runtime_checkable
class KeepsRecord(Protocol):
    """A scorer that keeps numbers beside its counts (a weights-only analysis such as the OV
    circuits; the pruning curve's order): `describe()` is what the run's summary records."""

    def describe(self) -> dict: ...
