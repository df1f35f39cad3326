"""The scorer contract: the streaming accumulator every analysis's scorer builds on.

    state = scorer.prepare(batch)                 # -> BatchState: rows, trials, baselines, own values
    scorer.update(attention, state)               # a batch's layers and measures in one call
    scorer.end_batch(state)                       # the batch's rows into the tallies; state dropped

A scorer turns one layer's attention into counts and keeps nothing else. For each batch it
declares its *rows*, one per (unit, label), with the number of trials `n` of each row (`prepare`
returns them in a `BatchState`, with what else the scorer needs of the batch in `state.own`);
`update` adds per-head hits (or attention mass) of every layer it is handed and every measure to
those rows on the device, in one call (so the launches per batch do not grow with depth);
`end_batch` adds the batch into the scorer's tallies, one per measure (per fold and bootstrap
resample, METHODS §5). The state is a value: nothing of a batch lives on the scorer, so a batch
retried after running out of memory, a query block, or a second measure cannot see another's.
With `keep_units` the per-unit rows are also kept (`unit_counts()`), for small corpora,
debugging and the exact multinomial bootstrap.

`attention` (`scoring.layer_attention.LayerAttention`) carries two leading axes: the layers it holds
(`attention.layers`: every layer of the batch where memory allows, else a group of them, or one
layer in query blocks) and the measures, in the order of `scorer.measures`: `attention.words`
[layer, measure, batch, head, word, word + 2], `attention.pieces` [layer, measure, batch, head,
query, key]. A scorer computes with `...` for those axes; `add` and `add_both` take values
[layer, measure, item, head].

Nothing in `update` reads a value back to the host (no `.item()`, `nonzero`, boolean indexing,
`if tensor`): whatever depends only on the batch (rows, indices, the baselines' hit pairs) is
built once, in `prepare`, from host arrays (`both_index` for `add_both`).

Baselines need no attention: a scorer names them in `variants` and fills
`state.baseline_hits` ([row, variant]; the trials are the row's `n`) in `prepare`; they come out
as rows with `variant` set and `layer = head = -1`.

Scorer kinds: a `CountScorer` reads attention; a `ModelScorer` (`scoring.model_scorer`) runs the
model itself and returns its state from `model_pass`; a `WeightsScorer` (`scoring.weights_scorer`)
reads only the weights, once. Optional hooks are declared as protocols (`RunsModel`,
`ReadsConventions`, `TakesHeads`, `TakesGroups`, `ReadsOptions`, `KeepsRecord`): the engine and the run ask
`isinstance(scorer, RunsModel)`, never `hasattr`. A scorer that runs a second pass over the
sentences says so in `second_pass`, and one that scores the language-model loss in `needs_lm_head`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import pandas as pd

from headprobe.core.seeds import SEED
from headprobe.model.control import TRAINED
from headprobe.scoring.measures import ARGMAX, WEIGHTS, tally_key
from headprobe.scoring.tally import N_BOOT, Tally

if TYPE_CHECKING:
    import torch

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

    def unit_rows(self, batch, n_for) -> tuple[list, list, np.ndarray]:
        """(keys, n, first_row [batch], host): rows for every unit in the batch, `n_for(example,
        label)` giving the trials. A unit's labels get consecutive rows, so label k of example b
        sits at row first_row[b] + k."""
        rows, first_row = RowIndex(), []
        for example in batch.examples:
            first_row.append(
                rows.count(example.unit, self.labels[0], n_for(example, self.labels[0]))
            )
            for label in self.labels[1:]:
                rows.count(example.unit, label, n_for(example, label))
        return rows.keys, rows.n, np.array(first_row, dtype=np.int64)


@dataclass
class BothIndex:
    """A batch's (item, baseline) pairs where the baseline hits, for `CountScorer.add_both`."""

    item: torch.Tensor  # [pair] the item (index into the hits' item axis)
    slot: torch.Tensor  # [pair] label x variant slot of `BatchState.both`


@dataclass
class BatchState:
    """What a scorer keeps of one batch, handed as a value from `prepare` to every `update` and to
    `end_batch` (the scorer itself keeps only its tallies): its (unit, label) rows and their
    trials, the counts of every measure, layer, direction and head, the baseline hits, the
    per-label extras, and `own`, the scorer's own per-batch values (arcs, masks, ...)."""

    keys: list[tuple[str, str]]  # (unit, label) per row
    n: np.ndarray  # [row, direction] trials
    values: torch.Tensor  # [measure, layer, direction, row, head] hits or mass
    baseline_hits: np.ndarray  # [row, variant]
    extra: dict[str, np.ndarray]  # name -> [row, direction]
    labels: list[str]  # this batch's labels, in order of first use
    label_index: np.ndarray  # [row]: index into `labels` (host)
    both: torch.Tensor | None = None  # [measure, layer, direction, label*variant, head]: add_both
    own: Any = None  # the scorer's own per-batch values
    batch: Any = None  # the batch itself (its word maps, sizes, device)


