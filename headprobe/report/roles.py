"""Head-role map: one dominant role per attention head, by simple stated rules.

Rules are tried in this order and the first that matches names the head's role
(every rule a head matches is listed too, in `all_roles`):

1. **positional** — a single non-zero offset (-2, -1, +1 or +2) takes at least
   `positional_share` (0.9) of the head's argmaxes (SPEC section 4, Voita et al. 2019).
2. **syntactic** — for at least one relation (not ALL/root/punct) with at least
   `min_arcs` arcs, the head's accuracy in its better direction is at least
   `syntactic_margin` (0.10) above that relation's best fixed-offset baseline.
   The detail names the relation with the largest gap (all qualifying relations
   are listed).
3. **coreference** — on at least `min_mentions` mentions (label ALL) the head's
   accuracy is at least `coref_margin` (0.05) above the `head_match` baseline
   (the `nearest` baseline when head_match is absent).
4. **sink** — mean attention mass to CLS/BOS + SEP/EOS is at least `sink_mass` (0.5).
5. **broad** — mean row entropy is at least `broad_ratio` (0.9) of the uniform entropy.
6. otherwise **none**.

All inputs are ratios from the tidy counts (fold '' = whole data).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from headprobe.report import tables as T

ROLE_ORDER = ("positional", "syntactic", "coreference", "sink", "broad", "none")
ROLE_COLORS = {
    "positional": "#4c72b0",
    "syntactic": "#55a868",
    "coreference": "#c44e52",
    "sink": "#8c8c8c",
    "broad": "#dd8452",
    "none": "#f2f2f2",
}


@dataclass(frozen=True)
class RoleRules:
    positional_share: float = 0.9
    syntactic_margin: float = 0.10
    min_arcs: int = 50
    coref_margin: float = 0.05
    min_mentions: int = 50
    sink_mass: float = 0.5
    broad_ratio: float = 0.9

    def describe(self) -> list[str]:
        """The rules as sentences, in the order they are applied (first match wins)."""
        return [
            f"positional: a single non-zero offset (-2, -1, +1, +2) takes at least "
            f"{self.positional_share:g} of the head's argmaxes (Voita et al. 2019).",
            f"syntactic: for some relation (not ALL, root, punct) with at least "
            f"{self.min_arcs} arcs, the head's accuracy in its better direction is at least "
            f"{self.syntactic_margin:g} above the relation's best fixed-offset baseline; "
            f"the cell names the relation with the largest gap.",
            f"coreference: on at least {self.min_mentions} mentions (kind ALL), the head's "
            f"accuracy is at least {self.coref_margin:g} above the head_match baseline "
            f"(nearest when head_match is absent).",
            f"sink: mean attention mass to CLS/BOS plus SEP/EOS is at least {self.sink_mass:g}.",
            f"broad: mean row entropy is at least {self.broad_ratio:g} of the uniform entropy.",
            "none: no rule matches.",
        ]


def head_roles(counts: pd.DataFrame, n_layers: int | None = None, n_heads: int | None = None,
               rules: RoleRules = RoleRules()) -> pd.DataFrame:
    """One row per head: layer, head, name, role, detail, short, all_roles, evidence and
    the statistics the rules looked at."""
    counts = T.normalize(counts)
    heads_present = counts[counts["layer"] >= 0]
    if n_layers is None:
        n_layers = int(heads_present["layer"].max()) + 1 if len(heads_present) else 0
    if n_heads is None:
        n_heads = int(heads_present["head"].max()) + 1 if len(heads_present) else 0
    grid = pd.DataFrame([(layer, head) for layer in range(n_layers) for head in range(n_heads)],
                        columns=["layer", "head"])

    # 1. positional
    pos = T.positional_shares(counts)
    pos = pos[["layer", "head", "dominant_offset", "dominant_share"]] if len(pos) else \
        pd.DataFrame(columns=["layer", "head", "dominant_offset", "dominant_share"])
    grid = grid.merge(pos, on=["layer", "head"], how="left")

    # 2. syntactic
    syn = _syntactic(counts, rules)
    grid = grid.merge(syn, on=["layer", "head"], how="left")

    # 3. coreference
    coref = _coreference(counts, rules)
    grid = grid.merge(coref, on=["layer", "head"], how="left")

    # 4./5. surface
    surf = T.surface_per_head(counts)
    keep = [c for c in ("cls_sep", "entropy_ratio") if c in surf.columns]
    if keep:
        grid = grid.merge(surf[["layer", "head", *keep]], on=["layer", "head"], how="left")
    for col in ("cls_sep", "entropy_ratio"):
        if col not in grid.columns:
            grid[col] = np.nan

    rows = []
    for r in grid.itertuples(index=False):
        matched: list[tuple[str, str, str, str]] = []   # role, detail, short, evidence
        share = _num(r.dominant_share)
        if share is not None and share >= rules.positional_share:
            off = str(r.dominant_offset)
            matched.append(("positional", f"offset {off}", off,
                            f"share of argmaxes at {off} = {share:.4f}"))
        if isinstance(r.syn_relations, str) and r.syn_relations:
            top = r.syn_relations.split(", ")[0]
            more = "+" if ", " in r.syn_relations else ""
            matched.append(("syntactic", r.syn_relations, top + more,
                            f"{top}: accuracy {r.syn_accuracy:.4f} ({r.syn_direction}) vs "
                            f"baseline {r.syn_baseline:.4f}, gap {r.syn_gap:.4f}"))
        if _num(r.coref_gap) is not None and r.coref_gap >= rules.coref_margin and \
                _num(r.coref_n) is not None and r.coref_n >= rules.min_mentions:
            matched.append(("coreference", "coreference (ALL)", "coref",
                            f"accuracy {r.coref_accuracy:.4f} vs {r.coref_baseline_variant} "
                            f"{r.coref_baseline:.4f}, gap {r.coref_gap:.4f}"))
        sink = _num(r.cls_sep)
        if sink is not None and sink >= rules.sink_mass:
            matched.append(("sink", "CLS+SEP", "sink", f"mean mass to CLS+SEP = {sink:.4f}"))
        ratio = _num(r.entropy_ratio)
        if ratio is not None and ratio >= rules.broad_ratio:
            matched.append(("broad", "near-uniform", "broad",
                            f"entropy / uniform entropy = {ratio:.4f}"))
        role, detail, short, evidence = matched[0] if matched else ("none", "", "", "")
        rows.append({
            "layer": int(r.layer), "head": int(r.head), "name": T.head_name(r.layer, r.head),
            "role": role, "detail": detail, "short": short, "evidence": evidence,
            "all_roles": ", ".join(m[0] for m in matched),
            "positional_offset": r.dominant_offset if share is not None else "",
            "positional_share": share if share is not None else np.nan,
            "syntactic_relations": r.syn_relations if isinstance(r.syn_relations, str) else "",
            "syntactic_gap": _num(r.syn_gap) if _num(r.syn_gap) is not None else np.nan,
            "coref_accuracy": _nan(r.coref_accuracy), "coref_gap": _nan(r.coref_gap),
            "cls_sep_mass": _nan(r.cls_sep), "entropy_ratio": _nan(r.entropy_ratio),
        })
    return pd.DataFrame(rows)


def role_summary(roles: pd.DataFrame, n_layers: int | None = None) -> pd.DataFrame:
    """Per role: number of heads, share of heads, layers where they sit, mean relative depth."""
    total = max(len(roles), 1)
    if n_layers is None:
        n_layers = int(roles["layer"].max()) + 1 if len(roles) else 1
    out = []
    for role in ROLE_ORDER:
        sub = roles[roles["role"] == role]
        depth = sub["layer"] / max(n_layers - 1, 1)
        out.append({
            "role": role, "heads": len(sub), "share": len(sub) / total,
            "layers": ", ".join(str(x) for x in sorted(sub["layer"].unique())),
            "mean_relative_depth": float(depth.mean()) if len(sub) else np.nan,
        })
    return pd.DataFrame(out)


def rules_dict(rules: RoleRules = RoleRules()) -> dict:
    return asdict(rules)


# ---------------------------------------------------------------- helpers

def _num(x):
    try:
        if x is None or pd.isna(x):
            return None
    except (TypeError, ValueError):
        return None
    return float(x)


def _nan(x):
    v = _num(x)
    return np.nan if v is None else v


def _syntactic(counts: pd.DataFrame, rules: RoleRules) -> pd.DataFrame:
    cols = ["layer", "head", "syn_relations", "syn_accuracy", "syn_direction",
            "syn_baseline", "syn_gap"]
    scores = T.head_scores(counts, "dependency")
    scores = scores[~scores["label"].isin(T.NOT_PER_RELATION) & (scores["n"] >= rules.min_arcs)]
    if not len(scores):
        return pd.DataFrame(columns=cols)
    base = {}
    for label in scores["label"].unique():
        bl = T.baselines(counts, "dependency", label)
        base[label] = float(bl["accuracy"].iloc[0]) if len(bl) else np.nan
    scores = scores.assign(baseline=scores["label"].map(base))
    scores = scores[scores["baseline"].notna()]
    # better direction per head and relation
    scores = scores.sort_values(["accuracy", "direction"], ascending=[False, True], kind="stable")
    best = scores.drop_duplicates(["label", "layer", "head"]).copy()
    best["gap"] = best["accuracy"] - best["baseline"]
    best = best[best["gap"] >= rules.syntactic_margin - 1e-12]
    out = []
    for (layer, head), grp in best.groupby(["layer", "head"]):
        grp = grp.sort_values(["gap", "label"], ascending=[False, True], kind="stable")
        top = grp.iloc[0]
        out.append({"layer": layer, "head": head,
                    "syn_relations": ", ".join(grp["label"]),
                    "syn_accuracy": top["accuracy"], "syn_direction": top["direction"],
                    "syn_baseline": top["baseline"], "syn_gap": top["gap"]})
    return pd.DataFrame(out, columns=cols)


def _coreference(counts: pd.DataFrame, rules: RoleRules) -> pd.DataFrame:
    cols = ["layer", "head", "coref_n", "coref_accuracy", "coref_baseline",
            "coref_baseline_variant", "coref_gap"]
    scores = T.head_scores(counts, "coreference", label="ALL")
    if not len(scores):
        return pd.DataFrame(columns=cols)
    bl = T.baselines(counts, "coreference", "ALL")
    chosen = None
    for variant in ("head_match", "nearest"):
        if (bl["variant"] == variant).any():
            chosen = bl[bl["variant"] == variant].iloc[0]
            break
    if chosen is None:
        return pd.DataFrame(columns=cols)
    scores = scores.sort_values("accuracy", ascending=False, kind="stable") \
        .drop_duplicates(["layer", "head"])
    return pd.DataFrame({
        "layer": scores["layer"], "head": scores["head"], "coref_n": scores["n"],
        "coref_accuracy": scores["accuracy"],
        "coref_baseline": float(chosen["accuracy"]),
        "coref_baseline_variant": str(chosen["variant"]),
        "coref_gap": scores["accuracy"] - float(chosen["accuracy"]),
    }, columns=cols)
