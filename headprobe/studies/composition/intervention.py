"""Intervention at the receiver, every sender at once (METHODS §18 "Intervention at the receiver").

    cache = clean_cache(model, inputs, stack)                      # headprobe.model.layer_cache
    sums = edge_sums(model, cache, layer=3, baseline=means)        # every head of layer 3 a receiver
    sums.pattern      # [batch, sender, head, channel]: total variation, summed over scored rows
    sums.output       # [batch, sender, head, channel]: ||o' - o|| / ||o||, summed over scored rows
    sums.role[INDUCTION]     # [batch, sender, head, channel]: drop of the role's attention, summed
    sums.rows, sums.role_rows[INDUCTION]   # [batch]: the rows each sum is over
    sums.senders      # [(layer, head)] in the order of the sender axis (MLPs, embed: `senders`)
    sums.estimate     # [batch, sender, head, channel]: first-order objective change (with `grads`)

For each sender s (every head of an earlier layer; given `senders.every_sender`, also the
embeddings and each earlier MLP, their writes in `senders.write_changes`), the residual stream
entering the receiver's layer becomes x' = x - w_s + b_s, with w_s = c_s a head's write (its
slice of the output projection's input times its block of W_O, METHODS §9) and b_s its write
under the kind of
ablation (`baseline`: None for zero, else what `HeadGates` takes as `means`: [layer, head,
d_head], [layer, piece, head, d_head] or [batch, layer, piece, head, d_head]; with MLP or
embeddings senders a `senders.Baseline` holding every kind's values). Where the family
norms the attention's output before the residual add (Gemma-2/3) that norm is recomputed;
post-norm families carry the change through frozen norms (`LayerCache.carried`). Then each
channel c of the receiver layer is recomputed from x' alone (`model.channels`), the other two
clean. Senders go in blocks sized from `budget` bytes.

Rows: the receiver's scored query rows (`rows` [batch, piece] bool; default every real piece).
A unit's effect is the sum of its rows' values over the sum of its rows (METHODS §5).

Cost: the receiver layer's projections take each sender's change in d_head space
(`model.projected`) where that shortcut applies and no sender layer norms its attention output
(else, for MLP and embeddings senders, or with `general=True`, the whole changed stream goes
through the layer's norm and projections); the layer's output projection is not run; the value channel reuses the clean
probabilities; only the query rows from the first to the last scored one are computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from headprobe.extend import UsageError
from headprobe.model.channels import CHANNELS, channel_attention, clean_attention, layer_input
from headprobe.model.layer_cache import LayerCache
from headprobe.model.projected import shortcut
from headprobe.model.sites import output_weight
from headprobe.studies.composition.senders import heads_of, is_head, write_changes
from headprobe.studies.induction.analysis import NAME as INDUCTION
from headprobe.studies.previous_token.analysis import NAME as PREVIOUS_TOKEN

BUDGET = 256 * 2**20  # bytes of intermediate tensors per block of senders


@dataclass
class EdgeSums:
    """Per example row of a batch, the effects of each sender on each receiver head."""

    layer: int  # the receivers' layer
    heads: list[int]  # receiver heads, in the order of the head axis
    senders: list[tuple[int, int]]  # (layer, head), in the order of the sender axis
    pattern: torch.Tensor  # [batch, sender, head, channel]
    output: torch.Tensor  # [batch, sender, head, channel]
    rows: torch.Tensor  # [batch] scored rows
    role: dict = field(default_factory=dict)  # name -> [batch, sender, head, channel]
    role_rows: dict = field(default_factory=dict)  # name -> [batch]
    estimate: torch.Tensor | None = None  # [batch, sender, head, channel] (`first_order`)


def check_receivers(cache: LayerCache, receivers) -> list[tuple[int, int]]:
    """The receivers (layer, head) checked against the stack; UsageError (one line) else."""
    n_layers, n_heads = len(cache.sites), cache.sites[0].heads
    out = []
    for layer, head in receivers:
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise UsageError(
                f"receiver {layer}-{head}: the {cache.stack} stack has {n_layers} layers of "
                f"{n_heads} heads (0-{n_layers - 1}, 0-{n_heads - 1})"
            )
        if layer == 0:
            raise UsageError(
                f"receiver {layer}-{head}: a head of the first layer has no senders (no earlier "
                "layer writes to its input)"
            )
        out.append((int(layer), int(head)))
    return out


def baseline_slice(baseline, layer: int, like: torch.Tensor) -> torch.Tensor:
    """Layer `layer`'s ablation value broadcast like the slices [batch, piece, head, d_head]."""
    if baseline is None:
        return torch.zeros_like(like)
    b = baseline[:, layer] if baseline.dim() == 5 else baseline[layer]
    return b.to(like).expand_as(like)


