"""Scoring conventions as one object: `headprobe`'s (METHODS §1-§2), or those of two
papers' released code.

    from headprobe.inputs.conventions import get_conventions
    conv = get_conventions("clark2019-code")       # or "headprobe" (default), "joanacero"
    conv.from_mode                                 # "first": attention FROM a word = its first piece
    conv.relation("obl:tmod")                      # "obl" (subtypes cut) or "obl:tmod" (kept)
    conv.scores("punct")                           # True: the arc counts per relation and in ALL
    conv.variants                                  # baseline names, in tie order
    conv.baseline_hits(dependent, head, n_words)   # [arc, variant] 0/1

Numbers made with a paper's released code differ from `headprobe` numbers in known ways
(docs/CONVENTIONS.md has the table and the reasons). A preset switches them all at
once, and the run names it (`summary["conventions"]`):

- `headprobe` (default): METHODS §1-§2.
- `clark2019-code`: Clark et al.'s attention-analysis code: "from" pooling by the
  first piece (`bpe_utils.get_word_word_attention`, default mode "first"; the paper
  says mean); `all` counts every arc, root and punct included (root arcs are always
  missed by a head); offset baselines -3..2, 0 included, with the prediction clipped
  into [ROOT, last word] (`offset_predictor`: `max(0, min(i + k + 1, n))`); no `first`
  baseline; subtypes cut (their PTB-converted data had none).
- `joanacero`: joanAcero/clark-attention-analysis (UD EWT): as clark2019-code, but
  "from" pooling by the mean (their word-level maps) and UD subtypes kept.

Readers (`corpora.conllu.read_conllu(..., conventions=)`) apply `relation`, the engine
`from_mode`, the dependency scorer `scores` and the baselines.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from headprobe.inputs.corpora.base import base_relation

FIRST = "first"
DEFAULT_OFFSETS = tuple(k for k in range(-5, 6) if k != 0)
CLARK_OFFSETS = tuple(range(-3, 3))  # Clark et al.'s `range(-3, 3)`: -3..2, 0 included


@dataclass(frozen=True)
class Conventions:
    """What a dependency number depends on besides the model and the data."""

    name: str
    from_mode: str = "mean"  # pooling of attention FROM a word's pieces
    unscored: tuple[str, ...] = ("root", "punct")  # relations left out, per relation and of ALL
    offsets: tuple[int, ...] = DEFAULT_OFFSETS  # fixed-offset baselines
    clip_offsets: bool = False  # offset predictions clipped into [ROOT, last word]
    first_baseline: bool = True  # the `first` baseline (word 1)
    cut_subtypes: bool = True  # obl:tmod -> obl
    description: str = ""

    def pooling(self, from_mode: str | None) -> str:
        """The pooling of attention FROM a word over its pieces: `from_mode` where one is given,
        else these conventions' (the one place a run's `--from-mode` is defaulted)."""
        return from_mode or self.from_mode

    @property
    def tie_order(self) -> tuple[int, ...]:
        """Offsets in baseline tie order: smallest |k| first, negative first."""
        return tuple(sorted(self.offsets, key=lambda k: (abs(k), k)))

    @property
    def variants(self) -> tuple[str, ...]:
        """Baseline names in tie order (the first best is the reported baseline)."""
        names = tuple(f"offset={k:+d}" for k in self.tie_order)
        return names + ((FIRST,) if self.first_baseline else ())

    def relation(self, deprel: str) -> str:
        """The relation label of a UD DEPREL under these conventions."""
        return base_relation(deprel) if self.cut_subtypes else deprel

    def scores(self, relation: str) -> bool:
        """Is an arc of `relation` scored (its own label and ALL)?"""
        return relation not in self.unscored

    def baseline_hits(
        self, dependent: np.ndarray, head: np.ndarray, n_words: np.ndarray
    ) -> np.ndarray:
        """[arc, variant] 0/1 (order of `variants`): does each baseline predict each arc's head?

        `head` is 0-based, -1 for ROOT. Offset k predicts word i + k; out of range it is
        wrong (METHODS §2), or with `clip_offsets` clipped to ROOT below the first word and to the
        last word beyond it (Clark et al.'s code). `first` predicts word 0."""
        dependent, head = np.asarray(dependent, dtype=np.int64), np.asarray(head, dtype=np.int64)
        offsets = np.asarray(self.tie_order, dtype=np.int64)
        predicted = dependent[:, None] + offsets[None, :]  # [arc, offset]
        if self.clip_offsets:
            last = np.asarray(n_words, dtype=np.int64)[:, None] - 1
            predicted = np.clip(predicted, -1, last)  # -1 = ROOT
        else:
            predicted = np.where(predicted >= 0, predicted, -2)  # never equals a head
        hits = predicted == head[:, None]
        if self.first_baseline:
            hits = np.concatenate([hits, (head == 0)[:, None]], axis=1)
        return hits.astype(np.float32)

    def summary(self) -> dict:
        """What the run records (`summary["conventions"]`)."""
        return {
            "name": self.name,
            "from_mode": self.from_mode,
            "unscored": list(self.unscored),
            "offsets": list(self.offsets),
            "clip_offsets": self.clip_offsets,
            "first_baseline": self.first_baseline,
            "cut_subtypes": self.cut_subtypes,
            "description": self.description,
        }


HEADPROBE = Conventions(
    "headprobe",
    description="METHODS §1-§2: from = mean of the pieces; root and punct not scored; offsets "
    "-5..5 without 0 (out of range: wrong) and `first`; subtypes cut",
)
CLARK2019_CODE = Conventions(
    "clark2019-code",
    from_mode="first",
    unscored=(),
    offsets=CLARK_OFFSETS,
    clip_offsets=True,
    first_baseline=False,
    cut_subtypes=True,
    description="Clark et al. 2019's released code: from = first piece; every arc scored (root and punct in "
    "ALL); offsets -3..2 with 0, clipped to [ROOT, last word]; no `first`; subtypes cut",
)
JOANACERO = Conventions(
    "joanacero",
    from_mode="mean",
    unscored=(),
    offsets=CLARK_OFFSETS,
    clip_offsets=True,
    first_baseline=False,
    cut_subtypes=False,
    description="joanAcero/clark-attention-analysis on UD: from = mean; every arc scored (root and punct in "
    "ALL); offsets -3..2 with 0, clipped; no `first`; UD subtypes kept",
)
PRESETS: dict[str, Conventions] = {c.name: c for c in (HEADPROBE, CLARK2019_CODE, JOANACERO)}


def get_conventions(conventions: str | Conventions | None = None) -> Conventions:
    """A preset by name (None: `headprobe`), or a `Conventions` object as it is."""
    if conventions is None:
        return HEADPROBE
    if isinstance(conventions, Conventions):
        return conventions
    if conventions not in PRESETS:
        raise ValueError(f"unknown conventions {conventions!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[conventions]
