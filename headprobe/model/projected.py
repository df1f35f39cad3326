"""A layer's input projections recomputed from changes given in d_head space (METHODS §18,
"Cost"): the shortcut that lets every sender of a receiver layer be done at once without
pushing each sender's change through the full q/k/v projections.

    short = shortcut(model, cache, layer)        # None where it does not apply (below)
    outs = short.outputs(diff, rows, d, factor)  # {projection: [sender * batch, piece, features]}
    channel_attention(model, cache, layer, None, projections=outs, copies=n_senders)

A sender s changes the residual stream entering the layer by d_s = f * (diff_s @ R_s), with
diff_s [batch, piece, d_head] its slice's change, R_s [d_head, hidden] the rows of its block of
W_O (post-norm families: carried through the frozen norms' linear parts, and f [batch, piece]
the inverse product of their clean scales; f = 1 on pre-norm families). The layer's projections
read norm(x + d) = g * (x + d)_c / s' + beta (the mean taken out for a LayerNorm, `_c`; RMSNorm:
not), so for a projection W (gain folded in: W g) with bias b:

    P(x + d) = c + [ (P(x) - c) s + f diff @ (R_s (W g)^T) - mu u ] / s',   c = W beta + b,
    s'^2 = s^2 + (2 x_c . d + ||d||^2 - n mu^2) / n,   mu = mean(d) (LayerNorm; RMSNorm 0),

with u = (W g) 1 and n the hidden width: `R_s (W g)^T` [d_head, features] is formed once per
(sender, receiver layer), so each position costs d_head x features instead of hidden x
features. Without a norm (post-norm families read x itself) P(x + d) = P(x) + f diff @ R_s W^T.
Everything after the projections is the family's own code (`channels.recall`: its reshape,
q/k norms, RoPE, ALiBi or relative bias, attention function), so the shortcut is exact up to
float rounding, as the general path is.

It applies where the layer's attention module computes q, k and v from its hidden states by
nn.Linear or Conv1D projections alone. `shortcut` checks that on the batch itself: one changed
input through the general path and through the shortcut must give the same q, k and v at the
attention function; where they differ, or where the module reads its hidden states otherwise,
it returns None and the caller keeps the general path (a norm on the attention output, Gemma's,
is the caller's to exclude: there a sender's change is not linear in its slice).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from headprobe.core.errors import UsageError
from headprobe.model.channels import recall
from headprobe.model.layer_cache import LayerCache
from headprobe.model.projections import projection_weight
from headprobe.model.unembed import fit_norm

CHECK_ROWS = 4  # d_head-space width of the check's random change
CHECK_RTOL = 1e-4  # the check's tolerance, relative to the largest |q|, |k|, |v| (float32;
# a half-precision model's general path rounds to its own precision: 4 of its epsilons)


@dataclass
class Shortcut:
    """Layer `layer`'s input projections, ready for changes in d_head space."""

    layer: int
    modules: list  # the projections reading the layer's hidden states, in call order
    widths: list[int]  # their output features
    weight: torch.Tensor  # [feature, hidden] every projection's rows, the norm's gain folded in
    clean: torch.Tensor  # [batch, piece, feature] their clean outputs, side by side
    offset: torch.Tensor  # [feature] their output at a zero normalised input: W beta + b
    kind: str | None  # "rms", "layer", or None: no norm (the projections read x itself)
    scale: torch.Tensor | None  # [batch, piece] the norm's clean scale, eps included
    centred: torch.Tensor | None  # [batch, piece, hidden] x (LayerNorm: its mean taken out)
    dtype: torch.dtype = torch.float32  # the projections' own output dtype

    def outputs(self, diff, rows, d, factor=None) -> dict:
        """{projection: [sender * batch, piece, features]}: each projection's output when the
        residual stream entering the layer is x + d_s. diff [sender, batch, piece, d_head],
        rows [sender, d_head, hidden] (module docstring), d [sender, batch, piece, hidden] the
        change itself (for the norm's new scale), factor [batch, piece] or None."""
        dtype = self.weight.dtype
        k = torch.matmul(rows.to(dtype), self.weight.T)  # [sender, d_head, feature]
        out = torch.matmul(diff.to(dtype).flatten(1, 2), k)  # [sender, batch * piece, feature]
        out = out.view(*diff.shape[:3], -1)  # [sender, batch, piece, feature]
        if factor is not None:
            out.mul_(factor[..., None])
        if self.kind is None:
            out.add_(self.clean)
        else:
            n = d.shape[-1]
            dot = torch.einsum("sbth,bth->sbt", d, self.centred)  # [sender, batch, piece]
            size = torch.linalg.vector_norm(d, dim=-1).pow_(2)
            new = self.scale.pow(2) + (2 * dot + size) / n
            if self.kind == "layer":
                mu = d.mean(-1)  # [sender, batch, piece]
                new.sub_(mu.pow(2))
                out.addcmul_(mu[..., None], self.weight.sum(-1), value=-1.0)
            out.add_((self.clean - self.offset) * self.scale[..., None])
            out.div_(new.sqrt_()[..., None]).add_(self.offset)
        out = out.flatten(0, 1)  # [sender * batch, piece, feature]
        got, start = {}, 0
        for module, width in zip(self.modules, self.widths):
            got[module] = out[..., start : start + width].to(self.dtype)
            start += width
        return got


