"""Render a `Document` as Markdown; figures are PNG files under `figures/` next to it."""

from __future__ import annotations

import re

from headprobe.report.document import (
    BulletList,
    Details,
    Document,
    Figure,
    Interactive,
    Paragraph,
    Table,
)
from headprobe.results import store


def esc(text: str) -> str:
    """Escape what Markdown would read as markup, so text shows as written (and no more,
    to keep the source readable): emphasis (not an underscore inside a word, as in
    best_heads), code, table pipes, tags, links and block markers at the start of a line."""
    text = str(text).replace("\\", "\\\\")
    text = re.sub(r"([`*|])", r"\\\1", text)
    text = re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", text)  # intraword _ is no emphasis
    text = re.sub(r"<(?=[A-Za-z/!?])", r"\\<", text)
    text = re.sub(r"\[(?=[^\]]*\]\()", r"\\[", text)
    text = re.sub(r"^([#>])", r"\\\1", text)
    text = re.sub(r"^([-+])(?= )", r"\\\1", text)
    text = re.sub(r"^(\d+)\.(?= )", r"\1\\.", text)
    return text


def render(doc: Document, figures_dir: str = store.REPORT_FIGURES) -> str:
    lines = [f"# {esc(doc.title)}", ""]
    if doc.subtitle:
        lines += [f"_{esc(doc.subtitle)}_", ""]
    lines += ["Contents:", ""]
    for s in doc.sections:
        if s.level == 2:
            lines.append(f"- [{esc(s.title)}](#{s.id})")
    lines.append("")
    for s in doc.sections:
        lines += [f'<a id="{s.id}"></a>', "", f"{'#' * s.level} {esc(s.title)}", ""]
        for block in s.blocks:
            lines += _block(block, figures_dir) + [""]
    return "\n".join(lines).rstrip() + "\n"


def _block(block, figures_dir: str) -> list[str]:
    if isinstance(block, Paragraph):
        text = block.markdown or esc(block.text)
        return [f"> {text}" if block.note else text]
    if isinstance(block, BulletList):
        items = block.markdown or [esc(i) for i in block.items]
        return [f"{k + 1}. {i}" if block.ordered else f"- {i}" for k, i in enumerate(items)]
    if isinstance(block, Figure):
        return [
            f"![{esc(block.alt or block.caption)}]({figures_dir}/{block.filename})",
            "",
            f"*{esc(block.caption)}*",
        ]
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Interactive):
        return [esc(block.text)]
    if isinstance(block, Details):  # GitHub and most renderers fold it, as the HTML does
        out = ["<details>", f"<summary>{esc(block.summary)}</summary>", ""]
        for b in block.blocks:
            out += _block(b, figures_dir) + [""]
        return out + ["</details>"]
    raise TypeError(f"unknown block {type(block).__name__}")


def _table(t: Table) -> list[str]:
    out = [f"**{esc(t.caption)}**", ""]
    out.append("| " + " | ".join(esc(c) for c in t.columns) + " |")
    out.append(
        "|" + "|".join("---:" if _numeric_col(t, i) else "---" for i in range(len(t.columns))) + "|"
    )
    for row in t.rows:
        out.append("| " + " | ".join(esc(c.text) for c in row) + " |")
    return out


def _numeric_col(t: Table, i: int) -> bool:
    return bool(t.rows) and all(len(r) > i and r[i].numeric for r in t.rows)
