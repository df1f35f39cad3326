"""Compose the report `Document` from a results directory's tables."""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.report import figures as F
from headprobe.report import tables as T
from headprobe.report.document import (BulletList, Cell, Document, Figure, Paragraph, Section,
                                       Table, slug)
from headprobe.report.roles import RoleRules, head_roles, role_summary

HEAD_LEGEND = ("Heads are named L-H = layer-head, both 0-based (Clark et al. 2019 print "
               "1-based indices, so their 8-10 is 7-9 here).")
LEGEND = "L-H = layer-head, both 0-based."
MAX_RELATION_PANELS = 12
MIN_TABLE_N = 20            # relations with fewer arcs go to a folded table
MAX_EXAMPLES = 30
COREF_KINDS = ("ALL", "pronoun", "proper", "nominal")


def compose(data: T.ReportData, rules: RoleRules = RoleRules()) -> Document:
    model = data.summary.get("model", "unknown model")
    doc = Document(title=f"headprobe report: {model}",
                   subtitle=f"{data.n_layers} layers x {data.n_heads} heads; "
                            f"results from {data.source}")
    doc.sections.append(_overview(data))
    roles = head_roles(data.counts, data.n_layers, data.n_heads, rules)
    doc.sections.append(_roles_section(data, roles, rules))
    present = set(data.counts["analysis"])
    if "dependency" in present:
        doc.sections.append(_dependency_section(data))
    if "coreference" in present:
        doc.sections.append(_coreference_section(data))
    if "positional" in present:
        doc.sections.append(_positional_section(data, rules))
    if "surface" in present:
        doc.sections.append(_surface_section(data))
    doc.sections.append(_examples_section(data))
    missing = [a for a in data.summary.get("analyses", []) or [] if a not in present]
    if missing:
        doc.sections[0].add(Paragraph(
            "Analyses named in summary.json but without rows in counts: " + ", ".join(missing)
            + ".", note=True))
    return doc


# ---------------------------------------------------------------- overview

def _overview(data: T.ReportData) -> Section:
    s = Section("overview", "Overview")
    summ = data.summary
    items = [f"model: {summ.get('model', 'unknown')}",
             f"layers x heads: {data.n_layers} x {data.n_heads}",
             "analyses: " + (", ".join(summ.get("analyses") or data.analyses) or "none")]
    skipped = summ.get("skipped") or {}
    if skipped:
        items.append("skipped (never silent): " + _flat(skipped))
    else:
        items.append("skipped: nothing reported")
    for key, value in summ.items():
        if key in ("model", "n_layers", "n_heads", "analyses", "skipped", "notes", "headline"):
            continue
        items.append(f"{key}: {_flat(value)}")
    s.add(BulletList(items))
    for note in summ.get("notes") or []:
        s.add(Paragraph(f"Note: {note}", note=True))
    for problem in data.problems:
        s.add(Paragraph(problem, note=True))
    s.add(Paragraph(HEAD_LEGEND))
    s.add(Paragraph(
        "Accuracy is hits / n from the counts table (arcs for dependency, mentions for "
        "coreference). In-sample: the best head is chosen and scored on the same data, as the "
        "papers did; held-out: chosen on one half of the sentences (documents for "
        "coreference), scored on the other half, and swapped (2-fold). Intervals are 95% "
        "bootstrap intervals (and paired intervals for gaps) read from the best-heads table."))
    s.add(Paragraph(
        "Every number in this report is read from the results tables (counts, best_heads, "
        "summary.json), as a stored value or a ratio of stored sums; nothing is recomputed from "
        "attention except the example pictures, which draw examples.json."))
    return s


def _flat(value, limit: int = 10) -> str:
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_flat(v)}" for k, v in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        more = f" (+{len(value) - limit} more)" if len(value) > limit else ""
        return (", ".join(_flat(v) for v in value[:limit]) + more) or "none"
    if value is None:
        return "—"
    return str(value)


