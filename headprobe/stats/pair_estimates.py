"""Estimates for pairs of heads: one row per (receiver, sender, channel), with intervals and Holm.

    table = pair_table(tally)     # a pair tally (`headprobe.scoring.pair_tally`)
    table.query("p_holm < 0.05").sort_values("score", ascending=False)
    significant_pairs(table)      # the same; receiver_matches(...) makes role rows of them

Per label and channel, a pair's score is hits / n on the whole data (both folds), its 95%
interval the percentile interval over the bootstrap resamples (METHODS §5; `estimate`), and
its p-value the one-sided bootstrap share of resamples whose score is at most `null`,
(1 + count) / (1 + resamples); `p_holm` adjusts those of one label's pairs together (Holm's
step-down, `holm`): a label is a family. Without resamples the interval and p are NaN.

A pair table enters the rest like a head table: `significant_pairs` selects, `receiver_matches`
turns pairs into a role rule's rows (one per receiver head; `stats.roles.pairs_of` gives a rule the
pair tables of its analyses), and the report shows them (`report.rendered_tables.pair_table_block`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.scoring.pair_tally import pair_arrays
from headprobe.stats.estimates import estimate, holm, ratio
from headprobe.stats.head_selection import ALPHA

PAIR_COLUMNS = [
    "analysis",
    "label",
    "channel",
    "layer",
    "head",
    "sender_layer",
    "sender_head",
    "n",
    "score",
    "ci_low",
    "ci_high",
    "p",
    "p_holm",
]


def pair_table(tally, null: float = 0.0) -> pd.DataFrame:
    """Every label's pairs of heads as rows (`PAIR_COLUMNS`), labels sorted, then channel,
    receiver (layer, head) and sender (layer, head) in order."""
    frames = [_label_rows(tally, label, null) for label in tally.sorted_labels()]
    frames = [frame for frame in frames if len(frame)]
    if not frames:
        return pd.DataFrame(columns=PAIR_COLUMNS)
    return pd.concat(frames, ignore_index=True)[PAIR_COLUMNS]


def _label_rows(tally, label: str, null: float) -> pd.DataFrame:
    arrays = pair_arrays(tally, label)
    hits = np.moveaxis(arrays["hits"].sum(0), -1, 1)  # [resample, channel, l, h, sl, sh]
    n = arrays["n"].sum(0)[:, :, None, None, None, None]  # [resample, channel, 1, 1, 1, 1]
    score, low, high = estimate(hits, n)  # each [channel, l, h, sl, sh]
    resamples = hits.shape[0] - 1
    if resamples:
        at_most = (ratio(hits[1:], n[1:]) <= null).sum(0)
        p = (1 + at_most) / (1 + resamples)
    else:
        p = np.full(score.shape, np.nan)
    channel, layer, head, s_layer, s_head = np.indices(score.shape).reshape(5, -1)
    frame = pd.DataFrame(
        {
            "analysis": tally.analysis,
            "label": label,
            "channel": np.asarray(tally.directions, dtype=object)[channel],
            "layer": np.asarray(tally.layers)[layer],
            "head": head,
            "sender_layer": np.asarray(tally.senders)[s_layer],
            "sender_head": s_head,
            "n": np.broadcast_to(n[0], score.shape).ravel(),
            "score": score.ravel(),
            "ci_low": low.ravel(),
            "ci_high": high.ravel(),
            "p": p.ravel(),
        }
    )
    tested = np.isfinite(frame["p"].to_numpy())
    frame["p_holm"] = np.nan
    frame.loc[tested, "p_holm"] = holm(frame.loc[tested, "p"].to_numpy())
    return frame


# ---------------------------------------------------------------- selection and roles

PAIR_KEYS = ["layer", "head", "sender_layer", "sender_head"]  # receiver, then sender


def is_pair_table(table: pd.DataFrame) -> bool:
    """Whether a table is keyed by pairs of heads (it has `PAIR_KEYS`)."""
    return set(PAIR_KEYS) <= set(table.columns)


def significant_pairs(pairs: pd.DataFrame, alpha: float = ALPHA) -> pd.DataFrame:
    """The pairs whose Holm-adjusted p-value is below `alpha`, highest score first (ties: in the
    table's order)."""
    kept = pairs[pairs["p_holm"] < alpha]
    return kept.sort_values("score", ascending=False, kind="stable").reset_index(drop=True)


def pair_evidence(row) -> str:
    """One pair's numbers as text: 'sender 0-1 (k): 0.4200 [0.3800, 0.4600], p_holm 0.001'."""
    channel = getattr(row, "channel", "")
    return (
        f"sender {int(row.sender_layer)}-{int(row.sender_head)}"
        + (f" ({channel})" if channel else "")
        + f": {row.score:.4f} [{row.ci_low:.4f}, {row.ci_high:.4f}], p_holm {row.p_holm:.3g}"
    )


def receiver_matches(pairs: pd.DataFrame, detail: str, short: str) -> pd.DataFrame:
    """Role match rows (`registry.RoleRule.match`'s columns) from pairs: one per receiver head,
    its highest-scoring pair as the score, every pair given listed in the evidence."""
    columns = ["layer", "head", "detail", "short", "evidence", "score", "brief"]
    if not len(pairs):
        return pd.DataFrame(columns=columns)
    rows = []
    ordered = pairs.sort_values("score", ascending=False, kind="stable")
    for (layer, head), group in ordered.groupby(["layer", "head"], sort=True):
        top = next(group.itertuples(index=False))
        rows.append(
            {
                "layer": int(layer),
                "head": int(head),
                "detail": detail,
                "short": short,
                "evidence": "; ".join(pair_evidence(r) for r in group.itertuples(index=False)),
                "score": float(top.score),
                "brief": f"{detail}: {pair_evidence(top)}",
            }
        )
    return pd.DataFrame(rows, columns=columns)
