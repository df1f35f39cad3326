"""Head roles (METHODS §6): one role per head, by stated rules with their evidence.

    roles = head_roles(results)          # one row per head: role, detail, evidence, all_roles

Every registered analysis may declare role rules (`registry.RoleRule`); a head gets the
first role (by `order`) whose rule it meets, and every rule it meets is listed beside it.
The built-in rules and their thresholds live here, one owner each; a rule reads the data
of the analyses that declare it (`registry.declaring`), so no analysis is named here.
"""

from __future__ import annotations

import pandas as pd

from headprobe.inputs.corpora.base import ALL
from headprobe.model.control import control_bar
from headprobe.scorers.registry import RoleRule, declaring, get, role_rules
from headprobe.stats.engine import ALPHA

POSITIONAL_SHARE = 0.9
SYNTACTIC_GAP = 0.10
MIN_ARCS = 50
NOT_PER_RELATION = (ALL, "root", "punct")
COREF_GAP = 0.05
MIN_MENTIONS = 50
SINK_MASS = 0.5
BROAD_RATIO = 0.9
NONE = "none"
NONE_COLOR = "#f2f2f2"
MATCH_COLUMNS = ["layer", "head", "detail", "short", "evidence", "score"]
# a derived table with these columns ranks every head by importance (`scorers.ablation.head_ranks`)
RANK_COLUMNS = {"layer", "head", "by", "score", "rank", "of"}


def dependency_family(label: str, n: float) -> bool:
    """The (head, relation) pairs the syntactic rule tests: relations other than ALL, root
    and punct with at least MIN_ARCS arcs."""
    return label not in NOT_PER_RELATION and n >= MIN_ARCS


def coreference_family(label: str, n: float) -> bool:
    return label == ALL and n >= MIN_MENTIONS


def _analyses_of(rule: RoleRule, results) -> list[str]:
    """The analyses in `results` that declare `rule`."""
    present = set(results.analyses)
    return [name for name in declaring(rule) if name in present]


def _tested(results, rule: RoleRule, margin: float) -> pd.DataFrame:
    """Head tests in the role family of the rule's analyses that pass both METHODS §6 conditions."""
    tests = results.head_tests
    tests = tests[
        tests["analysis"].isin(_analyses_of(rule, results)) & (tests["family"] == "roles")
    ]
    ok = (tests["heldout_gap"] >= margin - 1e-12) & (tests["p_holm"] < ALPHA)
    return tests[ok]


def beats_control(results, rule: RoleRule, passed: pd.DataFrame) -> pd.DataFrame:
    """The head tests in `passed` whose held-out accuracy is above the random-init control's
    held-out best for the same analysis and label (`control.control_bar`), with that best as
    `control_heldout`; all of them where the run has no control."""
    bar = control_bar(results.best_heads, _analyses_of(rule, results))
    if not bar:
        return passed.assign(control_heldout=float("nan"))
    best = [bar.get((a, l), float("nan")) for a, l in zip(passed["analysis"], passed["label"])]
    passed = passed.assign(control_heldout=best)
    return passed[passed["heldout_accuracy"] > passed["control_heldout"]]


def syntactic_match(results) -> pd.DataFrame:
    passed = beats_control(results, SYNTACTIC, _tested(results, SYNTACTIC, SYNTACTIC_GAP))
    rows = []
    for (layer, head), group in passed.groupby(["layer", "head"]):
        group = group.sort_values(["heldout_gap", "label"], ascending=[False, True], kind="stable")
        top = group.iloc[0]
        more = "+" if len(group) > 1 else ""
        rows.append(
            {
                "layer": layer,
                "head": head,
                "detail": ", ".join(group["label"]),
                "short": f"{top['label']}{more}",
                "score": top["heldout_gap"],
                "evidence": f"{top['label']}: held-out {top['heldout_accuracy']:.4f} vs baseline "
                f"{top['heldout_baseline']:.4f} (gap {top['heldout_gap']:+.4f}); in-sample "
                f"{top['direction']} {top['accuracy']:.4f} vs {top['baseline_variant']} "
                f"{top['baseline_accuracy']:.4f}, McNemar p = {top['p_value']:.2g}, "
                f"Holm {top['p_holm']:.2g}" + _control_text(top["control_heldout"]),
            }
        )
    return pd.DataFrame(rows, columns=MATCH_COLUMNS)


def _control_text(value: float) -> str:
    return "" if pd.isna(value) else f"; random-init control's held-out best {value:.4f}"


