"""Report tests: numbers trace back to the counts, and the page renders in Chromium.

The results are built from planted tallies (tests/fixtures_results.py), saved, and
read back by the report, so nothing here depends on a model. The Chromium test
drives the Debian `chromium` binary headless over the DevTools protocol (a tiny
stdlib WebSocket client below, no downloads): it opens report.html from disk,
checks that every <img> decoded (naturalWidth > 0), that nothing was logged as an
error on the console, and keeps a screenshot as `report_screenshot.png` beside the
report. It is skipped when /usr/bin/chromium (or `chromium` on PATH) is absent.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import time
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest

from headprobe.cli import main as cli_main
from headprobe.report import build_report, main_report
from headprobe.results import store
from headprobe.results.query import Results
from headprobe.scoring import registry
from headprobe.scoring.registry import Analysis
from headprobe.scoring.scorer_base import CountScorer

try:
    from tests.fixtures_results import (
        PROVENANCE,
        add_items,
        make_results,
        make_results_dir,
        new_tally,
    )
except ImportError:  # tests/ itself on sys.path (pytest's default rootdir handling)
    from fixtures_results import PROVENANCE, add_items, make_results, make_results_dir, new_tally

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PRINT_WIDTH = 718  # CSS pixels across an A4 page with Chromium's default print margins
BOS_MODE = "kept"


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory):
    return make_results_dir(tmp_path_factory.mktemp("results"), seed=0, causal=True, bos=BOS_MODE)


@pytest.fixture(scope="module")
def report(results_dir):
    return build_report(results_dir)


@pytest.fixture(scope="module")
def counts(results_dir):
    c = pd.read_parquet(results_dir / store.table_file("counts"))
    for col in ("direction", "variant", "fold", "label"):
        c[col] = c[col].fillna("").astype(str)
    return c


@pytest.fixture(scope="module")
def html(report):
    return report["html"].read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def html_tables(html):
    parser = TableParser()
    parser.feed(html)
    return parser.tables


class TableParser(HTMLParser):
    """Collects every <table data-table=NAME>: rows of (row attrs, {col: text}, [texts],
    {col: cell attrs}), and the text of every <li>."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list] = {}
        self.items: list[str] = []
        self._table = None
        self._row = None
        self._cell = None
        self._item = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._table = self.tables.setdefault(a.get("data-table", f"t{len(self.tables)}"), [])
        elif tag == "tr" and self._table is not None:
            self._row = ({k[5:]: v for k, v in a.items() if k.startswith("data-")}, {}, [], {})
        elif tag == "td" and self._row is not None:
            self._cell = [
                a.get("data-col"),
                "",
                {k[5:]: v for k, v in a.items() if k.startswith("data-")},
            ]
        elif tag == "li":
            self._item = ""

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1] += data
        if self._item is not None:
            self._item += data

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            col, text, cell_attrs = self._cell
            if col:
                self._row[1][col] = text
                self._row[3][col] = cell_attrs
            self._row[2].append(text)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._row[2]:
                self._table.append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "li" and self._item is not None:
            self.items.append(self._item)
            self._item = None


def ratio(counts, **where):
    sel = counts
    for key, value in where.items():
        sel = sel[sel[key] == value]
    assert len(sel), where
    return sel["hits"].sum() / sel["n"].sum(), sel["n"].sum()


def rows_of(tables, name):
    assert name in tables, sorted(tables)
    return {r[0].get("label", r[2][0]): r for r in tables[name]}


# ---------------------------------------------------------------- numbers


def shown_decimals(low: float, high: float) -> int:
    """The report's rounding rule, stated independently: one digit past the first significant
    digit of the interval's width, between 2 and 4 decimals."""
    width = high - low
    return 4 if width <= 0 else min(4, max(2, 1 - int(np.floor(np.log10(width)))))


def estimate_text(value, low, high, signed=False) -> str:
    d = shown_decimals(low, high)
    sign = "+" if signed else ""
    return f"{value:{sign}.{d}f} [{low:{sign}.{d}f},\u00a0{high:{sign}.{d}f}]"


