"""Circuits at MIB's budgets, their faithfulness curves and areas, and the circuit tables
(METHODS §20).

    order = ranking(scores, absolute=False)      # [edge] best first
    out = circuit_out(order, n, reach)           # [receiver, sender] 1 = out of the circuit
    f = faithfulness(m_c, m_clean, m_corr, w)    # [1 + resample, budget]: ratio of sums over units
    cpr, cmd = areas(f_signed), areas(abs(1 - f_absolute))

As MIB (Mueller et al. 2025) computes them (`evaluate_area_under_curve`): a circuit of budget b
is the top int(b x edges) edges; f = (m(C) - m_corrupted) / (m_clean - m_corrupted), here a ratio
of sums over units whose every bootstrap resample reweights both; CPR is the trapezoid area
under f over the budgets as fractions (linear axis, from 0.001 to 1) with edges ranked by their
signed score, CMD the area under |1 - f| with edges ranked by their absolute score. MIB prunes
a circuit's dangling nodes before it evaluates it; that changes no m(C) (a node none of whose
inputs is in the circuit writes its corrupted value either way), so here the budget's edges are
evaluated as ranked and pruning only names the nodes (`pruned`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.stats.estimates import percentiles

BUDGETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
RANKINGS = ("signed", "absolute")  # CPR's curve, CMD's curve
SAMPLES = ("in_sample", "held_out")
FAITHFUL = 0.8  # the smallest circuit whose held-out f has its interval's lower end at or above


def n_edges(total: int, budget: float) -> int:
    """Edges in a circuit of `budget` (a fraction): int(budget x total), as MIB counts them."""
    return int(budget * total)


def ranking(scores: np.ndarray, absolute: bool) -> np.ndarray:
    """[edge] indices best first: by score, or by |score| (ties in edge order)."""
    key = np.abs(scores) if absolute else scores
    return np.argsort(-key, kind="stable")


def circuit_out(order: np.ndarray, n: int, edges: np.ndarray, shape):
    """[receiver, sender] float tensor: 1 for every edge of the graph (`edges` [edge, 2]) outside
    the top `n` of `order`, 0 for those inside and where there is no edge."""
    import torch

    out = torch.zeros(shape)
    rest = edges[order[n:]]
    out[rest[:, 0], rest[:, 1]] = 1.0
    return out


def faithfulness(m_c: np.ndarray, m_clean: np.ndarray, m_corr: np.ndarray, weights) -> np.ndarray:
    """[1 + resample, ...] f from per-unit sums: m_c [unit, ...], m_clean and m_corr [unit];
    weights [1 + resample, unit] (resample 0: the data)."""
    top = np.tensordot(weights, m_c - m_corr.reshape(-1, *([1] * (m_c.ndim - 1))), axes=(1, 0))
    bottom = weights @ (m_clean - m_corr)  # [1 + resample]
    bottom = bottom.reshape(bottom.shape + (1,) * (top.ndim - 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(bottom != 0, top / np.where(bottom != 0, bottom, 1.0), np.nan)


def areas(f: np.ndarray, budgets=BUDGETS) -> np.ndarray:
    """[...]: the trapezoid area of f [..., budget] over the budgets (linear axis)."""
    x = np.asarray(budgets, dtype=float)
    return ((f[..., 1:] + f[..., :-1]) / 2 * np.diff(x)).sum(-1)


CURVE_COLUMNS = ["ranking", "budget", "n_edges"]


def curve_frame(values: dict, counts: list, weights, budgets=BUDGETS, held: bool = True):
    """(`circuit_curve`, `circuit_scores`) from values[(ranking, sample)] = m(C) per-unit sums
    [unit, budget], with "m_clean" and "m_corrupted" [unit]; without `held` (a fold too small)
    the held-out columns are left out, never filled with NaN; no budgets: both tables empty."""
    samples = SAMPLES if held else SAMPLES[:1]
    if not len(budgets):
        return pd.DataFrame(columns=CURVE_COLUMNS), pd.DataFrame(columns=["score", "ranking"])
    m_clean, m_corr = values["m_clean"], values["m_corrupted"]
    f_of = {
        (rank, sample): faithfulness(values[(rank, sample)], m_clean, m_corr, weights)
        for rank in RANKINGS
        for sample in samples
    }
    rows, scores = [], []
    for rank in RANKINGS:
        for i, budget in enumerate(budgets):
            row = {"ranking": rank, "budget": budget, "n_edges": counts[i]}
            for sample in samples:
                f = f_of[(rank, sample)][:, i]
                low, high = percentiles(f[1:])
                row.update(
                    {
                        f"f_{sample}": f[0],
                        f"f_{sample}_low": float(low),
                        f"f_{sample}_high": float(high),
                    }
                )
            rows.append(row)
    for score, rank, gap in (("CPR", "signed", False), ("CMD", "absolute", True)):
        row = {"score": score, "ranking": rank}
        for sample in samples:
            f = f_of[(rank, sample)]
            a = areas(np.abs(1 - f) if gap else f, budgets)  # [1 + resample]
            low, high = percentiles(a[1:])
            row.update({sample: a[0], f"{sample}_low": float(low), f"{sample}_high": float(high)})
        scores.append(row)
    return pd.DataFrame(rows), pd.DataFrame(scores)


def smallest_faithful(curve: pd.DataFrame) -> pd.Series | None:
    """The signed curve's smallest budget short of the whole graph (where f is 1 by definition)
    whose held-out f has its lower end >= FAITHFUL."""
    if "f_held_out_low" not in curve:
        return None
    mine = curve[(curve["ranking"] == "signed") & (curve["budget"] < 1.0)]
    mine = mine[mine["f_held_out_low"] >= FAITHFUL]
    return None if not len(mine) else mine.sort_values("budget").iloc[0]


def pruned(chosen: np.ndarray, edges: np.ndarray, senders: list, receivers: list) -> np.ndarray:
    """[edge] bool: the chosen edges left once nodes with no incoming edge (but the embeddings) or
    no outgoing edge (but the logits) are removed, repeatedly (MIB's `prune`)."""
    keep = chosen.copy()
    sender_node = np.array([senders[s] for s in edges[:, 1]])
    receiver_node = np.array([receivers[r][0] for r in edges[:, 0]])
    while True:
        has_in = set(receiver_node[keep]) | {"embed"}
        has_out = set(sender_node[keep]) | {"logits"}
        alive = keep & np.isin(sender_node, list(has_in)) & np.isin(receiver_node, list(has_out))
        if (alive == keep).all():
            return keep
        keep = alive


def spearman_check(est: dict, exact: np.ndarray, weights) -> pd.DataFrame:
    """`circuit_check`: per estimate, Spearman's rho with the exact values over the validation
    sample, and its 95% interval over the units' resamples; est[kind] and exact: per-unit sums
    [unit, edge]."""
    from headprobe.studies.ablation.validation import WEAK, _spearman

    rows = []
    ex = weights @ exact  # [1 + resample, edge]
    for kind, values in est.items():
        rho = _spearman(weights @ values, ex)
        low, high = percentiles(rho[1:])
        warning = ""
        if not rho[0] >= WEAK:
            warning = (
                f"{kind} ranks the sampled edges unlike their exact path patching "
                f"(Spearman {rho[0]:+.2f} < {WEAK}): read the exact column"
            )
        rows.append([kind, exact.shape[1], float(rho[0]), float(low), float(high), warning])
    return pd.DataFrame(
        rows, columns=["estimate", "edges", "spearman", "ci_low", "ci_high", "warning"]
    )