def coreference_match(results) -> pd.DataFrame:
    passed = _tested(results, COREFERENCE, COREF_GAP)
    return pd.DataFrame(
        {
            "layer": passed["layer"],
            "head": passed["head"],
            "detail": "coreference (ALL)",
            "short": "coref",
            "score": passed["heldout_gap"],
            "evidence": [
                f"held-out {a:.4f} vs strongest baseline {b:.4f} (gap {g:+.4f}); McNemar vs "
                f"{v} p = {p:.2g}, Holm {q:.2g}"
                for a, b, g, v, p, q in zip(
                    passed["heldout_accuracy"],
                    passed["heldout_baseline"],
                    passed["heldout_gap"],
                    passed["baseline_variant"],
                    passed["p_value"],
                    passed["p_holm"],
                )
            ],
        },
        columns=MATCH_COLUMNS,
    )


def offset_shares(results, analysis: str) -> pd.DataFrame:
    """The table an argmax-offset analysis declares with each head's dominant offset and its
    share (columns layer, head, offset, share, ...); empty when it declares none."""
    for name in get(analysis).tables:
        table = results.tables.get(name)
        if table is not None and {"layer", "head", "offset", "share"} <= set(table.columns):
            return table
    return pd.DataFrame(columns=["layer", "head", "offset", "share"])


def positional_match(results) -> pd.DataFrame:
    heads = _concat([offset_shares(results, name) for name in _analyses_of(POSITIONAL, results)])
    heads = heads[heads["share"] >= POSITIONAL_SHARE] if len(heads) else heads
    return pd.DataFrame(
        {
            "layer": heads.get("layer", []),
            "head": heads.get("head", []),
            "detail": [f"offset {o}" for o in heads.get("offset", [])],
            "short": list(heads.get("offset", [])),
            "score": list(heads.get("share", [])),
            "evidence": [
                f"share of argmaxes at {o} = {s:.4f}"
                for o, s in zip(heads.get("offset", []), heads.get("share", []))
            ],
        },
        columns=MATCH_COLUMNS,
    )


def _mass(results, rule: RoleRule) -> pd.DataFrame:
    """`Results.mass_per_head` of the rule's analyses."""
    return _concat([results.mass_per_head(name) for name in _analyses_of(rule, results)])


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return (
        pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["layer", "head"])
    )


def sink_match(results) -> pd.DataFrame:
    wide = _mass(results, SINK)
    if "sink_mass" not in wide:
        return pd.DataFrame(columns=MATCH_COLUMNS)
    hit = wide[wide["sink_mass"] >= SINK_MASS]
    return pd.DataFrame(
        {
            "layer": hit["layer"],
            "head": hit["head"],
            "detail": "first position + SEP/EOS",
            "short": "sink",
            "score": hit["sink_mass"],
            "evidence": [
                f"mean mass to the first position {f:.4f} + SEP/EOS {s:.4f} = {t:.4f}"
                for f, s, t in zip(hit["first"], hit["sep"], hit["sink_mass"])
            ],
        },
        columns=MATCH_COLUMNS,
    )


def broad_match(results) -> pd.DataFrame:
    wide = _mass(results, BROAD)
    if "entropy_ratio" not in wide:
        return pd.DataFrame(columns=MATCH_COLUMNS)
    hit = wide[wide["entropy_ratio"] >= BROAD_RATIO]
    return pd.DataFrame(
        {
            "layer": hit["layer"],
            "head": hit["head"],
            "detail": "near-uniform",
            "short": "broad",
            "score": hit["entropy_ratio"],
            "evidence": [f"entropy / uniform entropy = {r:.4f}" for r in hit["entropy_ratio"]],
        },
        columns=MATCH_COLUMNS,
    )


POSITIONAL = RoleRule(
    "positional",
    1,
    "#4c72b0",
    f"positional: a single non-zero offset (-2, -1, +1, +2) takes at least {POSITIONAL_SHARE:g} "
    "of the head's argmaxes (Voita et al. 2019).",
    positional_match,
)
SYNTACTIC = RoleRule(
    "syntactic",
    2,
    "#55a868",
    f"syntactic: for a relation (not ALL, root, punct) with at least {MIN_ARCS} arcs, the held-out "
    f"gap to the baseline (best of offsets and first word; direction and baseline chosen on the "
    f"other fold) is at least {SYNTACTIC_GAP:g}, and the one-sided exact McNemar test against the "
    f"in-sample best baseline has a Holm-adjusted p below {ALPHA:g} (family: every head x "
    "relation tested); with a random-init control (--control random-init), the head's held-out "
    "accuracy is also above the control's held-out best head for the relation; the role names "
    "the relation(s) with the largest held-out gap.",
    syntactic_match,
)
COREFERENCE = RoleRule(
    "coreference",
    3,
    "#c44e52",
    f"coreference: on at least {MIN_MENTIONS} scored mentions (kind ALL), the held-out gap to "
    f"the strongest baseline (nearest, head_match, rules) is at least {COREF_GAP:g}, and the "
    f"McNemar test has a Holm-adjusted p below {ALPHA:g} (family: every head).",
    coreference_match,
)
SINK = RoleRule(
    "sink",
    4,
    "#8c8c8c",
    f"sink: mean attention mass to the first position (BOS/CLS, else the first word) plus SEP/EOS "
    f"is at least {SINK_MASS:g}.",
    sink_match,
)
BROAD = RoleRule(
    "broad",
    5,
    "#dd8452",
    f"broad: mean row entropy is at least {BROAD_RATIO:g} of the uniform entropy.",
    broad_match,
)


