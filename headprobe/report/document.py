"""A renderer-neutral report: sections of paragraphs, lists, tables and figures.

`html.py` and `markdown.py` render the same `Document`, so the two reports carry
the same content. Text is plain (no markup); renderers escape it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass
class Cell:
    text: str
    attrs: dict = field(default_factory=dict)  # becomes data-* attributes in HTML
    numeric: bool = False
    wrap: bool = False  # long text: may wrap (HTML)
    keep: bool = False  # lines break at spaces only (HTML): "2-8 dep->head"


@dataclass
class Table:
    name: str  # id / file-safe name
    caption: str
    columns: list[str]
    rows: list[list[Cell]]
    row_attrs: list[dict] = field(default_factory=list)
    collapsed: bool = False  # long tables: folded in HTML (<details>)


@dataclass
class Figure:
    name: str  # file stem under figures/
    image: object  # a drawing.Drawing (PNG, SVG, PDF), or PNG bytes
    caption: str
    alt: str = ""

    @property
    def png(self) -> bytes:
        return self.image if isinstance(self.image, bytes) else self.image.png

    @property
    def filename(self) -> str:
        return f"{self.name}.png"


@dataclass
class Paragraph:
    text: str
    note: bool = False  # an aside / warning
    markdown: str = ""  # where set: Markdown source the Markdown report prints as is (METHODS)


@dataclass
class BulletList:
    items: list[str]
    ordered: bool = False
    markdown: list[str] | None = None  # where set: the items as Markdown source (as Paragraph's)


@dataclass
class Details:
    """A collapsed block (HTML <details>): `summary` is shown, `blocks` on request."""

    summary: str
    blocks: list = field(default_factory=list)


@dataclass
class Interactive:
    """Live HTML (markup and an inline script, self-contained) where the HTML report has it, and
    `text` where the renderer cannot run it (Markdown)."""

    html: str
    text: str


@dataclass
class Section:
    id: str
    title: str
    blocks: list = field(default_factory=list)
    level: int = 2

    def add(self, block):
        self.blocks.append(block)
        return block


@dataclass
class Document:
    title: str
    subtitle: str = ""
    sections: list[Section] = field(default_factory=list)

    def blocks(self) -> list:
        """Every block, those inside `Details` included, in order."""
        out = []
        for s in self.sections:
            for b in s.blocks:
                out += [b] + (b.blocks if isinstance(b, Details) else [])
        return out

    def figures(self) -> list[Figure]:
        return [b for b in self.blocks() if isinstance(b, Figure)]

    def tables(self) -> list[Table]:
        return [b for b in self.blocks() if isinstance(b, Table)]


def slug(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9]+", "-", str(text)).strip("-").lower()
    return s or "x"
