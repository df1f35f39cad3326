"""Weights beside norms (METHODS §7): views of `Results` scored on several measures.

    from headprobe.results.measure_views import role_changes
    role_changes(results)             # heads whose role differs between the measures

The report (`report/measures.py`) and `analyses/kobayashi2020_norms.py` render them; an
analysis's own views under each measure live in its module (`Analysis.measures_report`; the
surface analysis's: `headprobe.studies.surface.surface_measures`).
"""

from __future__ import annotations

import pandas as pd


def role_changes(results):
    """Heads whose role differs between the first two measures: layer, head, name, and per
    measure its role, detail and evidence (`roles` table)."""
    measures = results.measures[:2]
    columns = ["layer", "head", "name"] + [
        f"{c}_{m}" for m in measures for c in ("role", "detail", "evidence")
    ]
    roles = results.roles
    if len(measures) < 2 or not len(roles):
        return pd.DataFrame(columns=columns)
    keep = ["layer", "head", "name", "role", "detail", "evidence"]
    first, second = (
        roles[roles["measure"] == m][keep].set_index(["layer", "head", "name"]) for m in measures
    )
    both = first.merge(
        second,
        left_index=True,
        right_index=True,
        how="outer",
        suffixes=(f"_{measures[0]}", f"_{measures[1]}"),
    ).reset_index()
    changed = both[both[f"role_{measures[0]}"] != both[f"role_{measures[1]}"]]
    return changed[columns].sort_values(["layer", "head"]).reset_index(drop=True)
