"""Report section: attention weights beside norm-based attention (METHODS §7; Kobayashi et al. 2020).

    section = measures_section(results)        # results scored with --measure weights,norms

Renders what each analysis declares it shows under two measures (`Analysis.measures_report`: the
surface analysis's share of attention on [CLS]/[SEP] per layer and its statistics side by side),
the role maps side by side, and the heads whose role changed (`results.measure_views`).
"""

from __future__ import annotations

from headprobe.report.document import Cell, Figure, Paragraph, Section, Table
from headprobe.report.rendered_tables import LEGEND
from headprobe.report.role_figures import role_maps_figure
from headprobe.results.measure_views import role_changes
from headprobe.scoring import registry
from headprobe.scoring.measures import ARGMAX, MASS
from headprobe.stats.roles import role_colors


def measures_section(results) -> Section:
    first, second = results.measures[:2]
    s = Section(
        "measures",
        f"What heads pass on: {first} beside {second} (METHODS §7; Kobayashi et al. 2020)",
    )
    s.add(
        Paragraph(
            "A weight a[i, j] says how much a head looks at key j; N[i, j] = a[i, j] * ||v_j W_O|| says how much of "
            "key j reaches the head's output (v_j: the head's value vector of j, W_O: the head's block of the "
            "attention output projection). Argmax scores ("
            + ", ".join(_reading(results, ARGMAX))
            + ") use N; mass scores ("
            + ", ".join(_reading(results, MASS))
            + ") use N with each row normalised to sum 1. Every other section of this report "
            "shows the first measure; every table of the results has both, in its `measure` column."
        )
    )
    for name in registry.ordered(results.analyses):
        blocks = _measures_blocks_of(name)
        for block in blocks(results, name, first, second) if blocks is not None else ():
            s.add(block)
    _roles(s, results, first, second)
    return s


def _reading(results, reading: str) -> list[str]:
    """The analyses of `results` whose scorers read a measure as `reading` (`scorer.reads`)."""
    names = [n for n in registry.ordered(results.analyses) if n in registry.names()]
    return [n for n in names if registry.get(n).scorer.reads == reading] or ["none here"]


def _measures_blocks_of(name: str):
    """The callable giving analysis `name`'s blocks of this section, or None."""
    try:
        return registry.get(name).measures_blocks()
    except ValueError:  # an analysis whose plugin is not installed here
        return None


def _roles(s: Section, results, first: str, second: str) -> None:
    roles = results.roles
    if not len(roles):
        return
    colors = role_colors(results)
    maps = [
        (measure, roles[roles["measure"] == measure], results.n_layers, results.n_heads)
        for measure in (first, second)
    ]
    s.add(
        Figure(
            "measures_roles",
            role_maps_figure(maps, colors),
            f"Head-role maps: rules met on {first} (left) and on {second} (right). " + LEGEND,
            alt="role maps per measure",
        )
    )
    changed = role_changes(results)
    if not len(changed):
        s.add(Paragraph(f"No head's role differs between {first} and {second}."))
        return
    rows = [
        [
            Cell(r["name"]),
            Cell(r[f"role_{first}"]),
            Cell(r[f"detail_{first}"] or "—", wrap=True),
            Cell(r[f"role_{second}"]),
            Cell(r[f"detail_{second}"] or "—", wrap=True),
            Cell(r[f"evidence_{second}"] or r[f"evidence_{first}"] or "—", wrap=True),
        ]
        for _, r in changed.iterrows()
    ]
    s.add(
        Table(
            "measures-role-changes",
            f"What changed: the {len(rows)} heads whose role differs. " + LEGEND,
            ["Head", f"Role ({first})", "Detail", f"Role ({second})", "Detail", "Evidence"],
            rows,
            [{"layer": int(r["layer"]), "head": int(r["head"])} for _, r in changed.iterrows()],
            collapsed=len(rows) > 40,
        )
    )
