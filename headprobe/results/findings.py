"""What a run found, in a few rows: the views behind a report's summary, from `Results`.

    model_line(results)            # 'M: encoder, 6 layers x 12 heads; data: a.conllu (2,001 sentences, ...)'
    role_findings(results)         # [(line, [head lines])]: role counts, then each role's heads
    key_findings(results)          # per selection analysis: ALL and the top labels, held-out
    caveats(results)               # [(kind, text)]: small samples, ties, folds disagreeing, skipped input
    data_sources(results)          # per corpus read: path, examples, words, documents, mentions
    provenance(results)            # [(key, text)]: run id, inputs and SHA-256, options, conventions,
                                   # bundled data's source and licence
    best_heads_export(results, "dependency")   # the full best-heads table per label (for a CSV)
    repeated_columns(frame, ["cls", "first"])  # {"first": "cls"} when they hold the same numbers

Everything here is read from the `Results` tables and `summary`; nothing is
recounted. The report renders these views (headprobe.report), and so can a notebook.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from headprobe.inputs.corpora.base import ALL
from headprobe.scoring import registry
from headprobe.stats.head_selection import SHOWN_COLUMNS, min_trials
from headprobe.stats.roles import NONE, role_colors, role_summary

TOP_LABELS = 5  # labels shown per analysis in the key findings, besides ALL
RUNNERS_UP = 3
MAX_ITEMISED = 15  # heads of an itemised role given a line each (the strongest first)
MAX_INLINE = 8  # heads named on the one line of another role (the strongest first)
FINDING_COLUMNS = [c for c in SHOWN_COLUMNS if c != "selection"] + ["folds_agree"]
WHOLE = ("analysis", "label", "n")  # a finding's columns that are not the held-out figures
# summary keys that are shown as findings or data, not as provenance
NOT_PROVENANCE = (
    "model",
    "n_layers",
    "n_heads",
    "analyses",
    "notes",
    "headline",
    "tables",
    "skipped",
    "causal",
    "n_kv_heads",
)


def selection_analyses(results) -> list[str]:
    """Analyses of `results` with best heads, in the registry's order."""
    present = set(results.best_heads["analysis"])
    ordered = [a for a in registry.names() if a in present]
    return ordered + sorted(present - set(ordered))


def model_line(results, with_model: bool = True) -> str:
    """Model and data in one line: 'M: encoder, 6 layers x 12 heads; data: a.conllu (2,001
    sentences, 25,147 words), ...' (the BOS mode where a BOS token is, or could be, used)."""
    summary = results.summary
    kind = {True: "decoder (causal attention)", False: "encoder"}.get(summary.get("causal"))
    shape = ", ".join(
        x for x in (kind, f"{results.n_layers} layers x {results.n_heads} heads") if x
    )
    parts = [f"{summary.get('model', 'unknown model')}: {shape}" if with_model else shape]
    bos = summary.get("bos")
    if isinstance(bos, dict):
        used, asked = bos.get("used"), bos.get("asked")
        if summary.get("causal") or used not in (None, "none"):
            parts.append(
                f"BOS mode: {used}" + (f" (asked: {asked})" if asked not in (None, used) else "")
            )
    elif bos is not None:
        parts.append(f"BOS mode: {bos}")
    data = []
    probe = (summary.get("options") or {}).get("probe")
    for r in data_sources(results).itertuples(index=False):
        name = Path(r.path).name or r.input
        if r.input == registry.PROBE and isinstance(probe, dict) and probe.get("name"):
            name = probe["name"]  # a probe is named by its name; its stream's name says counts
        counts = [
            f"{int(r.examples):,} {r.unit}" if pd.notna(r.examples) else "",
            f"{int(r.words):,} words" if pd.notna(r.words) else "",
            f"{int(r.documents):,} documents" if pd.notna(r.documents) else "",
            f"{int(r.mentions):,} mentions" if pd.notna(r.mentions) else "",
        ]
        data.append(f"{name} ({', '.join(c for c in counts if c)})" if any(counts) else name)
    if data:
        parts.append("data: " + "; ".join(data))
    return "; ".join(parts)


