"""Coreference head scores (METHODS §3) with nearest / head-match / rule-based baselines.

Per window `Example` (words + `mentions` in window coordinates, see
`headprobe.inputs.corpora.corefud`):

- mentions are ordered by start, longer first on ties;
- a mention `m` is **scored** when a mention that starts before it (strictly smaller
  start) belongs to its cluster and has a different head word position;
- **candidates** are the distinct head words of all mentions starting before `m` (any
  cluster), without `m`'s own head; **gold** candidates are those that are the head of
  a mention of `m`'s cluster;
- an attention head **hits** when, from `m`'s head word, the candidate with the most
  word-level attention (self-attention set to 0, non-candidates to -inf, ties to the
  lowest index) is a gold candidate;
- kinds by the UPOS of `m`'s head: `pronoun` (PRON), `proper` (PROPN), `nominal`
  (anything else), and `ALL`.

Baselines (rows with `layer = head = -1` and `variant` set):

- `nearest`: the candidate whose latest mention starts last (ties: the later word);
- `head_match`: the latest-starting earlier mention (head != m's head) whose head word
  equals m's head word, case-insensitively (ties: the later head word), else `nearest`;
- `rules` (in the spirit of Lee et al. 2011): keep the candidates that agree with m's
  head in Number, Gender and Person (FEATS; a feature missing on either side agrees; a
  NOUN/PROPN without Person counts as Person=3), then `head_match` among them, else
  `nearest` among them; when no candidate agrees, `nearest` over all candidates.

Counts are kept per unit (document id) and returned by `unit_counts()` as the tidy
table of ARCHITECTURE.md (`analysis="coreference"`, `direction=""`, `mass=NaN`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from headprobe.extend import (
    COREFERENCE,
    MENTIONS,
    Analysis,
    BatchState,
    BothIndex,
    CountScorer,
    RoleRule,
    RowIndex,
    first_argmax,
    register,
)
from headprobe.inputs.corpora.base import ALL
from headprobe.scoring.scorer_base import query_rows
from headprobe.stats import roles
from headprobe.stats.head_selection import ALPHA

if TYPE_CHECKING:
    import torch

MENTION_KINDS = ("pronoun", "proper", "nominal")
LABELS = (ALL,) + MENTION_KINDS
BASELINES = ("nearest", "head_match", "rules")
AGREEMENT_FEATURES = ("Number", "Gender", "Person")


def mention_kind(upos: str | None) -> str:
    if upos == "PRON":
        return "pronoun"
    if upos == "PROPN":
        return "proper"
    return "nominal"


@dataclass
class ScoredMention:
    """One scored mention of a window (all indices are window word indices)."""

    index: int  # position of the mention in `example.mentions`
    query: int  # the mention's head word (query row)
    kind: str
    candidates: list[int]  # sorted distinct candidate words
    gold: list[int]  # candidates that head a mention of m's cluster
    predictions: dict[str, int] = field(default_factory=dict)  # baseline -> predicted word

    def hit(self, word: int) -> bool:
        return word in self.gold


def _feature(feats: dict, upos: str | None, name: str) -> str | None:
    value = feats.get(name)
    if value is None and name == "Person" and upos in ("NOUN", "PROPN"):
        return "3"
    return value


def agrees(feats_a: dict, upos_a: str | None, feats_b: dict, upos_b: str | None) -> bool:
    """Number/Gender/Person agreement; a feature missing on either side agrees."""
    for name in AGREEMENT_FEATURES:
        a, b = _feature(feats_a, upos_a, name), _feature(feats_b, upos_b, name)
        if a is not None and b is not None and a != b:
            return False
    return True


def _nearest(latest: dict[int, int], allowed: Sequence[int]) -> int:
    """The candidate whose latest mention starts last; ties: the later word."""
    return max(allowed, key=lambda c: (latest[c], c))


def _head_match(earlier, words: Sequence[str], query: int, allowed: set[int]) -> int | None:
    """Head word of the latest-starting earlier mention whose head word equals the query's."""
    target = words[query].lower()
    best = None
    for m in earlier:
        if m.head in allowed and words[m.head].lower() == target:
            key = (m.start, m.head)
            if best is None or key > best:
                best = key
    return None if best is None else best[1]


