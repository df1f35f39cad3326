"""Report section of the random-init control (`--control random-init`, `headprobe.model.control`).

    section = control_section(results)     # the trained model's best heads beside the control's

Every number is a stored value of `best_heads` (its `control_*` columns) and of the two
models' `roles` tables.
"""

from __future__ import annotations

from headprobe.report.document import Cell, Paragraph, Section, Table
from headprobe.report.rendered_tables import LEGEND, fmt, fmt_ci
from headprobe.stats.roles import role_colors, role_summary


def control_section(results) -> Section:
    """The trained model's held-out best heads beside the random-init control's, and both role counts."""
    s = Section("control", "Random-init control")
    info = results.summary.get("control") or {}
    s.add(
        Paragraph(
            f"Control: {info.get('model', 'the same architecture re-initialised')}; the same tokenizer "
            "and corpora. What the trained model learned is what it does beyond this control; a role "
            "rule may also require a head's held-out accuracy above the control's held-out best (see "
            "the rules in the role map)."
        )
    )
    best = results.best_heads
    if "control_accuracy" not in best:
        s.add(Paragraph("These results have no control.", note=True))
        return s
    held = best[(best["selection"] == "held-out") & (best["fold"] == "") & ~best["small_sample"]]
    s.add(_control_best_table(held))
    control = results.control
    if control is not None and len(control.roles):
        s.add(_control_roles_table(results, control))
    return s


def _control_best_table(held) -> Table:
    """The held-out best head per label beside the control's, with their intervals."""
    return Table(
        "control-best",
        "Held-out best head per label: trained vs the random-init control (95% "
        "intervals over units). " + LEGEND,
        [
            "Analysis",
            "Label",
            "Trained head",
            "Accuracy",
            "95% CI",
            "Control head",
            "Control accuracy",
            "95% CI (control)",
        ],
        [
            [
                Cell(r.analysis),
                Cell(r.label),
                Cell(r.heads or "—"),
                Cell(fmt(r.accuracy), numeric=True),
                Cell(fmt_ci(r.ci_low, r.ci_high), numeric=True),
                Cell(r.control_heads or "—"),
                Cell(fmt(r.control_accuracy), numeric=True),
                Cell(fmt_ci(r.control_ci_low, r.control_ci_high), numeric=True),
            ]
            for r in held.itertuples(index=False)
        ],
        collapsed=len(held) > 40,
    )


def _control_roles_table(results, control) -> Table:
    """The heads per role of the trained model and of its random-init control."""
    order = list(role_colors(results))
    mine = role_summary(results.roles, order).set_index("role")["heads"]
    theirs = role_summary(control.roles, order).set_index("role")["heads"]
    return Table(
        "control-roles",
        "Heads per role: trained vs the random-init control",
        ["Role", "Trained", "Control"],
        [
            [
                Cell(role),
                Cell(str(int(mine.get(role, 0))), numeric=True),
                Cell(str(int(theirs.get(role, 0))), numeric=True),
            ]
            for role in order
        ],
    )