# ---------------------------------------------------------------- roles

def _roles_section(data: T.ReportData, roles: pd.DataFrame, rules: RoleRules) -> Section:
    s = Section("roles", "Head-role map")
    s.add(Paragraph("Each head gets the role of the first rule it matches, in this order:"))
    s.add(BulletList(rules.describe(), ordered=True))
    s.add(Paragraph("A rule whose analysis is absent from the results cannot match. "
                    "Every rule a head matches is listed in the per-head table."))
    if not len(roles):
        s.add(Paragraph("No heads in the results.", note=True))
        return s
    s.add(Figure("roles", F.role_map_figure(roles, data.n_layers, data.n_heads),
                 "Head-role map. Cell text: positional offset, relation with the largest gap "
                 "('+' when more relations qualify), coref, sink or broad. " + LEGEND,
                 alt="head-role map"))
    summ = role_summary(roles, data.n_layers)
    s.add(Table("roles-summary", "Heads per role", ["Role", "Heads", "Share", "Layers"],
                [[Cell(r.role), Cell(str(r.heads), numeric=True),
                  Cell(T.fmt(r.share, 3), numeric=True), Cell(r.layers or "—")]
                 for r in summ.itertuples(index=False)]))
    rows, attrs = [], []
    for r in roles.itertuples(index=False):
        rows.append([Cell(r.name), Cell(r.role), Cell(r.detail or "—", wrap=True),
                     Cell(r.evidence or "—", wrap=True), Cell(r.all_roles or "—")])
        attrs.append({"layer": r.layer, "head": r.head, "role": r.role})
    s.add(Table("roles-per-head", "Role of every head. " + LEGEND,
                ["Head", "Role", "Detail", "Evidence", "All rules matched"], rows, attrs,
                collapsed=len(rows) > 40))
    return s


# ---------------------------------------------------------------- dependency / coreference

def _gap_matrix(data, scores, analysis, label, direction):
    variant, base = T.reference_baseline(data, analysis, label, direction)
    acc = T.to_matrix(scores, "accuracy", data.n_layers, data.n_heads)
    if variant is None:
        return acc, None, "none"
    return acc, acc - base, f"{variant}: {base:.4f}"


def _dependency_section(data: T.ReportData) -> Section:
    s = Section("dependency", "Dependency arcs (Clark et al. 2019, section 4)")
    s.add(Paragraph(
        "dep->head: the dependent's attention argmax (self excluded) is its head; head<-dep: of "
        "all words, the head is the one attending most to the dependent. The baseline is the "
        "best single fixed offset (-5..5) for the relation. root and punct arcs are not "
        "scored per relation; ALL is every other arc."))
    labels = T.labels_by_size(data.counts, "dependency")
    main = "ALL" if "ALL" in labels else (labels[0] if labels else None)
    if main is None:
        s.add(Paragraph("No dependency rows for attention heads.", note=True))
        return s
    panels = []
    for direction in T.DIRECTIONS:
        sc = T.head_scores(data.counts, "dependency", main, direction)
        if len(sc):
            acc, gap, base = _gap_matrix(data, sc, "dependency", main, direction)
            panels.append((f"{main}, {direction}", acc, gap, base))
    if panels:
        s.add(Figure("dependency_all", F.accuracy_gap_figure(panels),
                     f"Dependency accuracy per head for {main} arcs, each direction (left), and "
                     f"accuracy minus the fixed-offset baseline (right; baseline named in the "
                     f"panel title). " + LEGEND, alt=f"dependency heatmaps {main}"))
    rels = [lab for lab in labels if lab not in T.NOT_PER_RELATION][:MAX_RELATION_PANELS]
    items = []
    for lab in rels:
        sc = T.head_scores(data.counts, "dependency", lab)
        if not len(sc):
            continue
        best = sc.groupby(["layer", "head"], as_index=False)["accuracy"].max()
        variant, base = T.reference_baseline(data, "dependency", lab)
        if variant is None:
            continue
        best["gap"] = best["accuracy"] - base
        items.append((f"{lab} (vs {variant})", T.to_matrix(best, "gap", data.n_layers,
                                                           data.n_heads)))
    if items:
        s.add(Figure("dependency_relations", F.gap_grid_figure(items),
                     "Per relation (largest first): accuracy in the head's better direction minus "
                     "the relation's best fixed-offset baseline. Blue: below the baseline, "
                     "red: above. " + LEGEND, alt="per-relation gap heatmaps"))
    ordered = [main] + [x for x in labels if x != main]
    frequent = [x for x in ordered if x == main or _label_n(data, "dependency", x) >= MIN_TABLE_N]
    rare = [x for x in ordered if x not in frequent]
    s.add(_top_heads_table(data, "dependency", frequent))
    if rare:
        table = _top_heads_table(data, "dependency", rare, name="dependency-top-heads-rare")
        table.caption = (f"Relations with fewer than {MIN_TABLE_N} arcs (same columns; small "
                         f"samples, wide intervals)")
        table.collapsed = True
        s.add(table)
    return s


