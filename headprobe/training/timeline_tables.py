"""A timeline's tables, computed from its checkpoints' saved results (METHODS §17).

    runs = [(record, Results.load(path)), ...]       # record: {"checkpoint", "step", ...}, by step
    tables = timeline_tables(runs, objective="group_ablation-like analysis name")
    tables["timeline_heads"], tables["timeline_onsets"]

Tables (one row per checkpoint and entry; `step, checkpoint` first):
- `timeline_heads`: every head's score per analysis, label and measure (hits / n, or mass / n;
  of two directions the better one on the data), with its 95% bootstrap interval;
- `timeline_best`: each checkpoint's `best_heads`;
- `timeline_roles`: each checkpoint's `roles`;
- `timeline_objective`: the model's own loss (`objective`, value, 95% interval);
- `timeline_onsets`: per role (count of heads) and per analysis's best score (label, measure),
  the consecutive checkpoints with the largest rise, the rise and its paired interval; beside it
  the consecutive checkpoints where the objective falls most, with its paired interval.

Paired: a unit's bootstrap weights are a function of the seed and the unit's id (METHODS §5), so
resample r weighs the same units at every checkpoint; a change's interval is the percentiles of
(value at the later checkpoint - value at the earlier) resample by resample. Everything here is
read from the saved results, so a resumed timeline's tables are those of one run straight through.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.model.control import TRAINED
from headprobe.model.objectives import DESCRIPTIONS
from headprobe.scoring import registry
from headprobe.stats.estimates import percentiles, ratio
from headprobe.stats.head_selection import min_trials
from headprobe.stats.roles import NONE

RECORD = "timeline.json"  # OUT/timeline.json: what the timeline is (its checkpoints, its options)
FORMAT = "headprobe-timeline"
CHECKPOINTS = "checkpoints"  # OUT/checkpoints/<label>/: one results directory each
KEY = ["step", "checkpoint"]
NO_LOSS = DESCRIPTIONS["representation"]  # a model without a language-model head: 0 when intact
HEAD_COLUMNS = [*KEY, "analysis", "label", "measure", "layer", "head", "score", "ci_low", "ci_high"]
OBJECTIVE_COLUMNS = [*KEY, "objective", "value", "ci_low", "ci_high"]
CHANGE = ["from_step", "to_step", "from_checkpoint", "to_checkpoint"]
ONSET_COLUMNS = [
    "quantity",
    "analysis",
    "label",
    "measure",
    *CHANGE,
    "before",
    "after",
    "rise",
    "rise_low",
    "rise_high",
    "objective_from_step",
    "objective_to_step",
    "objective_fall",
    "objective_fall_low",
    "objective_fall_high",
    "same_interval",
]
BEST, ROLE = "best score", "role count"  # the quantities an onset is found for
OBJECTIVE_OPTION = "head_groups"  # the run option whose analysis gates groups (no group: intact)
TABLES = (
    "timeline_heads",
    "timeline_best",
    "timeline_roles",
    "timeline_objective",
    "timeline_onsets",
)


def objective_analysis() -> str:
    """The analysis whose first group is the intact model: the objective of every checkpoint."""
    return next(a.name for a in registry.analyses() if a.added_by == OBJECTIVE_OPTION)


def timeline_tables(runs: list[tuple[dict, object]], objective: str | None) -> dict:
    """{name: DataFrame} of `TABLES` from `runs` [(record, Results)] in step order; `objective`:
    the name of the analysis whose first group is the intact model's loss (None: none scored)."""
    heads, best_of = head_scores(runs, objective)
    roles = _stacked(runs, "roles")
    values = objective_values(runs, objective)
    table = objective_table(runs, values)
    fall = steepest(runs, values, fall=True)
    onsets = [*best_onsets(runs, best_of), *role_onsets(runs, roles)]
    onsets = [dict(row, **_beside(row, fall)) for row in onsets]
    return {
        "timeline_heads": heads,
        "timeline_best": _stacked(runs, "best_heads"),
        "timeline_roles": roles,
        "timeline_objective": table,
        "timeline_onsets": pd.DataFrame(onsets, columns=ONSET_COLUMNS),
    }


