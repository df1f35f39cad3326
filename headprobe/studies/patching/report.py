"""The patching analysis's console lines, report section and head cards (METHODS §19)."""

from __future__ import annotations

import pandas as pd

from headprobe.studies.patching.task_roles import TASK_ROLES


def _interval(value, low, high, digits: int = 2) -> str:
    return f"{value:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def metric_line(metric: pd.DataFrame) -> str:
    m = metric.set_index("metric")
    parts = [
        f"{name} {_interval(m.loc[name, 'value'], m.loc[name, 'low'], m.loc[name, 'high'])}"
        for name in ("clean", "corrupted", "difference")
    ]
    return (
        f"logit difference (answer - distractor), mean over {int(m.loc['clean', 'n']):,} examples: "
        + "; ".join(parts)
    )


def console_text(results, top: int = 8) -> str:
    metric = results.tables.get("patching_metric")
    if metric is None or not len(metric):
        return ""
    summary = results.task_summary()
    lines = [f"\ntask {summary['task']}: " + metric_line(metric)]
    if not summary["does_task"]:
        lines.append(
            "  the model does not do this task (the difference's 95% interval does not lie above "
            "0): no head is named"
        )
        return "\n".join(lines)
    nodes = results.tables.get("patching_nodes")
    best = nodes.reindex(nodes["noise"].abs().sort_values(ascending=False).index).head(top)
    lines.append("  largest noising effects (share of the difference, 95% interval):")
    for r in best.itertuples(index=False):
        lines.append(
            f"    {r.node:>8}  noise {_interval(r.noise_share, r.noise_share_low, r.noise_share_high)}"
            f"  denoise {_interval(r.denoise_share, r.denoise_share_low, r.denoise_share_high)}"
            + (f"  direct {r.direct_share:+.2f}" if pd.notna(r.direct_share) else "")
        )
    heads = results.tables.get("patching_heads")
    if heads is not None and len(heads):
        for role in TASK_ROLES:
            mine = heads[heads["role"] == role]
            if len(mine):
                names = ", ".join(f"{int(r.layer)}-{int(r.head)}" for r in mine.itertuples())
                lines.append(f"  {role} heads ({len(mine)}): {names}")
    check = results.tables.get("patching_check")
    if check is not None and len(check):
        for r in check.itertuples(index=False):
            lines.append(
                f"  estimate {r.estimate} ({r.effect}) against the exact values over {r.nodes} "
                f"nodes: Spearman {_interval(r.spearman, r.ci_low, r.ci_high)}"
            )
            if isinstance(r.warning, str) and r.warning:
                lines.append(f"  WARNING: {r.warning}")
    return "\n".join(lines)


def section(results, name: str):
    from headprobe.report.document import Paragraph, Section

    return Section(name, "Heads on a task", [Paragraph("(report section to come)")])


def card(results):
    return "Task", {}