@pytest.mark.parametrize("label", ["ALL", "nsubj", "det"])
def test_dependency_cells_equal_counts(html_tables, counts, results_dir, label):
    attrs, cells, _, values = rows_of(html_tables, "dependency-top-heads")[label]
    layer, head, direction = int(attrs["layer"]), int(attrs["head"]), attrs["direction"]
    assert values["head"]["head"] == f"{layer}-{head}" and values["head"]["direction"] == direction
    assert cells["head"] == f"{layer}-{head} {direction}"
    acc, n = ratio(
        counts,
        analysis="dependency",
        label=label,
        layer=layer,
        head=head,
        direction=direction,
        variant="",
        fold="",
    )
    assert float(values["accuracy"]["value"]) == pytest.approx(acc, rel=1e-12)
    best = pd.read_parquet(results_dir / "best_heads.parquet")
    row = best[
        (best["analysis"] == "dependency")
        & (best["label"] == label)
        & (best["selection"] == "in-sample")
        & (best["fold"] == "")
    ].iloc[0]
    assert cells["accuracy"] == estimate_text(acc, row["ci_low"], row["ci_high"])
    assert (
        float(values["accuracy"]["low"]) == row["ci_low"]
        and float(values["accuracy"]["high"]) == row["ci_high"]
    )
    assert int(cells["n"]) == n
    # the shown head is the best (layer, head, direction) in counts
    heads = counts[
        (counts["analysis"] == "dependency")
        & (counts["label"] == label)
        & (counts["variant"] == "")
        & (counts["fold"] == "")
    ]
    assert acc == pytest.approx((heads["hits"] / heads["n"]).max())
    variant = values["baseline"]["variant"]
    base, _ = ratio(counts, analysis="dependency", label=label, variant=variant, fold="")
    assert float(values["baseline"]["value"]) == pytest.approx(base, rel=1e-12)
    assert (
        cells["baseline"] == f"{variant} {base:.{shown_decimals(row['ci_low'], row['ci_high'])}f}"
    )
    bl = counts[
        (counts["analysis"] == "dependency")
        & (counts["label"] == label)
        & (counts["variant"] != "")
        & (counts["fold"] == "")
    ]
    assert base == pytest.approx((bl["hits"] / bl["n"]).max())  # the best baseline
    assert float(values["gap"]["value"]) == pytest.approx(acc - base, abs=1e-12)
    assert cells["gap"] == estimate_text(acc - base, row["gap_low"], row["gap_high"], signed=True)
    # unreachable arcs of the shown direction, as counted, in the flags
    shown = heads[
        (heads["layer"] == layer) & (heads["head"] == head) & (heads["direction"] == direction)
    ]
    unreachable = int(shown["unreachable"].iloc[0])
    assert (f"{unreachable} unreachable" in cells["flags"]) == (unreachable > 0)
    # McNemar from the stored discordant counts, recomputed with scipy's exact binomial test
    tests = pd.read_parquet(results_dir / store.table_file("head_tests"))
    t = tests[
        (tests["analysis"] == "dependency")
        & (tests["label"] == label)
        & (tests["layer"] == layer)
        & (tests["head"] == head)
    ].iloc[0]
    assert t["direction"] == direction and t["baseline_variant"] == variant
    b, c = int(t["head_only"]), int(t["baseline_only"])
    p = binomtest(b, b + c, 0.5, alternative="greater").pvalue if b + c else 1.0
    assert float(values["p"]["p_value"]) == pytest.approx(p, rel=1e-9)
    assert float(values["p"]["p_holm"]) == pytest.approx(t["p_holm"], rel=1e-12)
    assert cells["p"] == f"{p:.2g} / {t['p_holm']:.2g}"
    assert float(values["p"]["p_holm"]) >= float(values["p"]["p_value"])


@pytest.mark.parametrize("kind", ["ALL", "pronoun"])
def test_coreference_cells_equal_counts(html_tables, counts, report, kind):
    attrs, cells, _, values = rows_of(html_tables, "coreference-top-heads")[kind]
    acc, n = ratio(
        counts,
        analysis="coreference",
        label=kind,
        layer=int(attrs["layer"]),
        head=int(attrs["head"]),
        variant="",
        fold="",
    )
    assert float(values["accuracy"]["value"]) == pytest.approx(acc, rel=1e-12)
    assert int(cells["n"]) == n
    # each baseline's accuracy is in the CSV beside the report (the narrow table shows the best)
    csv = pd.read_csv(report["out_dir"] / "tables" / "coreference_best_heads.csv").set_index(
        "label"
    )
    best = []
    for variant in ("nearest", "head_match", "rules"):
        base, _ = ratio(counts, analysis="coreference", label=kind, variant=variant, fold="")
        assert csv.at[kind, f"baseline:{variant}"] == pytest.approx(base, rel=1e-12)
        best.append((base, variant))
    assert values["baseline"]["variant"] == max(best)[1]
    assert csv.at[kind, "accuracy"] == pytest.approx(acc, rel=1e-12)


def test_unreachable_table_equals_counts(html_tables, counts):
    rows = rows_of(html_tables, "dependency-unreachable")
    assert "ALL" in rows and "iobj" in rows
    for label, (_, cells, _, _) in rows.items():
        for direction in ("dep->head", "head<-dep"):
            sel = counts[
                (counts["analysis"] == "dependency")
                & (counts["label"] == label)
                & (counts["layer"] == 0)
                & (counts["head"] == 0)
                & (counts["direction"] == direction)
                & (counts["fold"] == "")
            ]
            unreachable, n = float(sel["unreachable"].iloc[0]), float(sel["n"].iloc[0])
            assert int(cells[f"unreachable:{direction}"]) == unreachable
            assert float(cells[f"share:{direction}"]) == pytest.approx(
                round(unreachable / n, 4), abs=1e-12
            )
    assert int(rows["ALL"][1]["unreachable:dep->head"]) > 0


