"""Dependency arcs (METHODS §2): per head, per relation, both directions.

For a dependent i with head h, on word-level attention A with self-attention
set to 0 and specials dropped:
- dep->head hit:  argmax_j A[i, j] == h
- head<-dep hit:  argmax_j A[j, i] == h
Ties go to the lowest index (`first_argmax`). A row (dep->head) or column
(head<-dep) with no attention left predicts nothing: the arc is a miss. Arcs whose
row or column is empty for every head (a causal model's first word's row, its last
word's column) are counted per relation and direction as `unreachable`.
`root` and `punct` arcs are not scored per relation; `ALL` is every other arc.
Baselines: each fixed offset k in -5..5 (k != 0) predicting h = i + k, and `first`,
predicting the sentence's first word; declared in tie order (smallest |k|, negative
first, then `first`), so the first best is the METHODS §2 choice.

Other conventions (`headprobe.inputs.conventions`, e.g. the released code of Clark et al.
2019) change which relations are scored and the baselines; the scorer reads them from
its `conventions` (the engine hands the run's preset over with `use_conventions`).
The default is METHODS §2's (the `headprobe` preset).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from headprobe.extend import (
    ARCS,
    SENTENCES,
    Analysis,
    BatchState,
    BothIndex,
    CountScorer,
    RoleRule,
    RowIndex,
    masked_word_attention,
    register,
)
from headprobe.inputs.conventions import HEADPROBE, Conventions, get_conventions
from headprobe.inputs.corpora.base import ALL
from headprobe.scoring.scorer_base import query_rows, word_fill
from headprobe.stats import roles
from headprobe.stats.head_selection import ALPHA

if TYPE_CHECKING:
    import torch

UNSCORED = HEADPROBE.unscored  # ("root", "punct")
FIRST = "first"
VARIANTS = HEADPROBE.variants


def scored_arcs(example, conventions: Conventions | None = None):
    """(dependent, head, relation) for every scored arc of an example (head -1: ROOT, scored
    only under conventions that score root arcs; no head ever predicts it)."""
    if example.heads is None:
        return []
    conventions = get_conventions(conventions)
    return [
        (i, h, rel)
        for i, (h, rel) in enumerate(zip(example.heads, example.deprels))
        if conventions.scores(rel) and (h >= 0 or conventions.scores("root"))
    ]


class DependencyScorer(CountScorer):
    analysis = "dependency"
    directions = ("dep->head", "head<-dep")
    variants = VARIANTS
    extras = ("unreachable",)
    blocks = True  # query blocks: dep->head row by row; head<-dep by a running column maximum

    def __init__(self, conventions: Conventions | str | None = None):
        super().__init__()
        self.use_conventions(conventions)

    def use_conventions(self, conventions) -> None:
        """Score under `conventions` (a preset name or object; None: `headprobe`, METHODS §2); before `bind`."""
        conventions = get_conventions(conventions)
        if self.tally_ is not None and conventions.variants != self.variants:
            raise ValueError("conventions must be set before the scorer is bound")
        self.conventions = conventions
        self.variants = conventions.variants

    def prepare(self, batch) -> BatchState:

        from headprobe.inputs.batching import on_device

        rows = RowIndex()
        arcs = []  # (batch row, dependent, head, row of rel, row of ALL)
        for b, example in enumerate(batch.examples):
            scored = scored_arcs(example, self.conventions)
            if not scored:
                continue
            all_row = rows.count(example.unit, ALL, len(scored))
            by_relation = defaultdict(list)
            for i, h, rel in scored:
                by_relation[rel].append((i, h))
            for rel, pairs in by_relation.items():
                row = rows.count(example.unit, rel, len(pairs))
                arcs.extend((b, i, h, row, all_row) for i, h in pairs)
        state = self.new_state(batch, rows.keys, rows.n)
        table = np.array(arcs, dtype=np.int64).reshape(-1, 5)  # [arc, (b, dep, head, row, ALL)]
        n_words = np.array([len(ex.words) for ex in batch.examples], dtype=np.int64)[table[:, 0]]
        base = self.conventions.baseline_hits(
            table[:, 1], table[:, 2], n_words
        )  # [arc, variant]: no attention
        unreachable = self.unreachable(batch, table)  # [arc, direction]
        for column in (3, 4):  # the arc's relation row, its ALL row
            np.add.at(state.baseline_hits, table[:, column], base)
            np.add.at(state.extra["unreachable"], table[:, column], unreachable)
        columns = on_device(table.T, batch.device)  # [5, arc]
        rows = np.concatenate([table[:, 3], table[:, 4]])  # [2 * arc]: its relation's, its ALL
        state.own = Arcs(
            b=columns[0],
            dep=columns[1],
            head=columns[2],
            rows=on_device(rows, batch.device),
            base=on_device(np.concatenate([base, base]), batch.device),
            fill=word_fill(batch),
            both=self.both_index(state, rows, np.concatenate([base, base])),
            n=len(table),
        )
        return state

    def unreachable(self, batch, table) -> np.ndarray:
        """[arc, direction]: 1 where the arc's row (dep->head) or column (head<-dep) is empty
        in every head: in a causal model, the first word sees no other word, and no other
        word sees the last one."""
        out = np.zeros((len(table), 2), dtype=np.int64)
        if self.causal and len(table):
            n_words = np.array([len(ex.words) for ex in batch.examples])[table[:, 0]]
            out[:, 0] = table[:, 1] == 0
            out[:, 1] = table[:, 1] == n_words - 1
        return out

    def update(self, att, state) -> None:
        arcs, batch = state.own, state.batch
        if arcs.n == 0:
            return
        w0, w1, _, _, first, last = query_rows(att, batch)
        if (w0, w1) != (0, batch.max_words):  # one query block of the layer
            return self._update_block(att, state, w0, w1, first, last)
        # [layer, measure, batch, head, word, word]
        scores = masked_word_attention(att, batch, prepared=arcs.fill)
        # the first maximum (ties -> lowest index); a row or column whose maximum is 0 has no
        # attention left after specials and self are removed: it predicts nothing
        to_top = scores.max(dim=-1)  # [layer, measure, batch, head, query]
        from_top = scores.max(dim=-2)  # [layer, measure, batch, head, key]
        for direction, top in enumerate((to_top, from_top)):
            hits = self._hits(state, top.values, top.indices, arcs.b, arcs.dep, arcs.head)
            self.add(state, att, direction, arcs.rows, hits)
            self.add_both(state, att, direction, arcs.both, hits)

    def _update_block(self, att, state, w0, w1, first, last):
        """Word rows `w0:w1` of a layer: dep->head for the arcs whose dependent's row is here;
        head<-dep needs whole columns, so each column's maximum and its first row (ties -> the
        lowest index: a later block replaces it only when strictly greater, exactly as the
        unblocked argmax) run across the blocks (in `state.own.column`) and are scored at the
        layer's last block."""
        import torch

        arcs, batch = state.own, state.batch
        if first:
            arcs.column = None
        if w1 > w0:
            keep, fill = arcs.fill  # [batch, 1, word, word]
            scores = torch.where(
                keep[:, :, w0:w1], att.words[..., : batch.max_words], fill[:, :, w0:w1]
            )  # [measure, batch, head, block row, word]
            to_top = scores.max(dim=-1)  # [layer, measure, batch, head, block row]
            here = ((arcs.dep >= w0) & (arcs.dep < w1)).nonzero().squeeze(1)  # [arc here]
            if here.numel():
                self._add_block_hits(
                    state, att, 0, to_top.values, to_top.indices, here, arcs.dep[here] - w0
                )
            top = scores.max(dim=-2)  # [layer, measure, batch, head, key]
            if arcs.column is None:
                arcs.column = (top.values, top.indices + w0)
            else:
                values, indices = arcs.column
                better = top.values > values
                arcs.column = (
                    torch.where(better, top.values, values),
                    torch.where(better, top.indices + w0, indices),
                )
        if last and arcs.column is not None:
            values, indices = arcs.column
            arcs.column = None
            hits = self._hits(state, values, indices, arcs.b, arcs.dep, arcs.head)
            self.add(state, att, 1, arcs.rows, hits)
            self.add_both(state, att, 1, arcs.both, hits)

    @staticmethod
    def _hits(state, values, indices, b, position, head):
        """[layer, measure, 2 * item, head] 0/1: is the arc whose row (or column) sits at
        `position` [item] of batch row `b` [item] hit by the [layer, measure, batch, head,
        position] maxima `values` / `indices`? Twice over: its relation's row, then ALL's."""
        import torch

        chosen = indices.transpose(-1, -2)[..., b, position, :]  # [layer, measure, item, head]
        alive = values.transpose(-1, -2)[..., b, position, :] > 0  # [layer, measure, item, head]
        hits = ((chosen == head[:, None]) & alive).float()
        return torch.cat([hits, hits], dim=-2)  # [layer, measure, 2 * item, head]

    def _add_block_hits(self, state, att, direction, values, indices, items, position):
        """Hits of arcs `items` [item] (those of one query block) whose row sits at `position`
        [item] of the maxima; their baselines' pairs found here (query blocks only)."""
        import torch

        arcs = state.own
        hits = self._hits(state, values, indices, arcs.b[items], position, arcs.head[items])
        both = torch.cat([items, items + arcs.n])  # its relation row, its ALL row
        rows = arcs.rows[both]
        self.add(state, att, direction, rows, hits)
        index = self.both_index(state, rows.cpu().numpy(), arcs.base[both].cpu().numpy())
        self.add_both(state, att, direction, index, hits)


