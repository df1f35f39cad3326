"""The comparison page of several runs: HTML + Markdown, rendered from `headprobe.results.comparison`.

    from headprobe.report.comparison_page import build_comparison
    paths = build_comparison(["out/minilm", "out/bert"], "out/compare")
    paths["html"], paths["markdown"], paths["figures"], paths["tables"]

Command line: `headprobe compare RUN_DIR RUN_DIR ... [--out DIR]`. Every number is a
value of the tables `headprobe.results.comparison.compare_runs` returns (written beside the page
as CSV); this module only renders them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from headprobe.report import html as _html
from headprobe.report import markdown as _markdown
from headprobe.report.build import HEAD_LEGEND
from headprobe.report.document import (
    BulletList,
    Cell,
    Details,
    Document,
    Figure,
    Interactive,
    Paragraph,
    Section,
    Table,
    slug,
)
from headprobe.report.heatmaps import matched_heads_figure
from headprobe.report.rendered_tables import LEGEND, fmt, fmt_est, fmt_int, fmt_signed_est
from headprobe.report.role_figures import compare_roles_figure, role_maps_figure
from headprobe.results.comparison import Run, compare_runs, unique_names
from headprobe.results.findings import model_line, provenance
from headprobe.stats.roles import NONE, role_colors


def build_comparison(sources, out_dir) -> dict:
    """Write compare.html, compare.md, figures/* (PNG, SVG, PDF) and tables/*.csv under `out_dir`
    for `sources`: results directories, `Results` or `Run`s (at least one). Raises
    FileNotFoundError / `report.UnreadableResults` for a directory that holds no readable results."""
    from headprobe.report import read_results, write_figures
    from headprobe.report.drawing import FORMATS

    runs = []
    for source in sources:
        if isinstance(source, Run):
            runs.append(source)
            continue
        results, where = read_results(source)
        runs.append(
            Run(
                str(results.summary.get("model") or Path(where).name or "run"),
                results,
                source=where,
            )
        )
    runs = unique_names(runs)
    tables = compare_runs(runs)
    doc = compose_comparison(runs, tables)
    out = Path(out_dir)
    pngs, vectors = write_figures(doc, out / "figures", FORMATS)
    paths = {
        "out_dir": out,
        "figures_dir": out / "figures",
        "figures": pngs,
        "vector_figures": vectors,
        "html": out / "compare.html",
        "markdown": out / "compare.md",
        "tables": [],
    }
    paths["html"].write_text(_html.render(doc), encoding="utf-8")
    paths["markdown"].write_text(_markdown.render(doc, "figures"), encoding="utf-8")
    (out / "tables").mkdir(exist_ok=True)
    for name, table in tables.items():
        path = out / "tables" / f"{name}.csv"
        table.to_csv(path, index=False)
        paths["tables"].append(path)
    return paths


def compose_comparison(runs: list[Run], tables: dict[str, pd.DataFrame]) -> Document:
    doc = Document(title="headprobe comparison: " + " vs ".join(r.name for r in runs))
    doc.sections += [
        _summary(runs, tables),
        _roles(runs, tables),
        _best_heads(runs, tables),
        _matches(runs, tables),
        _explorers(runs, tables),
        _provenance(runs),
    ]
    return doc


def _explorers(runs: list[Run], tables) -> Section:
    """One head explorer per run (the report's); selecting a head in one highlights the head it
    is matched with (see 'Matched heads') in each other run."""
    from headprobe.report.explorer import explorer_data, explorers_html

    s = Section("explorers", "Head explorers")
    s.add(
        Paragraph(
            "Each run's head explorer, as in its report. Selecting a head in one run outlines "
            "(orange) the head it is matched with in each other run."
        )
    )
    index = {run.name: i for i, run in enumerate(runs)}
    matched: dict[str, dict[str, str]] = {}
    for r in tables["matches"].itertuples(index=False):
        i, j = index.get(r.run_a), index.get(r.run_b)
        if i is None or j is None or not r.name_a or not r.name_b:
            continue
        matched.setdefault(f"{i}|{j}", {})[r.name_a] = r.name_b
        matched.setdefault(f"{j}|{i}", {})[r.name_b] = r.name_a
    parts = [
        (f"head-explorer-{k}", run.name, explorer_data(run.results)) for k, run in enumerate(runs)
    ]
    s.add(Interactive(explorers_html(parts, matched), "The head explorers are in compare.html."))
    return s


def _summary(runs: list[Run], tables) -> Section:
    s = Section("summary", "Summary")
    s.add(
        BulletList(
            [
                f"{r.name}: {model_line(r.results, with_model=r.name != r.results.summary.get('model'))}"
                + (f" (measure: {r.measure})" if r.measure else "")
                for r in runs
            ]
        )
    )
    pairs = tables["pairs"]
    if len(pairs):
        rows = [
            [
                Cell(f"{p.run_a} vs {p.run_b}"),
                Cell(fmt_int(p.pairs), numeric=True),
                Cell(fmt_int(p.features), numeric=True),
                Cell(fmt(p.mean_similarity, 3), numeric=True),
                Cell(fmt(p.mean_all_pairs, 3), numeric=True),
                Cell(
                    f"{p.roles_kept:.1%}",
                    {"col": "roles_kept", "value": repr(float(p.roles_kept))},
                    True,
                ),
                Cell(
                    "—" if pd.isna(p.roles_kept_with_role) else f"{p.roles_kept_with_role:.1%}",
                    numeric=True,
                ),
            ]
            for p in pairs.itertuples(index=False)
        ]
        s.add(
            Table(
                "pairs",
                "Heads matched one to one on their profiles of per-label scores (cosine similarity "
                "of centred profiles; see 'Matched heads'): mean similarity of the matched pairs beside the "
                "mean over every pair of heads (chance), and the share of matched pairs whose two heads hold "
                "the same role",
                [
                    "Runs",
                    "Pairs",
                    "Shared features",
                    "Mean similarity",
                    "All pairs",
                    "Roles kept",
                    "Roles kept (heads with a role)",
                ],
                rows,
            )
        )
    s.add(Paragraph(HEAD_LEGEND))
    return s


def _colors(runs: list[Run]) -> dict[str, str]:
    colors = {}
    for run in runs:
        colors.update({k: v for k, v in role_colors(run.results).items() if k != NONE})
    colors[NONE] = role_colors()[NONE]
    return colors


def _roles(runs: list[Run], tables) -> Section:
    s = Section("roles", "Head roles side by side")
    colors = _colors(runs)
    maps = [(r.name, r.results.roles, r.results.n_layers, r.results.n_heads) for r in runs]
    s.add(
        Figure(
            "role_maps",
            role_maps_figure(maps, colors, "Head-role maps (first matching rule)"),
            "Head-role maps side by side, each model in its own shape (square cells). " + LEGEND,
            alt="role maps side by side",
        )
    )
    counts = tables["role_counts"]
    order = [r for r in colors if r in set(counts["role"])]
    rows = []
    for role in order:
        row = [Cell(role)]
        for run in runs:
            hit = counts[(counts["run"] == run.name) & (counts["role"] == role)]
            heads, share = (
                (int(hit["heads"].iloc[0]), float(hit["share"].iloc[0])) if len(hit) else (0, 0.0)
            )
            row.append(Cell(f"{heads} ({share:.1%})", {"col": run.name, "heads": heads}, True))
        rows.append(row)
    s.add(
        Table(
            "role-counts",
            "Heads per role (share of the model's heads)",
            ["Role"] + [r.name for r in runs],
            rows,
            [{"role": role} for role in order],
        )
    )
    heads = pd.concat(
        [
            r.results.roles.assign(
                model=r.name,
                relative_depth=r.results.roles["layer"] / max(r.results.n_layers - 1, 1),
            )
            for r in runs
        ]
    )
    shares = counts.rename(columns={"run": "model"})
    s.add(
        Figure(
            "compare_roles",
            compare_roles_figure(shares, heads, colors, "Head roles per model"),
            "Share of heads per role (left) and the relative depth of each role's heads (right; 0 = first "
            "layer, 1 = last).",
            alt="role shares and depths",
        )
    )
    return s


def _best_heads(runs: list[Run], tables) -> Section:
    s = Section("best-heads", "Best heads per label")
    s.add(
        Paragraph(
            "Per label, each run's held-out best head (chosen on one half of the units, scored on the "
            "other, both ways, pooled) with its accuracy, 95% interval and gap over the baseline "
            "(best_heads.csv has every column)."
        )
    )
    best = tables["best_heads"]
    for analysis in dict.fromkeys(best["analysis"]):
        sub = best[best["analysis"] == analysis]
        rows, attrs = [], []
        for label in dict.fromkeys(sub["label"]):
            row = [Cell(label)]
            for run in runs:
                hit = sub[(sub["run"] == run.name) & (sub["label"] == label)]
                row.append(_best_cell(hit.iloc[0] if len(hit) else None, run.name))
            rows.append(row)
            attrs.append({"analysis": analysis, "label": label})
        s.add(
            Table(
                f"best-{slug(analysis)}",
                f"{analysis}: held-out best head, accuracy [95% CI], gap over the "
                "baseline [95% CI]. " + LEGEND,
                ["Label"] + [r.name for r in runs],
                rows,
                attrs,
            )
        )
    return s


def _best_cell(r, run: str) -> Cell:
    if r is None:
        return Cell("—", {"col": run})
    if r["note"]:
        return Cell(f"n {fmt_int(r['n'])}: {r['note']}", {"col": run}, wrap=True)
    head = " ".join(x for x in (str(r["heads"]), str(r["direction"] or "")) if x and x != "nan")
    return Cell(
        f"{head}: {fmt_est(r['accuracy'], r['ci_low'], r['ci_high'])}; gap "
        f"{fmt_signed_est(r['gap'], r['gap_low'], r['gap_high'])} (n {fmt_int(r['n'])})",
        {"col": run, "head": str(r["heads"]), "accuracy": repr(float(r["accuracy"]))},
    )


def _matches(runs: list[Run], tables) -> Section:
    s = Section("matches", "Matched heads")
    s.add(
        Paragraph(
            "Each head's profile: its accuracy for every label and direction with enough trials (dependency "
            "relations, coreference kinds, positional offsets) and its mean attention mass per surface measure "
            "(entropy as a share of uniform). Only features both runs have count; each is centred on the model's "
            "mean over heads, and each analysis weighs the same. Heads are matched one to one "
            "(scipy.optimize.linear_sum_assignment) to maximise the summed cosine similarity; a model with more "
            "heads leaves some unmatched."
        )
    )
    matches, agreement = tables["matches"], tables["agreement"]
    by_name = {r.name: r for r in runs}
    for (a, b), m in matches.groupby(["run_a", "run_b"], sort=False):
        agree = agreement[(agreement["run_a"] == a) & (agreement["run_b"] == b)]
        for block in _pair_blocks(a, b, m, by_name[a].results, agree):
            s.add(block)
    return s


def _pair_blocks(a: str, b: str, m, ra, agree) -> list:
    """The matched heads of runs `a` and `b` (`ra`: the results of `a`): a figure of their
    similarity, the roles kept and every matched pair."""
    sim = np.full((ra.n_layers, ra.n_heads), np.nan)
    names = np.full((ra.n_layers, ra.n_heads), "", dtype=object)
    for r in m.itertuples(index=False):
        sim[r.layer_a, r.head_a], names[r.layer_a, r.head_a] = r.similarity, r.name_b
    blocks = [Paragraph(f"{a} vs {b}", note=False)]
    blocks.append(
        Figure(
            f"matches_{slug(a)}_{slug(b)}",
            matched_heads_figure(sim, names, f"{a}: matched head of {b}"),
            f"Each head of {a} coloured by its similarity to the head of {b} it is matched with (cell "
            f"text: that head; grey: unmatched). " + LEGEND,
            alt=f"matched heads {a} {b}",
        )
    )
    blocks.append(
        Table(
            f"agreement-{slug(a)}-{slug(b)}",
            f"Roles kept: heads of {a} per role, how many are matched "
            f"with a head of {b} holding the same role",
            ["Role", "Matched heads", "Same role", "Share"],
            [
                [
                    Cell(r.role),
                    Cell(fmt_int(r.heads), numeric=True),
                    Cell(fmt_int(r.kept), numeric=True),
                    Cell("—" if pd.isna(r.share_kept) else f"{r.share_kept:.1%}", numeric=True),
                ]
                for r in agree.itertuples(index=False)
            ],
        )
    )
    blocks.append(_pairs_table(a, b, m))
    return blocks


def _pairs_table(a: str, b: str, m) -> Table:
    """Every matched pair of heads of runs `a` and `b` (`m`: their rows of `matches`)."""
    rows = [
        [
            Cell(r.name_a),
            Cell(r.role_a),
            Cell(r.name_b, {"col": "name_b"}),
            Cell(r.role_b),
            Cell(
                fmt(r.similarity, 3),
                {"col": "similarity", "value": repr(float(r.similarity))},
                True,
            ),
        ]
        for r in m.itertuples(index=False)
    ]
    return Table(
        f"matches-{slug(a)}-{slug(b)}",
        f"Every matched pair, {a} vs {b}. " + LEGEND,
        [f"Head ({a})", "Role", f"Head ({b})", "Role", "Similarity"],
        rows,
        [
            {
                "layer-a": int(r.layer_a),
                "head-a": int(r.head_a),
                "layer-b": int(r.layer_b),
                "head-b": int(r.head_b),
            }
            for r in m.itertuples(index=False)
        ],
        collapsed=True,
    )


def _provenance(runs: list[Run]) -> Section:
    s = Section("provenance", "Provenance")
    items = []
    for run in runs:
        items += [f"{run.name}: results directory: {run.source or '(in memory)'}"]
        items += [f"{run.name}: {k}: {v}" for k, v in provenance(run.results)]
    s.add(
        Details(
            f"Each run's inputs with their SHA-256, options and conventions ({len(items)} entries)",
            [BulletList(items)],
        )
    )
    return s
