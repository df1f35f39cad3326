"""Parsing from attention (Clark et al. 2019 section 6; Htut et al. 2019): all heads together.

Arcs: every arc of a relation other than root and punct (METHODS §2's ALL; under every
conventions preset, as the papers' classifiers leave punctuation out and this one has no ROOT
candidate). Word-level attention A = `att.words` without the special columns.

- **Attention-only classifier** (Clark et al.'s "Attn" probe; `probe` in the tables): for a
  dependent i and a candidate
  head j != i (any word of the sentence), the features are every head's A[i, j] and A[j, i]
  (2 x layers x heads). A candidate's score is w . phi(i, j); p(j | i) is the softmax over
  the candidates; the prediction is the argmax (ties: the lowest index). w is fitted by
  L-BFGS on the mean negative log-likelihood of the gold heads (+ `l2` |w|^2 / 2) on one
  fold (METHODS §5 folds by unit hash) and evaluated on the other, both ways: `probe` hits are
  held-out, pooled over the two evaluations (no other number is reported for it).
  The features stream to disk (float16, one file per fold, written batch by batch) and are
  read back in chunks, so memory does not grow with the corpus.
- **Trees** (Htut et al.): `mst` cells: per head, the maximum spanning tree over the
  symmetric scores A[d, h] + A[h, d] (rows not renormalised); its UUAS counts a gold arc
  found as an undirected tree edge. `probe_mst`: the maximum spanning arborescence
  (Chu-Liu-Edmonds, dummy ROOT with one child) over the held-out classifier's log p(h | d);
  its UUAS likewise. `chain` (UUAS of the tree linking adjacent words) is their baseline.
- **Single heads** on the same arcs: `dep->head` / `head<-dep` argmax hits (METHODS §2; under
  `headprobe` conventions the same counts as the dependency analysis's ALL) and the conventions' offset
  baselines, so that every comparison is paired (same arcs, same bootstrap weights).

Tally (one label, ALL): cells [layer, head, direction] for `dep->head`, `head<-dep`, `mst`;
variants (rows with layer = head = -1): `probe` (UAS), `probe_mst` (UUAS), the offset
baselines (UAS) and `chain` (UUAS). Trials: the arcs. Derived tables: `parse_scores`
(the classifier, best head, best baseline; held-out and in-sample, with intervals), `parse_gaps`
(paired differences with intervals) and `parse_heads` (every head's argmax accuracy and
MST UUAS with intervals).

Not run by default (`--analyses parsing`). A run resumed from a checkpoint cannot finish
it (the features of the batches before the checkpoint are gone): it says so.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from headprobe.extend import (
    SENTENCES,
    Analysis,
    BatchState,
    CountScorer,
    RowIndex,
    masked_word_attention,
    register,
)
from headprobe.inputs.conventions import Conventions, get_conventions
from headprobe.inputs.corpora.base import ALL
from headprobe.scoring.measures import tally_key
from headprobe.scoring.scorer_base import word_fill
from headprobe.stats.estimates import estimate, paired_gap, selected
from headprobe.stats.trees import max_arborescence, max_spanning_tree, undirected_hits
from headprobe.studies.parsing.probe import (
    L2,
    MAX_ITER,
    FoldFeatures,
    SentenceRecord,
    fit_classifier,
    log_softmax_rows,
    pair_features,
    sentence_scores,
    training_chunks,
)

if TYPE_CHECKING:
    import torch

UNSCORED = ("root", "punct")
# the classifier's rows in the tables keep the papers' name, "probe" (a trained classifier, not the
# synthetic inputs of `headprobe.inputs.probes`)
CLASSIFIER, CLASSIFIER_MST, CHAIN = "probe", "probe_mst", "chain"
DIRECTIONS = ("dep->head", "head<-dep", "mst")


def parse_arcs(example) -> list[tuple[int, int, str]]:
    """(dependent, head, relation) of every arc the parsing analysis scores."""
    if example.heads is None:
        return []
    return [
        (i, h, rel)
        for i, (h, rel) in enumerate(zip(example.heads, example.deprels))
        if h >= 0 and rel not in UNSCORED
    ]


# ---------------------------------------------------------------- the scorer


class ParsingScorer(CountScorer):
    analysis = "parsing"
    directions = DIRECTIONS
    variants = (CLASSIFIER, CLASSIFIER_MST)

    def __init__(
        self,
        conventions: Conventions | str | None = None,
        work_dir: str | None = None,
        l2: float = L2,
        max_iter: int = MAX_ITER,
    ):
        super().__init__()
        self.work_dir, self.l2, self.max_iter = work_dir, l2, max_iter
        self.use_conventions(conventions)
        self.stores_: dict[str, dict] = {}  # measure -> fold -> FoldFeatures (opened by `bind`)
        self._tmp = None
        self.classifier_weights_: dict[tuple, np.ndarray] = {}  # (measure, k): trained on fold k
        self.notes_: list[str] = []

    def use_conventions(self, conventions) -> None:
        """The offset baselines follow `conventions` (the arcs do not: always non-root, non-punct)."""
        conventions = get_conventions(conventions)
        variants = (CLASSIFIER, CLASSIFIER_MST) + conventions.variants + (CHAIN,)
        if self.tally_ is not None and variants != self.variants:
            raise ValueError("conventions must be set before the scorer is bound")
        self.conventions = conventions
        self.variants = variants

    # -- the pass -------------------------------------------------------------------------
    def bind(self, n_layers, n_heads, layers=None, **options) -> None:
        """Bound as any scorer, and the classifier's feature files opened (one per measure and
        fold, in a temporary directory removed by `finish`)."""
        super().bind(n_layers, n_heads, layers, **options)
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="headprobe-parsing-", dir=self.work_dir)
        n_features = 2 * len(self.layers) * self.n_heads
        for measure in self.measures:
            self.stores_.setdefault(
                measure,
                {
                    f: FoldFeatures(
                        os.path.join(self._tmp.name, f"{measure}-fold{f}.f16"), n_features
                    )
                    for f in (0, 1)
                },
            )

    def prepare(self, batch) -> BatchState:
        import torch

        rows = RowIndex()
        arcs = []  # (batch row, dependent, head, row)
        for b, example in enumerate(batch.examples):
            scored = parse_arcs(example)
            if scored:
                row = rows.count(example.unit, ALL, len(scored))
                arcs.extend((b, i, h, row) for i, h, _ in scored)
        state = self.new_state(batch, rows.keys, rows.n)
        table = np.array(arcs, dtype=np.int64).reshape(-1, 4)
        n_words = np.array([len(ex.words) for ex in batch.examples], dtype=np.int64)
        base = self.conventions.baseline_hits(table[:, 1], table[:, 2], n_words[table[:, 0]])
        chain = (np.abs(table[:, 1] - table[:, 2]) == 1).astype(np.float32)[:, None]
        hits = np.zeros((len(table), len(self.variants)), dtype=np.float32)
        hits[:, 2 : 2 + base.shape[1]] = base
        hits[:, -1:] = chain
        np.add.at(state.baseline_hits, table[:, 3], hits)
        tensors = torch.from_numpy(table).to(batch.device)
        b, dep, head, row = tensors.unbind(1)
        state.own = ParseArcs(
            arcs, b, dep, head, row, torch.from_numpy(n_words).to(batch.device), word_fill(batch)
        )
        return state

    def update(self, att, state) -> None:
        arcs, batch = state.own, state.batch
        words = att.words[..., : batch.max_words]  # [layer, measure, batch, head, w, w]
        n_layers, n_measures, n_batch, n_heads, w, _ = words.shape
        # [measure, batch, layer x head, w, w]: heads layer-major
        arcs.attention.append(
            words.permute(1, 2, 0, 3, 4, 5).reshape(n_measures, n_batch, n_layers * n_heads, w, w)
        )
        if len(arcs.table) == 0:
            return
        scores = masked_word_attention(att, batch, prepared=arcs.fill)
        for direction, top in enumerate((scores.max(dim=-1), scores.max(dim=-2))):
            # [layer, measure, arc, head]
            chosen = top.indices.transpose(-1, -2)[..., arcs.b, arcs.dep, :]
            alive = top.values.transpose(-1, -2)[..., arcs.b, arcs.dep, :] > 0
            hits = ((chosen == arcs.head[:, None]) & alive).float()
            self.add(state, att, direction, arcs.row, hits)

    def _trees(self, state, attention: torch.Tensor) -> None:
        """`mst` hits: every head's maximum spanning tree over A[d, h] + A[h, d], all layers and
        measures at once (`attention` [measure, batch, K, word, word])."""
        arcs = state.own
        m, b, k, w, _ = attention.shape
        symmetric = (attention + attention.transpose(-1, -2)).reshape(m * b * k, w, w)
        lengths = arcs.n_words.repeat_interleave(k).repeat(m)  # [measure x batch x K]
        parent = max_spanning_tree(symmetric, lengths).reshape(m, b, k, w)
        at_dep = parent.permute(0, 1, 3, 2)[:, arcs.b, arcs.dep]  # [measure, arc, K]
        at_head = parent.permute(0, 1, 3, 2)[:, arcs.b, arcs.head]
        edge = ((at_dep == arcs.head[None, :, None]) | (at_head == arcs.dep[None, :, None])).float()
        n_layers = len(self.layers)
        # [measure, arc, layer, head] -> [layer, measure, arc, head]: every layer in one call
        every = edge.reshape(m, len(arcs.b), n_layers, self.n_heads).permute(2, 0, 1, 3)
        self.add(state, tuple(self.layers), 2, arcs.row, every)

    def end_batch(self, state) -> None:
        import torch

        arcs, batch = state.own, state.batch
        if arcs.attention:
            attention = torch.cat(arcs.attention, dim=2)  # [measure, batch, K, word, word]
            if arcs.b.numel():
                self._trees(state, attention)
            by_example: dict[int, list] = {}
            for b, i, h, _ in arcs.table:
                by_example.setdefault(b, []).append((i, h))
            tally = self.tally_
            for b, example in enumerate(batch.examples):
                n = len(example.words)
                if n < 2:
                    continue
                pairs = by_example.get(b, [])
                record = SentenceRecord(
                    example.unit,
                    n,
                    0,
                    np.array([p[0] for p in pairs], dtype=np.int64),
                    np.array([p[1] for p in pairs], dtype=np.int64),
                )
                fold = tally.draws(example.unit)[0]
                for m, measure in enumerate(self.measures):
                    features = pair_features(attention[m, b], n).cpu().numpy()
                    self.stores_[measure][fold].append(record, features)
        super().end_batch(state)

    # -- after the pass: train, evaluate held-out, decode trees --------------------------------
    def finish(self) -> None:
        super().finish()
        try:
            for measure, store in self.stores_.items():
                key = tally_key(self.analysis, measure, self.model)
                self._fit_classifiers(store, self.tallies_[key], measure)
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None
            self.stores_ = {}

    def _fit_classifiers(self, store, tally, measure: str) -> None:
        seen = tally.labels.get(ALL)
        streamed = 0 if seen is None else int(seen.n[:, 0, 0].sum())
        stored = store[0].arcs + store[1].arcs
        if streamed != stored:
            raise RuntimeError(
                f"parsing: the classifier's features cover {stored} arcs, the counts {streamed}: a run "
                "resumed from a checkpoint cannot train the classifier (its features were not "
                "checkpointed); run again without --resume"
            )
        if not store[0].arcs or not store[1].arcs:
            self.notes_.append(
                "parsing: one fold has no arcs, so the classifier has no held-out evaluation"
            )
            return
        units, base = [], []
        for fold in (0, 1):
            train = store[1 - fold]
            chunks, n_items = training_chunks(train)
            weights = fit_classifier(chunks, train.n_features, n_items, self.l2, self.max_iter)
            self.classifier_weights_[measure, 1 - fold] = weights
            for record, scores in sentence_scores(store[fold], weights):
                if not len(record.dependents):
                    continue
                predicted = scores.argmax(axis=1)  # ties: lowest index
                right = predicted[record.dependents] == record.heads
                tree = max_arborescence(log_softmax_rows(scores))  # arcs h -> d: log p(h | d)
                mst = undirected_hits(tree, record.dependents, record.heads)
                hits = np.zeros(len(self.variants), dtype=np.float32)
                hits[0], hits[1] = right.sum(), mst.sum()
                units.append(record.unit)
                base.append(hits)
        if units:
            tally.add(
                units,
                [ALL] * len(units),
                None,
                np.zeros((len(units), len(self.directions))),
                np.stack(base),
            )
            tally.flush()


@dataclass
class ParseArcs:
    """A batch's arcs on the device, and its layers' word attention as they come
    (`ParsingScorer.prepare`; the classifier's features and the trees are made in `end_batch`)."""

    table: list  # (batch row, dependent, head, row) per arc
    b: torch.Tensor  # [arc]
    dep: torch.Tensor  # [arc]
    head: torch.Tensor  # [arc]
    row: torch.Tensor  # [arc]
    n_words: torch.Tensor  # [batch]
    fill: tuple  # word_fill(batch)
    attention: list = field(default_factory=list)  # per layer: [measure, batch, head, word, word]


# ---------------------------------------------------------------- derived tables

SCORE_COLUMNS = [
    "metric",
    "predictor",
    "selection",
    "heads",
    "variant",
    "n",
    "hits",
    "accuracy",
    "ci_low",
    "ci_high",
    "note",
]
GAP_COLUMNS = ["metric", "predictor", "versus", "selection", "gap", "gap_low", "gap_high"]
COMPARISONS = (
    ("UAS", "probe", "best head"),
    ("UAS", "probe", "best baseline"),
    ("UUAS", "probe MST", "best head MST"),
    ("UUAS", "probe MST", "chain"),
    ("UAS", "best head", "best baseline"),
    ("UUAS", "best head MST", "chain"),
)
HEAD_COLUMNS = ["layer", "head", "direction", "n", "hits", "accuracy", "ci_low", "ci_high"]


class ParseTotals:
    """The parsing tally's ALL label as [fold, resample, ...] arrays."""

    def __init__(self, tally):
        a = tally.arrays(ALL)
        self.tally = tally
        self.hits = a["hits"].astype(np.float64)  # [fold, resample, layer, head, direction]
        self.n = a["n"][..., 0]  # [fold, resample]
        self.base = a["base"].astype(np.float64)  # [fold, resample, variant]
        self.variants = list(tally.variants)

    def cells(self, directions) -> list[tuple[int, int, int]]:
        """(layer slot, head, direction index) candidates, in tie order (layer, head, direction)."""
        _, _, n_layers, n_heads, _ = self.hits.shape
        return [(l, h, d) for l in range(n_layers) for h in range(n_heads) for d in directions]

    def head(self, cell) -> np.ndarray:
        return self.hits[:, :, cell[0], cell[1], cell[2]]  # [fold, resample]

    def name(self, cell) -> str:
        return f"{self.tally.layers[cell[0]]}-{cell[1]} {DIRECTIONS[cell[2]]}"

    def predictor(self, options, names, selection):
        """(hits [resample], chosen name) of the best option (each [fold, resample] hits; the first
        when none has arcs): in-sample, or held-out (`stats.selected`)."""
        hits, picks = selected(np.stack(options, axis=-1), self.n, selection, default=0)
        name = names[picks[0]] if picks[0] == picks[1] else f"{names[picks[1]]} | {names[picks[0]]}"
        return hits, name


def _score_rows(t: ParseTotals, n: np.ndarray):
    """parse_scores rows and {(metric, predictor, selection): hits [resample]}."""
    scores, hits_of = [], {}

    def add(metric, predictor, selection, name, variant, hits, note=""):
        acc, low, high = estimate(hits, n)
        scores.append(
            dict(
                metric=metric,
                predictor=predictor,
                selection=selection,
                heads=name,
                variant=variant,
                n=float(n[0]),
                hits=float(hits[0]),
                accuracy=float(acc),
                ci_low=float(low),
                ci_high=float(high),
                note=note,
            )
        )
        hits_of[(metric, predictor, selection)] = hits

    classifier_note = (
        "" if t.base[:, 0, 0].sum() or not n[0] else "no held-out evaluation (a fold has no arcs)"
    )
    add("UAS", "probe", "held-out", "", CLASSIFIER, t.base[:, :, 0].sum(0), classifier_note)
    add(
        "UUAS", "probe MST", "held-out", "", CLASSIFIER_MST, t.base[:, :, 1].sum(0), classifier_note
    )
    offsets = [v for v in t.variants if v not in (CLASSIFIER, CLASSIFIER_MST, CHAIN)]
    for selection in ("held-out", "in-sample"):
        cells = t.cells((0, 1))
        hits, name = t.predictor([t.head(c) for c in cells], [t.name(c) for c in cells], selection)
        add("UAS", "best head", selection, name, "", hits)
        mst = t.cells((2,))
        hits, name = t.predictor(
            [t.head(c) for c in mst], [t.name(c).replace(" mst", "") for c in mst], selection
        )
        add("UUAS", "best head MST", selection, name, "", hits)
        options = [t.base[:, :, t.variants.index(v)] for v in offsets]
        if options:
            hits, name = t.predictor(options, offsets, selection)
            add("UAS", "best baseline", selection, "", name, hits)
    add("UUAS", "chain", "fixed", "", CHAIN, t.base[:, :, t.variants.index(CHAIN)].sum(0))
    return scores, hits_of


def _gap_rows(hits_of, n: np.ndarray) -> list[dict]:
    """Paired differences (same arcs, same resample weights); the classifier is always held-out, the
    single heads and baselines are selected held-out or in-sample, chain is fixed."""
    gaps = []
    for metric, predictor, versus in COMPARISONS:
        for selection in ("held-out", "in-sample"):
            classifier, fixed = predictor.startswith(CLASSIFIER), versus == "chain"
            if classifier and fixed and selection == "in-sample":  # nothing selected on either side
                continue
            a = hits_of.get((metric, predictor, "held-out" if classifier else selection))
            b = hits_of.get((metric, versus, "fixed" if fixed else selection))
            if a is None or b is None:
                continue
            gap, low, high = paired_gap(a, b, n)
            gaps.append(
                dict(
                    metric=metric,
                    predictor=predictor,
                    versus=versus,
                    selection=selection,
                    gap=float(gap),
                    gap_low=float(low),
                    gap_high=float(high),
                )
            )
    return gaps


def parse_tables(results) -> dict[str, pd.DataFrame]:
    tally = results.tallies.get("parsing")
    if tally is None or ALL not in tally.labels:
        return {
            "parse_scores": pd.DataFrame(columns=SCORE_COLUMNS),
            "parse_gaps": pd.DataFrame(columns=GAP_COLUMNS),
            "parse_heads": pd.DataFrame(columns=HEAD_COLUMNS),
        }
    t = ParseTotals(tally)
    n = t.n.sum(0)  # [resample]
    scores, hits_of = _score_rows(t, n)
    whole = t.hits.sum(0)  # [resample, layer, head, direction]
    acc, low, high = estimate(whole, n[:, None, None, None])  # [layer, head, direction]
    cells = t.cells((0, 1, 2))
    heads = pd.DataFrame(
        {
            "layer": [tally.layers[l] for l, _, _ in cells],
            "head": [h for _, h, _ in cells],
            "direction": [DIRECTIONS[d] for _, _, d in cells],
            "n": float(n[0]),
            "hits": whole[0].ravel(),
            "accuracy": acc.ravel(),
            "ci_low": low.ravel(),
            "ci_high": high.ravel(),
        },
        columns=HEAD_COLUMNS,
    )
    return {
        "parse_scores": pd.DataFrame(scores, columns=SCORE_COLUMNS),
        "parse_gaps": pd.DataFrame(_gap_rows(hits_of, n), columns=GAP_COLUMNS),
        "parse_heads": heads,
    }


def _table(name):
    return lambda results: parse_tables(results)[name]


ANALYSIS = register(
    Analysis(
        name="parsing",
        order=100,
        scorer=ParsingScorer,
        input=SENTENCES,
        selection=False,
        default=False,
        description="all heads together: an attention-only classifier (Clark et al. 2019 section 6) and maximum "
        "spanning trees per head and over the classifier (Htut et al. 2019), against the best single head "
        "and the offset baselines",
        tables={
            "parse_scores": _table("parse_scores"),
            "parse_gaps": _table("parse_gaps"),
            "parse_heads": _table("parse_heads"),
        },
        report="headprobe.studies.parsing.report:parsing_section",
    )
)
