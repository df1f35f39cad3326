"""The role rules of token patterns (`headprobe.extend.patterns`): `PatternRule`, what a
declared pattern says of its role, and `pattern_rule`, the rule it makes (the head's score at
least a threshold on each fold, the interval's lower end at least a value, the gap to the best
baseline above 0, enough rows; the patterns module's docstring says why)."""

from __future__ import annotations

from dataclasses import dataclass
from hashlib import blake2b

import numpy as np
import pandas as pd

from headprobe.scoring.registry import RoleRule
from headprobe.stats.head_selection import MIN_N
from headprobe.stats.roles import MATCH_COLUMNS

MUL = "mul"  # the label a rule reads by default (`patterns.MUL`)


# ---------------------------------------------------------------------------- role rules


def pattern_rule(
    role: str,
    analysis: str,
    order: float,
    color: str,
    short: str,
    threshold: float,
    lower: float,
    what: str,
    label: str = MUL,
    min_n: int = MIN_N,
    baseline: bool = True,
) -> RoleRule:
    """A held-out threshold rule on one label of a token analysis's `<analysis>_heads` table:
    score >= threshold on each fold, bootstrap lower end >= lower, (with `baseline`) the gap
    interval to the in-sample best baseline above 0, and n >= min_n."""

    def match(results) -> pd.DataFrame:
        table = results.tables.get(f"{analysis}_heads")
        if table is None or not len(table):
            return pd.DataFrame(columns=MATCH_COLUMNS)
        t = table[table["label"] == label]
        ok = (
            (t["n"] >= min_n)
            & (t["fold0"] >= threshold)
            & (t["fold1"] >= threshold)
            & (t["ci_low"] >= lower)
        )
        if baseline:
            ok &= t["gap_low"] > 0
        hit = t[ok.fillna(False).astype(bool)]
        evidence = [_evidence(r, label, threshold, lower, baseline) for r in hit.itertuples()]
        return pd.DataFrame(
            {
                "layer": hit["layer"],
                "head": hit["head"],
                "detail": what,
                "short": short,
                "evidence": evidence,
                "score": hit["score"],
                "brief": [
                    f"{r.score:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]" for r in hit.itertuples()
                ],
            },
            columns=MATCH_COLUMNS,
        )

    description = _rule_description(role, what, label, threshold, lower, baseline, min_n)
    brief = f"{label} score [95% CI]"
    return RoleRule(role, order, color, description, match, brief=brief)


def _evidence(r, label: str, threshold: float, lower: float, baseline: bool) -> str:
    """Why head row `r` of a `<analysis>_heads` table meets a `pattern_rule`, in words."""
    text = (
        f"{label} score {r.score:.4f} [{r.ci_low:.4f}, {r.ci_high:.4f}] on {int(r.n)} rows; "
        f"fold 0 {r.fold0:.4f}, fold 1 {r.fold1:.4f} (each >= {threshold:g}; lower end >= {lower:g})"
    )
    if baseline:
        text += f"; vs {r.baseline_variant} {r.baseline_score:.4f}: gap [{r.gap_low:+.4f}, {r.gap_high:+.4f}]"
    if label == MUL and np.isfinite(r.mul_all_rows):
        text += f"; mul over all rows {r.mul_all_rows:.4f}"
    return text


def _rule_description(role, what, label, threshold, lower, baseline, min_n) -> str:
    """What a `pattern_rule` checks, in one sentence (the report's list of rules)."""
    gap = (
        (
            ", the paired 95% interval of its gap to the analysis's best baseline (the best on all data) lies "
            "above 0"
        )
        if baseline
        else ""
    )
    return (
        f"{role}: {what}; the head's {label} score is at least {threshold:g} on each fold (found on "
        f"one half of the units, confirmed on the other), the lower end of its 95% bootstrap interval "
        f"is at least {lower:g}{gap}, on at least {min_n} rows."
    )


USER_ORDER = 0.9  # after induction (0.5) and duplicate-token (0.6), before positional (1)
USER_COLORS = ("#17becf", "#bcbd22", "#e377c2", "#ff9896", "#aec7e8", "#98df8a")


@dataclass(frozen=True)
class PatternRule:
    """The role rule of a declared pattern (`pattern_rule` says what it checks): the head's
    `label` score is at least `threshold` on each fold, the 95% interval's lower end at least
    `lower`, (with `baseline`) the gap interval to the best baseline above 0, on at least
    `min_n` rows. `what` says in words what the pattern is; `order` places the role among the
    others (a head gets the first it meets); `short` labels the role map's cells."""

    role: str
    threshold: float
    lower: float
    what: str
    order: float = USER_ORDER
    color: str | None = None  # None: one of USER_COLORS, by the role's name
    short: str = ""  # "": the role's first 4 letters
    label: str = MUL
    min_n: int = MIN_N
    baseline: bool = True

    def for_analysis(self, analysis: str) -> RoleRule:
        color = (
            self.color
            or USER_COLORS[
                int.from_bytes(blake2b(self.role.encode(), digest_size=2).digest(), "little")
                % len(USER_COLORS)
            ]
        )
        return pattern_rule(
            self.role,
            analysis,
            self.order,
            color,
            self.short or self.role[:4],
            self.threshold,
            self.lower,
            self.what,
            label=self.label,
            min_n=self.min_n,
            baseline=self.baseline,
        )