def scored_mentions(example, baselines: Sequence[str] = BASELINES) -> list[ScoredMention]:
    """The METHODS §3 scored mentions of one window, with baseline predictions."""
    mentions = list(example.mentions or [])
    if not mentions:
        return []
    words = example.words
    upos = example.upos or [None] * len(words)
    feats = example.feats or [{} for _ in words]
    order = sorted(
        range(len(mentions)),
        key=lambda i: (mentions[i].start, -(mentions[i].end - mentions[i].start)),
    )
    cluster_heads: dict[str, set[int]] = defaultdict(set)
    for m in mentions:
        cluster_heads[m.entity].add(m.head)
    out: list[ScoredMention] = []
    for i in order:
        m = mentions[i]
        earlier = [x for x in mentions if x.start < m.start]
        if not any(x.entity == m.entity and x.head != m.head for x in earlier):
            continue
        latest: dict[int, int] = {}
        for x in earlier:
            if x.head != m.head and latest.get(x.head, -1) < x.start:
                latest[x.head] = x.start
        candidates = sorted(latest)
        gold = [c for c in candidates if c in cluster_heads[m.entity]]
        sm = ScoredMention(i, m.head, mention_kind(upos[m.head]), candidates, gold)
        nearest = _nearest(latest, candidates)
        for name in baselines:
            if name == "nearest":
                sm.predictions[name] = nearest
            elif name == "head_match":
                match = _head_match(earlier, words, m.head, set(candidates))
                sm.predictions[name] = nearest if match is None else match
            elif name == "rules":
                agreeing = [
                    c for c in candidates if agrees(feats[c], upos[c], feats[m.head], upos[m.head])
                ]
                if not agreeing:
                    sm.predictions[name] = nearest
                else:
                    match = _head_match(earlier, words, m.head, set(agreeing))
                    sm.predictions[name] = _nearest(latest, agreeing) if match is None else match
            else:
                raise ValueError(
                    f"unknown coreference baseline {name!r}; known: {', '.join(BASELINES)}"
                )
        out.append(sm)
    return out


class CoreferenceScorer(CountScorer):
    """Streaming METHODS §3 scorer (ARCHITECTURE.md Scorer contract, via `CountScorer`).

    Rows are (document, label) with label in `LABELS`; every scored mention counts once
    for its kind and once for `ALL`. `unit_counts()` sums the rows of one document that
    come from different windows or batches, so each (unit, label, layer, head, variant)
    appears once.
    """

    analysis = "coreference"
    directions = ("",)
    variants = BASELINES  # the default; an instance may take fewer
    blocks = True  # row by row: a mention's row is its head word's

    def __init__(self, baselines: Sequence[str] = BASELINES):
        super().__init__()
        unknown = set(baselines) - set(BASELINES)
        if unknown:
            raise ValueError(
                f"unknown coreference baseline(s) {sorted(unknown)}; known: {', '.join(BASELINES)}"
            )
        self.variants = tuple(baselines)

    def prepare(self, batch) -> BatchState:
        """Per scored mention, on the batch's device: batch row, query word (the mention head),
        candidate mask and gold mask over the batch's words, and its two rows."""
        import torch

        rows = RowIndex()
        items = []  # (batch row, query word, kind row, ALL row, candidates, gold)
        baseline = []  # per mention: [variant] 0/1
        for b, example in enumerate(batch.examples):
            for sm in scored_mentions(example, self.variants):
                slots = [rows.count(example.unit, label) for label in (sm.kind, ALL)]
                baseline.append([float(sm.hit(sm.predictions[v])) for v in self.variants])
                items.append((b, sm.query, slots[0], slots[1], sm.candidates, sm.gold))
        state = self.new_state(batch, rows.keys, rows.n)
        device = batch.device
        base = torch.tensor(baseline, dtype=torch.float32).reshape(len(items), len(self.variants))
        for column in (2, 3):  # the mention's kind row, its ALL row
            np.add.at(state.baseline_hits, [it[column] for it in items], base.numpy())
        width = int(batch.max_words)
        long = dict(dtype=torch.long, device=device)
        cand = torch.zeros((len(items), width), dtype=torch.bool, device=device)  # [mention, word]
        gold = torch.zeros((len(items), width), dtype=torch.bool, device=device)  # [mention, word]
        cand_r = [r for r, it in enumerate(items) for _ in it[4]]
        gold_r = [r for r, it in enumerate(items) for _ in it[5]]
        cand[
            torch.tensor(cand_r, **long), torch.tensor([c for it in items for c in it[4]], **long)
        ] = True
        gold[
            torch.tensor(gold_r, **long), torch.tensor([c for it in items for c in it[5]], **long)
        ] = True
        rows = np.array([it[2] for it in items] + [it[3] for it in items], dtype=np.int64)
        both = torch.cat([base, base])  # [2 * mention, variant]
        state.own = Mentions(
            b=torch.tensor([it[0] for it in items], **long),
            q=torch.tensor([it[1] for it in items], **long),
            cand=cand,
            gold=gold,
            rows=torch.from_numpy(rows).to(device),
            base=both.to(device),
            both=self.both_index(state, rows, both.numpy()),
            n=len(items),
        )
        return state

    def update(self, att, state) -> None:
        import torch

        m, batch = state.own, state.batch
        if m.n == 0:
            return
        width = int(batch.max_words)
        words = att.words  # [layer, measure, batch, head, word, word + 2]
        if words.shape[-1] - 2 < width:
            raise ValueError(
                f"att.words has {words.shape[-1] - 2} word columns; the batch has {width} words"
            )
        w0, w1, *_ = query_rows(att, batch)
        b, q, cand, gold, rows_of, index = m.b, m.q, m.cand, m.gold, m.rows, m.both
        if (w0, w1) != (0, width):  # a query block: the mentions whose head row is here
            here = ((q >= w0) & (q < w1)).nonzero().squeeze(1)
            if not here.numel():
                return
            both = torch.cat([here, here + m.n])
            b, q, cand, gold = b[here], q[here], cand[here], gold[here]
            rows_of = rows_of[both]
            index = self.both_index(state, rows_of.cpu().numpy(), m.base[both].cpu().numpy())
        # [layer, measure, mention, head, word + 2] (a copy)
        rows = words.movedim(-2, 3)[:, :, b, q - w0]
        rows = rows[..., :width].float()  # [layer, measure, mention, head, word]
        # METHODS §3: the attention a word pays to itself is 0 before any argmax ...
        rows.scatter_(-1, q.view(1, 1, -1, 1, 1).expand(*rows.shape[:-1], 1), 0.0)
        # ... and only candidate words compete (ties -> the lowest index).
        rows.masked_fill_(~cand[:, None, :], float("-inf"))
        pred = first_argmax(rows, -1)  # [layer, measure, mention, head]
        # [layer, measure, mention, head]
        hit = gold.expand(*pred.shape[:2], -1, -1).gather(-1, pred)
        hits = torch.cat([hit, hit], dim=-2)  # [layer, measure, 2 * mention, head]
        self.add(state, att, 0, rows_of, hits)
        self.add_both(state, att, 0, index, hits)