def test_surface_and_positional_cells_equal_counts(html_tables, counts):
    for attrs, cells, _, _ in html_tables["surface-per-layer"]:
        layer = int(attrs["layer"])
        for label in ("cls", "sep", "first", "punct", "entropy"):
            sel = counts[
                (counts["analysis"] == "surface")
                & (counts["label"] == label)
                & (counts["layer"] == layer)
                & (counts["fold"] == "")
            ]
            assert float(cells[label]) == pytest.approx(
                round(sel["mass"].sum() / sel["n"].sum(), 4), abs=1e-12
            )
    attrs, cells, _, _ = html_tables["positional-top"][0]
    share, n = ratio(
        counts,
        analysis="positional",
        label="+1",
        layer=int(attrs["layer"]),
        head=int(attrs["head"]),
        fold="",
    )
    assert float(cells["dominant_share"]) == pytest.approx(round(share, 4), abs=1e-12)
    assert float(cells["share:+1"]) == pytest.approx(round(share, 4), abs=1e-12)
    assert cells["positional"] == "yes"


def test_markdown_carries_the_same_numbers(report, html_tables):
    md = report["markdown"].read_text(encoding="utf-8")
    for name in ("dependency-top-heads", "coreference-top-heads", "dependency-unreachable"):
        for _, _, texts, _ in html_tables[name]:
            line = "| " + " | ".join(t.replace("|", "\\|") for t in texts) + " |"
            assert _md_unescape(line) in _md_unescape(md), line
    for fig in report["figures"]:
        assert f"(figures/{fig.name})" in md
        assert fig.read_bytes().startswith(PNG_MAGIC)


def _md_unescape(text):
    return text.replace("\\", "")


# ---------------------------------------------------------------- roles, notes, legend


def test_planted_roles(results_dir, report, html_tables):
    roles = Results.load(results_dir).roles.set_index("name")
    assert roles.loc["0-0", "role"] == "positional" and roles.loc["0-0", "short"] == "+1"
    assert roles.loc["0-1", "role"] == "coreference"
    assert roles.loc["0-2", "role"] == "broad"
    assert roles.loc["1-0", "role"] == "syntactic" and roles.loc["1-0", "short"] == "det"
    assert roles.loc["1-1", "role"] == "sink"
    assert roles.loc["1-2", "role"] == "syntactic" and roles.loc["1-2", "short"] == "nsubj"
    shown = {r[2][0]: r[1] for r in html_tables["roles-per-head"]}
    for name, row in roles.iterrows():
        assert shown[name]["role"] == row["role"] and shown[name]["evidence"] == row["evidence"]
    assert pd.read_csv(report["roles"])["role"].tolist() == roles["role"].tolist()


def test_role_rules_are_printed(results_dir, html):
    rules = Results.load(results_dir).role_rules()
    assert [r.role for r in rules] == ["positional", "syntactic", "coreference", "sink", "broad"]
    parser = TableParser()
    parser.feed(html)
    for rule in rules:
        assert rule.description in parser.items


def test_noted_rows_show_the_note(html_tables):
    attrs, cells, texts, _ = rows_of(html_tables, "dependency-top-heads-small")["iobj"]
    assert cells["head"] == "fewer than 30 trials: no best head"
    assert cells["heldout_head"] == "no held-out selection: fold 1 has no trials"
    assert attrs["note"] == cells["head"] and attrs["heldout-note"] == cells["heldout_head"]
    for col in ("accuracy", "baseline", "gap", "p", "heldout_accuracy", "heldout_gap"):
        assert cells[col] == "—", col
    assert cells["n"] == "3" and "small sample" in cells["flags"]
    assert "folds differ" not in cells["flags"]  # no held-out selection: no folds to disagree
    assert "iobj" not in rows_of(html_tables, "dependency-top-heads")


def test_legend_explains_the_columns(html):
    parser = TableParser()
    parser.feed(html)
    legend = {item.split(":", 1)[0]: item.split(":", 1)[1] for item in parser.items if ":" in item}
    for column, words in (
        ("p_value", "McNemar"),
        ("p_holm", "Holm"),
        ("tied", "share the best accuracy"),
        ("folds_agree", "same head"),
        ("small_sample", "fewer than 30"),
        ("unreachable", "no attention"),
        ("note", "no numbers"),
    ):
        assert column in legend, column
        assert words in legend[column], (column, legend[column])
        assert legend[column].count(". ") == 0, f"{column}: one sentence"


def test_overview_names_the_bos_mode(html):
    assert f"BOS mode: {BOS_MODE}" in html


# ---------------------------------------------------------------- findings first, provenance last


def test_findings_first_provenance_last_in_html_and_markdown(report, html):
    order = re.findall(r'<section id="([^"]+)">', html)
    assert order[0] == "summary" and order[1] == "roles" and order[-1] == "provenance", order
    assert (
        html.index('data-table="key-findings"')
        < html.index('data-table="roles-per-head"')
        < html.index('data-table="dependency-top-heads"')
    )
    before, _, rest = html.partition('<details class="provenance">')
    inside = rest.split("</details>")[0]
    for marker in (PROVENANCE["run_id"], PROVENANCE["inputs"]["treebank"]["sha256"], "batch_size"):
        assert marker not in before and marker not in rest[len(inside) :] and marker in inside, (
            marker
        )
    md = report["markdown"].read_text(encoding="utf-8")
    assert re.findall(r'<a id="([^"]+)"></a>', md) == order  # the twin, in the same order
    md_before, _, md_rest = md.partition("<details>")
    assert (
        PROVENANCE["run_id"] not in md_before
        and PROVENANCE["run_id"] in md_rest.split("</details>")[0]
    )


