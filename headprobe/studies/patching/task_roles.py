"""What the heads that matter do on a task (METHODS §19): where they look from the scored piece,
which logit their direct effect moves, whether they copy the answer; and their task roles.

    att = scored_attention(model, nodes, pairs)      # [row, target, layer, head] (`sums.TARGETS`)
    heads = heads_frame(nodes_table, attention, ov)  # `patching_heads`: one row per significant head

Roles, for a head whose direct effect is significant (`p_holm` < `ALPHA`) on a task the model
does (`tables.does_task`): it *attends* to the answer (the distractor) when its mean attention
from the scored piece to the answer's (distractor's) pieces in the clean prompt, every
occurrence summed, is at least `ATTENDS`. Its direct effect's answer part is the fall of the
answer's logit when its write goes from clean to corrupted (> 0: the head raises the answer),
its distractor part the rise of the distractor's (> 0: the head lowers the distractor).

- **mover**: raises the answer (answer part > 0) and attends to it (Wang et al.'s name movers);
- **suppressor**: lowers the distractor (distractor part > 0) and attends to it (copy
  suppression working for the task, McDougall et al. 2023);
- **negative mover**: lowers the answer (answer part < 0) and attends to it;
- **other**: a significant head that fits none.

A head that meets two rules takes the one whose logit part is the larger in size; every rule it
meets is listed in its evidence.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.studies.patching.task_sums import TARGETS

ALPHA = 0.05
ATTENDS = (
    0.1  # mean attention from the scored piece to a name's pieces that counts as looking at it
)
MOVER, SUPPRESSOR, NEGATIVE, OTHER = "mover", "suppressor", "negative mover", "other"
TASK_ROLES = (MOVER, SUPPRESSOR, NEGATIVE, OTHER)
RULES = {
    MOVER: f"raises the answer's logit (direct effect's answer part > 0) and attends to the "
    f"answer (mean attention from the scored piece >= {ATTENDS})",
    SUPPRESSOR: f"lowers the distractor's logit (distractor part > 0) and attends to the "
    f"distractor (>= {ATTENDS})",
    NEGATIVE: f"lowers the answer's logit (answer part < 0) and attends to the answer "
    f"(>= {ATTENDS})",
    OTHER: "a significant direct effect that fits no rule above",
}
HEAD_COLUMNS = [
    "layer", "head", "direct", "direct_low", "direct_high", "p_holm",
    "direct_answer", "direct_answer_low", "direct_answer_high",
    "direct_distractor", "direct_distractor_low", "direct_distractor_high",
    *(f"attention_{t}" for t in TARGETS), "ov_copying_score", "ov_copy_rate", "role", "rules", "evidence",
]  # fmt: skip


def scored_attention(model, nodes, pairs, keep_row: bool = False):
    """([row, target, layer, head] float64 numpy, the first row's [layer, head, key] attention
    from its scored piece where `keep_row`, else None): the clean prompt's attention from the scored
    piece to each of `TARGETS` (the answer's token every occurrence summed, its first and its
    last occurrence, the same for the distractor, and the first position), per head, from one
    clean pass (`model.layer_cache`) with each layer's probabilities as eager attention computes
    them (`model.channels.clean_attention`)."""
    import torch

    from headprobe.model.channels import clean_attention
    from headprobe.model.layer_cache import clean_cache

    with torch.no_grad():
        cache = clean_cache(model, {"input_ids": pairs.clean}, nodes.stack)
        rows = torch.arange(len(pairs), device=pairs.clean.device)
        ids = pairs.clean  # [row, piece]
        out = np.zeros((len(pairs), len(TARGETS), nodes.n_layers, nodes.n_heads))
        pieces = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)  # [row, piece]
        masks = []
        for column in (0, 1):  # the answer's pieces, the distractor's
            hit = ids == pairs.targets[:, column : column + 1]  # [row, piece]
            first = torch.where(hit, pieces, ids.shape[1]).min(1).values  # [row]
            last = torch.where(hit, pieces, -1).max(1).values
            masks += [hit, (pieces == first[:, None]) & hit, (pieces == last[:, None]) & hit]
        masks.append(pieces == 0)  # the first position
        kept = np.zeros((nodes.n_layers, nodes.n_heads, ids.shape[1])) if keep_row else None
        for layer in range(nodes.n_layers):
            probs, _ = clean_attention(model, cache, layer)  # [row, head, query, key]
            row = probs[rows, :, pairs.position]  # [row, head, key]
            if keep_row:
                kept[layer] = row[0].double().cpu().numpy()
            for t, mask in enumerate(masks):
                got = (row * mask[:, None, :].to(row.dtype)).sum(-1)  # [row, head]
                out[:, t, layer] = got.double().cpu().numpy()
    return out, kept


def _attention_means(attention_sums: np.ndarray, count: np.ndarray) -> np.ndarray:
    """[target, layer, head] mean attention per example from the per-unit sums."""
    return attention_sums.sum(0) / max(1.0, float(count.sum()))


def classify(row) -> tuple[str, list[str], str]:
    """(role, every rule met, evidence) of a significant head's row (module docstring)."""
    answer, distractor = row.direct_answer, row.direct_distractor
    to_answer, to_distractor = row.attention_answer, row.attention_distractor
    met = []
    if answer > 0 and to_answer >= ATTENDS:
        met.append((MOVER, abs(answer)))
    if distractor > 0 and to_distractor >= ATTENDS:
        met.append((SUPPRESSOR, abs(distractor)))
    if answer < 0 and to_answer >= ATTENDS:
        met.append((NEGATIVE, abs(answer)))
    role = max(met, key=lambda m: m[1])[0] if met else OTHER
    evidence = (
        f"direct {row.direct:+.3f} [{row.direct_low:+.3f}, {row.direct_high:+.3f}] "
        f"(p_holm {row.p_holm:.2g}) = answer part {answer:+.3f} "
        f"[{row.direct_answer_low:+.3f}, {row.direct_answer_high:+.3f}] + distractor part "
        f"{distractor:+.3f} [{row.direct_distractor_low:+.3f}, {row.direct_distractor_high:+.3f}]; "
        f"attention to the answer {to_answer:.2f} (first {row.attention_answer_first:.2f}, last "
        f"{row.attention_answer_last:.2f}), to the distractor {to_distractor:.2f} (first "
        f"{row.attention_distractor_first:.2f}, last {row.attention_distractor_last:.2f}), to the "
        f"first position {row.attention_first_position:.2f}; OV copying of the answers "
        f"{row.ov_copy_rate:.2f}"
    )
    return role, [m[0] for m in met] or [OTHER], evidence


