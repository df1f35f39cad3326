"""Report section of the positional analysis (`headprobe.studies.positional.analysis`; Voita et al. 2019).

    section = positional_section(results, "positional")   # registered as the analysis's report

Share heatmaps of the argmax offsets and the heads by their dominant offset; rendering only.
"""

from __future__ import annotations

import math

import pandas as pd

from headprobe.extend import Cell, Figure, Paragraph, Section, Table
from headprobe.report.document import slug
from headprobe.report.drawing import Drawing, drawing, finish, legible, new_figure, planned
from headprobe.report.heatmaps import layer_head_heatmap, panel_size, small_panel_size
from headprobe.report.rendered_tables import LEGEND, fmt, fmt_int, head_name, to_matrix
from headprobe.scoring import registry
from headprobe.studies.positional.analysis import LABELS, POSITIONAL_SHARE, offset_shares


def positional_section(results, analysis: str) -> Section:
    """Argmax offsets: share heatmaps and the heads by their dominant offset (`roles.offset_shares`)."""
    key = slug(analysis)
    s = Section(key, "Positional heads (Voita et al. 2019)")
    s.add(
        Paragraph(
            "For every word (specials excluded as queries), where its attention argmax sits (self and special "
            "tokens included): relative offset -2..+2, a special token, or elsewhere. A head is positional when "
            f"one non-zero offset takes at least {POSITIONAL_SHARE:g} of the argmaxes."
        )
    )
    shares = offset_shares(results, analysis)
    if not len(shares):
        s.add(Paragraph(f"No {analysis} rows for attention heads.", note=True))
        return s
    s.add(
        Figure(
            key,
            positional_figure(shares, results.n_layers, results.n_heads),
            "Share of words whose argmax is at each relative position, per head. " + LEGEND,
            alt=f"{analysis} heatmaps",
        )
    )
    met = _rule_met(results, [rule.role for rule in registry.get(analysis).roles])
    top = shares.sort_values(
        ["share", "layer", "head"], ascending=[False, True, True], kind="stable"
    )
    n_positional = sum(
        met.get((int(r.layer), int(r.head)), False) for r in shares.itertuples(index=False)
    )
    top = top.head(max(10, n_positional))
    labels = [c for c in LABELS if c in shares.columns]
    rows, attrs = [], []
    for r in top.to_dict("records"):
        head = (int(r["layer"]), int(r["head"]))
        rows.append(
            [
                Cell(head_name(*head)),
                Cell(str(r["offset"])),
                Cell(fmt(r["share"]), {"col": "dominant_share"}, True),
                Cell("yes" if met.get(head) else "no", {"col": key}),
            ]
            + [Cell(fmt(r[c]), {"col": f"share:{c}"}, True) for c in labels]
            + [Cell(fmt_int(r["n"]), {"col": "n"}, True)]
        )
        attrs.append({"layer": head[0], "head": head[1]})
    s.add(
        Table(
            f"{key}-top",
            f"Heads by the share of their dominant non-zero offset ({n_positional} "
            f"positional heads). " + LEGEND,
            ["Head", "Offset", "Share", "Positional"] + [f"share {c}" for c in labels] + ["Words"],
            rows,
            attrs,
        )
    )
    return s


def _rule_met(results, roles: list[str]) -> dict:
    """{(layer, head): whether the head meets one of the `roles`' rules} from the roles table."""
    table = results.roles
    return {
        (int(l), int(h)): bool(set(roles) & set(str(met).split(", ")))
        for l, h, met in zip(table["layer"], table["head"], table["all_roles"])
    }


@planned
def positional_figure(shares: pd.DataFrame, n_layers: int, n_heads: int) -> Drawing:
    """One share heatmap per positional label (-2..+2, special, other)."""
    labels = [lab for lab in LABELS if lab in shares.columns]
    annotated = legible(n_layers, n_heads)
    ncols = min(2 if (annotated and n_heads >= 8) else 4, len(labels))
    nrows = math.ceil(len(labels) / ncols)
    w, h = panel_size(n_layers, n_heads) if annotated else small_panel_size(n_layers, n_heads)
    fig = new_figure(ncols * w, nrows * h + 0.5)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for k, lab in enumerate(labels):
        mat = to_matrix(shares, lab, n_layers, n_heads)
        name = {"0": "0 (self)", "special": "special token", "other": "other offset"}.get(lab, lab)
        layer_head_heatmap(
            axes[k // ncols, k % ncols],
            mat,
            f"argmax at {name}",
            cmap="YlGnBu",  # light to dark blue, as seaborn's mako_r, without importing seaborn
            vmin=0,
            vmax=1,
            cbar_label="share of words",
        )
    for k in range(len(labels), nrows * ncols):
        axes[k // ncols, k % ncols].set_axis_off()
    finish(fig, "Share of words whose attention argmax sits at each relative position")
    return drawing(fig)