def rules_in_use(results) -> list[RoleRule]:
    """The role rules of the analyses present in `results`, in the order they are tried."""
    present = set(results.analyses)
    return [rule for analysis, rule in role_rules() if analysis.name in present]


def role_colors(results=None) -> dict[str, str]:
    rules = rules_in_use(results) if results is not None else [rule for _, rule in role_rules()]
    colors = {rule.role: rule.color for rule in rules}
    colors[NONE] = NONE_COLOR
    return colors


def head_roles(results) -> pd.DataFrame:
    """One row per head: layer, head, name, role, detail, short, evidence, score (the number that
    decided its role: offset share, held-out gap, sink mass, entropy ratio, a pattern's score),
    all_roles, one `<role>_evidence` column per rule in use and, where the run ranks heads by
    importance (`head_ranks`), importance_score, importance_rank, importance_of, importance_by."""
    n_heads = results.n_heads
    layers = results.layers
    grid = pd.DataFrame(
        [(layer, head) for layer in layers for head in range(n_heads)], columns=["layer", "head"]
    )
    matched = {}
    rules = rules_in_use(results)
    for rule in rules:
        hits = rule.match(results)
        matched[rule.role] = {(int(r.layer), int(r.head)): r for r in hits.itertuples(index=False)}
    rows = []
    for layer, head in zip(grid["layer"], grid["head"]):
        met = [
            (rule, matched[rule.role][(layer, head)])
            for rule in rules
            if (layer, head) in matched[rule.role]
        ]
        first = met[0] if met else None
        row = {
            "layer": layer,
            "head": head,
            "name": f"{layer}-{head}",
            "role": first[0].role if first else NONE,
            "detail": first[1].detail if first else "",
            "short": first[1].short if first else "",
            "evidence": first[1].evidence if first else "",
            "score": float(getattr(first[1], "score", float("nan"))) if first else float("nan"),
            "all_roles": ", ".join(rule.role for rule, _ in met),
        }
        for rule in rules:
            hit = matched[rule.role].get((layer, head))
            row[f"{rule.role}_evidence"] = hit.evidence if hit is not None else ""
        rows.append(row)
    return with_importance(pd.DataFrame(rows), results)


def importance_ranks(results) -> pd.DataFrame | None:
    """The derived table that ranks every head by importance (`RANK_COLUMNS`), or None."""
    for table in results.tables.values():
        if RANK_COLUMNS <= set(table.columns):
            return table
    return None


def with_importance(roles: pd.DataFrame, results) -> pd.DataFrame:
    """Roles with each head's importance beside them (`importance_ranks`), where the run has it."""
    ranks = importance_ranks(results)
    if ranks is None or not len(roles):
        return roles
    ranks = ranks[["layer", "head", "score", "rank", "of", "by"]].rename(
        columns={
            "score": "importance_score",
            "rank": "importance_rank",
            "of": "importance_of",
            "by": "importance_by",
        }
    )
    out = roles.merge(ranks, on=["layer", "head"], how="left")
    for column in ("importance_rank", "importance_of"):
        out[column] = out[column].astype("Int64")
    return out


def role_summary(roles: pd.DataFrame, order=None) -> pd.DataFrame:
    """Per role: number of heads, share of heads, layers where they sit."""
    total = max(len(roles), 1)
    order = list(order or dict.fromkeys(list(roles["role"]) + [NONE]))
    out = []
    for role in order:
        sub = roles[roles["role"] == role]
        out.append(
            {
                "role": role,
                "heads": len(sub),
                "share": len(sub) / total,
                "layers": ", ".join(str(x) for x in sorted(sub["layer"].unique())),
            }
        )
    return pd.DataFrame(out)