def _stacked(runs, name: str) -> pd.DataFrame:
    """One table of every checkpoint's results, `step, checkpoint` first."""
    frames = []
    for record, results in runs:
        table = results.tables.get(name)
        if table is not None and len(table):
            frames.append(table.assign(step=record["step"], checkpoint=record["checkpoint"]))
    if not frames:
        return pd.DataFrame(columns=KEY)
    out = pd.concat(frames, ignore_index=True)
    return out[KEY + [c for c in out.columns if c not in KEY]]


# ------------------------------------------------------------------------------------ heads
def label_values(tally, label: str) -> tuple[np.ndarray, np.ndarray]:
    """(value [resample, layer, head], n [resample]) of one label: hits (or mass) / n over the
    whole data, in the head's better direction on the data (resample 0; ties: the first)."""
    a = tally.arrays(label)
    hits = a["hits"].sum(0)  # [resample, layer, head, direction]
    n = a["n"].sum(0)  # [resample, direction]
    value = ratio(hits, n[:, None, None, :])  # [resample, layer, head, direction]
    pick = np.argmax(np.nan_to_num(value[0], nan=-np.inf), axis=-1)  # [layer, head]
    chosen = np.take_along_axis(value, pick[None, ..., None], axis=-1)[..., 0]
    return chosen, n.max(axis=-1)  # [resample, layer, head], [resample]


def head_scores(runs, objective: str | None) -> tuple[pd.DataFrame, dict]:
    """`timeline_heads`, and per (analysis, label, measure) each checkpoint's best head's values
    over the resamples ([resample], None where the label has too few trials to name one)."""
    rows, best = [], {}
    for k, (record, results) in enumerate(runs):
        for tally in _head_tallies(results, objective):
            for label in tally.sorted_labels():
                value, n = label_values(tally, label)  # [resample, layer, head], [resample]
                low, high = percentiles(value[1:])  # [layer, head]
                layer, head = np.meshgrid(
                    np.asarray(tally.layers), np.arange(value.shape[2]), indexing="ij"
                )
                rows.append(
                    pd.DataFrame(
                        {
                            "step": record["step"],
                            "checkpoint": record["checkpoint"],
                            "analysis": tally.analysis,
                            "label": label,
                            "measure": tally.measure,
                            "layer": layer.ravel(),
                            "head": head.ravel(),
                            "score": value[0].ravel(),
                            "ci_low": low.ravel(),
                            "ci_high": high.ravel(),
                        }
                    )
                )
                key = (tally.analysis, label, tally.measure)
                best.setdefault(key, [None] * len(runs))[k] = _best_values(value, n, tally.analysis)
    heads = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=HEAD_COLUMNS)
    return heads[HEAD_COLUMNS], best


def _head_tallies(results, objective: str | None) -> list:
    """The trained model's tallies keyed by one head (not the objective's whole-model cell, not a
    pair tally), in the analyses' order, then by measure."""
    found = [
        t
        for t in results.tallies.values()
        if t.model == TRAINED
        and t.analysis != objective
        and any(layer >= 0 for layer in t.layers)
        and not t.senders  # a pair tally has no per-head score
    ]
    order = {name: i for i, name in enumerate(registry.ordered([t.analysis for t in found]))}
    return sorted(found, key=lambda t: (order.get(t.analysis, len(order)), t.measure))


def _best_values(value: np.ndarray, n: np.ndarray, analysis: str) -> np.ndarray | None:
    """The resample values [resample] of the head best on the data, or None (too few trials)."""
    flat = value.reshape(value.shape[0], -1)  # [resample, head]
    if n[0] < min_trials(analysis) or not np.isfinite(flat[0]).any():
        return None
    return flat[:, int(np.nanargmax(flat[0]))]


# -------------------------------------------------------------------------------- objective
def objective_values(runs, objective: str | None) -> list[np.ndarray | None]:
    """Per checkpoint, the objective over the resamples ([resample]: the intact model's group,
    the first, of the `objective` analysis's tally), or None where it was not scored."""
    values = []
    for _, results in runs:
        tally = next(
            (t for t in results.tallies.values() if t.analysis == objective and t.model == TRAINED),
            None,
        )
        kind = (results.summary.get("objectives") or {}).get(objective, "")
        if tally is None or not tally.labels or kind.startswith(NO_LOSS):
            values.append(None)  # not scored, or no language-model head: no loss to follow
            continue
        groups = list((results.summary.get(objective) or {}) or tally.sorted_labels())
        a = tally.arrays(groups[0])
        values.append(ratio(a["hits"].sum(0)[:, 0, 0, 0], a["n"].sum(0)[:, 0]))
    return values


