"""The head explorer: the layer x head grid, each head's card and its attention on example sentences.

    section = explorer_section(results)       # the report's "Head explorer" section
    html = explorer_html(explorer_data(results))   # a self-contained fragment (markup, data, script)
    widget = explore(results)                 # notebooks: an anywidget widget; widget.head

One JavaScript module (`explorer.js`, no framework, no network) draws it everywhere: inlined into
the report and the comparison page, and loaded as the notebook widget's module. Its data
(`data.explorer_data`) comes from the saved results alone: the tables and `head_attention.npz`.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from headprobe.report.document import Interactive, Paragraph, Section
from headprobe.report.explorer.data import explorer_data

__all__ = ["explorer_section", "explorer_html", "explorer_data", "explore", "script"]


@cache
def script() -> str:
    """The explorer's ES module source."""
    return (Path(__file__).parent / "explorer.js").read_text(encoding="utf-8")


def _json_for_script(data) -> str:
    """JSON safe inside <script>: no "</" can close the element early."""
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/")


def explorer_html(data: dict, element_id: str = "head-explorer", after: str = "") -> str:
    """The explorer of `data` as one HTML fragment: its element, its data (JSON) and the module,
    inline. `after`: more JavaScript run in the same module once it is mounted (`explorer` is the
    returned API)."""
    return (
        f'<div id="{element_id}" class="head-explorer"></div>'
        f'<script type="application/json" id="{element_id}-data">{_json_for_script(data)}</script>'
        f'<script type="module">{script()}\n'
        f'const explorer = mount(document.getElementById("{element_id}"), '
        f'JSON.parse(document.getElementById("{element_id}-data").textContent));\n'
        f"{after}</script>"
    )


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


def explore(results):
    """A notebook widget of `results` (a `Results` or a results directory): see `widget`."""
    from headprobe.report.explorer.widget import explore as _explore

    return _explore(results)
