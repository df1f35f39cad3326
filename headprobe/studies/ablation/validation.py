"""Every estimate shown against the exact effect (METHODS §8 "Estimates").

    headprobe.run("smollm2", probe="repeated-random", analyses=["importance"], estimate="michel,atp")
    results.importance_check              # per estimate: the sample's heads, estimate and exact effect
    results.importance_check_correlation  # per estimate: Spearman's rho on the sample, 95% interval

`importance_check` comes with every `importance` run (`added_by`): a second pass over the same
inputs (`second_pass`) that ablates exactly, by the kinds of `--ablation`, a validation sample
of heads: each estimate's top `TOP` (largest first) and `RANDOM` others drawn by a keyed hash
of the seed and the head (`keyed_hash(seed, "check", "L-H")`, smallest first) from the heads in
no estimate's top. Each estimate is compared, on every head of the sample (its own top, the
others' and the draw: `sample`), with the exact effect of its own kind of ablation (michel:
zero; atp, atp*: theirs).
The correlation's interval is over the units' bootstrap resamples: the estimate's and the
exact effect's per-resample values (the same weights) ranked afresh in each.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.core.seeds import keyed_hash
from headprobe.extend import ANY, Analysis, register
from headprobe.stats.estimates import percentiles, ratio
from headprobe.stats.heads import tally_scores
from headprobe.studies.ablation.effects import (
    AblationScorer,
    label_parts,
    objective_table,
    row_label,
)

TOP, RANDOM = 10, 10  # the validation sample: each estimate's top heads, and heads drawn at random
WEAK = 0.5  # a correlation below it is called out
CHECK = "importance_check"


class CheckScorer(AblationScorer):
    """The exact effects of the validation sample of heads (`use_tallies` picks them)."""

    analysis = CHECK
    second_pass = True

    def __init__(self):
        super().__init__()
        self.sample: dict = {}

    @staticmethod
    def prerequisites(kind: str, heads=None) -> list[str]:
        return ["importance"]

    def use_tallies(self, tallies: dict) -> None:
        """Each estimate's top heads by the first pass's `importance` tally, and random others."""
        tally = tallies["importance"]
        top = {}
        for label in tally.sorted_labels():
            scores = tally_scores(tally, label).sort_values(
                ["score", "layer", "head"], ascending=[False, True, True], kind="stable"
            )
            top[label] = [(int(r.layer), int(r.head)) for r in scores.head(TOP).itertuples()]
        every = [(int(r.layer), int(r.head)) for r in tally_scores(tally).itertuples()]
        chosen = {h for heads in top.values() for h in heads}
        seed = self.tally_.seed if self.tally_ else 0
        rest = sorted(
            (h for h in every if h not in chosen),
            key=lambda h: keyed_hash(seed, "check", f"{h[0]}-{h[1]}"),
        )
        drawn = sorted(rest[:RANDOM])
        self.sample = {"top": top, "random": drawn}
        self.use_heads(sorted(chosen) + drawn)

    def describe(self) -> dict:
        top = {k: [f"{l}-{h}" for l, h in v] for k, v in self.sample.get("top", {}).items()}
        drawn = [f"{l}-{h}" for l, h in self.sample.get("random", [])]
        return {**super().describe(), CHECK: {"top": top, "random": drawn}}


CHECK_COLUMNS = [
    "by",
    "ablation",
    "layer",
    "head",
    "sample",
    "estimate",
    "exact",
    "ci_low",
    "ci_high",
    "objective",
]
CORRELATION_COLUMNS = [
    "by",
    "ablation",
    "heads",
    "spearman",
    "ci_low",
    "ci_high",
    "top_exact_max",
    "missed",
    "missed_exact",
    "warning",
]


def _per_resample(tally, label: str, heads) -> np.ndarray:
    """[resample, head]: mass / n of `heads` under `label`, every resample (0: the data)."""
    a = tally.arrays(label)
    mass = a["hits"][..., 0].sum(0)  # [resample, layer, head]
    n = a["n"][..., 0].sum(0)  # [resample]
    layers = list(tally.layers)
    cells = np.stack([mass[:, layers.index(l), h] for l, h in heads], 1)
    return ratio(cells, n[:, None])


def _estimates(results):
    """(label, estimate, kind, top heads) of every estimate the check sampled."""
    info = results.summary.get(CHECK) or {}
    for label, top in (info.get("top") or {}).items():
        objective, kind, by = label_parts(label)
        yield label, objective, by, kind, [tuple(map(int, h.split("-"))) for h in top]


def check_table(results) -> pd.DataFrame:
    """Per estimate and head of the sample: the estimate, the exact effect of its kind (95%)."""
    exact = results.tallies.get(CHECK)
    info = results.summary.get(CHECK) or {}
    if exact is None or not info:
        return pd.DataFrame(columns=CHECK_COLUMNS)
    effects = objective_table(results, CHECK)
    scores = objective_table(results, "importance")
    drawn = {tuple(map(int, h.split("-"))) for h in info.get("random", [])}
    sampled = drawn | {h for *_, top in _estimates(results) for h in top}
    rows = []
    for _, _, by, kind, top in _estimates(results):
        est = scores[(scores["estimate"] == by) & (scores["ablation"] == kind)]
        ex = effects[effects["ablation"] == kind]
        for l, h in sorted(sampled):  # every head ablated exactly: the tops and the draw
            e = est[(est["layer"] == l) & (est["head"] == h)]
            x = ex[(ex["layer"] == l) & (ex["head"] == h)]
            if not len(e) or not len(x):
                continue
            sample = "top" if (l, h) in top else "random" if (l, h) in drawn else "other top"
            rows.append(
                {
                    "by": by,
                    "ablation": kind,
                    "layer": l,
                    "head": h,
                    "sample": sample,
                    "estimate": float(e["score"].iloc[0]),
                    "exact": float(x["score"].iloc[0]),
                    "ci_low": float(x["ci_low"].iloc[0]),
                    "ci_high": float(x["ci_high"].iloc[0]),
                    "objective": x["objective"].iloc[0],
                }
            )
    return pd.DataFrame(rows, columns=CHECK_COLUMNS)


def _spearman(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman's rho of a[r] and b[r] for every row r (average ranks on ties)."""
    ra = pd.DataFrame(a.T).rank().to_numpy().T
    rb = pd.DataFrame(b.T).rank().to_numpy().T
    ra, rb = ra - ra.mean(1, keepdims=True), rb - rb.mean(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (ra * rb).sum(1) / np.sqrt((ra**2).sum(1) * (rb**2).sum(1))


def correlation_table(results) -> pd.DataFrame:
    """Per estimate: Spearman's rho with the exact effects on the sample (95% bootstrap
    interval), and whether a head outside its top has a larger exact effect than all inside."""
    table = check_table(results)
    rows = []
    for label, objective, by, kind, top in _estimates(results):
        sub = table[(table["by"] == by) & (table["ablation"] == kind)]
        if len(sub) < 3:
            continue
        heads = list(zip(sub["layer"], sub["head"]))
        est = _per_resample(results.tallies["importance"], label, heads)
        exact = _per_resample(results.tallies[CHECK], row_label(objective, kind), heads)
        rho = _spearman(est, exact)
        low, high = percentiles(rho[1:])
        inside = sub[[h in top for h in heads]]["exact"].max()
        outside = sub[[h not in top for h in heads]].sort_values("exact", ascending=False)
        missed = outside[outside["exact"] > inside].head(3)
        notes = []
        if rho[0] < WEAK:
            notes.append(f"rank correlation {rho[0]:.2f} < {WEAK}")
        if len(missed):
            notes.append("heads outside its top have larger exact effects than any inside")
        rows.append(
            {
                "by": by,
                "ablation": kind,
                "heads": len(sub),
                "spearman": float(rho[0]),
                "ci_low": float(low),
                "ci_high": float(high),
                "top_exact_max": float(inside),
                "missed": " ".join(f"{r.layer}-{r.head}" for r in missed.itertuples()),
                "missed_exact": " ".join(f"{r.exact:+.3f}" for r in missed.itertuples()),
                "warning": "; ".join(notes),
            }
        )
    return pd.DataFrame(rows, columns=CORRELATION_COLUMNS)


def check_console(results, analysis: str) -> str:
    """Each estimate's rank correlation with the exact effects, said plainly where it is weak."""
    table = results.tables.get(f"{analysis}_correlation")
    if table is None or not len(table):
        return ""
    lines = [f"\n{analysis}: each estimate against exact ablation of its sample of heads:"]
    for r in table.itertuples(index=False):
        lines.append(
            f"  {r.by} ({r.ablation} ablation): Spearman {r.spearman:+.2f} "
            f"[{r.ci_low:+.2f}, {r.ci_high:+.2f}] over {r.heads} heads"
        )
        if r.warning:
            missed = f" (missed: {r.missed} at {r.missed_exact})" if r.missed else ""
            lines.append(f"  WARNING: {r.by} is not a reliable ranking here: {r.warning}{missed}")
    return "\n".join(lines)


IMPORTANCE_CHECK = register(
    Analysis(
        name=CHECK,
        order=121,
        scorer=CheckScorer,
        input=ANY,
        cross=True,
        selection=False,
        default=False,
        added_by="importance",
        options=("ablation",),
        description="each estimate of `importance` against exact ablation of a validation sample of "
        f"heads (its top {TOP} and {RANDOM} drawn at random, seeded): Spearman's rho with a bootstrap "
        "interval (METHODS §8)",
        tables={CHECK: check_table, f"{CHECK}_correlation": correlation_table},
        console=check_console,
    )
)