@dataclass
class Arcs:
    """A batch's scored arcs on the device (`DependencyScorer.prepare`)."""

    b: torch.Tensor  # [arc] batch row
    dep: torch.Tensor  # [arc] dependent word
    head: torch.Tensor  # [arc] head word
    rows: torch.Tensor  # [2 * arc]: the relation's row, then ALL's
    base: torch.Tensor  # [2 * arc, variant] baseline hits
    fill: tuple  # word_fill(batch)
    both: BothIndex  # the (item, baseline) pairs where the baseline hits (`add_both`)
    n: int  # arcs
    column: tuple | None = None  # head<-dep across query blocks: (max, first row) of each column


def baseline_hits(dependent: np.ndarray, head: np.ndarray) -> np.ndarray:
    """[arc, variant] 0/1 under METHODS §2: does each baseline predict each arc's head (order of
    `VARIANTS`)? offset k predicts i + k (out of range: wrong, as it never equals a head);
    `first` predicts word 0. (`Conventions.baseline_hits` for other conventions.)"""
    dependent = np.asarray(dependent)
    return HEADPROBE.baseline_hits(
        dependent, head, np.full(dependent.shape, np.iinfo(np.int32).max)
    )


# ---------------------------------------------------------------- role rule (METHODS §6)

SYNTACTIC_GAP = 0.10  # the held-out gap to the baseline a syntactic head needs
MIN_ARCS = 50  # the fewest arcs of a relation in the role family
NOT_PER_RELATION = (ALL, "root", "punct")  # labels that are not one relation


