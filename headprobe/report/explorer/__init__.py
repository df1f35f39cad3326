"""The head explorer: the layer x head grid, each head's card and its attention on example sentences.

    section = explorer_section(results)       # the report's "Head explorer" section
    html = explorer_html(explorer_data(results))   # a self-contained fragment (markup, data, script)
    widget = headprobe.explore(results)       # notebooks (`widget`): widget.head

One JavaScript module (`explorer.js`, no framework, no network) draws it everywhere: inlined into
the report and the comparison page, and loaded as the notebook widget's module. Its data
(`data.explorer_data`) comes from the saved results alone: the tables and `head_attention.npz`.
"""

from __future__ import annotations

import json
from functools import cache
from html import escape
from pathlib import Path

from headprobe.report.document import Interactive, Paragraph, Section
from headprobe.report.explorer.data import explorer_data

__all__ = [
    "explorer_section",
    "explorer_html",
    "explorers_html",
    "explorer_data",
    "explore",
    "script",
]


@cache
def script() -> str:
    """The explorer's ES module source."""
    return (Path(__file__).parent / "explorer.js").read_text(encoding="utf-8")


def _json_for_script(data) -> str:
    """JSON safe inside <script>: no "</" can close the element early."""
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/")


def explorer_html(data: dict, element_id: str = "head-explorer") -> str:
    """The explorer of `data` as one self-contained HTML fragment: its element, its data (JSON)
    and the module, inline."""
    return explorers_html([(element_id, "", data)])


def explorers_html(parts: list[tuple[str, str, dict]], matched: dict | None = None) -> str:
    """Several explorers, `parts` = [(element id, heading, data)], under one inline module.
    `matched`: {"i|j": {head of explorer i: its matched head of explorer j}}; selecting a head
    in explorer i highlights its match in every other explorer j."""
    blocks = []
    for element_id, heading, data in parts:
        title = f"<h3>{escape(heading)}</h3>" if heading else ""
        blocks.append(
            f'{title}<div id="{element_id}" class="head-explorer"></div>'
            f'<script type="application/json" id="{element_id}-data">'
            f"{_json_for_script(data)}</script>"
        )
    ids = [element_id for element_id, _, _ in parts]
    link = (
        f"const ids = {_json_for_script(ids)}, matched = {_json_for_script(matched or {})};\n"
        "const apis = [];\n"
        "ids.forEach((id, i) => apis.push(mount(document.getElementById(id),\n"
        '  JSON.parse(document.getElementById(id + "-data").textContent),\n'
        "  {onSelect: (key) => apis.forEach((api, j) => {\n"
        '    if (j !== i) api.highlight((matched[i + "|" + j] || {})[key] || null); })})));\n'
    )
    return "".join(blocks) + f'<script type="module">{script()}\n{link}</script>'


INTRO = (
    "Every scored head, coloured by its role (or by any score: choose it above the grid). Select a "
    "head with the mouse, or with the arrow keys and Enter, to see its card: its role and the "
    "evidence that decided it, its best relations by held-out accuracy beside the baseline, and "
    "its row of every per-head table. Below, its word-level attention on the run's example "
    "sentences (stored as uint8 for every head in head_attention.npz)."
)


def explorer_section(results) -> Section:
    """The report's head explorer (HTML); in Markdown, a line saying where it is."""
    s = Section("explorer", "Head explorer")
    s.add(Paragraph(INTRO))
    s.add(
        Interactive(
            explorer_html(explorer_data(results)),
            "The interactive head explorer is in report.html.",
        )
    )
    return s