def _label_n(data: T.ReportData, analysis: str, label: str) -> float:
    row = T.best_heads_row(data.best_heads, analysis, label)
    if row is not None and "n" in row.index and not pd.isna(row["n"]):
        return float(row["n"])
    sc = T.head_scores(data.counts, analysis, label)
    return float(sc["n"].max()) if len(sc) else 0.0


def _coreference_section(data: T.ReportData) -> Section:
    s = Section("coreference", "Coreference (Clark et al. 2019, section 5)")
    s.add(Paragraph(
        "A mention's head word scores a hit when the candidate it attends to most is the head "
        "of a mention of its own cluster. Baselines: nearest (latest-starting candidate), "
        "head_match (same head word, else nearest) and, where present, a rule-based baseline."))
    labels = T.labels_by_size(data.counts, "coreference")
    kinds = [k for k in COREF_KINDS if k in labels] + [k for k in labels if k not in COREF_KINDS]
    panels = []
    for kind in kinds:
        sc = T.head_scores(data.counts, "coreference", kind)
        if len(sc):
            sc = sc.sort_values("accuracy", ascending=False).drop_duplicates(["layer", "head"])
            acc, gap, base = _gap_matrix(data, sc, "coreference", kind, None)
            panels.append((kind, acc, gap, base))
    if panels:
        s.add(Figure("coreference", F.accuracy_gap_figure(panels),
                     "Coreference accuracy per head for each mention kind (left) and accuracy "
                     "minus the baseline the best-heads table compares with (right). "
                     + LEGEND, alt="coreference heatmaps"))
    else:
        s.add(Paragraph("No coreference rows for attention heads.", note=True))
    s.add(_top_heads_table(data, "coreference", kinds))
    return s


