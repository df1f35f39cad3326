"""The example pictures: one head's word-level attention on one sentence (reports, notebooks).

    chosen = pick_sentences(corpus, ["ALL", "nsubj"], seed=0)      # {label: [Example]}
    chosen = pick_mentions(windows, ["ALL", "pronoun"], seed=0)    # {kind: [MentionPick]}
    planned = planned_pictures(results.best_heads, corpus, seed=0, coref=windows)
    matrices = head_matrices(model, tokenizer, [p.request for p in planned])  # the pass (scoring/)
    example_pictures(planned, matrices)                            # the entries of examples.json
    picker = SentencePicker(seed=0)                                # during a run's scoring pass:
    for example in picker.watch(stream): ...                       # the same picks, no second read

This module chooses and keeps; it runs no model: the attention is drawn by
`headprobe.scoring.sentence_attention` (after the scoring pass) and read here.

The examples of a report are drawn at random with the run's seed, one per label, among
sentences of moderate length that hold the relation (a seeded reservoir per label: one
pass over any iterable of examples, memory of one pick per label), so each relation gets
its own sentence and the same seed gives the same sentences. A coreference example is a
scored mention (METHODS §3) with its nearest antecedent a few words before it.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from headprobe.inputs.corpora.base import ALL, Example
from headprobe.scoring.registry import ARCS, MENTIONS, picture_items, pictured

SENTENCE_WORDS = (8, 25)  # moderate length: a picture a reader can take in
FALLBACK_WORDS = 40  # when no sentence of moderate length holds the relation
MENTION_SPAN = (2, 25)  # words from the antecedent's head to the mention's head
CONTEXT = 3  # words shown before the antecedent and after the mention
NOT_IN_ALL = ("root", "punct")


# ---------------------------------------------------------------- choosing examples


class Reservoir:
    """`k` items drawn uniformly at random per label from a stream (Algorithm R), each label with
    its own generator seeded by (seed, label), so a label's pick does not depend on the others.

        r = Reservoir(seed=0); r.offer("nsubj", item); r.picks("nsubj")
    """

    def __init__(self, seed: int, k: int = 1, salt: str = "example"):
        self.seed, self.k, self.salt = seed, k, salt
        self._seen: dict[str, int] = {}
        self._items: dict[str, list] = {}
        self._rng: dict[str, random.Random] = {}

    def offer(self, label: str, item) -> None:
        if label not in self._rng:
            self._rng[label] = random.Random(f"{self.seed}:{self.salt}:{label}")
            self._seen[label], self._items[label] = 0, []
        self._seen[label] += 1
        items = self._items[label]
        if len(items) < self.k:
            items.append(item)
        else:
            j = self._rng[label].randrange(self._seen[label])
            if j < self.k:
                items[j] = item

    def picks(self, label: str) -> list:
        return list(self._items.get(label, []))


def gold_arcs(example: Example, label: str) -> list[list[int]]:
    """[[dependent, head], ...] of `label` in `example` (ALL: every arc but root and punct)."""
    if example.heads is None or example.deprels is None:
        return []
    return [
        [i, h]
        for i, (h, rel) in enumerate(zip(example.heads, example.deprels))
        if h >= 0 and (rel == label if label != ALL else rel not in NOT_IN_ALL)
    ]


class SentencePicker:
    """`pick_sentences` one example at a time: a seeded reservoir for every relation seen (each
    label's draw depends on its own examples only, so keeping them all gives the same picks as
    asking for a few). A run offers it the sentences as it scores them and asks for the best
    heads' labels afterwards, without reading the corpus again.

        picker = SentencePicker(seed=0)
        for example in picker.watch(stream): ...          # the scoring pass
        picker.chosen(["ALL", "nsubj"])                   # {label: [Example]}

    What is kept is bounded by the number of relations (`ALL` included) times 2 * `per_label`."""

    def __init__(
        self,
        seed: int = 0,
        per_label: int = 1,
        words: tuple[int, int] = SENTENCE_WORDS,
        fallback: int = FALLBACK_WORDS,
        labels: Iterable[str] | None = None,
    ):
        self.seed, self.per_label, self.words, self.fallback = seed, per_label, words, fallback
        self.labels = None if labels is None else set(labels)
        self.moderate, self.longer = (
            Reservoir(seed, per_label),
            Reservoir(seed, per_label, salt="longer"),
        )

    def offer(self, example: Example) -> None:
        if example.heads is None or example.deprels is None or len(example.words) > self.fallback:
            return
        present = {rel for h, rel in zip(example.heads, example.deprels) if h >= 0}
        if present - set(NOT_IN_ALL):
            present.add(ALL)
        pool = (
            self.moderate if self.words[0] <= len(example.words) <= self.words[1] else self.longer
        )
        for label in present if self.labels is None else present & self.labels:
            pool.offer(label, example)

    def watch(self, examples: Iterable[Example]):
        """`examples`, unchanged, each offered on its way."""
        for example in examples:
            self.offer(example)
            yield example

    def chosen(self, labels: list[str]) -> dict[str, list[Example]]:
        return {label: self.moderate.picks(label) or self.longer.picks(label) for label in labels}


def pick_sentences(
    examples: Iterable[Example],
    labels: list[str],
    seed: int = 0,
    per_label: int = 1,
    words: tuple[int, int] = SENTENCE_WORDS,
    fallback: int = FALLBACK_WORDS,
) -> dict[str, list[Example]]:
    """Per label, `per_label` sentences holding that relation, drawn at random with `seed`
    among those of `words[0]..words[1]` words (else, for a relation found in none, among
    those of at most `fallback` words). One pass over `examples` (any iterable)."""
    picker = SentencePicker(seed, per_label, words, fallback, labels)
    for example in examples:
        picker.offer(example)
    return picker.chosen(labels)


@dataclass
class MentionPick:
    """A scored mention of a window with its nearest antecedent (window word indices)."""

    window: Example
    kind: str
    query: int  # the mention's head word
    mention: tuple[int, int]  # [start, end) of the mention
    antecedent: int  # head word of the nearest earlier mention of its cluster
    antecedent_span: tuple[int, int]
    gold: list[int]  # every candidate heading a mention of its cluster


class MentionPicker:
    """`pick_mentions` one window at a time (as `SentencePicker`: every kind kept, picked later).

    picker = MentionPicker(seed=0)
    for window in picker.watch(windows): ...          # the scoring pass
    picker.chosen(["ALL", "pronoun"])                 # {kind: [MentionPick]}"""

    def __init__(
        self,
        seed: int = 0,
        per_label: int = 1,
        span: tuple[int, int] = MENTION_SPAN,
        kinds: Iterable[str] | None = None,
    ):
        self.span = span
        self.kinds = None if kinds is None else set(kinds)
        self.pool = Reservoir(seed, per_label, salt="mention")
        # a window's scored mentions, as the analysis pictured with mentions defines them
        self.scored = picture_items(MENTIONS)

    def offer(self, window: Example) -> None:
        span = self.span
        mentions = list(window.mentions or [])
        for sm in self.scored(window):
            before = [g for g in sm.gold if g < sm.query]
            if not before or not span[0] <= sm.query - max(before) <= span[1]:
                continue
            m = mentions[sm.index]
            ante = max(before)
            ante_m = max(
                (
                    x
                    for x in mentions
                    if x.head == ante and x.entity == m.entity and x.start < m.start
                ),
                key=lambda x: x.start,
                default=None,
            )
            if (
                ante_m is None
                or max(m.end, sm.query + 1) - min(ante_m.start, ante) > FALLBACK_WORDS - 2 * CONTEXT
            ):
                continue  # a long antecedent: no picture a reader takes in
            pick = MentionPick(
                window,
                sm.kind,
                sm.query,
                (m.start, m.end),
                ante,
                (ante_m.start, ante_m.end),
                list(sm.gold),
            )
            for label in {ALL, sm.kind} if self.kinds is None else {ALL, sm.kind} & self.kinds:
                self.pool.offer(label, pick)

    def watch(self, windows: Iterable[Example]):
        """`windows`, unchanged, each offered on its way."""
        for window in windows:
            self.offer(window)
            yield window

    def chosen(self, kinds: list[str]) -> dict[str, list[MentionPick]]:
        return {kind: self.pool.picks(kind) for kind in kinds}


