"""Surface statistics (METHODS §4; Clark et al. 2019 Figures 2 and 4).

Per head, summed over word queries (specials are not queries), on word-level
attention: mass to `self`, `prev` (words with a previous word), `next` (words
with a next word), `cls` (CLS/BOS-like specials), `sep` (SEP/EOS-like) and
`punct` (punctuation words), and `first`: mass to the first position of the input
(BOS / CLS where the tokenizer puts one first, else the first word's pieces: the sink
of a model without BOS), queries after the first only. Over word pieces as queries:
`entropy` of the piece-level row in nats, and `entropy_uniform`, the entropy of
uniform attention over the keys that query can see. mean = mass / n.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from headprobe.extend import SENTENCES, Analysis, BatchState, CountScorer, RoleRule, register
from headprobe.inputs.align import WORD
from headprobe.scoring.measures import MASS
from headprobe.scoring.scorer_base import UnitLabelRows, query_rows
from headprobe.stats import roles

if TYPE_CHECKING:
    import torch

LABELS = ["self", "prev", "next", "cls", "sep", "punct", "first", "entropy", "entropy_uniform"]
_PUNCT = re.compile(r"^[^\w\s]+$")


def is_punct(word: str, upos: str | None) -> bool:
    return upos == "PUNCT" if upos is not None else bool(_PUNCT.match(word))


def n_pieces(example, alignment) -> int:
    return sum(1 for k in alignment.piece_kind if k == WORD)


def special_first(alignment) -> bool:
    """Does the input start with a special piece (CLS / BOS) rather than a word?"""
    return alignment.piece_kind[0] != WORD


class SurfaceScorer(UnitLabelRows, CountScorer):
    analysis = "surface"
    labels = LABELS
    value = "mass"
    reads = MASS  # norms: row-normalised N (METHODS §7)
    bootstrap = False
    blocks = True  # row by row (word rows; piece rows for the entropy)

    def prepare(self, batch) -> BatchState:
        pieces = {id(ex): n_pieces(ex, a) for ex, a in zip(batch.examples, batch.alignments)}
        alignment = {id(ex): a for ex, a in zip(batch.examples, batch.alignments)}

        def n_for(example, label):
            words = len(example.words)
            if label in ("prev", "next"):
                return words - 1
            if label.startswith("entropy"):
                return pieces[id(example)]
            if label == "first":
                return words - (0 if special_first(alignment[id(example)]) else 1)
            return words

        keys, n, first_row = self.unit_rows(batch, n_for)
        return self.new_state(batch, keys, n, self.masks(batch, first_row))

    def masks(self, batch, first_row: np.ndarray) -> SurfaceMasks:
        """What the sums of one batch are taken over, built once per batch."""

        from headprobe.inputs.batching import on_device

        device = batch.device
        w = batch.max_words
        punct = np.zeros((len(batch), w), dtype=np.float32)
        for b, example in enumerate(batch.examples):
            upos = example.upos or [None] * len(example.words)
            punct[b, : len(example.words)] = [
                is_punct(word, tag) for word, tag in zip(example.words, upos)
            ]
        keys = batch.attention_mask.float()
        visible = (
            keys.cumsum(dim=1) if self.causal else keys.sum(dim=1, keepdim=True).expand_as(keys)
        )
        kind = batch.piece_kind_host  # [batch, piece], host: the masks are made there
        piece_query = (kind == WORD)[:, None, :].astype(np.float32)  # [batch, 1, piece]
        put = lambda array: on_device(array, device)
        piece_query_t = put(piece_query)
        uniform = (visible.clamp_min(1).log() * piece_query_t[:, 0]).sum(-1)  # [batch]
        # first position: a special piece at position 0 (column W: CLS/BOS-like), else word 0;
        # its own row does not count when it is a word
        first_special = kind[:, 0] != WORD  # [batch]
        words = batch.word_mask_host  # [batch, word]
        after_first = words.copy()
        after_first[:, 0] &= first_special
        every_row = first_row[None, :] + np.arange(len(LABELS))[:, None]  # [label, batch]
        f32 = lambda array: put(array.astype(np.float32))
        return SurfaceMasks(
            first_row=put(first_row),
            every_row=put(every_row.ravel()),
            punct=put(punct[:, None, None, :]),  # [batch, 1, 1, word]
            query=f32(words[:, None, :]),  # [batch, 1, word]
            second_on=f32(words[:, None, 1:]),  # [batch, 1, word - 1]: word 1.. real
            piece_query=piece_query_t,
            uniform=uniform[:, None].expand(-1, self.n_heads),  # [batch, head]
            first_special=put(first_special[:, None, None]),  # [batch, 1, 1]
            after_first=f32(after_first[:, None, :]),  # [batch, 1, word]
        )

    def _add(self, state, att, label, values):
        """Add per-example sums `values` [layer, measure, batch, head] to each example's row of
        `label`."""
        self.add(state, att, 0, state.own.first_row + LABEL_ROW[label], values)

    def update(self, att, state) -> None:
        import torch

        own, batch = state.own, state.batch
        w0, w1, p0, p1, first, last = query_rows(att, batch)
        if (w0, w1, p0, p1) != (0, batch.max_words, 0, batch.n_pieces):
            return self._update_block(att, state, w0, w1, p0, p1, last)
        w = batch.max_words
        words = att.words  # [layer, measure, batch, head, word, word + 2]
        square = words[..., :w]  # [layer, measure, batch, head, word, word]
        per_example = lambda x, mask: (x * mask).sum(-1)  # [layer, measure, batch, head]
        first = torch.where(
            own.first_special, words[..., w], words[..., 0]
        )  # [layer, measure, batch, head, word]
        # [layer, measure, batch, head, piece], nats
        entropy = torch.special.entr(att.pieces).sum(-1)
        sums = {
            "self": per_example(square.diagonal(0, -2, -1), own.query),
            # diagonal -1 holds A[i + 1, i] (word i + 1 to its previous word), +1 A[i, i + 1]
            "prev": per_example(square.diagonal(-1, -2, -1), own.second_on),
            "next": per_example(square.diagonal(1, -2, -1), own.second_on),
            "cls": per_example(words[..., w], own.query),
            "sep": per_example(words[..., w + 1], own.query),
            "punct": per_example((square * own.punct).sum(-1), own.query),
            "first": per_example(first, own.after_first),
            "entropy": per_example(entropy, own.piece_query),
            "entropy_uniform": own.uniform.expand(*words.shape[:2], -1, -1),
        }  # {label: [layer, measure, batch, head]}: each example's row of each label, in one call
        self.add(state, att, 0, own.every_row, torch.cat(list(sums.values()), dim=-2))

    def _update_block(self, att, state, w0, w1, p0, p1, last):
        """The same sums over word rows `w0:w1` and piece rows `p0:p1` of one query block
        (word i's row holds self A[i, i], prev A[i, i - 1], next A[i, i + 1])."""
        import torch

        own, batch = state.own, state.batch
        w = batch.max_words
        per_example = lambda x, mask: (x * mask).sum(-1)  # [layer, measure, batch, head]
        add = lambda label, values: self._add(state, att, label, values)
        if w1 > w0:
            words = att.words  # [layer, measure, batch, head, rows, word + 2]
            square = words[..., :w]  # [layer, measure, batch, head, rows, word]
            query = own.query[:, :, w0:w1]
            add("self", per_example(square.diagonal(w0, -2, -1), query))
            start = max(w0, 1)  # words with a previous word
            if w1 > start:
                mask = batch.word_mask[:, None, start:w1].float()
                add("prev", per_example(square.diagonal(w0 - 1, -2, -1), mask))
            stop = min(w1, w - 1)  # words with a next word
            if stop > w0:
                mask = batch.word_mask[:, None, w0 + 1 : stop + 1].float()
                add("next", per_example(square.diagonal(w0 + 1, -2, -1)[..., : stop - w0], mask))
            add("cls", per_example(words[..., w], query))
            add("sep", per_example(words[..., w + 1], query))
            add("punct", per_example((square * own.punct).sum(-1), query))
            first = torch.where(own.first_special, words[..., w], words[..., 0])
            add("first", per_example(first, own.after_first[:, :, w0:w1]))
        if p1 > p0:
            # [layer, measure, batch, head, rows], nats
            entropy = torch.special.entr(att.pieces).sum(-1)
            add("entropy", per_example(entropy, own.piece_query[:, :, p0:p1]))
        if last:
            add("entropy_uniform", own.uniform.expand(len(att.layers), len(att.measures), -1, -1))


LABEL_ROW = {label: slot for slot, label in enumerate(LABELS)}  # a label's row after the first


@dataclass
class SurfaceMasks:
    """What one batch's surface sums are taken over (`SurfaceScorer.masks`)."""

    first_row: torch.Tensor  # [batch] each example's first row (its labels follow, LABELS order)
    every_row: torch.Tensor  # [label x batch] the rows of each label (LABELS order), each example
    punct: torch.Tensor  # [batch, 1, 1, word] punctuation words
    query: torch.Tensor  # [batch, 1, word] real words
    second_on: torch.Tensor  # [batch, 1, word - 1] words with a previous word
    piece_query: torch.Tensor  # [batch, 1, piece] word pieces (the entropy's rows)
    uniform: torch.Tensor  # [batch, head] the entropy of uniform attention, summed over rows
    first_special: torch.Tensor  # [batch, 1, 1] the input starts with a special piece
    after_first: torch.Tensor  # [batch, 1, word] the rows the first position's mass counts in


def surface_table(counts: pd.DataFrame) -> pd.DataFrame:
    """Per head and statistic: mean = mass / n (whole data)."""
    rows = counts[(counts["analysis"] == "surface") & (counts["fold"] == "")]
    out = rows[["label", "layer", "head", "n", "mass"]].copy()
    out["mean"] = out["mass"] / out["n"]
    return out.reset_index(drop=True)


# ---------------------------------------------------------------- derived views

ENTROPY, UNIFORM = "entropy", "entropy_uniform"


def derived_views(wide: pd.DataFrame) -> pd.DataFrame:
    """Per head (or layer) label means with `entropy_ratio` (entropy / uniform entropy) and
    `sink_mass` (first position + SEP/EOS) added where their labels are there."""
    wide = wide.copy()
    if {ENTROPY, UNIFORM} <= set(wide.columns):
        wide["entropy_ratio"] = wide[ENTROPY] / wide[UNIFORM]
    if {"first", "sep"} <= set(wide.columns):
        wide["sink_mass"] = wide["first"].fillna(0) + wide["sep"].fillna(0)
    return wide


def profile_features(wide: pd.DataFrame) -> pd.DataFrame:
    """A head's surface features for head profiles: every mean mass, and the entropy as a share
    of the uniform entropy (nats depend on the sentence lengths, so runs on other corpora or
    tokenizers would not compare)."""
    features = wide.drop(columns=[c for c in (ENTROPY, UNIFORM) if c in wide.columns])
    if {ENTROPY, UNIFORM} <= set(wide.columns):
        features["entropy_ratio"] = wide[ENTROPY] / wide[UNIFORM]
    return features


# ---------------------------------------------------------------- role rules (METHODS §6)

SINK_MASS = 0.5  # mass to the first position + SEP/EOS that makes a head a sink
BROAD_RATIO = 0.9  # entropy / uniform entropy that makes a head broad


def sink_match(results) -> pd.DataFrame:
    """The heads whose mean mass to the first position plus SEP/EOS is at least `SINK_MASS`."""
    wide = roles.mass_of(results, SINK_ROLE)
    if "sink_mass" not in wide:
        return pd.DataFrame(columns=roles.MATCH_COLUMNS)
    hit = wide[wide["sink_mass"] >= SINK_MASS]
    return pd.DataFrame(
        {
            "layer": hit["layer"],
            "head": hit["head"],
            "detail": "first position + SEP/EOS",
            "short": "sink",
            "score": hit["sink_mass"],
            "evidence": [
                f"mean mass to the first position {f:.4f} + SEP/EOS {s:.4f} = {t:.4f}"
                for f, s, t in zip(hit["first"], hit["sep"], hit["sink_mass"])
            ],
            "brief": [f"{t:.3f}" for t in hit["sink_mass"]],
        },
        columns=roles.MATCH_COLUMNS,
    )


def broad_match(results) -> pd.DataFrame:
    """The heads whose mean row entropy is at least `BROAD_RATIO` of the uniform entropy."""
    wide = roles.mass_of(results, BROAD_ROLE)
    if "entropy_ratio" not in wide:
        return pd.DataFrame(columns=roles.MATCH_COLUMNS)
    hit = wide[wide["entropy_ratio"] >= BROAD_RATIO]
    return pd.DataFrame(
        {
            "layer": hit["layer"],
            "head": hit["head"],
            "detail": "near-uniform",
            "short": "broad",
            "score": hit["entropy_ratio"],
            "evidence": [f"entropy / uniform entropy = {r:.4f}" for r in hit["entropy_ratio"]],
            "brief": [f"{r:.3f}" for r in hit["entropy_ratio"]],
        },
        columns=roles.MATCH_COLUMNS,
    )


SINK_ROLE = RoleRule(
    "sink",
    4,
    "#8c8c8c",
    f"sink: mean attention mass to the first position (BOS/CLS, else the first word) plus SEP/EOS "
    f"is at least {SINK_MASS:g}.",
    sink_match,
    brief="mean mass to the first position + SEP/EOS",
)
BROAD_ROLE = RoleRule(
    "broad",
    5,
    "#dd8452",
    f"broad: mean row entropy is at least {BROAD_RATIO:g} of the uniform entropy.",
    broad_match,
    brief="mean row entropy / uniform entropy",
)


ANALYSIS = register(
    Analysis(
        name="surface",
        order=40,
        scorer=SurfaceScorer,
        input=SENTENCES,
        selection=False,
        cross=True,
        description="attention mass to self, neighbours, specials, punctuation, the first position; entropy "
        "(METHODS §4; Clark et al. 2019 Figures 2 and 4)",
        roles=(SINK_ROLE, BROAD_ROLE),
        tables={"surface": lambda results: surface_table(results.counts)},
        views=derived_views,
        profile=profile_features,
        report="headprobe.studies.surface.report:surface_section",
        measures_report="headprobe.studies.surface.report:measures_blocks",
        homes=("headprobe.studies.surface.surface_measures",),
    )
)
