"""Compose the report `Document` from `Results`: one section per analysis, from the registry.

    doc = compose(results)                     # overview, role map, analyses, examples

Each analysis names its section in its registry entry (`Analysis.report`, a callable
`section(results, analysis) -> Section`, given the analysis's registered name); the
built-in ones live beside their analyses (`headprobe/studies/<analysis>/report.py`), built
from the primitives of `headprobe.report` (`selection`, `tables`, `figures`, `document`).
An analysis without one gets `default_section`: a heatmap per label and, for selection analyses, its best-heads
table. Sections only render: every number is a stored value of a `Results` table or
view. No analysis is named here: a section reads the data of the analysis it is given,
and what it needs to know about it from the registry.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.core.errors import UsageError
from headprobe.inputs.corpora.base import ALL
from headprobe.report import methods
from headprobe.report.document import (
    BulletList,
    Cell,
    Details,
    Document,
    Figure,
    Paragraph,
    Section,
    Table,
    slug,
)
from headprobe.report.heatmaps import example_figure, heatmap_grid_figure
from headprobe.report.rendered_tables import (
    BEST_HEADS_LEGEND,
    LEGEND,
    decimals,
    fmt,
    fmt_est,
    fmt_int,
    fmt_signed_est,
    head_name,
    pair_table_block,
    to_matrix,
)
from headprobe.report.role_figures import role_map_figure
from headprobe.report.selection import MAX_PANELS, best_tables, described
from headprobe.results.findings import (
    TOP_LABELS,
    caveats,
    key_findings,
    model_line,
    provenance,
    role_findings,
)
from headprobe.scoring import registry
from headprobe.scoring.registry import PICTURES
from headprobe.stats.pair_estimates import is_pair_table, significant_pairs
from headprobe.stats.roles import role_colors, role_summary

HEAD_LEGEND = (
    "Heads are named L-H = layer-head, both 0-based (Clark et al. 2019 print "
    "1-based indices, so their 8-10 is 7-9 here)."
)
MAX_EXAMPLES = 30
MAX_PAIRS = 20  # pairs of heads shown in the view of a pair analysis without a section


def compose(results, source: str = "") -> Document:
    """The whole report of `results` (`source`: where they were read from): findings first (a
    short summary), the role map, one section per analysis (built-ins first, in the registry's
    order), example pictures, how to read the tables, and the provenance, collapsed, last."""
    model = results.summary.get("model", "unknown model")
    doc = Document(title=f"headprobe report: {model}")
    shown = results.for_measure()  # several measures (METHODS §7): the sections show the first
    doc.sections += [summary_section(shown), roles_section(shown)]
    from headprobe.report.explorer import explorer_section

    doc.sections.append(explorer_section(results))  # the interactive head explorer
    for name in registry.ordered(_scored(results)):
        doc.sections.append(analysis_section(shown, name))
    if shown.control is not None:  # the random-init control (headprobe.model.control)
        from headprobe.report.control_section import control_section

        doc.sections.append(control_section(shown))
    if len(results.measures) > 1:
        from headprobe.report.measures_section import measures_section

        doc.sections.append(measures_section(results))
    doc.sections += [
        examples_section(results),
        reading_section(),
        provenance_section(results, source),
    ]
    return doc


def _scored(results) -> list[str]:
    """The analyses a report has a section for: those with counts, then those that read only the
    weights (no tally: their record is the summary's entry under their name)."""
    counted = list(results.analyses)
    summary = results.summary
    weights = [n for n in summary.get("analyses") or () if n not in counted and summary.get(n)]
    return counted + weights


def analysis_section(results, name: str) -> Section:
    """The section of analysis `name`: the one it declares, else `default_section`. An analysis
    that is not registered here (its plugin is not installed, failed to import or is switched
    off) gets the default view of its counts under a line saying why its own section could not
    be drawn; a section that raises is that line alone (the rest of the report is drawn)."""
    why = ""
    try:
        render = registry.get(name).report_section()
    except UsageError as exc:  # a plugin that failed to import, or is switched off
        render, why = None, str(exc)
    except ValueError:
        render, why = (
            None,
            f"analysis {name!r} is not registered here (its package is not installed)",
        )
    try:
        section = (render or default_section)(results, name)
    except Exception as exc:  # noqa: BLE001 (one section's failure leaves the others drawn)
        said = " ".join(f"{type(exc).__name__}: {exc}".split())
        section = Section(slug(name), name)
        section.add(Paragraph(f"The {name} section could not be drawn: {said}.", note=True))
        return section
    if why:
        line = (
            f"The {name} section could not be drawn: {why}. Shown: the default view of its counts."
        )
        section.blocks.insert(0, Paragraph(line, note=True))
    return section


# ---------------------------------------------------------------- summary (findings first)


def summary_section(results) -> Section:
    s = Section("summary", "Summary")
    s.add(Paragraph(model_line(results) + "."))
    for line, heads in role_findings(results):  # the console prints the same lines
        s.add(Paragraph(line))
        if heads:
            s.add(BulletList(heads))
    found = key_findings(results)
    if len(found):
        s.add(_findings_table(found))
    s.add(Paragraph("Caveats:"))
    s.add(BulletList([text for _, text in caveats(results)]))
    s.add(Paragraph(HEAD_LEGEND))
    return s


def _findings_table(found: pd.DataFrame) -> Table:
    rows, attrs = [], []
    for r in found.to_dict("records"):
        head = " ".join(x for x in (str(r["heads"]), str(r["direction"] or "")) if x and x != "nan")
        nd = decimals(r["ci_low"], r["ci_high"])
        rows.append(
            [
                Cell(r["analysis"]),
                Cell(r["label"], {"col": "label"}),
                Cell(fmt_int(r["n"]), {"col": "n"}, True),
                Cell(head, {"col": "head"}, keep=True),
                Cell(
                    fmt_est(r["accuracy"], r["ci_low"], r["ci_high"]),
                    {"col": "accuracy", "value": repr(float(r["accuracy"]))},
                    True,
                ),
                Cell(
                    f"{r['baseline_variant']} {fmt(r['baseline_accuracy'], nd)}",
                    {"col": "baseline"},
                ),
                Cell(
                    fmt_signed_est(r["gap"], r["gap_low"], r["gap_high"]),
                    {"col": "gap", "value": repr(float(r["gap"]))},
                    True,
                ),
            ]
        )
        attrs.append({"analysis": r["analysis"], "label": r["label"]})
    return Table(
        "key-findings",
        f"Key findings, held-out (head and direction chosen on one half of the units, "
        f"scored on the other, both ways, pooled): per analysis, {ALL} and the {TOP_LABELS} labels with "
        "the largest gap over their baseline. " + LEGEND,
        [
            "Analysis",
            "Label",
            "n",
            "Held-out head",
            "Accuracy [95% CI]",
            "Baseline",
            "Gap [95% CI]",
        ],
        rows,
        attrs,
    )


def reading_section() -> Section:
    s = Section("reading", "How to read the tables")
    s.add(Paragraph(HEAD_LEGEND))
    s.add(
        Paragraph(
            "Accuracy is hits / n (arcs for dependency, mentions for coreference). In-sample: the best head "
            "is chosen and scored on the same data, as the papers did; held-out: chosen on one half of the "
            "units (documents where the corpus marks them, else sentences), scored on the other half, and "
            "swapped (2-fold, folds by a hash of the unit id). Every number is read from the results' "
            "tables (counts, best_heads, head_tests, roles and the derived tables), as a stored value or a "
            "ratio of stored sums; only the example pictures draw attention values (examples.json). "
            "Figures are in figures/ as PNG (SVG and PDF too with --figures png,svg,pdf); every table's "
            "full columns are in tables/ as CSV."
        )
    )
    s.add(Paragraph("Reading the best-heads tables (column names as in best_heads.csv):"))
    s.add(BulletList(BEST_HEADS_LEGEND))
    return s


def provenance_section(results, source: str = "") -> Section:
    """Inputs, hashes, options, conventions and software, how to cite, and the Methods appendix
    (METHODS sections behind the report's tables): collapsed, at the end."""
    s = Section("provenance", "Provenance and methods")
    items = ([f"results directory: {source}"] if source else []) + [
        f"{k}: {v}" for k, v in provenance(results)
    ]
    s.add(
        Details(
            "Inputs with their SHA-256, options, conventions, corpora, bundled data's sources and "
            f"licences, software versions and run id ({len(items)} entries)",
            [BulletList(items)],
        )
    )
    s.add(methods.citation_block())
    s.add(methods.appendix(results))  # the METHODS sections behind the tables, folded
    return s


# ---------------------------------------------------------------- roles


def roles_section(results) -> Section:
    s = Section("roles", "Head-role map")
    s.add(
        Paragraph(
            "Each head gets the role of the first rule it meets, in this order (METHODS §6); "
            "a head that meets none is 'none':"
        )
    )
    s.add(BulletList([rule.description for rule in results.role_rules()], ordered=True))
    s.add(
        Paragraph(
            "A rule whose analysis is absent from the results cannot be met. Every rule a head "
            "meets is listed in the per-head table, with the numbers that decided its role."
        )
    )
    roles = results.roles
    if not len(roles):
        s.add(Paragraph("No heads in the results.", note=True))
        return s
    colors = role_colors(results)
    s.add(
        Figure(
            "roles",
            role_map_figure(roles, results.n_layers, results.n_heads, colors),
            "Head-role map. Cell text: the short label of the head's role (an offset, the relation with "
            "the largest held-out gap, '+' when more qualify, ...; see the rules above). " + LEGEND,
            alt="head-role map",
        )
    )
    s.add(_roles_summary_table(role_summary(roles, order=list(colors))))
    s.add(_roles_per_head_table(roles))
    return s


def _roles_summary_table(counts) -> Table:
    """The heads per role: how many, their share and their layers."""
    return Table(
        "roles-summary",
        "Heads per role",
        ["Role", "Heads", "Share", "Layers"],
        [
            [
                Cell(r.role),
                Cell(str(r.heads), numeric=True),
                Cell(fmt(r.share, 3), numeric=True),
                Cell(r.layers or "—"),
            ]
            for r in counts.itertuples(index=False)
        ],
    )


def _roles_per_head_table(roles) -> Table:
    """The role of every head, with its detail, evidence and every rule it meets."""
    rows, attrs = [], []
    for r in roles.itertuples(index=False):
        rows.append(
            [
                Cell(r.name),
                Cell(r.role, {"col": "role"}),
                Cell(r.detail or "—", wrap=True),
                Cell(r.evidence or "—", {"col": "evidence"}, wrap=True),
                Cell(r.all_roles or "—", {"col": "all_roles"}),
            ]
        )
        attrs.append({"layer": r.layer, "head": r.head, "role": r.role})
    return Table(
        "roles-per-head",
        "Role of every head. " + LEGEND,
        ["Head", "Role", "Detail", "Evidence", "All rules met"],
        rows,
        attrs,
        collapsed=len(rows) > 40,
    )


# ---------------------------------------------------------------- any other analysis


def _pairs_block(pairs: pd.DataFrame, name: str) -> Table:
    """A pair table's significant pairs (Holm), highest score first, at most `MAX_PAIRS`."""
    shown = significant_pairs(pairs).head(MAX_PAIRS)
    return pair_table_block(
        shown,
        slug(name),
        f"{name}: the {len(shown)} pairs of heads with the highest score among those whose "
        "Holm-adjusted p is below 0.05, with 95% bootstrap intervals (METHODS §5). " + LEGEND,
    )


def default_section(results, analysis: str) -> Section:
    """The view of an analysis that declares no report section: per label (largest first, at most
    MAX_PANELS panels) a layer x head heatmap of hits / n (mass / n for attention mass), and
    for a selection analysis its best-heads table; for an analysis keyed by pairs of heads, its
    pair tables' significant pairs."""
    try:
        entry = registry.get(analysis)
    except ValueError:
        entry = None
    s = Section(slug(analysis), f"{analysis}")
    if entry is not None and entry.description:
        s.add(Paragraph(described(analysis)))
    tally = results.tallies.get(analysis)
    if tally is not None and tally.senders:  # keyed by pairs of heads: its pair tables
        for name in entry.tables if entry is not None else ():
            if name in results.tables and is_pair_table(results.table(name)):
                s.add(_pairs_block(results.table(name), name))
    else:
        _head_views(s, results, analysis, entry)
    return s


def _head_views(s: Section, results, analysis: str, entry) -> None:
    """`default_section`'s per-head heatmaps and, for a selection analysis, best-heads tables."""
    scores = results.head_scores(analysis)
    is_mass = bool(len(scores)) and scores["hits"].isna().all()
    what = (
        "mass / n (its summed value per trial, such as the mean attention mass)"
        if is_mass
        else "accuracy (hits / n)"
    )
    s.add(
        Paragraph(
            f"This analysis declares no report section of its own; shown here: each head's {what} per "
            f"label, largest labels first (at most {MAX_PANELS} panels)."
        )
    )
    items = []
    for label in results.labels(analysis):
        values = results.head_values(analysis, label)
        for direction in dict.fromkeys(values["direction"]):
            one = values[values["direction"] == direction]
            items.append(
                (
                    f"{label}, {direction}" if direction else label,
                    to_matrix(one, "value", results.n_layers, results.n_heads),
                )
            )
    items = items[:MAX_PANELS]
    if items:
        s.add(
            Figure(
                f"{slug(analysis)}_heads",
                heatmap_grid_figure(
                    items,
                    cbar_label="mass / n" if is_mass else "accuracy",
                    vmin=0,
                    vmax=None if is_mass else 1,
                ),
                f"{analysis}: {what} per head and label. " + LEGEND,
                alt=f"{analysis} heatmaps",
            )
        )
    else:
        s.add(Paragraph(f"No {analysis} rows for attention heads.", note=True))
    selection = (
        entry.selection
        if entry is not None
        else bool((results.best_heads["analysis"] == analysis).any())
    )
    if selection:
        best_tables(s, results, analysis, results.labels(analysis))


# ---------------------------------------------------------------- examples


def examples_section(results) -> Section:
    s = Section("examples", "Example attention")
    examples = results.examples
    if not examples:
        s.add(Paragraph(_no_examples(results), note=True))
        return s
    s.add(
        Paragraph(
            "Word-level attention of a top head on one example from the corpus per label (rows attend to columns), "
            "a sentence of moderate length holding the relation, drawn at random with the run's seed. Red "
            "boxes: gold arcs of that relation (dependent row, head column for dep->head; head row, dependent "
            "column for head<-dep); for coreference, the mention's head row and the heads of its antecedents "
            "(earlier mentions of its cluster). Orange dots: each row's argmax, self excluded. These pictures "
            "are the only part of the report drawn from attention values."
        )
    )
    for k, ex in enumerate(examples[:MAX_EXAMPLES]):
        try:
            words = [str(w) for w in ex["words"]]
            att = np.asarray(ex["attention"], dtype=float)
            if att.shape != (len(words), len(words)):
                raise ValueError(f"attention shape {att.shape} for {len(words)} words")
            gold = [list(p)[:2] for p in (ex.get("gold") or [])]
            analysis, label = str(ex.get("analysis", "")), str(ex.get("label", ""))
            layer, head = int(ex["layer"]), int(ex["head"])
            direction = str(ex.get("direction") or "")
        except (KeyError, TypeError, ValueError) as err:
            s.add(Paragraph(f"Example {k} skipped: {err}.", note=True))
            continue
        best = results.best_head(analysis, label) if analysis in results.analyses else None
        is_best = best is not None and (int(best["layer"]), int(best["head"])) == (layer, head)
        name = head_name(layer, head)
        title = f"{analysis} {label}: head {name}" + (f" ({direction})" if direction else "")
        s.add(
            Figure(
                f"example_{k:02d}_{slug(analysis)}_{slug(label)}_{name}",
                example_figure(words, att, gold, title, direction),
                _example_caption(ex, words, title, is_best),
                alt=f"attention of head {name}",
            )
        )
    if len(examples) > MAX_EXAMPLES:
        s.add(Paragraph(f"{len(examples) - MAX_EXAMPLES} further examples not drawn.", note=True))
    return s


def _no_examples(results) -> str:
    """Why a report has no example pictures: the analyses that draw them (`Analysis.pictures`)
    the run scored, or that it scored none of them (a token pattern draws none)."""
    pictured = [n for kind in PICTURES for n in registry.pictured(kind)]
    drawn = [name for name in results.analyses if name in pictured]
    if drawn:
        return (
            "No examples in the results (examples.json absent or empty), so there are no example "
            f"pictures. `headprobe run` draws one per top head of {', '.join(drawn)} unless "
            "told not to."
        )
    return (
        "No example pictures: none of this run's analyses draws them (example pictures show the "
        f"best heads of {', '.join(pictured) or 'no registered analysis'} on an example holding "
        "their relation)."
    )


def _example_caption(ex: dict, words: list[str], title: str, is_best: bool) -> str:
    mention, antecedent = ex.get("mention"), ex.get("antecedent")
    where = f" ({'window from ' if mention else ''}{ex['sentence']})" if ex.get("sentence") else ""
    text = f"{title}{' — best head for this label' if is_best else ''}. "
    if mention and antecedent:
        span = lambda m: " ".join(words[int(m[0]) : int(m[1])])
        text += f"Mention “{span(mention)}”, antecedent “{span(antecedent)}”. "
    shown = " ".join(words[:60]) + (" …" if len(words) > 60 else "")
    return text + f"{'Words' if mention else 'Sentence'}{where}: {shown}"
