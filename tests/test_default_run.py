"""`headprobe run` with no options (what `make run` runs; slow: the bundled MiniLM on the bundled
UD English EWT dev and the 14 openly licensed GUM dev documents), run once per session
(`conftest.default_run`):

- the console leads with what was found: the role counts, then at least 5 syntactic heads, each
  with its relation, held-out accuracy against the baseline and gap with its interval, as
  `head_tests` holds them; the best-heads table is left to --verbose; the report's path last;
- the report's summary says the same, line for line;
- the coreference table reports in-sample and held-out on the bundled sample (978 mentions).

The numbers themselves are pinned where README.md states them (tests/test_readme_numbers.py).
"""

from __future__ import annotations

import re

import pytest

from headprobe.results.query import Results

pytestmark = pytest.mark.slow

SYNTACTIC = re.compile(
    r"  (?P<layer>\d+)-(?P<head>\d+)\s+(?P<label>\S+)\s+(?P<acc>\d\.\d{4}) vs (?P<base>\d\.\d{4}), "
    r"gap (?P<gap>[+-]\d\.\d{3}) \[(?P<low>[+-]\d\.\d{3}), (?P<high>[+-]\d\.\d{3})\]"
    r"(?:; also (?P<also>.+))?"
)
BUNDLED_MENTIONS = 978  # scored mentions of the 14 bundled GUM dev documents


@pytest.fixture(scope="module")
def results(default_run):
    return Results.load(default_run.out)


@pytest.fixture(scope="module")
def console(default_run) -> list[str]:
    return default_run.console.strip().splitlines()


def role_counts(line: str) -> dict[str, int]:
    """'roles of the 72 heads (first rule met): 11 syntactic, 14 sink; 47 none; no broad head'
    -> {'syntactic': 11, 'sink': 14, 'none': 47}."""
    counted = line.split(": ", 1)[1]
    return {role: int(k) for k, role in re.findall(r"(\d+) ([a-z][a-z ()-]*?)(?=[,;]|$)", counted)}


def test_console_leads_with_the_roles_and_their_evidence(console, results):
    roles = results.roles.set_index("name")
    assert console[0].startswith(f"roles of the {len(roles)} heads (first rule met): ")
    counts = role_counts(console[0])
    assert counts == {k: int(v) for k, v in roles["role"].value_counts().items()}
    assert console[1].startswith("syntactic (relation, held-out accuracy vs baseline, gap [95% CI]")
    lines = [line for line in console[2:] if line.startswith("  ")]
    assert console[2 : 2 + len(lines)] == lines  # the heads follow their heading
    assert len(lines) == counts["syntactic"] >= 5
    tests = results.head_tests
    tests = tests[tests["analysis"] == "dependency"].set_index(["label", "layer", "head"])
    gaps = []
    for line in lines:
        m = SYNTACTIC.fullmatch(line)
        assert m, line
        name, label = f"{m['layer']}-{m['head']}", m["label"]
        role = roles.loc[name]
        assert role["role"] == "syntactic"
        assert role["detail"].split(", ") == [label] + (m["also"].split(", ") if m["also"] else [])
        t = tests.loc[(label, int(m["layer"]), int(m["head"]))]
        assert float(m["acc"]) == round(t["heldout_accuracy"], 4)
        assert float(m["base"]) == round(t["heldout_baseline"], 4)
        for key, column in (("gap", ""), ("low", "_low"), ("high", "_high")):
            assert float(m[key]) == round(t[f"heldout_gap{column}"], 3), (line, key)
        assert float(m["low"]) <= float(m["gap"]) <= float(m["high"])
        gaps.append(t["heldout_gap"])
    assert gaps == sorted(gaps, reverse=True)  # strongest first
    others = console[2 + len(lines) :]
    for role in counts:
        if role not in ("syntactic", "none"):
            assert any(line.startswith(f"{role} (") for line in others), role


def test_console_keeps_the_best_heads_table_for_verbose(default_run, console):
    assert "best heads" not in default_run.console and "in-sample" not in default_run.console
    report = console[-1].split()
    assert report[0] == "report:" and report[1].endswith("report.html")
    assert report[2].endswith("report.md")
    assert (default_run.out / "report" / "report.html").is_file()


def test_report_summary_says_what_the_console_says(default_run, console):
    md = (default_run.out / "report" / "report.md").read_text(encoding="utf-8")
    summary = md.split('<a id="summary">')[1].split('<a id="roles">')[0].replace("\\", "")
    found = [line for line in console if line.startswith("roles of") or line.startswith("  ")]
    found += [line for line in console if re.match(r"[a-z][a-z ()-]* \(", line)]
    assert len(found) >= 7
    for line in found:
        assert line.strip() in summary, line


def test_coreference_table_in_sample_and_held_out_on_the_bundled_sample(default_run, results):
    assert results.summary["coreference_corpus"]["documents"] == 14
    wide = results.best_heads_wide("coreference").set_index("label")
    assert wide.loc["ALL", "n"] == BUNDLED_MENTIONS == wide.loc["ALL", "heldout_n"]
    md = (default_run.out / "report" / "report.md").read_text(encoding="utf-8")
    section = md.split('<a id="coreference">')[1].split("<a id=")[0]
    header = next(line for line in section.splitlines() if line.startswith("| Label |"))
    assert "| Head |" in header and "| Held-out head |" in header
    rows = {
        cells[0]: cells
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith("| Label")
        for cells in [[c.strip().replace("\\", "") for c in line.strip("|").split(" | ")]]
    }
    columns = [c.strip() for c in header.strip("|").split(" | ")]
    for label in ("ALL", "pronoun", "proper", "nominal"):
        row = dict(zip(columns, rows[label]))
        assert int(row["n"].replace(",", "")) == wide.loc[label, "n"]
        assert row["Head"] == wide.loc[label, "heads"]
        assert row["Held-out head"] == wide.loc[label, "heldout_heads"]