def sender_changes(cache: LayerCache, to: int, senders, baseline=None) -> torch.Tensor:
    """[sender, batch, piece, hidden]: the change b_s - w_s of each sender's write, as it reaches
    the residual stream entering layer `to` (write norm recomputed; post-norm: frozen norms).
    MLP and embeddings senders: `senders.write_changes` (baseline: a `senders.Baseline`)."""
    heads = [s for s in senders if is_head(s)]
    if len(heads) < len(senders):
        others = [s for s in senders if not is_head(s)]
        parts = [write_changes(cache, to, others, baseline)]  # [other, batch, piece, hidden]
        if heads:
            parts.insert(0, sender_changes(cache, to, heads, baseline))
        index = {s: i for i, s in enumerate(heads + others)}
        return torch.cat(parts)[[index[s] for s in senders]]  # [sender, batch, piece, hidden]
    baseline = heads_of(baseline)
    out = []
    for layer in sorted({l for l, _ in senders}):
        heads = [h for l, h in senders if l == layer]
        z = cache.slices[layer]  # [batch, piece, head, d_head]
        b = baseline_slice(baseline, layer, z)
        w_o = output_weight(cache.sites[layer]).float().to(z.device)  # [head, d_head, hidden]
        diff = (b - z)[:, :, heads]  # [batch, piece, sender, d_head]
        d = torch.einsum("btsd,sde->sbte", diff, w_o[heads])  # [sender, batch, piece, hidden]
        d = cache.residual_change(layer, d.to(cache.dtypes[layer])).float()
        out.append(cache.carried(layer, to, d))
    return torch.cat(out)[_order(senders)]


def _order(senders) -> list[int]:
    """Where each sender sits when they are grouped by layer (layers ascending)."""
    layers = sorted({l for l, _ in senders})
    grouped = [(l, h) for l in layers for h in [h for m, h in senders if m == l]]
    return [grouped.index(s) for s in senders]


def sender_parts(cache: LayerCache, to: int, senders, baseline=None) -> tuple:
    """(diff [sender, batch, piece, d_head] each sender's slice change b_s - z_s, rows [sender,
    d_head, hidden] its block of W_O as it reaches layer `to` (post-norm: through the frozen
    norms' centring and gain), factor [batch, piece] or None): the sender's change of the
    stream entering `to` is factor * diff @ rows (`sender_changes` where no layer norms its
    attention output; `model.projected`). Heads only."""
    baseline = heads_of(baseline)
    diffs, rows, factor = [], [], None
    for layer in sorted({l for l, _ in senders}):
        heads = [h for l, h in senders if l == layer]
        z = cache.slices[layer]  # [batch, piece, head, d_head]
        b = baseline_slice(baseline, layer, z)
        diffs.append((b - z)[:, :, heads].permute(2, 0, 1, 3))  # [sender, batch, piece, d_head]
        w_o = output_weight(cache.sites[layer]).float().to(z.device)[heads]  # [s, d_head, hidden]
        w_o, factor = cache.carried_parts(layer, to, w_o)
        rows.append(w_o)
    index = _order(senders)
    return torch.cat(diffs)[index], torch.cat(rows)[index], factor