def role_findings(results) -> list[tuple[str, list[str]]]:
    """What the run found, as (line, [lines under it]): the heads per role first, then per role
    that any head holds, in the order roles are tried, its heads with their evidence in brief
    (`RoleRule.brief` says what it is): an itemised role (`RoleRule.itemised`: a syntactic head's
    relation) gives each head a line under its own, strongest first (at most MAX_ITEMISED),
    another role names its heads on its one line (at most MAX_INLINE). The console after a run
    and the report's summary both print these; [] for results without roles.

        [("roles of the 72 heads (first rule met): 11 syntactic, 14 sink, 3 broad; 44 none; no ...", []),
         ("syntactic (relation, held-out accuracy vs baseline, gap [95% CI]; ...):",
          ["2-8  case       0.6744 vs 0.3772, gap +0.297 [+0.273, +0.319]; also cop, ...", ...]),
         ("sink (mean mass to the first position + SEP/EOS): 2-9 0.796, 2-7 0.778, ...", []), ...]
    """
    roles = results.roles
    if not len(roles):
        return []
    rules = {rule.role: rule for rule in results.role_rules()}
    counts = role_summary(roles, order=list(role_colors(results)))
    out = [(_counts_line(counts, len(roles)), [])]
    for role in counts.loc[(counts["heads"] > 0) & (counts["role"] != NONE), "role"]:
        heads = roles[roles["role"] == role].sort_values(
            ["score", "layer", "head"], ascending=[False, True, True], kind="stable"
        )
        rule = rules.get(role)
        what = f"{role} ({rule.brief})" if rule is not None and rule.brief else role
        briefs = [(name, _brief(r)) for name, r in zip(heads["name"], heads.to_dict("records"))]
        if rule is not None and rule.itemised:
            width = max(len(name) for name, _ in briefs)
            lines = [f"{name:<{width}}  {brief}" for name, brief in briefs[:MAX_ITEMISED]]
            lines += _more(len(briefs), MAX_ITEMISED)
            out.append((f"{what}:", lines))
        else:
            shown = ", ".join(f"{name} {brief}".strip() for name, brief in briefs[:MAX_INLINE])
            more = f", and {len(briefs) - MAX_INLINE} more" if len(briefs) > MAX_INLINE else ""
            out.append((f"{what}: {shown}{more}", []))
    return out


def _counts_line(counts: pd.DataFrame, total: int) -> str:
    """'roles of the 72 heads (first rule met): 11 syntactic, 14 sink; 47 none; no broad head'."""
    held = [
        f"{r.heads} {r.role}" for r in counts.itertuples(index=False) if r.heads and r.role != NONE
    ]
    empty = [r.role for r in counts.itertuples(index=False) if not r.heads and r.role != NONE]
    none = int(counts.loc[counts["role"] == NONE, "heads"].sum())
    return (
        f"roles of the {total} heads (first rule met): "
        + (", ".join(held) or "no head meets a rule")
        + f"; {none} {NONE}"
        + (f"; no {' or '.join(empty)} head" if empty else "")
    )


def _brief(role_row: dict) -> str:
    """A head's evidence in brief (the `brief` column of `roles`; its evidence where a table has
    no brief, results saved before it was kept)."""
    brief = role_row.get("brief")
    return str(brief) if isinstance(brief, str) and brief else str(role_row.get("evidence") or "")


def _more(count: int, shown: int) -> list[str]:
    return (
        [f"... and {count - shown} more (the report's role map lists every head)"]
        if count > shown
        else []
    )


def key_findings(results, top: int = TOP_LABELS) -> pd.DataFrame:
    """Per selection analysis: the held-out best head of ALL and of the `top` other labels with
    the largest held-out gap over the baseline (labels with enough trials and a held-out
    selection only). Columns: FINDING_COLUMNS (held-out figures; `heads` reads
    'fold-0 pick | fold-1 pick' where the folds chose differently)."""
    rows = []
    for analysis in selection_analyses(results):
        wide = results.best_heads_wide(analysis)
        ok = wide[
            ~wide["small_sample"].astype(bool)
            & (wide["note"].fillna("") == "")
            & (wide["heldout_note"].fillna("") == "")
            & wide["heldout_accuracy"].notna()
        ]
        first = ok[ok["label"] == ALL]
        rest = ok[ok["label"] != ALL].sort_values(
            ["heldout_gap", "n"], ascending=False, kind="stable"
        )
        for r in pd.concat([first, rest.head(top)]).to_dict("records"):
            rows.append(
                {
                    "analysis": analysis,
                    "label": r["label"],
                    "n": r["n"],
                    **{c: r[f"heldout_{c}"] for c in FINDING_COLUMNS if c not in WHOLE},
                }
            )
    return pd.DataFrame(rows, columns=FINDING_COLUMNS)