def objective_table(runs, values) -> pd.DataFrame:
    rows = []
    for (record, results), value in zip(runs, values):
        if value is None:
            continue
        low, high = percentiles(value[1:])
        kinds = results.summary.get("objectives") or {}
        rows.append(
            {
                "step": record["step"],
                "checkpoint": record["checkpoint"],
                "objective": next(iter(kinds.values()), ""),
                "value": float(value[0]),
                "ci_low": float(low),
                "ci_high": float(high),
            }
        )
    return pd.DataFrame(rows, columns=OBJECTIVE_COLUMNS)


# ----------------------------------------------------------------------------------- onsets
def steepest(runs, values: list, fall: bool = False) -> dict | None:
    """The consecutive checkpoints (both with a value) where `values` rise most (`fall`: fall
    most): {from_step, to_step, from_checkpoint, to_checkpoint, before, after, rise, rise_low,
    rise_high} (a fall as a positive number, its interval likewise), or None (under two values).
    `values`: per checkpoint an array [resample] (a paired interval) or a number (none)."""
    kept = [k for k, v in enumerate(values) if v is not None and np.isfinite(np.ravel(v)[0])]
    best = None
    for a, b in zip(kept, kept[1:]):
        change = np.asarray(values[b], dtype=float) - np.asarray(values[a], dtype=float)
        change = -change if fall else change
        if best is None or change.ravel()[0] > best[2].ravel()[0]:
            best = (a, b, change)
    if best is None:
        return None
    a, b, change = best
    low, high = (np.nan, np.nan) if change.ndim == 0 else map(float, percentiles(change[1:]))
    return {
        "from_step": runs[a][0]["step"],
        "to_step": runs[b][0]["step"],
        "from_checkpoint": runs[a][0]["checkpoint"],
        "to_checkpoint": runs[b][0]["checkpoint"],
        "before": float(np.ravel(values[a])[0]),
        "after": float(np.ravel(values[b])[0]),
        "rise": float(change.ravel()[0]),
        "rise_low": low,
        "rise_high": high,
    }


def best_onsets(runs, best_of: dict) -> list[dict]:
    """Per (analysis, label, measure) with a best head at two checkpoints or more: where the best
    score rises most (the best head may differ from checkpoint to checkpoint)."""
    rows = []
    for (analysis, label, measure), values in best_of.items():
        found = steepest(runs, values)
        if found is not None:
            rows.append(
                dict(quantity=BEST, analysis=analysis, label=label, measure=measure, **found)
            )
    return rows


def role_counts(roles: pd.DataFrame) -> pd.DataFrame:
    """step, checkpoint, measure, role, heads: how many heads have each role first (not `none`)."""
    if not len(roles) or "role" not in roles:
        return pd.DataFrame(columns=[*KEY, "measure", "role", "heads"])
    named = roles[roles["role"] != NONE]
    counts = named.groupby([*KEY, "measure", "role"], sort=True).size().rename("heads")
    return counts.reset_index()


def role_onsets(runs, roles: pd.DataFrame) -> list[dict]:
    """Per role and measure: where the count of heads with the role rises most (a count of
    tests' verdicts: no resampled interval)."""
    counts = role_counts(roles)
    declared = {rule.role: a.name for a, rule in registry.role_rules()}
    rows = []
    for (measure, role), sub in counts.groupby(["measure", "role"], sort=True):
        per = dict(zip(sub["checkpoint"], sub["heads"]))
        values = [float(per.get(record["checkpoint"], 0)) for record, _ in runs]
        found = steepest(runs, values)
        if found is not None:
            row = dict(quantity=ROLE, analysis=declared.get(role, ""), label=role, measure=measure)
            rows.append(dict(row, **found))
    return rows


def _beside(row: dict, fall: dict | None) -> dict:
    """The objective's steepest fall beside an onset, and whether both are the same interval."""
    if fall is None:
        return {"same_interval": False}
    return {
        "objective_from_step": fall["from_step"],
        "objective_to_step": fall["to_step"],
        "objective_fall": fall["rise"],
        "objective_fall_low": fall["rise_low"],
        "objective_fall_high": fall["rise_high"],
        "same_interval": (row["from_step"], row["to_step"]) == (fall["from_step"], fall["to_step"]),
    }