def test_summary_leads_with_the_planted_roles(results_dir, report, html):
    """The summary's role lines (`role_findings`, which the console prints too): the counts of
    the planted roles (one head each, two syntactic), the syntactic heads a line each with their
    relation and held-out numbers from `head_tests`, strongest first; the same in Markdown."""
    from html import escape

    from headprobe.results.findings import role_findings

    results = Results.load(results_dir)
    found = role_findings(results)
    assert found[0] == (
        "roles of the 6 heads (first rule met): 1 positional, 2 syntactic, 1 coreference, "
        "1 sink, 1 broad; 0 none",
        [],
    )
    lines = dict(found[1:])
    syntactic = next(v for k, v in lines.items() if k.startswith("syntactic ("))
    tests = results.head_tests.set_index(["label", "layer", "head"])
    planted = [tests.loc[("det", 1, 0)], tests.loc[("nsubj", 1, 2)]]
    planted.sort(key=lambda t: -t["heldout_gap"])  # strongest first
    assert syntactic == [
        f"{t.name[1]}-{t.name[2]}  {t.name[0]:<10} {t['heldout_accuracy']:.4f} vs "
        f"{t['heldout_baseline']:.4f}, gap {t['heldout_gap']:+.3f} "
        f"[{t['heldout_gap_low']:+.3f}, {t['heldout_gap_high']:+.3f}]"
        for t in planted
    ]
    for t in planted:  # the planted heads clear the rule's margin, interval and all
        assert t["heldout_gap_low"] > 0.1
    assert any(k.startswith("positional (offset, share of argmaxes): 0-0 +1 0.9") for k in lines)
    assert any(k.startswith("sink (") and k.endswith(": 1-1 " + k.split()[-1]) for k in lines)
    summary = html.split('<section id="roles">')[0]
    md = report["markdown"].read_text(encoding="utf-8").split('<a id="roles">')[0]
    for line, heads in found:
        assert escape(line, quote=False) in summary, line
        assert _md_unescape(line) in _md_unescape(md), line
        for head in heads:
            assert f"<li>{escape(head, quote=False)}</li>" in summary, head
            assert _md_unescape(head) in _md_unescape(md), head


def test_key_findings_are_the_held_out_rows(html_tables, results_dir):
    best = pd.read_parquet(results_dir / "best_heads.parquet")
    held = best[(best["selection"] == "held-out") & (best["fold"] == "")].set_index(
        ["analysis", "label"]
    )
    ins = best[(best["selection"] == "in-sample") & (best["fold"] == "")].set_index(
        ["analysis", "label"]
    )
    shown = html_tables["key-findings"]
    for analysis in ("dependency", "coreference"):
        rows = [r for r in shown if r[0]["analysis"] == analysis]
        ok = [
            label
            for (a, label), r in held.iterrows()
            if a == analysis and not r["note"] and not ins.loc[(a, label), "small_sample"]
        ]
        expected = ["ALL"] + sorted(
            (x for x in ok if x != "ALL"),
            key=lambda x: (-held.loc[(analysis, x), "gap"], -held.loc[(analysis, x), "n"]),
        )[:5]
        assert [r[0]["label"] for r in rows] == expected
        for attrs, cells, _, values in rows:
            h = held.loc[(analysis, attrs["label"])]
            assert cells["head"] == " ".join(x for x in (h["heads"], h["direction"]) if x)
            assert float(values["accuracy"]["value"]) == pytest.approx(
                h["hits"] / h["n"], rel=1e-12
            )
            assert cells["accuracy"] == estimate_text(h["accuracy"], h["ci_low"], h["ci_high"])
            assert cells["gap"] == estimate_text(h["gap"], h["gap_low"], h["gap_high"], signed=True)


def test_caveats_name_small_samples_and_skipped_input(html):
    parser = TableParser()
    parser.feed(html)
    assert any(
        i.startswith("dependency: 1 label(s) with fewer than 30 trials") and "iobj (3)" in i
        for i in parser.items
    ), parser.items
    assert "Skipped (never silently): sentences too long 1." in parser.items


def test_repeated_surface_columns_are_shown_once(tmp_path):
    results = make_results(seed=3, examples=False, first_is_cls=True)  # an encoder: first = [CLS]
    paths = build_report(results, tmp_path / "enc")
    parser = TableParser()
    parser.feed(paths["html"].read_text(encoding="utf-8"))
    for name in ("surface-per-layer", "surface-per-head"):
        cols = set(parser.tables[name][0][1])
        assert "cls" in cols and "first" not in cols and "sep" in cols, cols
    assert "CLS/BOS = first position" in paths["html"].read_text(encoding="utf-8")
    per_layer = results.mass_per_layer("surface")
    for attrs, cells, _, _ in parser.tables["surface-per-layer"]:
        row = per_layer[per_layer["layer"] == int(attrs["layer"])].iloc[0]
        assert float(cells["cls"]) == pytest.approx(round(row["first"], 4), abs=1e-12)


