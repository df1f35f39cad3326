"""Render a `Document` as one self-contained HTML page.

Figures are embedded as base64 `data:` URIs, and the stylesheet and the explorer's script are
inline: the page loads no script, font or stylesheet from anywhere and opens offline.
"""

from __future__ import annotations

import base64
from html import escape

from headprobe.report.document import (
    BulletList,
    Details,
    Document,
    Figure,
    Interactive,
    Paragraph,
    Table,
)

CSS = """
:root { color-scheme: light; }
*, *::before, *::after { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       margin: 0; color: #1d1d1f; background: #fafafa; line-height: 1.45; }
main { max-width: 1180px; margin: 0 auto; padding: 1.2rem 1.6rem 3rem; background: #fff; }
h1 { font-size: 1.6rem; margin: 0.4rem 0 0.2rem; }
h2 { font-size: 1.25rem; margin-top: 2.2rem; border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
h3 { font-size: 1.05rem; margin-top: 1.4rem; }
p, li, figcaption, summary { overflow-wrap: anywhere; }
.subtitle { color: #555; margin: 0 0 1rem; }
nav.toc { background: #f4f6f8; padding: .5rem 1rem; border-radius: 6px; font-size: .92rem; }
nav.toc ul { margin: .2rem 0; padding-left: 1.2rem; columns: 2; }
p.note { background: #fff7e0; border-left: 4px solid #e0a800; padding: .4rem .7rem; }
figure { margin: 1rem 0 1.4rem; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: .88rem; color: #444; margin-top: .3rem; }
table { border-collapse: collapse; font-size: .8rem; margin: .4rem 0 1rem; max-width: 100%; }
p.tablecap { font-size: .88rem; color: #444; margin: 1rem 0 .3rem; }
th, td { border: 1px solid #ddd; padding: .2rem .4rem; vertical-align: top; overflow-wrap: break-word; }
th { background: #f0f2f4; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; overflow-wrap: normal; }
td.wrap { min-width: 10em; }
td.keep span { white-space: nowrap; }
tbody tr:nth-child(even) { background: #fafbfc; }
details summary { cursor: pointer; color: #2a5db0; margin: .3rem 0; }
details.provenance ul { font-size: .82rem; color: #333; }
@media print {
  body { background: #fff; font-size: 10pt; }
  main { max-width: none; padding: 0; }
  nav.toc { display: none; }
  table { font-size: 7pt; }
  th, td { padding: .08rem .18rem; }
  figure, tr { break-inside: avoid; }
}
"""


def render(doc: Document) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(doc.title)}</title>",
        f"<style>{CSS}</style>",
        "</head>",
        "<body>",
        "<main>",
        f"<h1>{escape(doc.title)}</h1>",
    ]
    if doc.subtitle:
        parts.append(f'<p class="subtitle">{escape(doc.subtitle)}</p>')
    parts.append('<nav class="toc"><strong>Contents</strong><ul>')
    for s in doc.sections:
        if s.level == 2:
            parts.append(f'<li><a href="#{escape(s.id)}">{escape(s.title)}</a></li>')
    parts.append("</ul></nav>")
    for s in doc.sections:
        h = f"h{s.level}"
        parts.append(f'<section id="{escape(s.id)}"><{h}>{escape(s.title)}</{h}>')
        for block in s.blocks:
            parts.append(_block(block))
        parts.append("</section>")
    parts += ["</main>", "</body>", "</html>"]
    return "\n".join(parts) + "\n"


def _block(block) -> str:
    if isinstance(block, Paragraph):
        cls = ' class="note"' if block.note else ""
        return f"<p{cls}>{escape(block.text)}</p>"
    if isinstance(block, BulletList):
        items = "".join(f"<li>{escape(i)}</li>" for i in block.items)
        tag = "ol" if block.ordered else "ul"
        return f"<{tag}>{items}</{tag}>"
    if isinstance(block, Figure):
        data = base64.b64encode(block.png).decode("ascii")
        return (
            f'<figure id="fig-{escape(block.name)}">'
            f'<img src="data:image/png;base64,{data}" alt="{escape(block.alt or block.caption)}">'
            f"<figcaption>{escape(block.caption)}</figcaption></figure>"
        )
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Interactive):
        return block.html
    if isinstance(block, Details):
        inner = "".join(_block(b) for b in block.blocks)
        return f'<details class="provenance"><summary>{escape(block.summary)}</summary>{inner}</details>'
    raise TypeError(f"unknown block {type(block).__name__}")


def _attrs(attrs: dict) -> str:
    return "".join(f' data-{escape(str(k))}="{escape(str(v))}"' for k, v in attrs.items())


def _table(t: Table) -> str:
    out = [
        f'<p class="tablecap">{escape(t.caption)}</p>' if not t.collapsed else "",
        f'<table id="table-{escape(t.name)}" data-table="{escape(t.name)}">',
        "<thead><tr>",
    ]
    out += [f"<th>{escape(c)}</th>" for c in t.columns]
    out.append("</tr></thead><tbody>")
    for i, row in enumerate(t.rows):
        ra = t.row_attrs[i] if i < len(t.row_attrs) else {}
        out.append(f"<tr{_attrs(ra)}>")
        for cell in row:
            cls = next(
                (
                    f' class="{c}"'
                    for c, on in (("num", cell.numeric), ("wrap", cell.wrap), ("keep", cell.keep))
                    if on
                ),
                "",
            )
            text = (
                " ".join(f"<span>{escape(w)}</span>" for w in cell.text.split(" "))
                if cell.keep
                else escape(cell.text)
            )  # keep: lines break at spaces only ("dep->head" whole)
            out.append(f"<td{cls}{_attrs(cell.attrs)}>{text}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    html = "".join(out)
    if t.collapsed:
        html = (
            f"<details><summary>{escape(t.caption)} ({len(t.rows)} rows)</summary>{html}</details>"
        )
    return html