def pick_mentions(
    windows: Iterable[Example],
    kinds: list[str],
    seed: int = 0,
    per_label: int = 1,
    span: tuple[int, int] = MENTION_SPAN,
) -> dict[str, list[MentionPick]]:
    """Per mention kind (ALL, pronoun, proper, nominal), `per_label` scored mentions (METHODS §3)
    whose nearest antecedent's head lies `span[0]..span[1]` words before the mention's head,
    drawn at random with `seed`. One pass over `windows` (any iterable)."""
    picker = MentionPicker(seed, per_label, span, kinds)
    for window in windows:
        picker.offer(window)
    return picker.chosen(kinds)


# ---------------------------------------------------------------- pictures


def _best_rows(best_heads: pd.DataFrame, kind: str, max_labels: int) -> pd.DataFrame:
    """In-sample best heads that name a head, of the analyses pictured as `kind` (`registry.PICTURES`),
    most trials first."""
    rows = best_heads[
        best_heads["analysis"].isin(pictured(kind))
        & (best_heads["selection"] == "in-sample")
        & (best_heads["fold"] == "")
        & (best_heads["layer"] >= 0)
    ]  # small samples name no head
    return rows.sort_values("n", ascending=False, kind="stable").head(max_labels)


@dataclass
class PlannedPicture:
    """A picture chosen before its attention is drawn: the entry of examples.json without its
    `attention`, the words the head reads (`request`: words, layer, head, for
    `scoring.sentence_attention.head_matrices`) and the rows and columns of that matrix it keeps."""

    entry: dict
    request: tuple[list[str], int, int]  # (words, layer, head)
    keep: tuple[int, int]  # [lo, hi): the words kept as rows and as columns


