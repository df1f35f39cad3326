"""The composition's tables from per unit sums (METHODS §5, §18): bootstrap intervals over units,
Holm across every edge, the check of the first-order estimate, the weights-only comparison.

    frames = composition(model, batches, ablation="mean", baseline=means, token_id=5)
    frames["composition_edges"]          # one row per (sender, receiver, channel)
    frames["composition_check"]          # the validation sample: estimate beside exact
    frames["composition_check_correlation"]   # Spearman, its interval, a plain warning below 0.5
    frames["composition_weights"]        # weights-only scores, their Gaussian null and rank
                                         # correlation with the interventional effects

Intervals: the 95% percentile interval over the units' Poisson(1) bootstrap resamples (the
tally's unit weights, `scoring.tally.UnitDraws`; a resample's effect is its weighted row sums
over its weighted rows). `p_holm`: each edge's two-sided test of "output effect = 0" (its
bootstrap z, the effect over the resamples' standard deviation; with 1,000 resamples the
smallest percentile p-value, 1/1001, could never survive Holm over thousands of edges), Holm's
correction over every edge of the run (`stats.estimates.holm`). The pattern and output effects
are magnitudes, so a small `p_holm` says an edge is not 0, not that it matters: the effect
sizes rank the edges.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import norm

from headprobe.model.layer_cache import check_supported
from headprobe.model.objectives import Objective
from headprobe.scoring.tally import UnitDraws
from headprobe.stats.estimates import holm, percentiles
from headprobe.studies.ablation.validation import _spearman
from headprobe.studies.composition.first_order import KIND, check_frames, per_resample
from headprobe.studies.composition.path_patching import validation_sample
from headprobe.studies.composition.run_options import SENDER, sender_kind
from headprobe.studies.composition.sweep import composition_sums, exact_sums
from headprobe.studies.composition.weights import composition_weights

KEYS = ["layer", "head", "channel", "sender_layer", "sender_head"]
EFFECTS = ("pattern_effect", "output_effect", "role_effect")
ROLE_SHARE = 0.4  # a receiver's role: the pattern role whose clean share of attention passes it
CHUNK = 4096  # edges per bootstrap block ([resample, edge] float64: 33 MB)


def unit_weights_matrix(units, seed: int = 0) -> np.ndarray:
    """[1 + resample, unit]: each unit's bootstrap weights (resample 0: the data, all 1)."""
    draws = UnitDraws.shared(seed)
    return np.stack([draws(u)[1] for u in units], 1).astype(np.float64)


def receiver_roles(sums, share: float = ROLE_SHARE) -> dict:
    """(layer, head) -> role name: the pattern role with the largest clean share of the head's
    attention on its targets, where that share is at least `share` (interim: the run's role map
    names them once composition is an analysis of a run)."""
    out, best = {}, {}
    for name, scores in sums.scores.items():
        n = sums.role_rows[name].sum()
        if n <= 0:
            continue
        value = scores.sum(0) / n  # [layer, head]
        for l, h in zip(*np.nonzero(value >= share)):
            if value[l, h] > best.get((l, h), -1):
                best[(int(l), int(h))], out[(int(l), int(h))] = value[l, h], name
    return out


def role_score_table(sums, seed: int = 0) -> pd.DataFrame:
    """Per role and head: the clean share of attention on the role's targets, with interval."""
    weights = unit_weights_matrix(sums.units, seed)
    rows = []
    for name, scores in sums.scores.items():
        v = per_resample(scores, sums.role_rows[name], weights)  # [resample, layer, head]
        low, high = percentiles(v[1:])
        for l, h in np.ndindex(v.shape[1:]):
            rows.append([name, l, h, v[0, l, h], low[l, h], high[l, h]])
    return pd.DataFrame(rows, columns=["role", "layer", "head", "score", "ci_low", "ci_high"])


def _effect(values, count, weights, chunk):
    """(value, low, high, sd) per edge of values[:, chunk]."""
    v = per_resample(values[:, chunk], count, weights)  # [resample, edge]
    low, high = percentiles(v[1:])
    return v[0], low, high, np.nanstd(v[1:], 0)


def edges_frame(sums, ablation: str, roles: dict | None = None, seed: int = 0) -> pd.DataFrame:
    """`composition_edges`: KEYS, ablation, role, each effect with `_low`/`_high` (95%), the
    first-order `estimate` (objective change per piece) and `p_holm` (module docstring)."""
    roles = receiver_roles(sums) if roles is None else roles
    weights = unit_weights_matrix(sums.units, seed)
    n = len(sums.edges)
    out = {f"{e}{s}": np.full(n, np.nan) for e in EFFECTS for s in ("", "_low", "_high")}
    out["estimate"], z = np.full(n, np.nan), np.full(n, np.nan)
    role_of = np.array([roles.get(e[1], "") for e in sums.edges], dtype=object)
    for start in range(0, n, CHUNK):
        chunk = slice(start, min(n, start + CHUNK))
        for name, values, count in (
            ("pattern_effect", sums.pattern, sums.rows),
            ("output_effect", sums.output, sums.rows),
        ):
            v, low, high, sd = _effect(values, count, weights, chunk)
            out[name][chunk], out[f"{name}_low"][chunk], out[f"{name}_high"][chunk] = v, low, high
            if name == "output_effect":
                with np.errstate(invalid="ignore", divide="ignore"):
                    z[chunk] = np.where(sd > 0, v / sd, np.where(v != 0, np.inf, 0.0))
        for name in sums.role:
            mine = np.flatnonzero(role_of[chunk] == name) + start
            if len(mine):
                v, low, high, _ = _effect(sums.role[name], sums.role_rows[name], weights, mine)
                for key, got in zip(("", "_low", "_high"), (v, low, high)):
                    out[f"role_effect{key}"][mine] = got
        if sums.estimate is not None:
            out["estimate"][chunk] = per_resample(
                sums.estimate[:, chunk], sums.tokens, weights[:1]
            )[0]
    frame = pd.DataFrame(
        [(l, h, c, sl, sh) for (sl, sh), (l, h), c in sums.edges], columns=KEYS
    ).assign(**{KIND: ablation, "role": role_of})
    frame[SENDER] = [sender_kind(*e[0]) for e in sums.edges]  # "head", "mlp" or "embed"
    frame = pd.concat([frame, pd.DataFrame(out)], axis=1)
    frame["p_holm"] = holm(2 * norm.sf(np.abs(np.nan_to_num(z))))
    return frame