def caveats(results) -> list[tuple[str, str]]:
    """What to keep in mind when reading the numbers, as (kind, one sentence): labels too small
    to name a head, exact ties, held-out folds that chose different heads, arcs no head can
    predict, input skipped (or that nothing was), and the run's own notes."""
    out = []
    for analysis in selection_analyses(results):
        out += _selection_caveats(analysis, results.best_heads_wide(analysis))
    for analysis in selection_analyses(results):
        out += _unreachable_caveats(analysis, results.unreachable_arcs(analysis))
    out.append(("skipped input", skipped_text(results.summary.get("skipped") or {})))
    out += [("note", str(note)) for note in results.summary.get("notes") or []]
    return out


def _selection_caveats(analysis: str, wide) -> list[tuple[str, str]]:
    """An analysis's small labels, exact ties, disagreeing folds and a best head below its
    baseline, from its best heads (`wide`: `Results.best_heads_wide`)."""
    out = []
    small = wide[wide["small_sample"].astype(bool)]
    if len(small):
        out.append(
            (
                "small samples",
                f"{analysis}: {len(small)} label(s) with fewer than {min_trials(analysis)} "
                f"trials, shown with their counts but never named a best head or a role: "
                f"{_listing(small['label'], small['n'])}.",
            )
        )
    tied = wide[
        ~wide["small_sample"].astype(bool) & (pd.to_numeric(wide["tied"], errors="coerce") > 1)
    ]
    if len(tied):
        out.append(
            (
                "ties",
                f"{analysis}: exact ties for the best head (candidates sharing the best "
                f"accuracy; the lowest layer, head, direction is shown): {_listing(tied['label'], tied['tied'])}.",
            )
        )
    split = wide[~wide["small_sample"].astype(bool) & (wide["heldout_folds_agree"] == False)]  # noqa: E712
    if len(split):
        out.append(
            (
                "folds disagree",
                f"{analysis}: the two held-out folds chose different heads for "
                f"{', '.join(split['label'])}.",
            )
        )
    below = wide[(wide["label"] == ALL) & (wide["heldout_gap_high"] < 0)]
    for r in below.itertuples(index=False):
        out.append(
            (
                "below baseline",
                f"{analysis}: held-out, the best head of {ALL} is below the "
                f"{r.baseline_variant} baseline (gap {r.heldout_gap:+.3f}, 95% CI "
                f"[{r.heldout_gap_low:+.3f}, {r.heldout_gap_high:+.3f}]).",
            )
        )
    return out


def _unreachable_caveats(analysis: str, unreachable) -> list[tuple[str, str]]:
    """The items of an analysis's whole-label row that hold no attention (they count as misses)."""
    out = []
    everything = unreachable[(unreachable["label"] == ALL) & (unreachable["unreachable"] > 0)]
    for r in everything.itertuples(index=False):
        out.append(
            (
                "unreachable",
                f"{analysis}, {r.direction}: {int(r.unreachable):,} of {int(r.n):,} "
                f"{ALL} items ({r.share:.1%}) hold no attention in their row or column; they count as "
                "misses.",
            )
        )
    return out


def _listing(labels, values, limit: int = 8) -> str:
    pairs = [f"{label} ({_int(v)})" for label, v in zip(labels, values)]
    more = f", and {len(pairs) - limit} more" if len(pairs) > limit else ""
    return ", ".join(pairs[:limit]) + more


def _int(v) -> str:
    try:
        return f"{int(round(float(v))):,}"
    except (TypeError, ValueError):
        return str(v)


def skipped_counts(skipped: dict) -> dict:
    """The non-zero counts of a summary's `skipped` (its lists of skipped sources left out):
    `skipped_counts({"too_long": 2, "malformed_sentences": 0, "malformed_sources": []})` is
    `{"too_long": 2}`."""
    return {k: v for k, v in skipped.items() if isinstance(v, (int, float, np.integer)) and v}


def skipped_text(skipped: dict) -> str:
    """One sentence on the input a run skipped (counts only; the skipped sources are provenance)."""
    counts = skipped_counts(skipped)
    if not counts:
        return "No input was skipped."
    return (
        "Skipped (never silently): "
        + ", ".join(f"{k.replace('_', ' ')} {_int(v)}" for k, v in counts.items())
        + "."
    )


UNITS = {
    registry.SENTENCES: "sentences",
    registry.COREFERENCE: "windows",
    registry.PROBE: "sequences",
}  # an input's examples