def _top_heads_table(data: T.ReportData, analysis: str, labels: list[str],
                     name: str | None = None) -> Table:
    is_dep = analysis == "dependency"
    bl_variants = []
    if not is_dep:
        c = data.counts
        bl_variants = sorted(c[(c["analysis"] == analysis) & (c["variant"] != "")]["variant"]
                             .unique())
    columns = (["Relation", "Arcs", "Head", "Direction"] if is_dep
               else ["Kind", "Mentions", "Head"]) + ["Accuracy", "95% CI"]
    if is_dep:
        columns += ["Baseline", "Baseline acc."]
    else:
        columns += [f"{v} acc." for v in bl_variants] + ["Gap vs"]
    columns += ["Gap", "Gap CI", "Held-out head", "Held-out acc.", "Held-out CI",
                "Held-out gap", "Held-out gap CI", "Next best (in-sample, from counts)"]
    rows, attrs = [], []
    fallback = False
    for label in labels:
        ins = T.best_heads_row(data.best_heads, analysis, label, "in-sample")
        held = T.best_heads_row(data.best_heads, analysis, label, "held-out")
        scores = T.head_scores(data.counts, analysis, label)
        if ins is None:
            if not len(scores):
                continue
            fallback = True
            top = scores.sort_values(["accuracy", "layer", "head"], ascending=[False, True, True],
                                     kind="stable").iloc[0]
            variant, base = T.reference_baseline(data, analysis, label, top["direction"] or None)
            ins = pd.Series({"layer": top["layer"], "head": top["head"],
                             "direction": top["direction"], "n": top["n"], "hits": top["hits"],
                             "accuracy": top["accuracy"], "baseline_variant": variant or "",
                             "baseline_accuracy": base, "gap": top["accuracy"] - base})
        get = lambda row, key: row[key] if (row is not None and key in row.index) else np.nan  # noqa: E731
        direction = str(get(ins, "direction") or "")
        row = [Cell(label), Cell(T.fmt_int(get(ins, "n")), {"col": "n"}, True),
               Cell(T.head_name(get(ins, "layer"), get(ins, "head")), {"col": "head"})]
        if is_dep:
            row.append(Cell(direction or "—", {"col": "direction"}))
        row += [Cell(T.fmt(get(ins, "accuracy")), {"col": "accuracy"}, True),
               Cell(T.fmt_ci(get(ins, "ci_low"), get(ins, "ci_high")), {"col": "ci"}, True)]
        if is_dep:
            row += [Cell(str(get(ins, "baseline_variant") or "—"), {"col": "baseline"}),
                    Cell(T.fmt(get(ins, "baseline_accuracy")), {"col": "baseline_accuracy"},
                         True)]
        else:
            bl = T.baselines(data.counts, analysis, label)
            accs = dict(zip(bl["variant"], bl["accuracy"]))
            row += [Cell(T.fmt(accs.get(v)), {"col": f"baseline:{v}"}, True) for v in bl_variants]
            row.append(Cell(str(get(ins, "baseline_variant") or "—"), {"col": "baseline"}))
        row += [Cell(T.fmt(get(ins, "gap")), {"col": "gap"}, True),
                Cell(T.fmt_ci(get(ins, "gap_low"), get(ins, "gap_high")), {"col": "gap_ci"}, True),
                Cell(T.row_head_name(held), {"col": "heldout_head"}),
                Cell(T.fmt(get(held, "accuracy")), {"col": "heldout_accuracy"}, True),
                Cell(T.fmt_ci(get(held, "ci_low"), get(held, "ci_high")), {"col": "heldout_ci"},
                     True),
                Cell(T.fmt(get(held, "gap")), {"col": "heldout_gap"}, True),
                Cell(T.fmt_ci(get(held, "gap_low"), get(held, "gap_high")),
                     {"col": "heldout_gap_ci"}, True),
                Cell(_runners_up(scores, get(ins, "layer"), get(ins, "head")),
                     {"col": "next_best"}, wrap=True)]
        rows.append(row)
        attrs.append({"analysis": analysis, "label": label,
                      "layer": int(get(ins, "layer")), "head": int(get(ins, "head")),
                      "direction": direction})
    what = "relation" if is_dep else "mention kind"
    caption = (f"Best head per {what}: in-sample (selected and scored on all the data) and "
               f"held-out (selected on one half, scored on the other, 2-fold). CI: 95% "
               f"bootstrap interval; gap = accuracy minus the baseline, with its paired "
               f"interval. Held-out head 'A | B': the two folds chose different heads (A on "
               f"fold 0, B on fold 1). Next best: the following heads by in-sample accuracy, "
               f"from counts. " + LEGEND)
    if fallback:
        caption += (" Rows without a best-heads entry are taken from counts (no intervals, "
                    "no held-out).")
    return Table(name or f"{analysis}-top-heads", caption, columns, rows, attrs)