def check_sample(edges_table: pd.DataFrame, seed: int = 0) -> tuple[list, list]:
    """(edges, "top"/"random" per edge): the validation sample, top by pattern or output effect
    (an edge's better rank of the two) and the rest drawn by a keyed hash (`validation_sample`)."""
    edges = [
        ((int(r.sender_layer), int(r.sender_head)), (int(r.layer), int(r.head)), r.channel)
        for r in edges_table.itertuples()
    ]
    rank = np.minimum(
        edges_table["pattern_effect"].rank(ascending=False, method="first").to_numpy(),
        edges_table["output_effect"].rank(ascending=False, method="first").to_numpy(),
    )
    chosen = validation_sample(edges, -rank, seed)
    top = {edges[i] for i in np.argsort(rank, kind="stable")[:20]}
    return chosen, ["top" if e in top else "random" for e in chosen]


def weights_frame(weights: pd.DataFrame, edges_table: pd.DataFrame) -> pd.DataFrame:
    """`composition_weights`: the weights-only scores with the interventional effects beside
    them, and per channel the Spearman correlation of score and each effect (`spearman_*`,
    the same on every row of a channel). MLP and embeddings senders have no W_OV, so no
    weights-only score: their edges follow with `score`, `null_mean`, `null_sd`, `z` NaN."""
    effects = edges_table[KEYS + ["pattern_effect", "output_effect"]]
    merged = weights.merge(effects, on=KEYS, how="left")
    if SENDER in edges_table:
        others = effects[edges_table[SENDER] != "head"]
        merged = pd.concat([merged, others], ignore_index=True) if len(others) else merged
    for effect in ("pattern_effect", "output_effect"):
        merged[f"spearman_{effect.split('_')[0]}"] = np.nan
        for _, part in merged.groupby("channel"):
            ok = part[["score", effect]].dropna()
            if len(ok) >= 3:
                rho = _spearman(ok["score"].to_numpy()[None], ok[effect].to_numpy()[None])[0]
                merged.loc[part.index, f"spearman_{effect.split('_')[0]}"] = rho
    return merged


def composition(
    model,
    batches,
    ablation: str = "mean",
    baseline=None,
    receivers=None,
    objective=None,
    token_id: int | None = None,
    stack=None,
    seed: int = 0,
    progress=None,
    roles: dict | None = None,
    sums=None,
    senders=("heads",),
) -> dict:
    """Every table of the composition (module docstring) over `batches` (a list: the check
    streams them a second time). baseline: the ablation values of `ablation` (None: zero; a
    tensor for mean; `sweep.resampled(baselines)` for resample);
    token_id: an ordinary token for the weights-only scores (None: that table is left out);
    sums: the sweep's `UnitSums` over `batches` where the caller streamed them already;
    senders: the kinds of sender (`sweep.composition_sums`)."""
    stack = check_supported(model, stack)
    objective = objective or Objective.for_model(model, stack=stack)
    if sums is None:
        sums = composition_sums(
            model, batches, receivers, baseline, objective, stack, None, progress, senders
        )
    if callable(roles):  # a function of the sums: the receivers' roles from the run itself
        roles = roles(sums)
    edges = edges_frame(sums, ablation, roles, seed=seed)
    sample, kinds = check_sample(edges, seed)
    units, exact, tokens = exact_sums(model, batches, sample, baseline, objective, stack)
    index = {e: i for i, e in enumerate(sums.edges)}
    order = [sums.units.index(u) for u in units]
    estimate = None  # the objective has no first-order estimate (`first_order.has_estimate`)
    if sums.estimate is not None:
        estimate = sums.estimate[order][:, [index[e] for e in sample]]
    weights = unit_weights_matrix(units, seed)
    kind = getattr(objective, "kind", "")
    check, correlation = check_frames(
        sample, kinds, exact, estimate, tokens, weights, ablation, kind
    )
    out = {
        "composition_edges": edges,
        "composition_check": check,
        "composition_check_correlation": correlation,
        "role_scores": role_score_table(sums, seed),
        "sums": sums,
    }
    if token_id is not None:
        out["composition_weights"] = weights_frame(
            composition_weights(model, token_id, stack), edges
        )
    return out