class CountScorer:
    """Base of every scorer: per-batch (unit, label) rows, streamed into one `Tally` per measure.

        state = scorer.prepare(batch)                 # rows, baselines, the scorer's own values
        scorer.update(attention, state)               # its layers (attention.layers) and measures
        scorer.end_batch(state)                       # the batch's counts into the tallies

    Class attributes a scorer declares (its analysis's registry entry reads them):
    `analysis`, `directions`, `value` ("hits" or "mass"), `variants` (baselines),
    `extras` (per-label counts that do not depend on a head, e.g. `unreachable`).
    Nothing of a batch is kept on the scorer: `prepare` returns it, `update` and `end_batch`
    receive it; what the scorer learns (its tallies, and with `keep_units` the per-unit rows) is
    added to through methods.
    """

    analysis = ""
    directions: tuple[str, ...] = ("",)
    value = "hits"  # "hits" (counts) or "mass" (summed attention)
    variants: tuple[str, ...] = ()  # baseline names (rows with layer = head = -1)
    extras: tuple[str, ...] = ()  # per-label counts without a head, [row, direction]
    bootstrap = True  # resampled totals (for selection and intervals)
    pairs = False  # keyed by (receiver head, sender layer, sender head): `scoring.pair_scorer`
    # Query blocks (`headprobe run --query-block N`): True when `update` accepts a layer in
    # blocks of query rows (`query_rows`): `att.words` holds only the word rows `att.query_words`,
    # `att.pieces` only the piece rows `att.query_pieces`, `att.first` / `att.last` mark the
    # layer's first and last block, every row comes once. False: whole matrices (no blocks).
    blocks = False
    # The model this instance counts (`headprobe.model.control`): "trained", or "control" for the
    # random-init control's instance (its tallies are kept apart: `tally_key`).
    model = TRAINED
    # Measures (METHODS §7, `headprobe.scoring.measures`): the measures this instance counts, all
    # at once (`attention` carries a leading measure axis in this order; one tally each), and how
    # it reads one: ARGMAX (N = a * ||v W_O||) or MASS (N with each row normalised to sum 1).
    # Under `weights` both are the weights.
    measures: tuple[str, ...] = (WEIGHTS,)
    reads = ARGMAX
    reads_attention = True  # False: it runs the model itself, or reads only its weights
    # Run shape (`headprobe.api`): scored in a second pass over the sentences, after the first
    # pass's tallies (the pruning curve's order); scores the loss under a language-model head.
    second_pass = False
    needs_lm_head = False

    def __init__(self):
        self.chunks_: list[tuple] = []  # per-unit rows, only with keep_units
        self.baseline_chunks_: list[tuple] = []
        self.tallies_: dict[str, Tally] = {}  # tally key -> Tally, one per measure
        self.n_layers = self.n_heads = None

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
        causal: bool = False,
    ) -> None:
        """Before the run: the layers and heads counted, one tally per measure (kept when the
        scorer was bound before: a resumed checkpoint's); `causal`: the stack's, resolved once."""
        self.n_layers, self.n_heads, self.causal = n_layers, n_heads, causal
        self.layers = list(range(n_layers)) if layers is None else sorted(int(x) for x in layers)
        self.layer_slot = {layer: slot for slot, layer in enumerate(self.layers)}
        self.keep_units = keep_units
        self.seed = seed
        for measure, key in zip(self.measures, self.tally_keys()):
            if key not in self.tallies_:
                self.tallies_[key] = Tally(
                    self.analysis,
                    directions=self.directions,
                    variants=self.variants,
                    layers=self.layers,
                    n_heads=n_heads,
                    senders=self.layers if self.pairs else (),
                    value=self.value,
                    resamples=n_boot,
                    bootstrap=self.bootstrap,
                    seed=seed,
                    extras=self.extras,
                    device=device,
                    model=self.model,
                    measure=measure,
                )

    def tally_keys(self) -> list[str]:
        """The names of this scorer's tallies, one per measure (`measures.tally_key`)."""
        return [tally_key(self.analysis, measure, self.model) for measure in self.measures]

    @property
    def tally_(self) -> Tally | None:
        """The first measure's tally (the only one of a one-measure scorer), None before `bind`."""
        return next(iter(self.tallies_.values()), None)

    @property
    def key(self) -> str:
        """The name of the first measure's tally (`measures.tally_key`): the analysis, `@<measure>`
        beyond weights, `~control` for the control's."""
        return tally_key(self.analysis, self.measures[0], self.model)

    def new_state(self, batch, keys, n, own=None) -> BatchState:
        """A batch's state with rows `keys` [(unit, label)] and trials `n` ([row] or [row,
        direction]), zero counts, baseline hits and extras, and the scorer's `own` values."""
        import torch

        n = np.asarray(n, dtype=np.float64)
        if n.ndim == 1:
            n = np.repeat(n[:, None], len(self.directions), axis=1)
        names = [k[1] for k in keys]
        labels = list(dict.fromkeys(names))  # in order of first use
        slot = {name: i for i, name in enumerate(labels)}
        return BatchState(
            keys=list(keys),
            n=n.reshape(len(keys), len(self.directions)),
            values=torch.zeros(
                len(self.measures),
                len(self.layers),
                len(self.directions),
                len(keys),
                self.n_heads * (len(self.layers) * self.n_heads if self.pairs else 1),
                dtype=torch.float64 if self.value == "mass" else torch.float32,
                device=batch.device,
            ),
            baseline_hits=np.zeros((len(keys), len(self.variants)), dtype=np.float32),
            extra={
                name: np.zeros((len(keys), len(self.directions)), dtype=np.int64)
                for name in self.extras
            },
            labels=labels,
            label_index=np.array([slot[name] for name in names], dtype=np.int64),
            own=own,
            batch=batch,
        )

    def prepare(self, batch) -> BatchState:
        """The batch's rows, baseline hits and the scorer's own per-batch values."""
        raise NotImplementedError

    def update(self, att, state: BatchState) -> None:
        """Add the counts of the layers `att.layers` (every measure of `att` at once) into
        `state`; called once per batch, or once per group of layers where memory asks for it."""
        raise NotImplementedError

    def end_batch(self, state: BatchState) -> None:
        """Add the batch's rows into the tallies (and, with `keep_units`, the per-unit rows)."""
        if not state.keys:
            return
        units, labels = [k[0] for k in state.keys], [k[1] for k in state.keys]
        for m, tally in enumerate(self.tallies_.values()):
            values = state.values[m].permute(2, 0, 3, 1)  # [row, layer, head, direction]
            tally.add(units, labels, values, state.n, state.baseline_hits, state.extra)
            if state.both is not None:  # -> [label, layer, head, direction, variant]
                both = state.both[m].reshape(
                    len(self.layers),
                    len(self.directions),
                    len(state.labels),
                    len(self.variants),
                    self.n_heads,
                )
                tally.add_both(state.labels, both.permute(2, 0, 4, 1, 3))
        if self.keep_units:
            kept = state.values.cpu().numpy()  # [measure, layer, direction, row, head]
            kept = np.ascontiguousarray(kept.astype(smallest_dtype(kept, self.value == "hits")))
            self.chunks_.append((state.keys, kept, state.n.astype(np.float32)))
            if self.variants:  # (keys, trials [row], hits [row, variant])
                self.baseline_chunks_.append(
                    (state.keys, state.n[:, 0].astype(np.float32), state.baseline_hits)
                )

    def finish(self) -> None:
        """The corpus is done: add what is still buffered into the totals."""
        for tally in self.tallies_.values():
            tally.flush()

    # -- helpers for subclasses -------------------------------------------------------
    def slots(self, att) -> slice:
        """The slots of `att.layers` (or of a tuple of layers) in this scorer's layers (a slice:
        the layers a batch hands on together are consecutive among those scored)."""
        layers = att if isinstance(att, tuple) else att.layers
        first = self.layer_slot[layers[0]]
        return slice(first, first + len(layers))

    def add(self, state: BatchState, att, direction: int, row, values) -> None:
        """Add `values` [layer, measure, item, head] (the layers of `att`, or of a tuple of
        layers) to rows `row` [item] of this direction."""
        target = state.values[:, self.slots(att), direction]  # [measure, layer, row, head]
        if values.dtype != target.dtype:
            values = values.to(target.dtype)
        target.index_add_(2, row, values.transpose(0, 1))

    def add_both(self, state: BatchState, att, direction: int, index: BothIndex, hits) -> None:
        """Count items hit by a head and by a baseline: `hits` [layer, measure, item, head] (0/1)
        of the items that `index` (`both_index`, built in `prepare`) pairs with the baselines that
        hit them; McNemar's discordant counts follow (head only = hits - both, baseline only =
        baseline hits - both)."""
        import torch

        if state.both is None:
            state.both = torch.zeros(
                len(self.measures),
                len(self.layers),
                len(self.directions),
                len(state.labels) * len(self.variants),
                self.n_heads,
                dtype=torch.float32,
                device=hits.device,
            )
        target = state.both[:, self.slots(att), direction]  # [measure, layer, label*variant, head]
        picked = hits.index_select(2, index.item)  # [layer, measure, pair, head]
        if picked.dtype != target.dtype:
            picked = picked.to(target.dtype)
        target.index_add_(2, index.slot, picked.transpose(0, 1))

    def both_index(self, state: BatchState, rows: np.ndarray, base: np.ndarray) -> BothIndex:
        """The (item, baseline) pairs where baseline hits `base` [item, variant] (host, 0/1) are 1,
        items in rows `rows` [item] (host): built once per batch, so `add_both` reads nothing
        back. Baseline hits are sparse (an arc's head sits at one offset)."""

        from headprobe.inputs.batching import on_device

        item, variant = np.nonzero(np.asarray(base))
        label = state.label_index[np.asarray(rows, dtype=np.int64)[item]]
        device = state.batch.device if state.batch is not None else "cpu"
        return BothIndex(
            item=on_device(item.astype(np.int64), device),
            slot=on_device((label * len(self.variants) + variant).astype(np.int64), device),
        )

    # -- results ----------------------------------------------------------------------
    def unit_counts(self) -> pd.DataFrame:
        """Per-unit counts as a tidy frame (categorical keys, float32 values); duplicate keys summed."""
        frames = [
            self._frame(keys, values[m], n, measure)
            for keys, values, n in self.chunks_
            for m, measure in enumerate(self.measures)
        ]
        if self.baseline_chunks_:
            frames += [self._baseline_frame(measure) for measure in self.measures]
        if not frames:
            return pd.DataFrame(columns=UNIT_COLUMNS)
        return sum_duplicates(concat_compact(frames))

    def _baseline_frame(self, measure: str) -> pd.DataFrame:
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
                "measure": pd.Categorical.from_codes(np.zeros(size, dtype=np.int8), [measure]),
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

    def _frame(self, keys, values: np.ndarray, n: np.ndarray, measure: str) -> pd.DataFrame:
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
                "measure": pd.Categorical.from_codes(np.zeros(flat.size, dtype=np.int8), [measure]),
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
    """Built on the host from the batch's word counts, then moved once."""
    from headprobe.inputs.batching import on_device

    mask = batch.word_mask_host  # [batch, word]
    valid = mask[:, None, :, None] & mask[:, None, None, :]  # [batch, 1, word, word]
    keep = valid & ~np.eye(batch.max_words, dtype=bool) if drop_self else valid
    fill = np.where(valid, 0.0, -1.0).astype(np.float32)
    return on_device(keep, batch.device), on_device(fill, batch.device)