def family(label: str, n: float) -> bool:
    """The (head, relation) pairs the syntactic rule tests: relations other than ALL, root
    and punct with at least MIN_ARCS arcs."""
    return label not in NOT_PER_RELATION and n >= MIN_ARCS


def syntactic_match(results) -> pd.DataFrame:
    """The heads that pass the syntactic rule for some relation (`ROLE.description`), named by
    the relation(s) with the largest held-out gap."""
    passed = roles.beats_control(results, ROLE, roles.tested(results, ROLE, SYNTACTIC_GAP))
    rows = []
    for (layer, head), group in passed.groupby(["layer", "head"]):
        group = group.sort_values(["heldout_gap", "label"], ascending=[False, True], kind="stable")
        top = group.iloc[0]
        more = "+" if len(group) > 1 else ""
        rows.append(
            {
                "layer": layer,
                "head": head,
                "detail": ", ".join(group["label"]),
                "short": f"{top['label']}{more}",
                "score": top["heldout_gap"],
                "evidence": f"{top['label']}: held-out {top['heldout_accuracy']:.4f} vs baseline "
                f"{top['heldout_baseline']:.4f} (gap {top['heldout_gap']:+.4f}, 95% CI "
                f"{roles.gap_interval(top)}); in-sample "
                f"{top['direction']} {top['accuracy']:.4f} vs {top['baseline_variant']} "
                f"{top['baseline_accuracy']:.4f}, McNemar p = {top['p_value']:.2g}, "
                f"Holm {top['p_holm']:.2g}" + roles.control_text(top["control_heldout"]),
                "brief": f"{top['label']:<{BRIEF_WIDTH}} {top['heldout_accuracy']:.4f} vs "
                f"{top['heldout_baseline']:.4f}, gap {top['heldout_gap']:+.3f} {roles.gap_interval(top)}"
                + (f"; also {', '.join(group['label'].iloc[1:])}" if more else ""),
            }
        )
    return pd.DataFrame(rows, columns=roles.MATCH_COLUMNS)


BRIEF_WIDTH = 10  # a relation's name padded to this width in a brief, so the numbers line up


ROLE = RoleRule(
    "syntactic",
    2,
    "#55a868",
    f"syntactic: for a relation (not ALL, root, punct) with at least {MIN_ARCS} arcs, the held-out "
    f"gap to the baseline (best of offsets and first word; direction and baseline chosen on the "
    f"other fold) is at least {SYNTACTIC_GAP:g}, and the one-sided exact McNemar test against the "
    f"in-sample best baseline has a Holm-adjusted p below {ALPHA:g} (family: every head x "
    "relation tested); with a random-init control (--control random-init), the head's held-out "
    "accuracy is also above the control's held-out best head for the relation; the role names "
    "the relation(s) with the largest held-out gap.",
    syntactic_match,
    brief="relation, held-out accuracy vs baseline, gap [95% CI]; the other relations it passes",
    itemised=True,
)


ANALYSIS = register(
    Analysis(
        name="dependency",
        order=10,
        scorer=DependencyScorer,
        input=SENTENCES,
        selection=True,
        description="dependency arcs per relation, both directions (METHODS §2; Clark et al. 2019 section 4.2)",
        family=family,
        roles=(ROLE,),
        headline=(ALL, "nsubj", "det", "obj", "amod", "aux"),
        pictures=ARCS,
        report="headprobe.studies.dependency.report:dependency_section",
    )
)
