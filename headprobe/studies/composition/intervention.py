"""Intervention at the receiver, every sender at once (METHODS §18 "Intervention at the receiver").

    cache = clean_cache(model, inputs, stack)                      # headprobe.model.layer_cache
    sums = edge_sums(model, cache, layer=3, baseline=means)        # every head of layer 3 a receiver
    sums.pattern      # [batch, sender, head, channel]: total variation, summed over scored rows
    sums.output       # [batch, sender, head, channel]: ||o' - o|| / ||o||, summed over scored rows
    sums.role[INDUCTION]     # [batch, sender, head, channel]: drop of the role's attention, summed
    sums.rows, sums.role_rows[INDUCTION]   # [batch]: the rows each sum is over
    sums.senders      # [(layer, head)] in the order of the sender axis
    sums.estimate     # [batch, sender, head, channel]: first-order objective change (with `grads`)

For each sender s (every head of an earlier layer), the residual stream entering the receiver's
layer becomes x' = x - w_s + b_s, with w_s = c_s the sender's write (its slice of the output
projection's input times its block of W_O, METHODS §9) and b_s its write under the kind of
ablation (`baseline`: None for zero, else what `HeadGates` takes as `means`: [layer, head,
d_head], [layer, piece, head, d_head] or [batch, layer, piece, head, d_head]). Where the family
norms the attention's output before the residual add (Gemma-2/3) that norm is recomputed;
post-norm families carry the change through frozen norms (`LayerCache.carried`). Then each
channel c of the receiver layer is recomputed from x' alone (`model.channels`), the other two
clean. Senders go in blocks sized from `budget` bytes.

Rows: the receiver's scored query rows (`rows` [batch, piece] bool; default every real piece).
A unit's effect is the sum of its rows' values over the sum of its rows (METHODS §5).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from headprobe.core.errors import UsageError
from headprobe.model.channels import CHANNELS, channel_attention, clean_attention, layer_input
from headprobe.model.layer_cache import LayerCache
from headprobe.model.sites import output_weight
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
    the residual stream entering layer `to` (write norm recomputed; post-norm: frozen norms)."""
    out = []
    for layer in sorted({l for l, _ in senders}):
        heads = [h for l, h in senders if l == layer]
        z = cache.slices[layer]  # [batch, piece, head, d_head]
        b = baseline_slice(baseline, layer, z)
        w_o = output_weight(cache.sites[layer]).float().to(z.device)  # [head, d_head, hidden]
        diff = (b - z)[:, :, heads]  # [batch, piece, sender, d_head]
        d = torch.einsum("btsd,sde->sbte", diff, w_o[heads])  # [sender, batch, piece, hidden]
        d = cache.residual_change(layer, d.to(cache.attention_out[layer].dtype)).float()
        out.append(cache.carried(layer, to, d))
    order = [
        (l, h) for l in sorted({l for l, _ in senders}) for h in [h for m, h in senders if m == l]
    ]
    index = [order.index(s) for s in senders]
    return torch.cat(out)[index]


def block_size(batch: int, piece: int, hidden: int, heads: int, d_head: int, budget: int) -> int:
    """Senders per block so that one block's tensors stay near `budget` bytes."""
    per = 4 * batch * piece * (4 * hidden + 6 * heads * piece + 10 * heads * d_head)
    return max(1, int(budget // max(per, 1)))


def _row_mean_gram(w_o: torch.Tensor) -> torch.Tensor:
    return w_o @ w_o.transpose(1, 2)  # [head, d_head, d_head]: ||u W_O^h||^2 = u G_h u^T


def _write_norm(z: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """[..., query, head]: ||z_h W_O^h|| of z [..., query, head, d_head]."""
    return torch.einsum("...qhd,hde,...qhe->...qh", z, gram, z).clamp_min(0).sqrt()


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
) -> EdgeSums:
    """See the module docstring. senders: [(layer, head)] of earlier layers (default every head
    of layers 0 .. layer - 1); heads: the receiver heads kept (default all); roles: name ->
    [batch, piece] long, each query row's role target key (-1: none), e.g. `role_targets`;
    grads: [channel, head (as `heads`), batch, piece, hidden] the objective's gradient with
    respect to each receiver channel's input (`first_order.input_gradients`): then `estimate`
    is its dot product with each sender's change, summed over the row's pieces."""
    site = cache.sites[layer]
    heads = list(range(site.heads)) if heads is None else list(heads)
    check_receivers(cache, [(layer, h) for h in heads] or [(layer, 0)])
    senders = senders or [(l, h) for l in range(layer) for h in range(cache.sites[l].heads)]
    x = cache.x[layer]  # [batch, piece, hidden]
    batch, piece, hidden = x.shape
    rows = _rows(rows, x)  # [batch, piece] float
    probs0, z0 = clean_attention(model, cache, layer)  # [batch, head, q, k], [batch, q, head, d]
    gram = _row_mean_gram(output_weight(site).float().to(x.device))
    norm0 = _write_norm(z0, gram)  # [batch, query, head]
    step = block_size(batch, piece, hidden, site.heads, z0.shape[-1], budget)
    pattern, output, role = [], [], {name: [] for name in roles or {}}
    estimate = []
    for start in range(0, len(senders), step):
        block = senders[start : start + step]
        d = sender_changes(cache, layer, block, baseline)  # [sender, batch, piece, hidden]
        changed = layer_input(
            cache, layer, (x + d).flatten(0, 1)
        )  # [sender * batch, piece, hidden]
        out = channel_attention(model, cache, layer, changed)
        n = len(block)
        p, o, r = _block_effects(out, probs0, z0, norm0, gram, rows, roles or {}, n)
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
        {name: (rows * (t >= 0)).sum(-1) for name, t in (roles or {}).items()},
    )
    sums.estimate = torch.cat(estimate, 1) if estimate else None  # grads are `heads`' already
    return sums


def _rows(rows, x: torch.Tensor) -> torch.Tensor:
    if rows is None:
        return torch.ones(x.shape[:2], device=x.device)
    return rows.to(device=x.device, dtype=torch.float32)


def _block_effects(out, probs0, z0, norm0, gram, rows, roles, n: int):
    """Row sums of one block's effects: ([batch, sender, head, channel] pattern, output, and per
    role name the same shape)."""
    batch = probs0.shape[0]
    pattern, output, role = [], [], {name: [] for name in roles}
    for c in CHANNELS:
        probs = out.probs[c].view(n, batch, *probs0.shape[1:])  # [sender, batch, head, q, k]
        z = out.z[c].view(n, batch, *z0.shape[1:])  # [sender, batch, query, head, d_head]
        tv = 0.5 * (probs - probs0).abs().sum(-1)  # [sender, batch, head, query]
        tv = torch.zeros_like(tv) if c == "v" else tv  # the value leaves the pattern as it is
        moved = _write_norm(z - z0, gram)  # [sender, batch, query, head]
        rel = torch.where(norm0 > 0, moved / norm0.clamp_min(1e-30), torch.zeros_like(moved))
        pattern.append(torch.einsum("sbhq,bq->bsh", tv, rows))
        output.append(torch.einsum("sbqh,bq->bsh", rel, rows))
        for name, targets in roles.items():
            role[name].append(role_drop(probs, probs0, targets, rows))
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
