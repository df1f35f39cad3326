"""docs/METHODS.md is the project's one reference (METHODS §n): every citation points into it,
every registered analysis is defined in it, the installed package carries it, and reports and
the README cite the project the same way.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from headprobe.report import methods

ROOT = Path(__file__).resolve().parents[1]
CITING = ("headprobe", "README.md", "docs", "notebooks", "analyses")  # what users read
TEXT = (".py", ".md", ".ipynb", ".txt", ".cff", ".toml", ".cfg", ".html")
METHODS_MD = ROOT / "docs" / "METHODS.md"
# "METHODS §6", "METHODS §1-§2", "METHODS §5's", "METHODS\n§5" (a docstring's line break)
CITATION = re.compile(r"METHODS\s+§(\d+)(?:\s*-\s*§(\d+))?")
LINK = re.compile(r"METHODS\.md#([A-Za-z0-9_-]+)")
# an issue number: "issue 18", "issues 12 and 13", "Issue #7", "(#18)"
ISSUE = re.compile(r"\bissues?\s*#?\s*\d+|\(#\d+\)", re.IGNORECASE)


def files(*roots: str, suffixes=TEXT) -> list[Path]:
    out = []
    for name in roots:
        path = ROOT / name
        found = [path] if path.is_file() else sorted(path.rglob("*"))
        out += [p for p in found if p.is_file() and p.suffix in suffixes]
    return out


def test_no_reference_outside_the_repository_or_to_an_issue():
    bad = []
    for path in files(*CITING):
        for k, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "SPEC" in line or ISSUE.search(line):
                bad.append(f"{path.relative_to(ROOT)}:{k}: {line.strip()[:100]}")
    assert not bad, "\n".join(bad)


def test_the_reference_checks_catch_what_they_should():
    assert ISSUE.search("Does the head matter? (issue 18)") and ISSUE.search("see #3 (#12)")
    assert not ISSUE.search("tissue 3") and not ISSUE.search("no issues found")
    assert [m.groups() for m in CITATION.finditer("METHODS §1-§2 and METHODS\n    §5's")] == [
        ("1", "2"),
        ("5", None),
    ]


def test_every_methods_citation_has_its_anchor():
    anchors = methods.anchors(METHODS_MD.read_text(encoding="utf-8"))
    missing, seen = [], 0
    for path in files(*CITING, "tests", "Makefile", "CITATION.cff"):
        text = path.read_text(encoding="utf-8")
        for m in CITATION.finditer(text):
            seen += 1
            first, last = int(m.group(1)), int(m.group(2) or m.group(1))
            missing += [
                f"{path.relative_to(ROOT)}: {m.group(0)!r} (no s{n})"
                for n in range(first, last + 1)
                if f"s{n}" not in anchors
            ]
        for m in LINK.finditer(text):
            if m.group(1) not in anchors:
                missing.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
    assert seen > 100  # the checker reads the citations (there are many)
    assert not missing, "\n".join(missing)


def test_in_document_links_resolve():
    text = METHODS_MD.read_text(encoding="utf-8")
    anchors = methods.anchors(text)
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert links and not [a for a in links if a not in anchors]


def test_docs_copy_is_the_package_source():
    """docs/METHODS.md is byte-identical to headprobe/report/methods.md (the wheel's copy);
    `python -m headprobe.report.methods` rewrites it."""
    assert METHODS_MD.read_bytes() == (ROOT / "headprobe" / "report" / "methods.md").read_bytes()
    assert methods.text() == METHODS_MD.read_text(encoding="utf-8")
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'"headprobe\.report" = \["methods\.md"\]', pyproject)  # package data


def test_sections_are_numbered_in_order_with_their_anchors():
    parts = methods.sections()
    assert list(parts) == [f"s{n}" for n in range(1, len(parts) + 1)]
    assert [p.number for p in parts.values()] == [str(n) for n in range(1, len(parts) + 1)]
    # sections 1-9 keep the numbering the code cites
    topics = ["word-level", "dependency", "coreference", "positional", "statistics", "roles"]
    topics += ["norm", "ablation", "writes"]
    for n, topic in enumerate(topics, 1):
        assert topic in parts[f"s{n}"].title.lower(), (n, parts[f"s{n}"].title)
    for anchor in ("s5-holm", "s5-bootstrap", "s5-gap", "s5-folds", "s8-no-lm-head"):
        assert anchor in methods.anchors()


def registered_names() -> list[str]:
    """The registry's analyses in a fresh interpreter (no test's own analysis registered)."""
    code = (
        "import json; from headprobe.scoring import registry; print(json.dumps(registry.names()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_registered_analysis_is_defined():
    names = registered_names()
    assert {"dependency", "coreference", "induction", "ablation"} <= set(names)
    anchors = methods.anchors()
    missing = [name for name in names if f"analysis-{name}" not in anchors]
    assert not missing, f"analyses without a definition in docs/METHODS.md: {missing}"
    # defined ahead of their registration (METHODS §9)
    for name in ("head_output", "logit_attribution", "ov_copying"):
        assert methods.section_of(name) == "s9"


def test_every_test_the_methods_name_exists():
    named = re.findall(r"(tests/[a-z_]+\.py)::([a-z0-9_]+)", methods.text())
    assert len(named) > 20
    missing = []
    for path, name in named:
        source = (ROOT / path).read_text(encoding="utf-8") if (ROOT / path).is_file() else ""
        if not re.search(rf"^def {name}\(", source, re.MULTILINE):
            missing.append(f"{path}::{name}")
    assert not missing, missing


class FakeResults:
    def __init__(self, analyses, measures=("weights",), control=None):
        self.analyses, self.measures, self.control = list(analyses), list(measures), control
        self.summary = {"conventions": {"name": "headprobe"}} if "dependency" in analyses else {}


@pytest.mark.parametrize(
    "analyses, measures, control, expected",
    [
        (["dependency"], ["weights"], None, ["s1", "s2", "s5", "s6", "s14", "s15"]),
        (
            ["surface", "induction"],
            ["weights", "norms"],
            None,
            ["s1", "s4", "s5", "s6", "s7", "s10", "s15"],
        ),
        (["coreference", "my_own"], ["weights"], object(), ["s1", "s3", "s5", "s6", "s8", "s15"]),
    ],
)
def test_the_appendix_holds_the_sections_behind_the_tables(analyses, measures, control, expected):
    keys = methods.used_by(FakeResults(analyses, measures, control))
    assert keys == expected
    details = methods.appendix(FakeResults(analyses, measures, control))
    titles = [b.text for b in details.blocks if getattr(b, "note", False)]
    assert titles == [f"METHODS §{k[1:]}. {methods.sections()[k].title}" for k in keys]


def test_a_users_own_pattern_gets_the_token_patterns_section():
    import numpy as np

    from headprobe.extend import pattern_analysis
    from headprobe.scoring import registry

    def two_back(ids, token):
        # ids: [T]; D: [T, T] key j = query i - 2
        return np.eye(len(ids), k=-2, dtype=bool) & token[:, None] & token[None, :]

    pattern_analysis("two_back_methods_test", two_back)
    try:
        keys = methods.used_by(FakeResults(["two_back_methods_test"]))
    finally:
        registry.unregister("two_back_methods_test")
    assert keys == ["s1", "s5", "s6", "s10", "s15"]


def test_how_to_cite_is_the_same_in_readme_citation_file_and_reports():
    from headprobe import __version__

    text = methods.how_to_cite()
    assert __version__ in text and methods.TITLE in text
    assert text in (ROOT / "README.md").read_text(encoding="utf-8")
    cff = (ROOT / "CITATION.cff").read_text(encoding="utf-8")
    assert re.search(rf'^title: "{re.escape(methods.TITLE)}"$', cff, re.MULTILINE)
    assert re.search(rf"^version: {re.escape(__version__)}$", cff, re.MULTILINE)
    assert methods.citation_block().text == f"How to cite: {text}"


def test_the_run_records_its_software():
    from headprobe.results import software

    record = software.record()
    assert set(record) >= {"headprobe", "transformers", "torch", "python"}
    import torch
    import transformers

    assert (
        record["torch"] == torch.__version__ and record["transformers"] == transformers.__version__
    )
    if (ROOT / ".git").exists():
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        assert record["commit"].removesuffix("-dirty") == head


ROOMS = ("core", "inputs", "model", "scoring", "stats", "results", "report", "studies")
ROOMS += ("api", "session", "passes", "cli", "config", "core_options", "checks")
# a code reference: `room.module.name`, `headprobe.room...`, optionally called: `x.y(...)`
CODE_REF = re.compile(r"`((?:headprobe\.)?(?:" + "|".join(ROOMS) + r")(?:\.[A-Za-z_]\w*)+)")


def resolve(reference: str):
    """The object a dotted reference into the package names (ImportError / AttributeError if none)."""
    import importlib

    parts = reference.removeprefix("headprobe.").split(".")
    for end in range(len(parts), 0, -1):
        try:
            target = importlib.import_module("headprobe." + ".".join(parts[:end]))
        except ImportError:
            continue
        for name in parts[end:]:
            target = getattr(target, name)
        return target
    raise ImportError(reference)


def test_the_methods_code_references_resolve():
    """Every `room.module.name` the methods cite exists (a moved or renamed name fails here)."""
    text = METHODS_MD.read_text(encoding="utf-8")
    references = sorted(set(CODE_REF.findall(text)))
    assert "core.seeds.keyed_hash" in references
    broken = []
    for reference in references:
        try:
            resolve(reference)
        except (ImportError, AttributeError) as exc:
            broken.append(f"{reference}: {type(exc).__name__}: {exc}")
    assert not broken, "METHODS cites names that do not exist:\n" + "\n".join(broken)
    with pytest.raises(AttributeError):
        resolve("stats.roles.POSITIONAL_SHARE")  # where it lived before the layers
