"""The project's methods (docs/METHODS.md) as package data, and the parts of it a report shows.

    from headprobe.report import methods
    methods.text()                      # the whole document (headprobe/report/methods.md)
    methods.sections()                  # {"s5": Part("5", "Statistics", markdown), ...}
    methods.section_of("induction")     # "s10": the numbered section defining an analysis
    methods.used_by(results)            # ["s1", "s2", ...]: the sections behind a report's tables
    methods.how_to_cite()               # the citation text (README "How to cite", reports)

The one source is `headprobe/report/methods.md`, shipped in the wheel (an installed headprobe has
no docs/ folder); `docs/METHODS.md` is a byte-identical copy, rewritten by
`python -m headprobe.report.methods` and checked by tests/test_methods.py. A numbered section n
starts with the anchor `<a id="sn"></a>`; an analysis's definition carries `analysis-<name>`.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

ANCHOR = re.compile(r'<a id="([^"]+)"></a>')
SECTION = re.compile(r'^<a id="(s\d+)"></a>\s*\n## (\d+)\. (.+)$', re.MULTILINE)
ALWAYS = ("s1", "s5", "s6", "s15")
USER_PATTERNS = "s10-user"  # the definition of a user-declared token pattern  # inputs, statistics, roles, provenance: behind every report
TITLE = "headprobe: scoring the attention heads of Hugging Face Transformers"


@dataclass(frozen=True)
class Part:
    number: str
    title: str
    markdown: str  # the section's body, its heading left out


@lru_cache(maxsize=1)
def text() -> str:
    """The whole methods document, read from the installed package."""
    return resources.files("headprobe.report").joinpath("methods.md").read_text(encoding="utf-8")


def anchors(document: str | None = None) -> set[str]:
    """Every `<a id="...">` of the document."""
    return set(ANCHOR.findall(text() if document is None else document))


def sections() -> dict[str, Part]:
    """{anchor "sn": its number, title and body} of every numbered section, in order."""
    doc = text()
    starts = list(SECTION.finditer(doc))
    out = {}
    for k, m in enumerate(starts):
        end = starts[k + 1].start() if k + 1 < len(starts) else len(doc)
        body = doc[m.end() : end].strip().removesuffix("---").strip()
        title = ANCHOR.sub("", m.group(3)).strip()
        out[m.group(1)] = Part(m.group(2), title, body)
    return out


def section_of(analysis: str) -> str | None:
    """The numbered section holding `analysis-<analysis>`, or None (e.g. a user's own analysis)."""
    return holding(f"analysis-{analysis}")


def holding(anchor: str) -> str | None:
    """The numbered section holding the anchor `anchor`, or None."""
    doc = text()
    at = doc.find(f'<a id="{anchor}"></a>')
    if at < 0:
        return None
    before = [m for m in SECTION.finditer(doc) if m.start() <= at]
    return before[-1].group(1) if before else None


def _defined_in(analysis: str) -> str | None:
    """`section_of`, and for a user's own token pattern the token patterns' section (§10)."""
    found = section_of(analysis)
    if found is None:
        from headprobe.scoring import registry

        try:
            scorer = registry.get(analysis).scorer
        except ValueError:  # not registered here (a plugin not installed)
            return None
        # a declared token pattern's scorer carries its pattern (`pattern_analysis`)
        found = holding(USER_PATTERNS) if callable(getattr(scorer, "pattern", None)) else None
    return found


def used_by(results) -> list[str]:
    """The numbered sections behind the tables of a report of `results`, in document order:
    inputs, statistics, roles and provenance always; each analysis's own section; norms (§7)
    with a second measure; §8 with a random-init control; the presets (§14) where the run
    records the conventions it scored under."""
    wanted = set(ALWAYS)
    wanted.update(s for s in map(_defined_in, results.analyses) if s is not None)
    if any(m != "weights" for m in getattr(results, "measures", ["weights"])):
        wanted.add("s7")
    if getattr(results, "control", None) is not None:
        wanted.add("s8")
    if (getattr(results, "summary", None) or {}).get("conventions"):  # the run names its preset
        wanted.add("s14")
    return [key for key in sections() if key in wanted]


def how_to_cite(version: str | None = None) -> str:
    """The citation text of README.md's "How to cite" and of every report (CITATION.cff holds the
    same title and version)."""
    if version is None:
        from headprobe.version import __version__ as version
    return (
        f"The headprobe authors (2026). {TITLE}, version {version}. Definitions: the headprobe "
        "methods (docs/METHODS.md; every report's Methods appendix), cited as METHODS §n."
    )


def write_docs(root: Path) -> Path:
    """Rewrite `root`/docs/METHODS.md from the package source; returns its path."""
    path = Path(root) / "docs" / "METHODS.md"
    path.write_text(text(), encoding="utf-8")
    return path


if __name__ == "__main__":  # python -m headprobe.report.methods [REPO_ROOT]
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
    print(write_docs(root))


# ---------------------------------------------------------------- the report's appendix

ITEM = re.compile(r"^(?:- |\d+\. )")
LINK = re.compile(r"\[([^\]]+)\]\(#[^)]+\)")


def plain(markdown: str) -> str:
    """Markdown inline markup removed (bold, code, in-document links); math kept as written."""
    return LINK.sub(r"\1", markdown).replace("**", "").replace("`", "")


def _blocks(number: str, markdown: str) -> list:
    """A section body as report blocks: Markdown tables as Tables, lists as BulletLists, every
    other paragraph as a Paragraph; the Markdown report prints the source (anchors removed),
    the HTML its plain text (`plain`)."""
    from headprobe.report.document import BulletList, Cell, Paragraph, Table

    out = []
    markdown = LINK.sub(r"\1", ANCHOR.sub("", markdown))  # links into METHODS.md: plain §n
    for k, chunk in enumerate(re.split(r"\n\s*\n", markdown)):
        lines = [line.rstrip() for line in chunk.strip().splitlines() if line.strip()]
        if not lines or lines == ["---"]:
            continue
        if all(line.startswith("|") for line in lines):
            cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
            rows = [[Cell(plain(c), wrap=True) for c in row] for row in cells[2:]]
            columns = [plain(c) for c in cells[0]]
            out.append(Table(f"methods-s{number}-{k}", f"METHODS §{number}", columns, rows))
        elif ITEM.match(lines[0]):
            items: list[str] = []
            for line in lines:
                if ITEM.match(line):
                    items.append(ITEM.sub("", line).strip())
                else:
                    items[-1] += " " + line.strip()
            ordered = not lines[0].startswith("- ")
            out.append(BulletList([plain(i) for i in items], ordered, markdown=items))
        else:
            text = " ".join(line.strip() for line in lines)
            out.append(Paragraph(plain(text), markdown=text))
    return out


def appendix(results):
    """The report's folded "Methods" appendix (a `Details` block of its provenance section): the
    definitions behind its tables (`used_by`)."""
    from headprobe.report.document import Details, Paragraph

    parts = sections()
    keys = used_by(results)
    blocks = [
        Paragraph(
            "The definitions behind this report's tables, from the headprobe methods "
            "(docs/METHODS.md in the repository, cited as METHODS §n; formulas in Markdown math)."
        )
    ]
    for key in keys:
        part = parts[key]
        blocks.append(Paragraph(f"METHODS §{part.number}. {part.title}", note=True))
        blocks += _blocks(part.number, part.markdown)
    numbers = ", ".join(f"§{parts[k].number}" for k in keys)
    return Details(f"Methods: the definitions used here (METHODS {numbers})", blocks)


def citation_block():
    """The "How to cite" paragraph of the report's provenance (the README's text)."""
    from headprobe.report.document import Paragraph

    return Paragraph(f"How to cite: {how_to_cite()}")
