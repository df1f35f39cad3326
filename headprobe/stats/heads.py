"""Per-head estimates of an analysis's tally as tables (the numbers of `headprobe.stats.estimates`).

    heads = head_table(results, "induction", all_rows_label="mul")   # label x head, with intervals
    groups = group_table(results, "induction")                     # layer x KV group

Every analysis whose labels are per-head shares or means (the token patterns, the sinks,
ablation, logit attribution) shows them with these: score, per-fold scores, 95% bootstrap
interval, the in-sample best baseline and the paired gap, and the KV group of the head.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.stats.estimates import choose, estimate, paired_gap, ratio

HEAD_COLUMNS = [
    "label",
    "layer",
    "head",
    "kv_group",
    "n",
    "score",
    "fold0",
    "fold1",
    "ci_low",
    "ci_high",
    "baseline_variant",
    "baseline_score",
    "gap",
    "gap_low",
    "gap_high",
    "queries",
    "mul_all_rows",
]
GROUP_COLUMNS = ["label", "layer", "kv_group", "heads", "n", "score", "score_max", "best_head"]


def kv_groups(results) -> tuple[int, int]:
    """(KV heads, query heads per KV head): query head h reads KV head h // group (as
    `capture.eager_probs` repeats them). Without GQA, or when the run did not record it,
    every head is its own group."""
    n_heads = results.n_heads
    n_kv = int(results.summary.get("n_kv_heads") or n_heads)
    if n_kv <= 0 or n_heads % n_kv:
        n_kv = n_heads
    return n_kv, n_heads // n_kv


def tally_scores(tally, label: str | None = None) -> pd.DataFrame:
    """layer, head, score (mass / n, all folds and units) of one label of a per-head mass tally
    (default its first label): what a second pass ranks heads by (the pruning curve's order, the
    retrieval check's top heads), read from tallies before any results exist."""
    a = tally.arrays(label if label is not None else tally.sorted_labels()[0])
    mass = a["hits"][:, 0, ..., 0].sum(0)  # [layer, head]
    n = a["n"][:, 0, 0].sum()
    layer, head = np.meshgrid(np.asarray(tally.layers), np.arange(mass.shape[1]), indexing="ij")
    return pd.DataFrame(
        {"layer": layer.ravel(), "head": head.ravel(), "score": ratio(mass, n).ravel()}
    )


def head_table(results, analysis: str, all_rows_label: str | None = None) -> pd.DataFrame:
    """One row per label x head of a token analysis: score (mass / n), per-fold scores,
    95% bootstrap interval, in-sample best baseline and the paired gap interval, KV group;
    `mul_all_rows` (mass / every position, empty rows included) for `all_rows_label`, where the
    tally counts every position (`extra:queries`)."""
    tally = results.tallies.get(analysis)
    if tally is None:
        return pd.DataFrame(columns=HEAD_COLUMNS)
    _, group = kv_groups(results)
    frames = [
        _label_heads(tally, label, group, label == all_rows_label)
        for label in tally.sorted_labels()
    ]
    if not frames:
        return pd.DataFrame(columns=HEAD_COLUMNS)
    out = pd.concat(frames, ignore_index=True)
    for column in HEAD_COLUMNS:
        if column not in out:
            out[column] = np.nan
    return out[HEAD_COLUMNS]


def _label_heads(tally, label: str, group: int, all_rows: bool) -> pd.DataFrame:
    """`head_table`'s rows of one label (the numbers from `headprobe.stats.estimates`)."""
    a = tally.arrays(label)
    mass = a["hits"][..., 0]  # [fold, resample, layer, head]
    n = a["n"][..., 0]  # [fold, resample]
    whole, whole_n = (
        mass.sum(0),
        n.sum(0)[:, None, None],
    )  # [resample, layer, head], [resample, 1, 1]
    score, low, high = estimate(whole, whole_n)  # [layer, head]
    layer, head = np.meshgrid(np.asarray(tally.layers), np.arange(score.shape[1]), indexing="ij")
    frame = {
        "label": label,
        "layer": layer.ravel(),
        "head": head.ravel(),
        "kv_group": (head // group).ravel(),
        "n": float(whole_n[0, 0, 0]),
        "score": score.ravel(),
        "fold0": ratio(mass[0, 0], n[0, 0]).ravel(),
        "fold1": ratio(mass[1, 0], n[1, 0]).ravel(),
        "ci_low": low.ravel(),
        "ci_high": high.ravel(),
    }
    if a["base"].shape[-1]:
        best = choose(a["base"], n, (0, 1), default=0)  # in-sample best baseline
        base = a["base"][..., best].sum(0)[:, None, None]  # [resample, 1, 1]
        gap, g_low, g_high = paired_gap(whole, base, whole_n)  # [layer, head]
        frame.update(
            baseline_variant=tally.variants[best],
            baseline_score=ratio(base[0], whole_n[0]).item(),
            gap=gap.ravel(),
            gap_low=g_low.ravel(),
            gap_high=g_high.ravel(),
        )
    queries = a.get("extra:queries")
    if queries is not None:
        frame["queries"] = float(queries.sum())
        if all_rows:
            frame["mul_all_rows"] = ratio(mass[:, 0].sum(0), float(queries.sum())).ravel()
    return pd.DataFrame(frame)


def group_table(results, analysis: str) -> pd.DataFrame:
    """Per layer x KV group x label: the mean (and max) of its query heads' scores, for
    grouped-query models (SmolLM2: 9 heads, 3 KV heads -> groups of 3). Without GQA each
    group is one head."""
    heads = results.table(f"{analysis}_heads")
    if not len(heads):
        return pd.DataFrame(columns=GROUP_COLUMNS)
    rows = []
    for (label, layer, g), sub in heads.groupby(["label", "layer", "kv_group"], sort=True):
        top = sub.loc[sub["score"].fillna(-1).idxmax()]
        rows.append(
            {
                "label": label,
                "layer": layer,
                "kv_group": g,
                "heads": ",".join(str(h) for h in sub["head"]),
                "n": sub["n"].max(),
                "score": sub["score"].mean(),
                "score_max": sub["score"].max(),
                "best_head": f"{layer}-{int(top['head'])}",
            }
        )
    return pd.DataFrame(rows, columns=GROUP_COLUMNS)