def planned_pictures(
    best_heads: pd.DataFrame,
    examples,
    max_words: int = SENTENCE_WORDS[1],
    per_label: int = 1,
    max_labels: int = 8,
    seed: int = 0,
    coref=None,
    min_words: int = SENTENCE_WORDS[0],
) -> list[PlannedPicture]:
    """For the in-sample best dependency heads (most arcs first, at most `max_labels`): each one on
    a sentence holding its relation (`pick_sentences`, seeded); with `coref` windows, the best
    coreference head of each kind around a mention and its nearest antecedent (`pick_mentions`).
    `examples` / `coref`: any iterable (read once), or a `SentencePicker` / `MentionPicker` that
    watched the scoring pass (its seed and sizes are then the picker's). The attention is drawn
    after (`scoring.sentence_attention.head_matrices`) and put in by `example_pictures`."""
    planned = []
    rows = _best_rows(best_heads, ARCS, max_labels) if examples is not None else best_heads.iloc[:0]
    if isinstance(examples, SentencePicker):  # filled during the scoring pass
        chosen = examples.chosen(list(rows["label"]))
    else:
        chosen = (
            pick_sentences(examples, list(rows["label"]), seed, per_label, (min_words, max_words))
            if len(rows)
            else {}
        )
    for row in rows.itertuples():
        for example in chosen.get(row.label, []):
            entry = dict(
                analysis=row.analysis,
                label=row.label,
                layer=int(row.layer),
                head=int(row.head),
                direction=row.direction,
                unit=example.unit,
                sentence=example.sent_id,
                words=list(example.words),
                attention=None,
                gold=gold_arcs(example, row.label),
                seed=seed,
            )
            request = (list(example.words), int(row.layer), int(row.head))
            planned.append(PlannedPicture(entry, request, (0, len(example.words))))
    if coref is not None:
        planned += planned_coref_pictures(best_heads, coref, per_label, seed)
    return planned


def planned_coref_pictures(
    best_heads: pd.DataFrame, windows, per_label: int = 1, seed: int = 0
) -> list[PlannedPicture]:
    """The best coreference head of each kind on a mention and its antecedent: attention over the
    whole window, cropped to the words from just before the antecedent to just after the mention."""
    rows = _best_rows(best_heads, MENTIONS, 8)
    if isinstance(windows, MentionPicker):  # filled during the scoring pass
        chosen = windows.chosen(list(rows["label"]))
    else:
        chosen = pick_mentions(windows, list(rows["label"]), seed, per_label) if len(rows) else {}
    planned = []
    for row in rows.itertuples():
        for pick in chosen.get(row.label, []):
            words = pick.window.words
            lo = max(0, min(pick.antecedent_span[0], pick.antecedent) - CONTEXT)
            hi = min(len(words), max(pick.mention[1], pick.query + 1) + CONTEXT)
            entry = dict(
                analysis=row.analysis,
                label=row.label,
                layer=int(row.layer),
                head=int(row.head),
                direction="",
                unit=pick.window.unit,
                sentence=pick.window.sent_id,
                words=list(words[lo:hi]),
                attention=None,
                offset=lo,
                gold=[[pick.query - lo, g - lo] for g in pick.gold if lo <= g < hi],
                mention=[pick.mention[0] - lo, pick.mention[1] - lo],
                antecedent=[pick.antecedent_span[0] - lo, pick.antecedent_span[1] - lo],
                seed=seed,
            )
            planned.append(
                PlannedPicture(entry, (list(words), int(row.layer), int(row.head)), (lo, hi))
            )
    return planned


def example_pictures(planned: list[PlannedPicture], matrices) -> list[dict]:
    """The entries of examples.json: each planned picture with its attention, the rows and columns
    it keeps of its matrix (`matrices`: one [word, word + 2] array per picture, in order, from
    `scoring.sentence_attention.head_matrices(model, tokenizer, [p.request for p in planned])`)."""
    pictures = []
    for plan, matrix in zip(planned, matrices, strict=True):
        lo, hi = plan.keep
        pictures.append({**plan.entry, "attention": matrix[lo:hi, lo:hi].tolist()})
    return pictures
