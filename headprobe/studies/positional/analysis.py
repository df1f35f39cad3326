"""Positional proximity (METHODS §4, Voita et al. 2019).

Per head, over word queries (specials are not queries): where does the argmax
of the word-level row sit? Self is included, specials are included (as two key
columns, CLS-like and SEP-like). Labels: relative offsets -2..+2, `special`,
`other`. A *positional head* (`positional_heads`, the table the role reads) is one where a
single non-zero offset takes at least `POSITIONAL_SHARE` (0.9) of the argmaxes (its role rule, `ROLE`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from headprobe.extend import (
    SENTENCES,
    Analysis,
    BatchState,
    CountScorer,
    RoleRule,
    first_argmax,
    register,
)
from headprobe.scoring.registry import get
from headprobe.scoring.scorer_base import UnitLabelRows, query_rows
from headprobe.stats import roles

if TYPE_CHECKING:
    import torch

OFFSET_LABELS = ["-2", "-1", "0", "+1", "+2"]
LABELS = OFFSET_LABELS + ["special", "other"]
MARKER_BUCKET, OTHER = len(OFFSET_LABELS), len(OFFSET_LABELS) + 1


class PositionalScorer(UnitLabelRows, CountScorer):
    analysis = "positional"
    labels = LABELS
    bootstrap = False
    blocks = True  # row by row: each query's argmax is in its own row

    def prepare(self, batch) -> BatchState:
        import torch

        from headprobe.inputs.batching import on_device

        keys, n, first_row = self.unit_rows(batch, lambda example, label: len(example.words))
        q_b, q_i = batch.word_rows()  # [query]: every real word, in order (host)
        put = lambda array: on_device(array, batch.device)
        keys_ok = torch.cat([batch.word_mask, batch.special_present], dim=1)  # [batch, word + 2]
        own = Queries(
            put(first_row),
            put(q_b),
            put(q_i),
            keys_ok[:, None, None, :],  # [batch, 1, 1, word + 2]
            put(first_row[q_b]),
            put(np.arange(len(keys), dtype=np.int64)),
        )
        return self.new_state(batch, keys, n, own)

    def update(self, att, state) -> None:
        import torch

        own, batch = state.own, state.batch
        w0, w1, *_ = query_rows(att, batch)
        q_b, q_i, q_row = own.q_b, own.q_i, own.q_row  # [query]
        if (w0, w1) != (0, batch.max_words):  # a query block: its word rows
            here = (q_i >= w0) & (q_i < w1)
            q_b, q_i, q_row = q_b[here], q_i[here], q_row[here]
            if not q_b.numel():
                return
        # [layer, measure, batch, head, word, word + 2]
        scores = torch.where(own.key_ok, att.words, -1.0)
        target = first_argmax(scores, -1)  # [layer, measure, batch, head, word]
        target = target.transpose(-1, -2)[..., q_b, q_i - w0, :]  # [layer, measure, query, head]
        offset = target - q_i[:, None]  # [layer, measure, query, head]
        bucket = torch.where(offset.abs() <= 2, offset + 2, OTHER)
        bucket = torch.where(target >= batch.max_words, MARKER_BUCKET, bucket)
        rows = q_row[:, None] + bucket  # [layer, measure, query, head]
        counts = rows.new_zeros((*rows.shape[:2], len(state.keys), self.n_heads), dtype=torch.float)
        counts.scatter_add_(2, rows, torch.ones_like(rows, dtype=counts.dtype))
        self.add(state, att, 0, own.every_row, counts)


@dataclass
class Queries:
    """A batch's query words and rows (`PositionalScorer.prepare`)."""

    first_row: torch.Tensor  # [batch] each example's first row (its labels follow)
    q_b: torch.Tensor  # [query] batch row
    q_i: torch.Tensor  # [query] word
    key_ok: torch.Tensor  # [batch, 1, 1, word + 2] words and the specials present
    q_row: torch.Tensor  # [query] its example's first row
    every_row: torch.Tensor  # [row] 0, 1, ...


POSITIONAL_SHARE = 0.9  # the share of argmaxes at one non-zero offset that makes a head positional


def positional_heads(counts: pd.DataFrame, threshold: float = POSITIONAL_SHARE) -> pd.DataFrame:
    """Per head: the share of argmaxes at each offset; positional if one non-zero offset >= threshold."""
    rows = counts[(counts["analysis"] == "positional") & (counts["fold"] == "")]
    if rows.empty:
        return pd.DataFrame(columns=["layer", "head", "n", "offset", "share", "positional"])
    share = (
        rows.assign(share=rows["hits"] / rows["n"])
        .pivot_table(index=["layer", "head"], columns="label", values="share", aggfunc="sum")
        .fillna(0.0)
    )
    nonzero = [c for c in OFFSET_LABELS if c != "0" and c in share.columns]
    top = share[nonzero].idxmax(axis=1)
    out = share.reset_index()
    out.insert(2, "n", rows.groupby(["layer", "head"])["n"].max().reindex(share.index).to_numpy())
    out["offset"] = top.to_numpy()
    out["share"] = share[nonzero].max(axis=1).to_numpy()
    out["positional"] = out["share"] >= threshold
    out.columns.name = None
    return out


# ---------------------------------------------------------------- role rule (METHODS §6)


def offset_shares(results, analysis: str) -> pd.DataFrame:
    """The table analysis `analysis` declares with each head's dominant offset and its share
    (columns layer, head, offset, share, ...); empty when it declares none."""
    for name in get(analysis).tables:
        table = results.tables.get(name)
        if table is not None and {"layer", "head", "offset", "share"} <= set(table.columns):
            return table
    return pd.DataFrame(columns=["layer", "head", "offset", "share"])


def positional_match(results) -> pd.DataFrame:
    """The heads whose dominant non-zero offset takes at least `POSITIONAL_SHARE` of their argmaxes."""
    heads = roles.concat(
        [offset_shares(results, name) for name in roles.analyses_of(ROLE, results)]
    )
    heads = heads[heads["share"] >= POSITIONAL_SHARE] if len(heads) else heads
    return pd.DataFrame(
        {
            "layer": heads.get("layer", []),
            "head": heads.get("head", []),
            "detail": [f"offset {o}" for o in heads.get("offset", [])],
            "short": list(heads.get("offset", [])),
            "score": list(heads.get("share", [])),
            "evidence": [
                f"share of argmaxes at {o} = {s:.4f}"
                for o, s in zip(heads.get("offset", []), heads.get("share", []))
            ],
            "brief": [
                f"{o} {s:.3f}" for o, s in zip(heads.get("offset", []), heads.get("share", []))
            ],
        },
        columns=roles.MATCH_COLUMNS,
    )


ROLE = RoleRule(
    "positional",
    1,
    "#4c72b0",
    f"positional: a single non-zero offset (-2, -1, +1, +2) takes at least {POSITIONAL_SHARE:g} "
    "of the head's argmaxes (Voita et al. 2019).",
    positional_match,
    brief="offset, share of argmaxes",
)


ANALYSIS = register(
    Analysis(
        name="positional",
        order=30,
        scorer=PositionalScorer,
        input=SENTENCES,
        selection=False,
        cross=True,
        description="argmax offsets per head (METHODS §4; Voita et al. 2019)",
        roles=(ROLE,),
        tables={"positional_heads": lambda results: positional_heads(results.counts)},
        report="headprobe.studies.positional.report:positional_section",
    )
)