def block_size(
    batch: int, piece: int, hidden: int, heads: int, d_head: int, budget: int, rows=None
) -> int:
    """Senders per block so that one block's tensors stay near `budget` bytes (rows: the query
    rows computed, default every piece)."""
    rows = piece if rows is None else rows
    per = 4 * batch * (piece * (4 * hidden + 10 * heads * d_head) + 8 * heads * rows * piece)
    return max(1, int(budget // max(per, 1)))


def _row_mean_gram(w_o: torch.Tensor) -> torch.Tensor:
    return w_o @ w_o.transpose(1, 2)  # [head, d_head, d_head]: ||u W_O^h||^2 = u G_h u^T


def _write_norm(z: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """[..., query, head]: ||z_h W_O^h|| of z [..., query, head, d_head]."""
    return torch.einsum("...qhd,hde,...qhe->...qh", z, gram, z).clamp_min(0).sqrt()


def scored_span(rows: torch.Tensor) -> slice:
    """The query rows from the first to the last scored one of any row of the batch (rows
    [batch, piece]); every effect is a sum over scored rows, so the others are not computed."""
    seen = torch.nonzero(rows.sum(0) > 0).flatten()
    if not len(seen):
        return slice(0, 0)
    return slice(int(seen[0]), int(seen[-1]) + 1)


@torch.no_grad()
def edge_sums(
    model,
    cache: LayerCache,
    layer: int,
    senders=None,
    baseline=None,
    rows: torch.Tensor | None = None,
    roles: dict | None = None,
    heads=None,
    budget: int = BUDGET,
    grads: torch.Tensor | None = None,
    general: bool = False,
) -> EdgeSums:
    """See the module docstring. senders: [(layer, head)] of earlier layers (default every head
    of layers 0 .. layer - 1; MLPs and the embeddings as `senders.every_sender` gives them); heads: the receiver heads kept (default all); roles: name ->
    [batch, piece] long, each query row's role target key (-1: none), e.g. `role_targets`;
    grads: [channel, head (as `heads`), batch, piece, hidden] the objective's gradient with
    respect to each receiver channel's input (`first_order.input_gradients`): then `estimate`
    is its dot product with each sender's change, summed over the row's pieces. general: never
    the shortcut (module docstring, "Cost")."""
    site = cache.sites[layer]
    heads = list(range(site.heads)) if heads is None else list(heads)
    check_receivers(cache, [(layer, h) for h in heads] or [(layer, 0)])
    senders = senders or [(l, h) for l in range(layer) for h in range(cache.sites[l].heads)]
    x = cache.x[layer]  # [batch, piece, hidden]
    batch, piece, hidden = x.shape
    rows = _rows(rows, x)  # [batch, piece] float
    span = scored_span(rows)
    probs0, z0 = clean_attention(model, cache, layer)  # [batch, head, q, k], [batch, q, head, d]
    probs0, z0, part = probs0[:, :, span], z0[:, span], rows[:, span]
    parts = {name: t.to(rows.device)[:, span] for name, t in (roles or {}).items()}
    gram = _row_mean_gram(output_weight(site).float().to(x.device))
    norm0 = _write_norm(z0, gram)  # [batch, query, head]
    use = not general and not any(l in cache.write_norms for l, h in senders if is_head((l, h)))
    short = shortcut(model, cache, layer) if use else None
    step = block_size(batch, piece, hidden, site.heads, z0.shape[-1], budget, z0.shape[1])
    pattern, output, estimate, role = [], [], [], {name: [] for name in roles or {}}
    for block in _blocks(senders, step):
        out, d = _changed_attention(model, cache, layer, block, baseline, short, span, probs0)
        p, o, r = _block_effects(out, probs0, z0, norm0, gram, part, parts, len(block))
        pattern.append(p)
        output.append(o)
        if grads is not None:  # [batch, sender, head, channel]
            estimate.append(torch.einsum("crbte,sbte->bsrc", grads.to(d), d))
        for name in role:
            role[name].append(r[name])
    keep = lambda t: torch.cat(t, 1)[:, :, heads]  # [batch, sender, head, channel]
    sums = EdgeSums(
        layer,
        heads,
        list(senders),
        keep(pattern),
        keep(output),
        rows.sum(-1),
        {name: keep(v) for name, v in role.items()},
        {name: (rows * (t.to(rows.device) >= 0)).sum(-1) for name, t in (roles or {}).items()},
    )
    sums.estimate = torch.cat(estimate, 1) if estimate else None  # grads are `heads`' already
    return sums


def _blocks(senders, step: int):
    """Consecutive blocks of at most `step` senders, heads and other senders never in one."""
    start = 0
    while start < len(senders):
        kind = is_head(senders[start])
        stop = start + 1
        while stop < min(len(senders), start + step) and is_head(senders[stop]) == kind:
            stop += 1
        yield senders[start:stop]
        start = stop


def _changed_attention(model, cache, layer, block, baseline, short, span, probs0) -> tuple:
    """(`ChannelAttention` of the block's senders, d [sender, batch, piece, hidden] each one's
    change of the stream entering `layer`): through the shortcut where `short` is given and the
    block's senders are heads, else through the layer's own norm and projections."""
    n = len(block)
    if short is not None and is_head(block[0]):
        diff, w_rows, factor = sender_parts(cache, layer, block, baseline)
        d = torch.matmul(diff, w_rows[:, None])  # [sender, batch, piece, hidden]
        d = d if factor is None else d * factor[..., None]
        outs = short.outputs(diff, w_rows, d, factor)
        return channel_attention(model, cache, layer, None, CHANNELS, span, outs, n, probs0), d
    d = sender_changes(cache, layer, block, baseline)  # [sender, batch, piece, hidden]
    changed = layer_input(cache, layer, (cache.x[layer] + d).flatten(0, 1))  # [s * batch, ..]
    return channel_attention(model, cache, layer, changed, CHANNELS, span, None, n, probs0), d


def _rows(rows, x: torch.Tensor) -> torch.Tensor:
    if rows is None:
        return torch.ones(x.shape[:2], device=x.device)
    return rows.to(device=x.device, dtype=torch.float32)


def _block_effects(out, probs0, z0, norm0, gram, rows, roles, n: int):
    """Row sums of one block's effects: ([batch, sender, head, channel] pattern, output, and per
    role name the same shape). probs0, z0, norm0, rows and the roles' targets: the computed
    query rows only."""
    batch = probs0.shape[0]
    pattern, output, role = [], [], {name: [] for name in roles}
    for c in CHANNELS:
        z = out.z[c].view(n, batch, *z0.shape[1:])  # [sender, batch, query, head, d_head]
        moved = _write_norm(z - z0, gram)  # [sender, batch, query, head]
        rel = torch.where(norm0 > 0, moved / norm0.clamp_min(1e-30), torch.zeros_like(moved))
        output.append(torch.einsum("sbqh,bq->bsh", rel, rows))
        if c == "v":  # the value leaves the pattern as it is
            zero = torch.zeros(batch, n, probs0.shape[1], device=z.device)  # [batch, sender, head]
            pattern.append(zero)
            for name in roles:
                role[name].append(zero)
            continue
        probs = out.probs[c].view(n, batch, *probs0.shape[1:])  # [sender, batch, head, q, k]
        for name, targets in roles.items():
            role[name].append(role_drop(probs, probs0, targets, rows))
        tv = probs.sub_(probs0).abs_().sum(-1).mul_(0.5)  # [sender, batch, head, query]
        pattern.append(torch.einsum("sbhq,bq->bsh", tv, rows))
    stack = lambda t: torch.stack(t, -1)  # [batch, sender, head, channel]
    return stack(pattern), stack(output), {name: stack(v) for name, v in role.items()}


def role_drop(probs, probs0, targets: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """[batch, sender, head]: sum over scored rows with a target of the drop of the attention
    to the row's target key, probs0 [batch, head, q, k] - probs [sender, batch, head, q, k]."""
    t = targets.to(probs.device).clamp_min(0)  # [batch, query]
    keep = rows * (targets.to(rows.device) >= 0)  # [batch, query]
    index = t[:, None, :, None].expand(-1, probs0.shape[1], -1, 1)  # [batch, head, query, 1]
    clean = probs0.gather(-1, index)[..., 0]  # [batch, head, query]
    index = index.expand(probs.shape[0], *index.shape)
    changed = probs.gather(-1, index)[..., 0]  # [sender, batch, head, query]
    return torch.einsum("sbhq,bq->bsh", clean - changed, keep)


def role_targets(role: str, ids: torch.Tensor, half=None, period=None) -> torch.Tensor:
    """[batch, piece] long: each query row's target key for a pattern role (-1: none).

    previous_token: the key before the row; induction (the repeated-random probe, its second
    half starting at piece `half`, the sequence repeating after `period` pieces; `period`
    defaults to `half`, an input without a BOS): the key after the row's earlier copy,
    i - period + 1, for rows i >= half. `half`, `period`: ints or [batch, 1] tensors. Another
    role (a dependency relation) gives its own targets in the same form."""
    batch, piece = ids.shape
    i = torch.arange(piece, device=ids.device).expand(batch, piece)
    if role == PREVIOUS_TOKEN:
        return torch.where(i > 0, i - 1, -1)
    if role == INDUCTION:
        if half is None:
            raise ValueError("induction targets need the repeated half's first piece")
        period = half if period is None else period
        return torch.where(i >= half, i - period + 1, -1)
    raise ValueError(f"no pattern targets for role {role!r}")