def _runners_up(scores: pd.DataFrame, layer, head, k: int = 3) -> str:
    if not len(scores):
        return "—"
    best = scores.sort_values(["accuracy", "layer", "head", "direction"],
                              ascending=[False, True, True, True], kind="stable") \
        .drop_duplicates(["layer", "head"])
    if layer is not None and not pd.isna(layer):
        best = best[~((best["layer"] == int(layer)) & (best["head"] == int(head)))]
    parts = []
    for r in best.head(k).itertuples(index=False):
        d = f" {r.direction}" if r.direction else ""
        parts.append(f"{T.head_name(r.layer, r.head)}{d} {T.fmt(r.accuracy)}")
    return "; ".join(parts) or "—"


# ---------------------------------------------------------------- positional

def _positional_section(data: T.ReportData, rules: RoleRules) -> Section:
    s = Section("positional", "Positional heads (Voita et al. 2019)")
    s.add(Paragraph(
        "For every word (specials excluded as queries), where its attention argmax sits "
        "(self and special tokens included): relative offset -2..+2, a special token, or "
        f"elsewhere. A head is positional when one non-zero offset takes at least "
        f"{rules.positional_share:g} of the argmaxes."))
    shares = T.positional_shares(data.counts)
    if not len(shares):
        s.add(Paragraph("No positional rows for attention heads.", note=True))
        return s
    s.add(Figure("positional", F.positional_figure(shares, data.n_layers, data.n_heads),
                 "Share of words whose argmax is at each relative position, per head. "
                 + LEGEND, alt="positional heatmaps"))
    top = shares.sort_values(["dominant_share", "layer", "head"], ascending=[False, True, True],
                             kind="stable")
    n_pos = int((top["dominant_share"] >= rules.positional_share).sum())
    top = top.head(max(10, n_pos))
    cols = [c for c in T.POSITIONAL_LABELS if c in shares.columns]
    rows, attrs = [], []
    for _, r in top.iterrows():
        share = r["dominant_share"]
        rows.append([Cell(T.head_name(r["layer"], r["head"])), Cell(str(r["dominant_offset"])),
                     Cell(T.fmt(share), {"col": "dominant_share"}, True),
                     Cell("yes" if share >= rules.positional_share else "no")]
                    + [Cell(T.fmt(r[c]), {"col": f"share:{c}"}, True) for c in cols]
                    + [Cell(T.fmt_int(r["words"]), {"col": "n"}, True)])
        attrs.append({"layer": int(r["layer"]), "head": int(r["head"])})
    s.add(Table("positional-top", f"Heads by the share of their dominant non-zero offset "
                f"({n_pos} positional heads). " + LEGEND,
                ["Head", "Offset", "Share", "Positional"] + [f"share {c}" for c in cols]
                + ["Words"], rows, attrs))
    return s


# ---------------------------------------------------------------- surface

SURFACE_COLUMNS = [("cls", "CLS/BOS"), ("sep", "SEP/EOS"), ("punct", "punct"), ("self", "self"),
                   ("prev", "prev"), ("next", "next"), ("entropy", "entropy"),
                   ("entropy_uniform", "uniform entropy"), ("entropy_ratio", "entropy / uniform")]