def test_default_figures_are_png_only(report):
    assert report["figures"] and report["vector_figures"] == []
    assert {p.suffix for p in report["figures_dir"].iterdir()} == {".png"}
    assert sorted(report["figures_dir"].iterdir()) == sorted(report["figures"])


def test_every_figure_in_three_formats_with_the_same_bytes_twice(report, results_dir, tmp_path):
    import xml.etree.ElementTree as ET

    outs = [tmp_path / "first", tmp_path / "second"]
    for out in outs:
        cmd = ["report", str(results_dir), "--out", str(out), "--figures", "png,svg,pdf"]
        assert cli_main(cmd) == 0
    names = sorted(p.name for p in (outs[0] / "figures").iterdir())
    stems = sorted(p.stem for p in report["figures"])
    assert names == sorted(f"{stem}.{ext}" for stem in stems for ext in ("pdf", "png", "svg"))
    for name in names:  # the same figure, the same bytes, run to run
        first, second = (out / "figures" / name for out in outs)
        assert first.read_bytes() == second.read_bytes(), name
    for stem in stems:
        svg, pdf = (outs[0] / "figures" / f"{stem}.{ext}" for ext in ("svg", "pdf"))
        assert ET.parse(svg).getroot().tag.endswith("svg")
        assert pdf.read_bytes().startswith(b"%PDF") and b"/FontFile2" in pdf.read_bytes()
    for stem in stems:  # the PNG of the default report is the same too
        png = (outs[0] / "figures" / f"{stem}.png").read_bytes()
        assert png == (report["figures_dir"] / f"{stem}.png").read_bytes(), stem


