"""Head roles (METHODS §6): one role per head, by stated rules with their evidence.

    roles = head_roles(results)          # one row per head: role, detail, evidence, all_roles

Every registered analysis may declare role rules (`registry.RoleRule`); a head gets the
first role (by `order`) whose rule it meets, and every rule it meets is listed beside it.
Each rule and its thresholds live in the module of the analysis that declares it
(`headprobe/studies/<analysis>/analysis.py`); this is the role engine, with the tests rules share
(`tested`, `beats_control`, `mass_of`, `pairs_of`: a rule may read pairs of heads, and name the
receiver heads, `pair_estimates.receiver_matches`). A rule reads the data of the analyses that declare it
(`registry.declaring`), so no analysis is named here.
"""

from __future__ import annotations

import pandas as pd

from headprobe.model.control import control_bar
from headprobe.scoring.registry import CIRCUIT_COLUMN, RoleRule, declaring, get, role_rules
from headprobe.stats.head_selection import ALPHA
from headprobe.stats.pair_estimates import PAIR_COLUMNS, is_pair_table

NONE = "none"
NONE_COLOR = "#f2f2f2"
MATCH_COLUMNS = ["layer", "head", "detail", "short", "evidence", "score", "brief"]
# a derived table with these columns ranks every head by importance (`scorers.ablation.head_ranks`)
RANK_COLUMNS = {"layer", "head", "by", "score", "rank", "of"}


def analyses_of(rule: RoleRule, results) -> list[str]:
    """The analyses in `results` that declare `rule`."""
    present = set(results.analyses)
    return [name for name in declaring(rule) if name in present]


def tested(results, rule: RoleRule, margin: float) -> pd.DataFrame:
    """Head tests in the role family of the rule's analyses that pass both METHODS §6 conditions."""
    tests = results.head_tests
    tests = tests[tests["analysis"].isin(analyses_of(rule, results)) & (tests["family"] == "roles")]
    ok = (tests["heldout_gap"] >= margin - 1e-12) & (tests["p_holm"] < ALPHA)
    return tests[ok]


def beats_control(results, rule: RoleRule, passed: pd.DataFrame) -> pd.DataFrame:
    """The head tests in `passed` whose held-out accuracy is above the random-init control's
    held-out best for the same analysis and label (`control.control_bar`), with that best as
    `control_heldout`; all of them where the run has no control."""
    bar = control_bar(results.best_heads, analyses_of(rule, results))
    if not bar:
        return passed.assign(control_heldout=float("nan"))
    best = [bar.get((a, l), float("nan")) for a, l in zip(passed["analysis"], passed["label"])]
    passed = passed.assign(control_heldout=best)
    return passed[passed["heldout_accuracy"] > passed["control_heldout"]]


def gap_interval(test) -> str:
    """A head test's held-out gap interval (`head_tests`' heldout_gap_low, heldout_gap_high) as
    text: '[+0.273, +0.319]'; '[—]' where it has none (results saved before they were kept)."""
    low, high = (
        test.get("heldout_gap_low", float("nan")),
        test.get("heldout_gap_high", float("nan")),
    )
    return "[—]" if pd.isna(low) or pd.isna(high) else f"[{low:+.3f}, {high:+.3f}]"


def control_text(value: float) -> str:
    return "" if pd.isna(value) else f"; random-init control's held-out best {value:.4f}"


def mass_of(results, rule: RoleRule) -> pd.DataFrame:
    """`Results.mass_per_head` of the rule's analyses."""
    return concat([results.mass_per_head(name) for name in analyses_of(rule, results)])


def pairs_of(results, rule: RoleRule) -> pd.DataFrame:
    """The pair-of-heads tables (`pair_estimates.is_pair_table`) that the rule's analyses
    declare, one after another (`pair_estimates.PAIR_COLUMNS` at least)."""
    frames = [
        results.table(table)
        for name in analyses_of(rule, results)
        for table in get(name).tables
        if table in results.tables and is_pair_table(results.table(table))
    ]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=PAIR_COLUMNS)


def concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return (
        pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["layer", "head"])
    )


def rules_in_use(results) -> list[RoleRule]:
    """The role rules of the analyses present in `results`, in the order they are tried."""
    present = set(results.analyses)
    return [rule for analysis, rule in role_rules() if analysis.name in present]


UNREGISTERED_COLOR = "#8c8c8c"  # a stored role whose rule is not registered here (a missing plugin)


def role_colors(results=None) -> dict[str, str]:
    """{role: color} of the rules in use (every registered rule without `results`), then a grey
    for each role the stored role map holds whose rule is not registered here (results of a
    plugin that is missing or failed to import), then `NONE`."""
    rules = rules_in_use(results) if results is not None else [rule for _, rule in role_rules()]
    colors = {rule.role: rule.color for rule in rules}
    stored = _stored_roles(results)
    colors.update({role: UNREGISTERED_COLOR for role in stored if role not in colors | {NONE: ""}})
    colors[NONE] = NONE_COLOR
    return colors


def _stored_roles(results) -> list[str]:
    """The roles of `results`'s role map (as stored, where the results were read), in order;
    [] without one."""
    tables = getattr(results, "tables", None)
    roles = tables.get("roles") if isinstance(tables, dict) else None
    if roles is None or "role" not in roles:
        return []
    return list(dict.fromkeys(roles["role"].astype(str)))


def head_roles(results) -> pd.DataFrame:
    """One row per head: layer, head, name, role, detail, short, evidence, score (the number that
    decided its role: offset share, held-out gap, sink mass, entropy ratio, a pattern's score),
    brief (its evidence in a few words, `RoleRule.brief`), all_roles, one `<role>_evidence` column per rule in use and, where the run ranks heads by
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
            "brief": brief_of(first[1]) if first else "",
            "all_roles": ", ".join(rule.role for rule, _ in met),
        }
        for rule in rules:
            hit = matched[rule.role].get((layer, head))
            row[f"{rule.role}_evidence"] = hit.evidence if hit is not None else ""
        rows.append(row)
    return with_importance(with_circuits(pd.DataFrame(rows), results), results)


def with_circuits(roles: pd.DataFrame, results) -> pd.DataFrame:
    """Roles with a `circuits` column where an analysis of the run names circuits
    (`Analysis.circuits`: the composition's): the circuits found with evidence, "; "-joined per
    head, "" where none names the head. Unchanged where no analysis of the run names any."""
    finders = [analysis_named(name) for name in results.analyses]
    finders = [a.circuit_finder() for a in finders if a is not None and a.circuits is not None]
    if not len(roles) or not finders:
        return roles
    found = [f for f in (finder(results, roles) for finder in finders) if len(f)]
    roles = roles.assign(**{CIRCUIT_COLUMN: ""})
    if not found:
        return roles
    text = pd.concat(found).groupby(["layer", "head"])[CIRCUIT_COLUMN].agg("; ".join)
    keys = list(zip(roles["layer"].astype(int), roles["head"].astype(int)))
    roles[CIRCUIT_COLUMN] = [text.get(key, "") for key in keys]
    return roles


def analysis_named(name: str):
    """The registered analysis `name`, or None (a tally of an analysis no longer registered)."""
    try:
        return get(name)
    except ValueError:
        return None


def brief_of(match) -> str:
    """A match row's `brief` (its evidence in a few words), else its score to 4 places, else ""."""
    brief = getattr(match, "brief", None)
    if isinstance(brief, str) and brief:
        return brief
    score = float(getattr(match, "score", float("nan")))
    return "" if pd.isna(score) else f"{score:.4f}"


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