@dataclass
class Mentions:
    """A batch's scored mentions on the device (`CoreferenceScorer.prepare`)."""

    b: torch.Tensor  # [mention] batch row
    q: torch.Tensor  # [mention] the mention's head word (its query row)
    cand: torch.Tensor  # [mention, word] bool: candidate antecedent heads
    gold: torch.Tensor  # [mention, word] bool: candidates heading a mention of its cluster
    rows: torch.Tensor  # [2 * mention]: the kind's row, then ALL's
    base: torch.Tensor  # [2 * mention, variant] baseline hits
    both: BothIndex  # the (mention row, baseline) pairs where the baseline hits (`add_both`)
    n: int  # scored mentions


# ---------------------------------------------------------------- role rule (METHODS §6)

COREF_GAP = 0.05  # the held-out gap to the strongest baseline a coreference head needs
MIN_MENTIONS = 50  # the fewest scored mentions (kind ALL) in the role family


def family(label: str, n: float) -> bool:
    """The heads the coreference rule tests: kind ALL, on at least MIN_MENTIONS mentions."""
    return label == ALL and n >= MIN_MENTIONS


def coreference_match(results) -> pd.DataFrame:
    """The heads that pass the coreference rule (`ROLE.description`)."""
    passed = roles.tested(results, ROLE, COREF_GAP)
    tests = [r for _, r in passed.iterrows()]
    return pd.DataFrame(
        {
            "layer": passed["layer"],
            "head": passed["head"],
            "detail": "coreference (ALL)",
            "short": "coref",
            "score": passed["heldout_gap"],
            "evidence": [
                f"held-out {t['heldout_accuracy']:.4f} vs strongest baseline "
                f"{t['heldout_baseline']:.4f} (gap {t['heldout_gap']:+.4f}, 95% CI "
                f"{roles.gap_interval(t)}); McNemar vs {t['baseline_variant']} p = "
                f"{t['p_value']:.2g}, Holm {t['p_holm']:.2g}"
                for t in tests
            ],
            "brief": [
                f"{t['heldout_accuracy']:.4f} vs {t['heldout_baseline']:.4f}, gap "
                f"{t['heldout_gap']:+.3f} {roles.gap_interval(t)}"
                for t in tests
            ],
        },
        columns=roles.MATCH_COLUMNS,
    )


ROLE = RoleRule(
    "coreference",
    3,
    "#c44e52",
    f"coreference: on at least {MIN_MENTIONS} scored mentions (kind ALL), the held-out gap to "
    f"the strongest baseline (nearest, head_match, rules) is at least {COREF_GAP:g}, and the "
    f"McNemar test has a Holm-adjusted p below {ALPHA:g} (family: every head).",
    coreference_match,
    brief="held-out accuracy vs the strongest baseline, gap [95% CI] (kind ALL)",
    itemised=True,
)


ANALYSIS = register(
    Analysis(
        name="coreference",
        order=20,
        scorer=CoreferenceScorer,
        input=COREFERENCE,
        selection=True,
        description="coreferent antecedents from a mention's head (METHODS §3; Clark et al. 2019 section 4.3)",
        family=family,
        roles=(ROLE,),
        headline=LABELS,
        pictures=MENTIONS,
        picture_items=lambda window: scored_mentions(window, baselines=()),
        report="headprobe.studies.coreference.report:coreference_section",
    )
)
