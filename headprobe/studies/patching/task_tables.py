"""The patching tables from a task's per-unit sums (METHODS §19): intervals by the bootstrap over
units, Holm over the nodes, the estimates against the exact values.

    frames = patching_frames(sums, seed=0, kinds=("atp", "ig"))
    frames["patching_metric"]     # clean, corrupted, difference: value, low, high, n
    frames["patching_nodes"]      # one row per node: noise, denoise, direct, their shares, intervals, p_holm
    frames["patching_check"]      # per estimate and effect: Spearman over every node, its interval

A node's `noise` (`denoise`, `direct`) is its mean per example, sum over units over examples,
and `noise_share` the sum over units over the sum of m_clean - m_corrupted: ratios of sums,
whose every bootstrap resample reweights both (the unit weights of METHODS §5). `p_holm`: each
node's two-sided test of "direct effect = 0" (its bootstrap z: the effect over the resamples'
standard deviation, as for pairs of heads), Holm over every node; where there is no direct
effect (post-norm families) the noising effect's. `p_holm_noise` and `p_holm_denoise` likewise.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import norm

from headprobe.stats.estimates import holm, percentiles
from headprobe.studies.ablation.validation import WEAK, _spearman
from headprobe.studies.composition.first_order import per_resample
from headprobe.studies.composition.tables import unit_weights_matrix

EFFECTS = ("noise", "denoise", "direct")
METRIC_COLUMNS = ["metric", "value", "low", "high", "n"]
CHECK_COLUMNS = ["estimate", "effect", "nodes", "spearman", "ci_low", "ci_high", "warning"]


def shares(values: np.ndarray, total: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """[resample, ...]: sum_u w_u values_u / sum_u w_u total_u, values [unit, ...], total [unit]:
    a share of a signed total (`per_resample` is for counts, whose total is never below 0);
    NaN where a resample's total is 0."""
    top = np.tensordot(weights, values, axes=(1, 0))
    bottom = np.tensordot(weights, total, axes=(1, 0))
    bottom = bottom.reshape(bottom.shape + (1,) * (top.ndim - bottom.ndim))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(bottom != 0, top / np.where(bottom != 0, bottom, 1.0), np.nan)


def estimate_key(kind: str, effect: str) -> str:
    """The column of an estimate: `atp_noise`, `atp_star_denoise`, `ig_noise`, ..."""
    return f"{kind.replace('*', '_star')}_{effect}"


def metric_frame(sums, weights) -> pd.DataFrame:
    """`patching_metric`: m_clean, m_corrupted and their difference, mean per example."""
    count = sums.get("count")
    rows = []
    for name, values in (
        ("clean", sums.get("m_clean")),
        ("corrupted", sums.get("m_corrupted")),
        ("difference", sums.get("m_clean") - sums.get("m_corrupted")),
    ):
        v = per_resample(values, count, weights)  # [resample]
        low, high = percentiles(v[1:])
        rows.append([name, float(v[0]), float(low), float(high), int(count.sum())])
    return pd.DataFrame(rows, columns=METRIC_COLUMNS)


def does_task(metric: pd.DataFrame) -> bool:
    """Whether the model does the task: the difference's interval excludes 0 (and is above it)."""
    diff = metric.set_index("metric").loc["difference"]
    return bool(diff["low"] > 0)


def _z_holm(v: np.ndarray) -> np.ndarray:
    """Holm-adjusted two-sided p of "value = 0" per column of v [1 + resample, node]."""
    sd = np.nanstd(v[1:], 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(sd > 0, v[0] / sd, np.where(v[0] != 0, np.inf, 0.0))
    return holm(2 * norm.sf(np.abs(np.nan_to_num(z))))


def nodes_frame(sums, node_index, weights, kinds=()) -> pd.DataFrame:
    """`patching_nodes` (module docstring); `node_index`: (node, layer, head) per node."""
    count = sums.get("count")
    diff = sums.get("m_clean") - sums.get("m_corrupted")  # [unit]
    frame = pd.DataFrame(node_index, columns=["node", "layer", "head"])
    p = {}
    for effect in EFFECTS:
        values = sums.get(effect)
        if values is None:
            for suffix in ("", "_low", "_high", "_share", "_share_low", "_share_high"):
                frame[effect + suffix] = np.nan
            continue
        v = per_resample(values, count, weights)  # [resample, node] mean per example
        share = shares(values, diff, weights)  # [resample, node]
        low, high = percentiles(v[1:])
        s_low, s_high = percentiles(share[1:])
        frame[effect], frame[f"{effect}_low"], frame[f"{effect}_high"] = v[0], low, high
        frame[f"{effect}_share"] = share[0]
        frame[f"{effect}_share_low"], frame[f"{effect}_share_high"] = s_low, s_high
        p[effect] = _z_holm(v)
    for part in ("direct_answer", "direct_distractor"):
        values = sums.get(part)
        if values is None:
            frame[part] = frame[f"{part}_low"] = frame[f"{part}_high"] = np.nan
            continue
        v = per_resample(values, count, weights)
        low, high = percentiles(v[1:])
        frame[part], frame[f"{part}_low"], frame[f"{part}_high"] = v[0], low, high
    for kind in kinds:
        for effect in ("noise", "denoise"):
            key = estimate_key(kind, effect)
            frame[key] = per_resample(sums.get(key), count, weights[:1])[0]
    frame["p_holm"] = p.get("direct", p["noise"])
    frame["p_holm_noise"], frame["p_holm_denoise"] = p["noise"], p["denoise"]
    return frame


def check_frame(sums, weights, kinds) -> pd.DataFrame:
    """`patching_check`: per estimate and effect, Spearman's rho with the exact values over every
    node, its 95% interval over the units' resamples (both ranked afresh in each), and a plain
    warning below `WEAK`."""
    count = sums.get("count")
    rows = []
    for kind in kinds:
        for effect in ("noise", "denoise"):
            est = per_resample(sums.get(estimate_key(kind, effect)), count, weights)
            exact = per_resample(sums.get(effect), count, weights)  # [resample, node]
            rho = _spearman(est, exact)
            low, high = percentiles(rho[1:])
            warning = ""
            if not rho[0] >= WEAK:
                warning = (
                    f"{kind}'s {effect} estimate ranks the nodes unlike the exact values "
                    f"(Spearman {rho[0]:+.2f} < {WEAK}): read the exact column"
                )
            rows.append(
                [kind, effect, est.shape[1], float(rho[0]), float(low), float(high), warning]
            )
    return pd.DataFrame(rows, columns=CHECK_COLUMNS)


def patching_frames(sums, node_index, seed: int = 0, kinds=()) -> dict:
    """Every patching table but the heads' (module docstring)."""
    weights = unit_weights_matrix(sums.units, seed)  # [1 + resample, unit]
    return {
        "patching_metric": metric_frame(sums, weights),
        "patching_nodes": nodes_frame(sums, node_index, weights, kinds),
        "patching_check": check_frame(sums, weights, kinds),
    }