def test_vector_figures_added_to_an_existing_report(report, results_dir, tmp_path):
    out = tmp_path / "rep"
    assert cli_main(["report", str(results_dir), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert cli_main(["report", str(results_dir), "--out", str(out), "--figures", "svg,pdf"]) == 0
    after = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {k: after[k] for k in before} == before  # pages, tables and PNG untouched
    stems = sorted(p.stem for p in report["figures"])
    assert sorted(set(after) - set(before)) == sorted(
        f"{stem}.{ext}" for stem in stems for ext in ("pdf", "svg")
    )
    only = tmp_path / "only"
    assert cli_main(["report", str(results_dir), "--out", str(only), "--figures-only"]) == 0
    assert not (only / "report.html").exists() and not (only / "report.md").exists()
    assert sorted(p.name for p in (only / "figures").iterdir()) == [f"{s}.png" for s in stems]


def test_bad_figure_format_is_one_line(results_dir, tmp_path, capsys):
    out = tmp_path / "bad"
    assert cli_main(["report", str(results_dir), "--out", str(out), "--figures", "png,gif"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("headprobe: error: --figures: gif") and "\n" not in err
    assert not out.exists()


def test_html_is_self_contained(report, html):
    # the only scripts: the head explorer's data and its inline module (none with a src)
    scripts = re.findall(r"<script[^>]*>", html)
    assert scripts == [
        '<script type="application/json" id="head-explorer-data">',
        '<script type="module">',
    ]
    assert "<link" not in html
    for marker in ('src="http', "src='http", 'href="http', "url(http", "@import"):
        assert marker not in html
    assert html.count('src="data:image/png;base64,') == len(report["figures"])


# ---------------------------------------------------------------- sections from the registry


class ToyScorer(CountScorer):
    """A selection analysis without a report section of its own (for the default view)."""

    analysis = "toy"
    variants = ("always",)


def test_default_section_for_an_analysis_without_one(tmp_path):
    registry.register(
        Analysis(name="toy", scorer=ToyScorer, selection=True, default=False, report=None)
    )
    try:
        rng = np.random.default_rng(5)
        tally = new_tally("toy", 2, 3)
        p = np.array([[0.2, 0.9, 0.3], [0.1, 0.4, 0.2]])[..., None]  # [layer, head, 1]
        for u in range(40):
            labels = ["a"] * 3 + ["b"] * 2
            hits = (rng.random((len(labels), 2, 3, 1)) < p).astype(np.float64)
            add_items(
                tally,
                f"t{u:02d}",
                labels,
                hits,
                (rng.random((len(labels), 1)) < 0.5).astype(np.float64),
            )
        base = make_results(seed=2, examples=False)
        results = Results({**base.tallies, "toy": tally}, base.summary)
        paths = build_report(results, tmp_path / "out")
    finally:
        registry.unregister("toy")
    page = paths["html"].read_text(encoding="utf-8")
    assert '<section id="toy">' in page and "declares no report section" in page
    assert (paths["figures_dir"] / "toy_heads.png").is_file()
    parser = TableParser()
    parser.feed(page)
    rows = rows_of(parser.tables, "toy-top-heads")
    assert rows["ALL"][1]["head"] == "0-1" and set(rows) == {"ALL", "a", "b"}
    scores = results.head_scores("toy", "ALL")
    best = scores.loc[scores["accuracy"].idxmax()]
    assert float(rows["ALL"][3]["accuracy"]["value"]) == pytest.approx(
        best["hits"] / best["n"], rel=1e-12
    )


def test_without_examples_and_cli(tmp_path):
    results = make_results_dir(tmp_path / "res", seed=1, examples=False)
    out = tmp_path / "out"
    assert main_report([str(results), "--out", str(out)]) == 0
    page = (out / store.REPORT_HTML).read_text(encoding="utf-8")
    assert "No examples in the results" in page
    assert 'data-table="dependency-unreachable"' not in page  # an encoder: nothing unreachable
    assert "BOS mode" not in page
    assert (out / store.REPORT_MARKDOWN).exists() and list(
        (out / store.REPORT_FIGURES).glob("*.png")
    )
    assert main_report([str(tmp_path / "missing")]) == 2


def test_cli_report_on_unreadable_directories(tmp_path, capsys, results_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not results")
    corrupt_json = tmp_path / "corrupt_json"
    corrupt_json.mkdir()
    (corrupt_json / store.SUMMARY).write_text("{not json")
    corrupt_table = tmp_path / "corrupt_table"
    shutil.copytree(results_dir, corrupt_table, ignore=shutil.ignore_patterns(store.REPORT_DIR))
    (corrupt_table / store.table_file("best_heads")).write_bytes(b"garbage")
    for directory in (tmp_path / "missing", empty, foreign, corrupt_json, corrupt_table):
        assert cli_main(["report", str(directory)]) == 2, directory
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert str(directory) in err


# ---------------------------------------------------------------- Chromium


def chromium_binary():
    for cand in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if cand and Path(cand).exists():
            return cand
    return None


class DevTools:
    """Just enough of a WebSocket client (RFC 6455, text frames) for the DevTools protocol."""

    def __init__(self, ws_url: str, timeout: float = 60.0):
        u = urllib.parse.urlparse(ws_url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {u.path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
                "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("DevTools closed the connection during the handshake")
            head += chunk
        status, _, self._buf = head.partition(b"\r\n\r\n")
        if b" 101 " not in status.split(b"\r\n")[0]:
            raise ConnectionError(status.decode(errors="replace"))
        self.events: list[dict] = []
        self._id = 0

    def _recv_exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self._buf)))
            if not chunk:
                raise ConnectionError("DevTools connection closed")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def _send(self, opcode: int, payload: bytes):
        mask = os.urandom(4)
        n = len(payload)
        header = bytes([0x80 | opcode])
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 65536:
            header += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def _recv_message(self) -> dict:
        data = b""
        while True:
            b0, b1 = self._recv_exact(2)
            fin, opcode, n = b0 & 0x80, b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._recv_exact(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._recv_exact(8))[0]
            mask = self._recv_exact(4) if b1 & 0x80 else None
            payload = self._recv_exact(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x9:  # ping
                self._send(0xA, payload)
                continue
            if opcode == 0x8:
                raise ConnectionError("DevTools sent close")
            if opcode in (0x1, 0x2, 0x0):
                data += payload
                if fin:
                    return json.loads(data.decode())

    def call(self, method: str, **params) -> dict:
        self._id += 1
        self._send(0x1, json.dumps({"id": self._id, "method": method, "params": params}).encode())
        while True:
            msg = self._recv_message()
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_event(self, method: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        for msg in self.events:
            if msg.get("method") == method:
                return msg
        while time.monotonic() < deadline:
            msg = self._recv_message()
            self.events.append(msg)
            if msg.get("method") == method:
                return msg
        raise TimeoutError(method)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def console_errors(events: list[dict]) -> list[str]:
    errors = []
    for ev in events:
        method, params = ev.get("method"), ev.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append(
                " ".join(
                    str(a.get("value", a.get("description", ""))) for a in params.get("args", [])
                )
            )
        elif method == "Runtime.exceptionThrown":
            errors.append(params.get("exceptionDetails", {}).get("text", "exception"))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            errors.append(f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}")
    return errors


# Layout, measured in the page: the page itself must not scroll sideways, and no rendered box may be
# wider than its own box allows (scrollWidth > clientWidth: content cut or scrolling) nor reach out
# of its parent's box. Collapsed <details> are opened first, so what they hold is measured too.
LAYOUT_JS = """(() => {
  const bad = [];
  const page = document.documentElement;
  if (page.scrollWidth > window.innerWidth) bad.push(`page: scrollWidth ${page.scrollWidth} > ${window.innerWidth}`);
  const name = e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') +
                    (e.dataset && e.dataset.table ? '[' + e.dataset.table + ']' : '');
  for (const e of document.querySelectorAll('body *')) {
    const cs = getComputedStyle(e);
    if (cs.display === 'inline' || cs.display === 'none' || e.clientWidth === 0) continue;
    if (e.scrollWidth > e.clientWidth + 1)
      bad.push(`${name(e)}: scrollWidth ${e.scrollWidth} > clientWidth ${e.clientWidth}`);
    const p = e.parentElement;
    if (p && p !== document.body && !['TR', 'TBODY', 'THEAD', 'TABLE'].includes(p.tagName)) {
      const r = e.getBoundingClientRect(), q = p.getBoundingClientRect();
      if (r.right > q.right + 1 || r.left < q.left - 1)
        bad.push(`${name(e)} in ${name(p)}: [${Math.round(r.left)}, ${Math.round(r.right)}] outside `
                 + `[${Math.round(q.left)}, ${Math.round(q.right)}]`);
    }
  }
  return JSON.stringify(bad);
})()"""

# Provenance (run id, SHA-256 of the inputs, options) may appear only inside a collapsed <details>.
HIDDEN_JS = """((markers) => {
  const out = [];
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    const hit = markers.find(m => n.textContent.includes(m));
    if (!hit) continue;
    const box = n.parentElement.closest('details');
    const shown = n.parentElement.checkVisibility();   // false inside a closed <details>
    if (!box || box.open || shown) out.push(hit + ' in <' + n.parentElement.tagName.toLowerCase() + '>');
  }
  return JSON.stringify(out);
})(MARKERS)"""


def check_page_in_chromium(
    html_path: Path,
    screenshot: Path,
    width: int = 1280,
    max_height: int = 8000,
    hidden_markers=(),
    print_width: int | None = None,
    actions=None,
) -> dict:
    """Open `html_path` in headless Chromium; return {"images": [...], "errors": [...],
    "visible_markers": [...], "layout": [...], "print_layout": [...]} and write a full-page
    screenshot (at most `max_height` pixels tall). `visible_markers`: those of `hidden_markers`
    shown outside a collapsed <details>; `layout`: boxes wider than they may be at `width`
    (details opened); `print_layout`: the same in print media at `print_width`; `requests`:
    every URL the page asked for (Network domain); `actions`: what `actions(tools, evaluate)`
    returned, run after the layout is measured (clicks, keys: DevTools `Input` events)."""
    binary = chromium_binary()
    profile = Path(screenshot).parent / ".chromium-profile"
    shutil.rmtree(profile, ignore_errors=True)
    profile.mkdir(parents=True)
    proc = subprocess.Popen(
        [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-default-apps",
            "--disable-extensions",
            "--no-first-run",
            "--no-default-browser-check",
            "--mute-audio",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--window-size={width},900",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    tools = None
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start (exit {proc.poll()})")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        targets = json.loads(opener.open(f"http://127.0.0.1:{port}/json/list", timeout=30).read())
        page = next(t for t in targets if t.get("type") == "page")
        tools = DevTools(page["webSocketDebuggerUrl"])
        for domain in ("Page", "Runtime", "Log", "Network"):
            tools.call(f"{domain}.enable")
        tools.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=900,
            deviceScaleFactor=1,
            mobile=False,
        )
        tools.call("Page.navigate", url=Path(html_path).resolve().as_uri())
        tools.wait_event("Page.loadEventFired", timeout=60)
        result = tools.call(
            "Runtime.evaluate",
            returnByValue=True,
            awaitPromise=True,
            expression="Promise.all([...document.images].map(i => i.decode().catch(() => 0)))"
            ".then(() => JSON.stringify({images: [...document.images].map(i => ("
            "{alt: i.alt, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight"
            "})), height: document.documentElement.scrollHeight,"
            " external: [...document.querySelectorAll('[src],[href]')]"
            ".map(e => e.getAttribute('src') || e.getAttribute('href'))"
            ".filter(u => !u.startsWith('data:') && !u.startsWith('#'))}))",
        )
        info = json.loads(result["result"]["value"])
        height = min(int(info["height"]), max_height)
        shot = tools.call(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
        )
        Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
        evaluate = lambda js: json.loads(
            tools.call("Runtime.evaluate", expression=js, returnByValue=True)["result"]["value"]
        )
        info["visible_markers"] = evaluate(
            HIDDEN_JS.replace("MARKERS", json.dumps(list(hidden_markers)))
        )
        evaluate(
            "JSON.stringify([...document.querySelectorAll('details')].map(d => d.open = true))"
        )
        info["layout"] = evaluate(LAYOUT_JS)
        if actions is not None:
            info["actions"] = actions(tools, evaluate)
        if print_width:
            tools.call("Emulation.setEmulatedMedia", media="print")
            tools.call(
                "Emulation.setDeviceMetricsOverride",
                width=print_width,
                height=900,
                deviceScaleFactor=1,
                mobile=False,
            )
            info["print_layout"] = evaluate(LAYOUT_JS)
        time.sleep(0.2)  # let late console events arrive
        tools.sock.settimeout(0.5)
        try:
            while True:
                tools.events.append(tools._recv_message())
        except TimeoutError:
            pass
        info["errors"] = console_errors(tools.events)
        info["requests"] = [
            e["params"]["request"]["url"]
            for e in tools.events
            if e.get("method") == "Network.requestWillBeSent"
        ]
        try:
            tools.sock.settimeout(10)
            tools.call("Browser.close")
        except (ConnectionError, OSError, RuntimeError):
            pass
        return info
    finally:
        if tools is not None:
            tools.close()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.skipif(
    chromium_binary() is None, reason="chromium not installed (apt-get install chromium)"
)
def test_report_renders_in_chromium(report):
    screenshot = report["out_dir"] / "report_screenshot.png"
    markers = [PROVENANCE["run_id"], PROVENANCE["inputs"]["treebank"]["sha256"], "batch_size"]
    info = check_page_in_chromium(
        report["html"], screenshot, hidden_markers=markers, print_width=PRINT_WIDTH
    )
    assert not info["visible_markers"], info["visible_markers"]
    assert not info["layout"], info["layout"]  # nothing wider than its box at 1280 px
    assert not info["print_layout"], info["print_layout"]  # nor on an A4 page
    assert info["images"], "no <img> in the page"
    assert len(info["images"]) == len(report["figures"])
    broken = [i for i in info["images"] if not (i["complete"] and i["w"] > 0 and i["h"] > 0)]
    assert not broken, broken
    assert not info["external"], info["external"]
    assert not info["errors"], info["errors"]
    data = screenshot.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    # keep the page and its screenshot where CI (and a person) can look at them
    artifacts = Path(
        os.environ.get(
            "HEADPROBE_ARTIFACTS", Path(__file__).resolve().parents[1] / "results" / "ci"
        )
    )
    artifacts.mkdir(parents=True, exist_ok=True)
    shutil.copy(screenshot, artifacts / "report_screenshot.png")
    shutil.copy(report["html"], artifacts / store.REPORT_HTML)


def test_heatmap_cells_annotated_up_to_16_by_16():
    from headprobe.report.drawing import new_figure
    from headprobe.report.heatmaps import layer_head_heatmap

    for shape, texts in (((16, 16), 256), ((17, 16), 0), ((16, 17), 0)):
        fig = new_figure(4, 4)
        ax = fig.subplots()
        mat = np.arange(shape[0] * shape[1], dtype=float).reshape(shape) / 1000  # [layer, head]
        layer_head_heatmap(ax, mat, "t", cbar_label="value")
        assert len(ax.texts) == texts, shape
        assert len(fig.axes) == 2, shape  # the map and its colour bar


def test_worker_processes_draw_the_same_bytes(tmp_path):
    """Planned figures drawn by two worker processes equal those drawn here."""
    from headprobe.report.drawing import write_drawings
    from headprobe.report.heatmaps import heatmap_grid_figure

    mats = [np.linspace(0, 1, 12).reshape(3, 4) * k for k in (1, 0.5, 0.25)]  # [layer, head]
    items = [(f"m{k}", m) for k, m in enumerate(mats)]
    plans = [heatmap_grid_figure(items[: k + 1], f"grid {k}") for k in range(3)]
    (tmp_path / "pool").mkdir()
    pooled = write_drawings(
        [(d, tmp_path / "pool" / f"g{k}") for k, d in enumerate(plans)], ("png", "svg"), workers=2
    )
    assert [[p.name for p in paths] for paths in pooled] == [
        [f"g{k}.png", f"g{k}.svg"] for k in range(3)
    ]
    for k, paths in enumerate(pooled):
        here = heatmap_grid_figure(items[: k + 1], f"grid {k}")
        assert plans[k].png == here.png == paths[0].read_bytes()
        assert paths[1].read_bytes() == here.svg


def test_best_head_is_the_first_pooled_row_a_filter_finds():
    """`Results.best_head` (indexed once per best-heads table) gives, for every measure, analysis,
    label and selection, the first pooled row of the table filtered by them, None where there
    is none, and indexes a replaced table anew."""
    from fixtures_results import make_results

    from headprobe.results.query import Results

    weights, norms = make_results(seed=3, examples=False), make_results(seed=4, examples=False)
    tallies = dict(weights.tallies)
    for key, tally in norms.tallies.items():
        tally.measure = "norms"
        tallies[f"{key}@norms"] = tally
    results = Results(tallies, weights.summary)
    table = results.best_heads
    keys = ["measure", "analysis", "label", "selection"]
    assert set(table["measure"]) == {"weights", "norms"}
    checked = 0
    for (measure, analysis, label, selection), group in table.groupby(keys, observed=True):
        got = results.best_head(analysis, label, selection, measure)
        pooled = group[group["fold"] == ""]
        if not len(pooled):
            assert got is None
            continue
        pd.testing.assert_series_equal(got, pooled.iloc[0], check_names=False)
        checked += 1
    assert checked > 10
    first = results.best_head("dependency", "ALL")
    assert (
        first["accuracy"] == results.best_head("dependency", "ALL", measure="weights")["accuracy"]
    )
    assert first["accuracy"] != results.best_head("dependency", "ALL", measure="norms")["accuracy"]
    assert results.best_head("dependency", "no such label") is None
    results._tables["best_heads"] = table.assign(accuracy=table["accuracy"] + 1.0)
    assert results.best_head("dependency", "ALL")["accuracy"] == first["accuracy"] + 1.0