def shortcut(model, cache: LayerCache, layer: int) -> Shortcut | None:
    """Layer `layer`'s `Shortcut`, checked on the cache's batch (module docstring), or None
    where it does not apply. Kept in `cache.shortcuts`."""
    if layer not in cache.shortcuts:
        try:
            found = _build(model, cache, layer)
            ok = found is not None and _check(model, cache, found)
            cache.shortcuts[layer] = found if ok else None
        except (UsageError, RuntimeError, ValueError, TypeError, KeyError, IndexError):
            cache.shortcuts[layer] = None
    return cache.shortcuts[layer]


@torch.no_grad()
def _build(model, cache: LayerCache, layer: int) -> Shortcut | None:
    site, call = cache.sites[layer], cache.calls[layer]
    hidden = call.hidden()  # [batch, piece, hidden]: what the module read
    seen: list = []

    def keep(module, args, output):
        if args and torch.is_tensor(args[0]) and args[0] is hidden:
            seen.append((module, output))

    handles = [
        m.register_forward_hook(keep)
        for m in site.module.modules()
        if isinstance(m, (nn.Linear, Conv1D)) and m is not site.output
    ]
    try:
        recall(model, cache, layer, hidden, _nothing)
    finally:
        for h in handles:
            h.remove()
    if not seen or len({id(m) for m, _ in seen}) != len(seen):
        return None
    modules = [m for m, _ in seen]
    weights = [projection_weight(m).float() for m in modules]  # [out, hidden] each
    biases = [
        m.bias.float() if getattr(m, "bias", None) is not None else torch.zeros(len(w))
        for m, w in zip(modules, weights)
    ]
    raw = torch.cat(weights)  # [feature, hidden]
    bias = torch.cat([b.to(raw.device) for b in biases])  # [feature]
    weight = raw
    clean = torch.cat([o.float() for _, o in seen], -1)  # [batch, piece, feature]
    x = cache.x[layer].float()  # [batch, piece, hidden]
    norm = site.norm_in
    kind = scale = centred = None
    beta = torch.zeros(x.shape[-1], device=x.device)
    if norm is not None:
        kind, gain, eps = _norm_parts(norm, x.shape[-1])
        zero = torch.zeros(1, 1, x.shape[-1], dtype=hidden.dtype, device=x.device)
        beta = norm(zero).float()[0, 0]  # [hidden]
        weight = weight * gain.to(weight.device)[None, :]
        centred = x - x.mean(-1, keepdim=True) if kind == "layer" else x
        scale = torch.sqrt(centred.pow(2).mean(-1) + eps)  # [batch, piece]
    offset = raw @ beta + bias  # [feature]
    widths = [len(w) for w in weights]
    dtype = seen[0][1].dtype
    return Shortcut(layer, modules, widths, weight, clean, offset, kind, scale, centred, dtype)


def _norm_parts(norm: nn.Module, hidden: int) -> tuple:
    """(kind, gain [hidden], eps) of the layer's input norm."""
    if isinstance(norm, nn.LayerNorm):
        gain = norm.weight.float() if norm.weight is not None else torch.ones(hidden)
        return "layer", gain.detach(), float(norm.eps)
    kind, gain, eps = fit_norm(norm, hidden)
    return kind, gain, eps


def _nothing(module, query, key, value, mask, scaling, extra):
    """An attention function's stand-in whose result is not used: zeros of its output's shape."""
    shape = (query.shape[0], query.shape[2], query.shape[1], value.shape[-1])
    return torch.zeros(shape, dtype=query.dtype, device=query.device), None


@torch.no_grad()
def _check(model, cache: LayerCache, short: Shortcut) -> bool:
    """The shortcut and the general path give the same q, k, v for one random change."""
    from headprobe.model.channels import layer_input

    layer = short.layer
    x = cache.x[layer].float()  # [batch, piece, hidden]
    gen = torch.Generator().manual_seed(layer)
    rows = torch.randn(1, CHECK_ROWS, x.shape[-1], generator=gen).to(x)  # [1, r, hidden]
    diff = torch.randn(1, *x.shape[:2], CHECK_ROWS, generator=gen).to(x)  # [1, batch, piece, r]
    d = torch.matmul(diff, rows)  # [1, batch, piece, hidden]
    size = 0.3 * x.norm(dim=-1, keepdim=True) / d.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    diff = diff * size  # a change of 0.3 of the stream's size at every position
    d = torch.matmul(diff, rows)
    got = {}

    def grab(name):
        def handler(module, query, key, value, mask, scaling, extra):
            got[name] = (query.float(), key.float(), value.float())
            return _nothing(module, query, key, value, mask, scaling, extra)

        return handler

    recall(model, cache, layer, layer_input(cache, layer, x + d[0]), grab("general"))
    outs = short.outputs(diff, rows, d)
    recall(model, cache, layer, None, grab("short"), outs, 1)
    tol = max(CHECK_RTOL, 4 * torch.finfo(short.dtype).eps)
    for a, b in zip(got["general"], got["short"]):
        top = float(a.abs().max())
        if not torch.isfinite(b).all() or float((a - b).abs().max()) > tol * max(top, 1e-6):
            return False
    return True