def heads_frame(nodes_table: pd.DataFrame, attention: np.ndarray, ov, task_done: bool):
    """`patching_heads`: every head whose direct effect is significant, on a task the model
    does (none otherwise), with its logit split, attention targets, OV copying and task role.
    attention: [target, layer, head] means; ov: DataFrame (layer, head, copying, hits, n) or
    None."""
    heads = nodes_table[nodes_table["head"] >= 0]
    if not task_done or heads["direct"].isna().all():
        return pd.DataFrame(columns=HEAD_COLUMNS)
    keep = heads[heads["p_holm"] < ALPHA].copy()
    layer, head = keep["layer"].to_numpy(int), keep["head"].to_numpy(int)
    for t, target in enumerate(TARGETS):
        keep[f"attention_{target}"] = attention[t, layer, head]
    if ov is not None and len(ov):
        ov = ov.set_index(["layer", "head"])
        index = list(zip(layer, head))
        keep["ov_copying_score"] = [float(ov.loc[i, "copying"]) for i in index]
        keep["ov_copy_rate"] = [float(ov.loc[i, "hits"] / max(1, ov.loc[i, "n"])) for i in index]
    else:
        keep["ov_copying_score"] = keep["ov_copy_rate"] = np.nan
    got = [classify(r) for r in keep.itertuples(index=False)]
    keep["role"] = [g[0] for g in got]
    keep["rules"] = [", ".join(g[1]) for g in got]
    keep["evidence"] = [g[2] for g in got]
    keep = keep.sort_values("direct", key=np.abs, ascending=False, kind="stable")
    return keep[HEAD_COLUMNS].reset_index(drop=True)
