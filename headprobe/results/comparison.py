"""Compare runs: role counts, best heads side by side, and heads matched across models.

    runs = [Run.load("out/minilm"), Run.load("out/bert")]       # or Run("MiniLM", results)
    tables = compare_runs(runs)          # {"role_counts", "best_heads", "matches", "agreement"}
    profiles = head_profiles(results)    # [head, feature]: what each head does, per label
    matches = match_heads(runs[0], runs[1])                      # one row per matched pair

Two models may differ in shape (6 x 12 against 30 x 9 heads). Each head gets a profile of
per-label scores (`head_profiles`): the share of items it gets right for every label and
direction of every counting analysis (dependency relations, coreference kinds, positional
offsets, ...) with enough trials, and its mean attention mass for the surface measures (the
row entropy as a share of the uniform entropy). Only the features both runs have are
compared. Within a run each feature is centred on the mean over heads (what sets a head
apart from the model's other heads), and each analysis's block is divided by the square root
of its feature count, so every analysis weighs the same however many labels it has. Heads
are then matched one to one (`scipy.optimize.linear_sum_assignment`) to maximise the summed
cosine similarity; each pair's similarity and whether the two heads hold the same role are
reported. Runs of one model under two measures (METHODS §7: `measure` column) or against a
control model compare the same way: a `Run` names the measure it reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import linear_sum_assignment

from headprobe.inputs.corpora.base import ALL
from headprobe.scoring import registry
from headprobe.stats.head_selection import SHOWN_COLUMNS, min_trials
from headprobe.stats.roles import NONE, role_summary

MATCH_COLUMNS = [
    "run_a",
    "layer_a",
    "head_a",
    "name_a",
    "role_a",
    "run_b",
    "layer_b",
    "head_b",
    "name_b",
    "role_b",
    "similarity",
    "same_role",
    "depth_a",
    "depth_b",
]
BEST_COLUMNS = ["run", *(c for c in SHOWN_COLUMNS if c != "selection"), "in_sample_heads"]
NOT_HELD_OUT = ("run", "analysis", "label", "n", "in_sample_heads")  # the others: held-out figures


@dataclass
class Run:
    """One side of a comparison: a name, its `Results`, and the measure it reads (None: the
    only one; a run scored on several measures is read under its first, `weights`, unless one
    is named), `source` where it was read from."""

    name: str
    results: object
    measure: str | None = None
    source: str = ""
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        measures = getattr(self.results, "measures", [])
        if self.measure is None and len(measures) > 1:
            self.measure = measures[0]

    @classmethod
    def load(cls, directory, name: str | None = None, measure: str | None = None) -> Run:
        from headprobe.results.query import Results

        results = Results.load(directory)
        return cls(
            name or str(results.summary.get("model") or Path(directory).name),
            results,
            measure,
            str(directory),
        )


def unique_names(runs: list[Run]) -> list[Run]:
    """The runs, each name made unique: a repeated one gets its measure, then ' #2', ' #3'."""
    seen: dict[str, int] = {}
    for run in runs:
        if run.measure and not run.name.endswith(f"({run.measure})"):
            if sum(r.name == run.name for r in runs) > 1:
                run.name = f"{run.name} ({run.measure})"
        seen[run.name] = seen.get(run.name, 0) + 1
        if seen[run.name] > 1:
            run.name = f"{run.name} #{seen[run.name]}"
    return runs


# ---------------------------------------------------------------- profiles


def _of_measure(frame: pd.DataFrame, measure: str | None) -> pd.DataFrame:
    if measure is not None and "measure" in frame.columns:
        return frame[frame["measure"] == measure]
    return frame


def head_profiles(results, measure: str | None = None) -> pd.DataFrame:
    """[head, feature] per-label scores of every head: index (layer, head), columns
    'analysis|label|direction'. Counting analyses give hits / n (labels with at least the
    analysis's `min_n` trials); mass analyses give mass / n per label, or the features their
    analysis declares (`Analysis.profile`: the surface analysis gives its entropy as a share of
    the uniform entropy instead of nats). Read from `results.counts` (whole data, no baselines)."""
    c = _of_measure(results.counts, measure)
    c = c[(c["variant"] == "") & (c["fold"] == "") & (c["layer"] >= 0)]
    columns = {}
    for (analysis, direction), g in c.groupby(["analysis", "direction"], sort=True):
        if g["hits"].notna().any():
            for label, one in g.groupby("label", sort=True):
                one = one.set_index(["layer", "head"])
                if one["n"].max() >= min_trials(analysis):
                    columns[f"{analysis}|{label}|{direction}"] = one["hits"] / one["n"]
            continue
        wide = g.assign(mean=g["mass"] / g["n"]).pivot_table(
            index=["layer", "head"], columns="label", values="mean", aggfunc="sum"
        )
        wide.columns.name = None
        profile = registry.profile_of(analysis)
        for label, values in (wide if profile is None else profile(wide)).items():
            columns[f"{analysis}|{label}|{direction}"] = values
    profiles = pd.DataFrame(columns)
    profiles.index = profiles.index.set_names(["layer", "head"])
    return profiles.sort_index().astype(float)


def comparable(a: pd.DataFrame, b: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The two profiles on their shared features, each centred per feature and weighted so every
    analysis block counts the same: ([heads_a, feature], [heads_b, feature], feature names)."""
    shared = [f for f in a.columns if f in b.columns and a[f].notna().any() and b[f].notna().any()]
    out = []
    for p in (a, b):
        x = p[shared].to_numpy(dtype=float)  # [head, feature]
        x = np.where(np.isnan(x), np.nanmean(x, axis=0, keepdims=True), x)
        x = x - x.mean(axis=0, keepdims=True)
        blocks = np.array([f.split("|", 1)[0] for f in shared])
        for block in set(blocks):
            x[:, blocks == block] /= np.sqrt((blocks == block).sum())
        out.append(x)
    return out[0], out[1], shared


def cosine(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """[rows of x, rows of y] cosine similarity (0 where a row is all zeros)."""
    nx = np.linalg.norm(x, axis=1, keepdims=True)
    ny = np.linalg.norm(y, axis=1, keepdims=True)
    return (x / np.where(nx > 0, nx, 1)) @ (y / np.where(ny > 0, ny, 1)).T


# ---------------------------------------------------------------- matching


def _roles(run: Run) -> pd.DataFrame:
    roles = _of_measure(run.results.roles, run.measure)
    return roles.set_index(["layer", "head"])["role"]


def match_profiles(pa: pd.DataFrame, pb: pd.DataFrame) -> pd.DataFrame:
    """One-to-one matching of the rows (heads) of two profiles maximising the summed cosine
    similarity on their shared features (`comparable`): one row per pair with `a` and `b` (row
    positions) and `similarity`; `attrs`: features, mean_all_pairs (every pair of heads)."""
    xa, xb, shared = comparable(pa, pb)
    if not shared:
        raise ValueError("the runs share no scored label: nothing to match heads on")
    sim = cosine(xa, xb)  # [head_a, head_b]
    rows, cols = linear_sum_assignment(sim, maximize=True)
    out = pd.DataFrame({"a": rows, "b": cols, "similarity": sim[rows, cols]})
    out.attrs.update(features=len(shared), mean_all_pairs=float(sim.mean()))
    return out


def match_heads(a: Run, b: Run) -> pd.DataFrame:
    """The heads of `a` and `b` matched one to one on their profiles (`match_profiles`;
    min(heads) pairs), one row per pair in `a`'s head order (MATCH_COLUMNS). `attrs`: features
    (how many were shared), mean_similarity (matched pairs), mean_all_pairs (every pair of
    heads: what a match by chance would score)."""
    pa, pb = head_profiles(a.results, a.measure), head_profiles(b.results, b.measure)
    try:
        pairs = match_profiles(pa, pb)
    except ValueError as err:
        raise ValueError(f"{a.name} and {b.name}: {err}") from None
    roles_a, roles_b = _roles(a), _roles(b)
    depth = lambda run, layer: layer / max(run.results.n_layers - 1, 1)
    out = []
    for i, j, similarity in zip(pairs["a"], pairs["b"], pairs["similarity"]):
        (la, ha), (lb, hb) = pa.index[i], pb.index[j]
        ra, rb = roles_a.get((la, ha), NONE), roles_b.get((lb, hb), NONE)
        out.append(
            [
                a.name,
                la,
                ha,
                f"{la}-{ha}",
                ra,
                b.name,
                lb,
                hb,
                f"{lb}-{hb}",
                rb,
                float(similarity),
                ra == rb,
                depth(a, la),
                depth(b, lb),
            ]
        )
    matches = pd.DataFrame(out, columns=MATCH_COLUMNS).sort_values(
        ["layer_a", "head_a"], kind="stable"
    )
    matches = matches.reset_index(drop=True)
    matches.attrs.update(pairs.attrs, mean_similarity=float(matches["similarity"].mean()))
    return matches


def role_agreement(matches: pd.DataFrame) -> pd.DataFrame:
    """Per role of the first run's heads: matched heads, how many kept their role in the second
    run, and the share; then 'all heads' and 'heads with a role' (not none)."""
    rows = []
    for role, g in matches.groupby("role_a", sort=False):
        rows.append({"role": role, "heads": len(g), "kept": int(g["same_role"].sum())})
    with_role = matches[matches["role_a"] != NONE]
    rows += [
        {"role": "all heads", "heads": len(matches), "kept": int(matches["same_role"].sum())},
        {
            "role": "heads with a role",
            "heads": len(with_role),
            "kept": int(with_role["same_role"].sum()),
        },
    ]
    out = pd.DataFrame(rows, columns=["role", "heads", "kept"])
    out["share_kept"] = out["kept"] / out["heads"].where(out["heads"] > 0)
    return out


# ---------------------------------------------------------------- side by side


def role_counts(runs: list[Run], order: list[str] | None = None) -> pd.DataFrame:
    """Long table: run, role, heads, share, layers (every role of any run, in `order`)."""
    frames = []
    roles_of = {run.name: _of_measure(run.results.roles, run.measure) for run in runs}
    if order is None:
        order = list(dict.fromkeys(r for roles in roles_of.values() for r in roles["role"]))
        order = [r for r in order if r != NONE] + [NONE]
    for run in runs:
        frames.append(role_summary(roles_of[run.name], order=order).assign(run=run.name))
    return pd.concat(frames, ignore_index=True)[["run", "role", "heads", "share", "layers"]]


def best_heads_side_by_side(runs: list[Run], analysis: str) -> pd.DataFrame:
    """Long table (BEST_COLUMNS): per run and label of `analysis`, the held-out best head with its
    accuracy, interval and gap over the baseline, and the in-sample head; labels in the first
    run's order (ALL first), then labels only later runs have."""
    frames = []
    for run in runs:
        if analysis not in run.results.analyses:
            continue
        wide = _of_measure(run.results.best_heads_wide(analysis), run.measure)
        frames.append(
            pd.DataFrame(
                {
                    "run": run.name,
                    "analysis": analysis,
                    "label": wide["label"],
                    "n": wide["n"],
                    **{c: wide[f"heldout_{c}"] for c in BEST_COLUMNS if c not in NOT_HELD_OUT},
                    "in_sample_heads": wide["heads"],
                    "note": wide["note"]
                    .fillna("")
                    .where(wide["note"].fillna("") != "", wide["heldout_note"].fillna("")),
                }
            )
        )
    if not frames:
        return pd.DataFrame(columns=BEST_COLUMNS + ["note"])
    out = pd.concat(frames, ignore_index=True)
    order = list(dict.fromkeys([ALL] * (ALL in set(out["label"])) + list(out["label"])))
    out["rank"] = out["label"].map({label: i for i, label in enumerate(order)})
    return out.sort_values(["rank"], kind="stable").drop(columns="rank").reset_index(drop=True)


def compare_runs(runs: list[Run]) -> dict[str, pd.DataFrame]:
    """Every comparison table: role_counts, best_heads (every selection analysis), matches (every
    pair of runs, in the order given: run_a, run_b columns), agreement (roles kept, per pair and
    role) and pairs (one row per pair: features, mean similarities, share of roles kept)."""
    runs = unique_names(list(runs))
    analyses = list(dict.fromkeys(a for run in runs for a in run.results.best_heads["analysis"]))
    best = [best_heads_side_by_side(runs, a) for a in analyses]
    matches, agreement, pairs = [], [], []
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            m = match_heads(a, b)
            agree = role_agreement(m).assign(run_a=a.name, run_b=b.name)
            kept = agree.set_index("role")
            pairs.append(
                {
                    "run_a": a.name,
                    "run_b": b.name,
                    "pairs": len(m),
                    "features": m.attrs["features"],
                    "mean_similarity": m.attrs["mean_similarity"],
                    "mean_all_pairs": m.attrs["mean_all_pairs"],
                    "roles_kept": kept.at["all heads", "share_kept"],
                    "roles_kept_with_role": kept.at["heads with a role", "share_kept"],
                }
            )
            matches.append(m)
            agreement.append(agree)
    return {
        "role_counts": role_counts(runs),
        "best_heads": pd.concat(best, ignore_index=True)
        if best
        else pd.DataFrame(columns=BEST_COLUMNS),
        "matches": pd.concat(matches, ignore_index=True)
        if matches
        else pd.DataFrame(columns=MATCH_COLUMNS),
        "agreement": pd.concat(agreement, ignore_index=True) if agreement else pd.DataFrame(),
        "pairs": pd.DataFrame(pairs),
    }