def masked_word_attention(att, batch, drop_self: bool = True, prepared=None) -> torch.Tensor:
    """[..., batch, head, word, word] (a leading measure axis kept): word-to-word attention,
    specials dropped, padding = -1,
    and with `drop_self` the attention a word pays to itself set to 0. Rows are not
    renormalised. `prepared` is `word_fill(batch, drop_self)`, to build it once per batch."""
    import torch

    keep, fill = prepared if prepared is not None else word_fill(batch, drop_self)
    return torch.where(keep, att.words[..., : batch.max_words], fill)


# ------------------------------------------------------------------ optional hooks


@runtime_checkable
class RunsModel(Protocol):
    """A scorer that runs the model itself and ignores the attention (head ablation, importance):
    the engine hands it the model before the run (`use_model`) and calls `model_pass(model,
    batch)` for every batch, which returns the batch's state (in place of `prepare`);
    `objective` says what it scores (`headprobe.model.objectives`)."""

    def use_model(self, model, tokenizer, stack: str | None = None) -> None: ...

    def model_pass(self, model, batch) -> BatchState: ...


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
class ReadsOptions(Protocol):
    """A scorer that reads run options of its own (`Analysis.options`): the run hands them over
    by name before the pass, {option: value} (e.g. the causal check's number of heads)."""

    def use_options(self, options: dict) -> None: ...


@runtime_checkable
class ReadsInputs(Protocol):
    """A scorer that reads the pass's inputs once before scoring them (mean and resample
    ablation: the heads' means, the partners): the run hands it the examples after binding."""

    def use_inputs(self, examples) -> None: ...


@runtime_checkable
class KeepsRecord(Protocol):
    """A scorer that keeps numbers beside its counts (a weights-only analysis such as the OV
    circuits; the pruning curve's order): `describe()` is what the run's summary records."""

    def describe(self) -> dict: ...
