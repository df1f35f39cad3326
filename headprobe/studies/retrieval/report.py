"""The report sections of the retrieval analyses (`analysis`, `check`; rendering only)

    retrieval_section(results, "retrieval")     # success map, copy scores per head, top heads
    check_section(results, "retrieval_check")   # none / top-k / random heads ablated

Every number is a stored value of `retrieval_heads`, `retrieval_success`, `retrieval_check`,
`retrieval_check_versus` or `best_heads`; nothing here computes a statistic.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.extend import Cell, Figure, Paragraph, Section, Table
from headprobe.report.document import slug
from headprobe.report.drawing import Drawing, drawing, finish, new_figure, planned
from headprobe.report.heatmaps import draw_heatmap
from headprobe.report.rendered_tables import LEGEND, fmt, fmt_est, fmt_signed_est, head_name
from headprobe.report.selection import described, head_maps
from headprobe.studies.retrieval.analysis import RETRIEVAL_ROLE, SCORE

TOP = 10


@planned
def success_figure(share: np.ndarray, text: np.ndarray, lengths: list, depths: list) -> Drawing:
    """The share of probes recalled per context length (rows) and needle depth (columns), each
    cell annotated `recalled/probes`."""
    fig = new_figure(max(3.6, 0.9 * len(depths) + 1.8), max(1.8, 0.5 * len(lengths) + 1.2))
    ax = fig.subplots()
    draw_heatmap(
        ax,
        share,
        cmap="viridis",
        vmin=0.0,
        vmax=1.0,
        annot_text=text,
        cbar_label="share recalled",
        xticklabels=[f"{d:g}" for d in depths],
        yticklabels=[str(length) for length in lengths],
        fontsize=8,
    )
    ax.set_xlabel("needle depth (0: context start, 1: end)", fontsize=8)
    ax.set_ylabel("context length (tokens)", fontsize=8)
    ax.set_title("needle probes recalled", fontsize=9)
    finish(fig)
    return drawing(fig)


def success_map(success: pd.DataFrame, name: str) -> Figure:
    """The success map of a `retrieval_success` table as a length x depth heatmap."""
    lengths = sorted(success["length"].unique().tolist())
    depths = sorted(success["depth"].unique().tolist())
    share = np.full((len(lengths), len(depths)), np.nan)
    text = np.full(share.shape, "", dtype=object)
    for r in success.itertuples(index=False):
        i, j = lengths.index(r.length), depths.index(r.depth)
        share[i, j], text[i, j] = r.share, f"{r.recalled}/{r.probes}"
    return Figure(
        name,
        success_figure(share, text, lengths, depths),
        "Needle probes the model recalls (its response holds more than half of the answer's words), "
        "per context length and depth; each cell: recalled/probes.",
        alt="success map of the needle probe",
    )


def _success_rows(success: pd.DataFrame) -> list[list[Cell]]:
    return [
        [
            Cell(str(r.length), numeric=True),
            Cell(f"{r.depth:g}", numeric=True),
            Cell(str(r.probes), numeric=True),
            Cell(str(r.recalled), numeric=True),
            Cell(fmt_est(r.share, r.share_low, r.share_high, 2), numeric=True),
        ]
        for r in success.itertuples(index=False)
    ]


def _head_rows(heads: pd.DataFrame) -> list[list[Cell]]:
    return [
        [
            Cell(head_name(r.layer, r.head)),
            Cell(fmt_est(r.score, r.ci_low, r.ci_high), numeric=True),
            Cell(fmt(r.fold0, 3), numeric=True),
            Cell(fmt(r.fold1, 3), numeric=True),
            Cell(str(int(r.n)), numeric=True),
            Cell("yes" if r.passes else "no"),
        ]
        for r in heads.itertuples(index=False)
    ]


def _held_out(results, analysis: str) -> str:
    """One sentence: the best head chosen on one half of the probes, reported on the other."""
    best = results.best_heads
    if best is None or not len(best):
        return ""
    rows = best[
        (best["analysis"] == analysis)
        & (best["label"] == SCORE)
        & (best["selection"] == "held-out")
        & (best["fold"].astype(str).isin(["", "None", "nan"]))
    ]
    if not len(rows):
        return ""
    r = rows.iloc[0]
    if pd.isna(r["accuracy"]) or not r["heads"] or pd.isna(r["heads"]):
        note = r.get("note")
        return f"Held out: {note}." if isinstance(note, str) and note else ""
    return (
        f"Held out (the best head chosen on one half of the recalled probes, its score read on the "
        f"other, both halves pooled): heads {str(r['heads']).replace(' | ', ' and ')}, mean copy score "
        f"{fmt_est(r['accuracy'], r['ci_low'], r['ci_high'])}."
    )


def retrieval_section(results, analysis: str) -> Section:
    """The success map, the copy scores per head (map and top heads), the rule and its heads."""
    s = Section(slug(analysis), "Retrieval heads: the needle probe")
    s.add(Paragraph(described(analysis)))
    success = results.tables.get(f"{analysis}_success")
    heads = results.tables.get(f"{analysis}_heads")
    if success is None or not len(success):
        s.add(Paragraph(f"No {analysis} rows.", note=True))
        return s
    got, probes = int(success["recalled"].sum()), int(success["probes"].sum())
    s.add(Paragraph(f"The model recalls {got} of {probes} needle probes."))
    s.add(success_map(success, f"{slug(analysis)}_success"))
    s.add(
        Table(
            f"{slug(analysis)}-success",
            "Needle probes recalled per context length and depth, with the Wilson 95% interval.",
            ["Length", "Depth", "Probes", "Recalled", "Share [95% CI]"],
            _success_rows(success),
        )
    )
    if heads is None or not len(heads):
        s.add(Paragraph("No probe was recalled: no head has a copy score.", note=True))
        return s
    items = [("mean copy score", heads, "score")]
    s.add(head_maps(results, f"{slug(analysis)}_scores", items, "copy score"))
    passed = heads[heads["passes"].astype(bool)]
    s.add(Paragraph(RETRIEVAL_ROLE.description))
    s.add(
        Paragraph(
            f"{len(passed)} of {len(heads)} heads ({len(passed) / len(heads):.1%}) meet the rule"
            + (": " + ", ".join(head_name(l, h) for l, h in zip(passed["layer"], passed["head"])))
            * bool(len(passed))
            + "."
        )
    )
    top = heads.sort_values(["score", "layer", "head"], ascending=[False, True, True]).head(TOP)
    s.add(
        Table(
            f"{slug(analysis)}-top",
            f"The {len(top)} heads with the highest mean copy score over the recalled probes (n), "
            "with the 95% bootstrap interval over probes and the mean on each fold. " + LEGEND,
            ["Head", "Mean copy score [95% CI]", "Fold 0", "Fold 1", "n", "Retrieval head"],
            _head_rows(top),
        )
    )
    held = _held_out(results, analysis)
    if held:
        s.add(Paragraph(held))
    return s


def _check_rows(table: pd.DataFrame) -> list[list[Cell]]:
    return [
        [
            Cell(r.condition),
            Cell(r.heads or "—", wrap=True),
            Cell(fmt_est(r.success, r.success_low, r.success_high, 3), numeric=True),
            Cell(
                fmt_signed_est(r.success_change, r.success_change_low, r.success_change_high),
                numeric=True,
            ),
            Cell(fmt_est(r.logprob, r.logprob_low, r.logprob_high), numeric=True),
            Cell(
                fmt_signed_est(r.logprob_change, r.logprob_change_low, r.logprob_change_high),
                numeric=True,
            ),
        ]
        for r in table.itertuples(index=False)
    ]


def check_section(results, analysis: str) -> Section:
    """The causal check: each condition's success rate and answer log p, changes from none, and
    the top-k retrieval heads against the random draws' mean."""
    s = Section(slug(analysis), "Retrieval heads: the causal check", level=3)
    s.add(Paragraph(described(analysis)))
    table = results.tables.get(analysis)
    info = results.summary.get(analysis) or {}
    if table is None or not len(table):
        s.add(Paragraph(f"Not run: {info.get('note') or 'no rows'}.", note=True))
        return s
    s.add(Paragraph(f"{table['objective'].iloc[0]}. Changes are paired (same probes)."))
    s.add(
        Table(
            f"{slug(analysis)}-conditions",
            f"Heads ablated together (gated to 0), k = {info.get('k')}, on {table['probes'].iloc[0]} "
            "probes: success rate and the answer's mean log p per token, with 95% intervals and the "
            "paired change from no ablation. " + LEGEND,
            ["Condition", "Heads", "Success", "Change", "Answer log p", "Change"],
            _check_rows(table),
        )
    )
    versus = results.tables.get(f"{analysis}_versus")
    if versus is not None and len(versus):
        s.add(
            Paragraph(
                "Top-k retrieval heads against k random heads (the draws' mean), paired: "
                + "; ".join(
                    f"{r.what} {fmt_signed_est(r.change, r.change_low, r.change_high)}"
                    for r in versus.itertuples(index=False)
                )
                + "."
            )
        )
    return s