def data_sources(results) -> pd.DataFrame:
    """One row per corpus the run read: input (`registry.INPUTS`: sentences, coreference, probe),
    path, examples and what they are (`unit`: sentences, windows, sequences), words, and for
    coreference windows their documents and mentions (NaN where unknown)."""
    summary = results.summary
    corpora, runs = summary.get("corpora") or {}, summary.get("runs") or {}
    coref = summary.get("coreference_corpus") or {}
    rows = []
    for key in list(dict.fromkeys(list(corpora) + list(runs))):
        run = runs.get(key) or {}
        row = {
            "input": key,
            "path": str(corpora.get(key, "")),
            "unit": UNITS.get(key, "examples"),
            "examples": run.get("examples", np.nan),
            "words": run.get("words", np.nan),
            "documents": np.nan,
            "mentions": np.nan,
        }
        if key == registry.COREFERENCE:
            row.update(
                documents=coref.get("documents", np.nan), mentions=coref.get("mentions", np.nan)
            )
        rows.append(row)
    return pd.DataFrame(
        rows, columns=["input", "path", "unit", "examples", "words", "documents", "mentions"]
    )


def provenance(results) -> list[tuple[str, str]]:
    """Everything needed to reproduce or cite the run, as (key, value text): run id, inputs with
    their sizes and SHA-256, options, conventions, corpora read, the source and licence of each
    bundled data file read, and every other summary entry that is no finding."""
    summary = results.summary
    out = []
    for key, value in summary.items():
        if key in NOT_PROVENANCE:
            continue
        if key == "inputs" and isinstance(value, dict):
            out += [(f"input {name}", flat(spec)) for name, spec in value.items()]
        elif isinstance(value, dict) and key in (
            "options",
            "conventions",
            "runs",
            "coreference_corpus",
            "software",
            "bundled_data",  # each bundled file read: what, source, licence, credit
        ):
            out += [(f"{key}: {k}", flat(v)) for k, v in value.items()]
        else:
            out.append((key, flat(value)))
    sources = summary.get("skipped") or {}
    out += [
        (f"skipped: {k}", flat(v)) for k, v in sources.items() if not isinstance(v, (int, float))
    ]
    return out


def flat(value, limit: int = 20) -> str:
    """A summary value as one line of text (dicts as 'k: v; ...', lists comma-separated)."""
    if isinstance(value, dict):
        return "; ".join(f"{k}: {flat(v)}" for k, v in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        more = f" (+{len(value) - limit} more)" if len(value) > limit else ""
        return (", ".join(flat(v) for v in value[:limit]) + more) or "none"
    return "—" if value is None else str(value)


def repeated_columns(frame: pd.DataFrame, columns: list[str], atol: float = 1e-9) -> dict[str, str]:
    """{column: earlier column} for each of `columns` (in order) whose values equal an earlier
    one's on every row (NaN only where it is NaN): an encoder's first position is its [CLS]."""
    present = [c for c in columns if c in frame.columns]
    same = {}
    for i, col in enumerate(present):
        for earlier in present[:i]:
            if earlier in same:
                continue
            a, b = frame[col].to_numpy(dtype=float), frame[earlier].to_numpy(dtype=float)
            if (
                len(a)
                and np.array_equal(np.isnan(a), np.isnan(b))
                and np.allclose(a, b, rtol=0, atol=atol, equal_nan=True)
            ):
                same[col] = earlier
                break
    return same


def best_heads_export(results, analysis: str) -> pd.DataFrame:
    """Every best-heads column per label (in-sample, then held-out as `heldout_*`), each
    baseline's accuracy (`baseline:<variant>`) and the next heads by in-sample accuracy
    (`next_best`): the columns a narrow report table leaves to its CSV."""
    wide = results.best_heads_wide(analysis)
    base = results.baselines
    base = base[base["analysis"] == analysis]
    for variant in dict.fromkeys(base["variant"]):
        acc = base[base["variant"] == variant].set_index("label")["accuracy"]
        wide[f"baseline:{variant}"] = wide["label"].map(acc)
    scores = results.head_scores(analysis)
    wide["next_best"] = [
        next_best(scores[scores["label"] == r["label"]], r["layer"], r["head"])
        for r in wide.to_dict("records")
    ]
    return wide


def next_best(scores: pd.DataFrame, layer, head, k: int = RUNNERS_UP) -> str:
    """The next `k` heads by in-sample accuracy (each in its better direction), as text."""
    if not len(scores):
        return ""
    ranked = scores.sort_values(
        ["accuracy", "layer", "head", "direction"],
        ascending=[False, True, True, True],
        kind="stable",
    ).drop_duplicates(["layer", "head"])
    if layer is not None and not pd.isna(layer) and int(layer) >= 0:
        ranked = ranked[~((ranked["layer"] == int(layer)) & (ranked["head"] == int(head)))]
    return "; ".join(
        f"{int(r.layer)}-{int(r.head)}{' ' + r.direction if r.direction else ''} {r.accuracy:.4f}"
        for r in ranked.head(k).itertuples(index=False)
    )