def _surface_section(data: T.ReportData) -> Section:
    s = Section("surface", "Surface statistics (Clark et al. 2019, section 3)")
    s.add(Paragraph(
        "Mean attention mass a word pays to [CLS]/BOS, [SEP]/EOS, punctuation words, itself, "
        "the previous and the next word (Clark et al. Figure 2), and the mean entropy of the "
        "attention rows in nats over pieces, beside the entropy of uniform attention (their "
        "Figure 4). Per-layer values are the layer's summed mass over its summed counts."))
    per_head = T.surface_per_head(data.counts)
    per_layer = T.surface_per_layer(data.counts)
    if not len(per_head):
        s.add(Paragraph("No surface rows for attention heads.", note=True))
        return s
    if any(c in per_head.columns for c in T.SURFACE_LABELS):
        s.add(Figure("surface_mass", F.surface_figure(per_head, per_layer),
                     "Mean attention mass per head (dots) and per layer (line), by layer "
                     "(0-based).", alt="surface statistics"))
    if "entropy" in per_head.columns:
        s.add(Figure("surface_entropy", F.entropy_figure(per_head, per_layer),
                     "Mean entropy of the attention rows per head (dots) and per layer (line), "
                     "with the entropy of uniform attention (dashed).", alt="entropy"))
    cols = [(k, name) for k, name in SURFACE_COLUMNS if k in per_layer.columns]
    rows = [[Cell(str(int(r["layer"])))] +
            [Cell(T.fmt(r[k]), {"col": k}, True) for k, _ in cols]
            for _, r in per_layer.iterrows()]
    s.add(Table("surface-per-layer", "Surface statistics per layer (mean over the layer's "
                "heads; mass in [0, 1], entropy in nats)", ["Layer"] + [n for _, n in cols],
                rows, [{"layer": int(r["layer"])} for _, r in per_layer.iterrows()]))
    hcols = [(k, name) for k, name in SURFACE_COLUMNS if k in per_head.columns]
    rows = [[Cell(T.head_name(r["layer"], r["head"]))] +
            [Cell(T.fmt(r[k]), {"col": k}, True) for k, _ in hcols]
            for _, r in per_head.iterrows()]
    s.add(Table("surface-per-head", "Surface statistics per head. " + LEGEND,
                ["Head"] + [n for _, n in hcols], rows,
                [{"layer": int(r["layer"]), "head": int(r["head"])}
                 for _, r in per_head.iterrows()], collapsed=True))
    return s


# ---------------------------------------------------------------- examples

def _examples_section(data: T.ReportData) -> Section:
    s = Section("examples", "Example attention")
    if data.examples is None:
        s.add(Paragraph("No examples.json in the results directory, so there are no example "
                        "pictures. The pipeline writes one attention matrix per top head when "
                        "asked to.", note=True))
        return s
    if not isinstance(data.examples, list) or not data.examples:
        s.add(Paragraph("examples.json holds no examples.", note=True))
        return s
    s.add(Paragraph(
        "Word-level attention of a top head on one example from the corpus (rows attend to "
        "columns). Red boxes: gold arcs (dependent row, head column for dep->head; head row, "
        "dependent column for head<-dep; mention row, antecedent column for coreference). "
        "Orange dots: each row's argmax, self excluded. These pictures are the only part of "
        "the report drawn from attention values (examples.json)."))
    best = data.best_heads
    skipped = 0
    for k, ex in enumerate(data.examples[:MAX_EXAMPLES]):
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
            skipped += 1
            s.add(Paragraph(f"Example {k} skipped: {err}.", note=True))
            continue
        is_best = bool(len(best) and ((best["analysis"] == analysis) & (best["label"] == label)
                                      & (best["layer"] == layer) & (best["head"] == head)).any())
        name = T.head_name(layer, head)
        title = f"{analysis} {label}: head {name}" + (f" ({direction})" if direction else "")
        caption = (f"{title}{' — best head for this label' if is_best else ''}. "
                   f"Sentence: {' '.join(words[:60])}{' …' if len(words) > 60 else ''}")
        s.add(Figure(f"example_{k:02d}_{slug(analysis)}_{slug(label)}_{name}",
                     F.example_figure(words, att, gold, title, direction), caption,
                     alt=f"attention of head {name}"))
    if len(data.examples) > MAX_EXAMPLES:
        s.add(Paragraph(f"{len(data.examples) - MAX_EXAMPLES} further examples not drawn.",
                        note=True))
    return s
