"""The composition's report section (METHODS §18): the graph of significant edges, the strongest
edges with intervals, the circuits the role map names, and the check of the first-order
estimate against exact path patching. Head cards read `head_lines`: what a head reads per
channel, and who reads it.

Rendering only: every number is a stored value of `composition_edges`,
`composition_check_correlation` or `roles`; nothing here computes a statistic.
"""

from __future__ import annotations

import pandas as pd

from headprobe.extend import CIRCUIT_COLUMN, Cell, Figure, Paragraph, Section, Table
from headprobe.report.document import slug
from headprobe.report.rendered_tables import fmt, fmt_ci, head_name
from headprobe.report.selection import described
from headprobe.stats.roles import NONE
from headprobe.studies.ablation.flags import ABLATION
from headprobe.studies.composition.graph import CHANNEL_NAMES, composition_graph, graph_edges
from headprobe.studies.composition.run_options import MLP_HEAD, sender_name

TOP_EDGES = 15
KIND = ABLATION.name  # the column naming the kind of ablation
PER_CHANNEL = 3  # senders a head card lists per channel


def _edge(r) -> str:
    return f"{sender_name(r.sender_layer, r.sender_head)} → {r.layer}-{r.head}"


def section(results, name: str) -> Section:
    s = Section(slug(name), "Heads that work together: composition")
    s.add(Paragraph(described(name)))
    edges = results.tables.get("composition_edges")
    if edges is None or not len(edges):
        s.add(Paragraph("No composition edges in these results.", note=True))
        return s
    kind = edges[KIND].iloc[0]
    shown = graph_edges(edges)
    roles = results.tables.get("roles")
    named = {}
    if roles is not None and len(roles):
        named = {
            (int(r.layer), int(r.head)): r.short or r.role
            for r in roles.itertuples(index=False)
            if r.role != NONE
        }
    s.add(
        Figure(
            "composition_graph",
            composition_graph(shown, results.n_layers, results.n_heads, named),
            f"The {len(shown)} strongest significant edges (p_holm < 0.05, by output effect; "
            f"{kind} ablation): an arrow from the sender to the receiver, coloured by the "
            "receiver's channel that reads it (q query, k key, v value), as wide as the output "
            "effect. Layers go up the page; heads with a role carry its short name; MLP senders "
            "(MLP L) stand right of their layer's heads, the embeddings below the first layer.",
            alt="composition graph of the significant edges",
        )
    )
    s.add(top_table(edges, kind))
    circuits_block(s, roles)
    corr = results.tables.get("composition_check_correlation")
    if corr is not None and len(corr):
        c = corr.iloc[0]
        if pd.isna(c.spearman):  # no estimate (`first_order.has_estimate`): the warning says why
            s.add(Paragraph(f"Exact path patching on {int(c.edges)} edges; {c.warning}."))
        else:
            text = (
                f"First-order estimate against exact path patching on {int(c.edges)} edges: "
                f"Spearman {c.spearman:+.2f} [{c.ci_low:+.2f}, {c.ci_high:+.2f}]."
            )
            s.add(Paragraph(text + (f" Warning: {c.warning}" if c.warning else "")))
    return s


def top_table(edges: pd.DataFrame, kind: str) -> Table:
    """The edges with the largest output effect, with intervals."""
    top = edges.nlargest(TOP_EDGES, "output_effect")
    return Table(
        "composition-top",
        f"The {len(top)} edges with the largest output effect ({kind} ablation; 95% "
        "intervals over units; p_holm: Holm over every edge).",
        [
            "Edge",
            "Channel",
            "Output effect",
            "95% CI",
            "Pattern effect",
            "Role effect",
            "p_holm",
        ],
        [
            [
                Cell(_edge(r), keep=True),
                Cell(r.channel),
                Cell(fmt(r.output_effect), numeric=True),
                Cell(fmt_ci(r.output_effect_low, r.output_effect_high), numeric=True),
                Cell(fmt(r.pattern_effect), numeric=True),
                Cell(fmt(r.role_effect), numeric=True),
                Cell(f"{r.p_holm:.2g}", numeric=True),
            ]
            for r in top.itertuples(index=False)
        ],
    )


def circuits_block(s: Section, roles: pd.DataFrame | None) -> None:
    """The circuits the role map names (its `circuits` column), or a note that none was found."""
    if roles is not None and CIRCUIT_COLUMN in roles:
        found = roles[roles[CIRCUIT_COLUMN].astype(str) != ""]
        if len(found):
            s.add(
                Table(
                    "composition-circuits",
                    "Circuits the role map names with evidence: an induction head whose key "
                    "reads a previous-token head (the edge's drop of the induction score, 95% "
                    "interval).",
                    ["Head", "Role", "Circuit"],
                    [
                        [Cell(head_name(r.layer, r.head)), Cell(r.role), Cell(r.circuit, wrap=True)]
                        for r in found.itertuples(index=False)
                    ],
                )
            )
        else:
            s.add(Paragraph("No circuit found with evidence in this run.", note=True))


def head_lines(edges: pd.DataFrame | None, layer: int, head: int) -> list[str]:
    """A head card's lines: per channel the senders it reads most (significant edges, largest
    output effect first), then the receivers that read it; [] without composition edges."""
    if edges is None or not len(edges):
        return []
    sig = edges[edges["p_holm"] < 0.05]
    lines = []
    mine = sig[(sig["layer"] == layer) & (sig["head"] == head)]
    for c in "qkv":
        part = mine[mine["channel"] == c].nlargest(PER_CHANNEL, "output_effect")
        if len(part):
            lines.append(
                f"reads through its {CHANNEL_NAMES[c]}: "
                + ", ".join(
                    f"{sender_name(r.sender_layer, r.sender_head)} ({r.output_effect:.3f})"
                    for r in part.itertuples(index=False)
                )
            )
    theirs = sig[(sig["sender_layer"] == layer) & (sig["sender_head"] == head)]
    theirs = theirs.nlargest(PER_CHANNEL * 2, "output_effect")
    if len(theirs):
        lines.append(
            "read by: "
            + ", ".join(
                f"{r.layer}-{r.head} {r.channel} ({r.output_effect:.3f})"
                for r in theirs.itertuples(index=False)
            )
        )
    return lines


def card(results) -> tuple[str, dict]:
    """The head cards' lines (`Analysis.card`): what each head reads per channel, who reads it."""
    edges = results.tables.get("composition_edges")
    heads = set()
    if edges is not None and len(edges):
        heads = set(zip(edges["layer"].astype(int), edges["head"].astype(int)))
        senders = zip(edges["sender_layer"].astype(int), edges["sender_head"].astype(int))
        heads |= {(l, h) for l, h in senders if h != MLP_HEAD}  # MLPs, embeddings: no card
    lines = {key: head_lines(edges, *key) for key in sorted(heads)}
    kind = edges[KIND].iloc[0] if edges is not None and len(edges) else ""
    return f"Composition: what it reads, who reads it ({kind} ablation, output effect)", lines
