"""A layer's query, key and value recomputed from a changed input, one channel at a time
(METHODS §18): the receiver side of heads that work together.

    cache = clean_cache(model, inputs)                        # model.layer_cache
    out = channel_attention(model, cache, layer, hidden)      # hidden [copy * batch, piece, hidden]
    out.probs["q"]      # [copy * batch, head, query, key]: q from `hidden`, k and v clean
    out.z["v"]          # [copy * batch, query, head, d_head]: v from `hidden`, q and k clean

The layer's attention module is called again on the new hidden states (the input of its q, k and
v projections: after its own norm on pre-norm families), with every other argument of its clean
call (masks, RoPE's cos and sin, T5's position bias) repeated `copy` times along the batch, so a
block of changed inputs is one batched call of the family's own projections, q/k norms and
position encoding. Its attention function is intercepted: there q', k', v' meet the clean q, k, v
and, per channel, the probabilities and the heads' outputs are computed as eager attention does
(`attention.probs_and_output`: masks, windows, ALiBi, soft-capping, sinks). Grouped-query
attention: a query head's key and value are its key/value group's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from headprobe.core.errors import UsageError
from headprobe.model.attention import eager_probs, not_understood, probs_and_output, routed
from headprobe.model.layer_cache import CACHE_KWARGS, LayerCache
from headprobe.model.projections import features_last, projection_weight

CHANNELS = ("q", "k", "v")


@dataclass
class ChannelAttention:
    """Per channel: the probabilities and the heads' outputs with that channel changed."""

    probs: dict  # channel -> [copy * batch, head, query, key] float32 ("v": the clean ones)
    z: dict  # channel -> [copy * batch, query, head, d_head] float32
    qkv: tuple  # (q', k', v') as the attention function got them


def repeated(value, batch: int, copies: int):
    """`value` with every tensor of `batch` rows repeated `copies` times (copy-major), inside
    tuples, lists and dicts too; anything else unchanged."""
    if torch.is_tensor(value):
        if copies > 1 and value.dim() and value.shape[0] == batch:
            return value.repeat(copies, *([1] * (value.dim() - 1)))
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(repeated(v, batch, copies) for v in value)
    if isinstance(value, dict):
        return {k: repeated(v, batch, copies) for k, v in value.items()}
    return value


def recall(model, cache: LayerCache, layer: int, hidden, handler, projections=None, copies=None):
    """Call layer `layer`'s attention module on `hidden` [copy * batch, piece, hidden] with its
    clean call's other arguments repeated; `handler(module, q, k, v, mask, scaling, kwargs)`
    takes its attention function's call and returns what the module receives back.

    projections: None, or {projection module: its output [copy * batch, piece, features]}:
    those modules return the given outputs instead of computing them (`model.projected`), and
    `hidden` is None: the module reads a stand-in of `copies` copies, all NaN, so anything else
    that read it would show. The output projection is never run (its result is not used)."""
    site, call = cache.sites[layer], cache.calls[layer]
    batch = call.hidden().shape[0]
    if hidden is None:
        shape = (copies * batch, *call.hidden().shape[1:])
        nan = torch.full((1, 1, 1), float("nan"), dtype=call.hidden().dtype)
        hidden = nan.to(call.hidden().device).expand(shape)
    copies = hidden.shape[0] // batch
    args = repeated(call.args[1:], batch, copies)
    kwargs = {k: (None if k in CACHE_KWARGS else v) for k, v in call.kwargs.items()}
    kwargs = repeated(kwargs, batch, copies)
    hidden = hidden.to(call.hidden().dtype)
    if call.args:
        args = (hidden, *args)
    else:
        kwargs["hidden_states"] = hidden

    def intercept(module, query, key, value, mask, scaling, dropout, extra):
        return handler(module, query, key, value, mask, scaling, extra)

    given = {m: (lambda *a, out=out, **k: out) for m, out in (projections or {}).items()}
    if site.output is not None and site.output not in given:
        given[site.output] = _skipped(site.output)
    with routed(model, {site.module: intercept}), returning(given):
        site.module(*args, **kwargs)


def _skipped(projection):
    """A stand-in forward for an output projection whose result is not used: zeros of its
    output's shape, no product computed."""
    width = projection_weight(projection).shape[0]

    def forward(x, *args, **kwargs):
        shape = (*features_last(projection, x).shape[:-1], width)  # [batch, piece, out]
        zero = torch.zeros((1,) * len(shape), dtype=x.dtype, device=x.device).expand(shape)
        return features_last(projection, zero)

    return forward


@contextlib.contextmanager
def returning(forwards: dict):
    """Each module of `forwards` runs the given function instead of its own `forward` (an
    instance attribute, so another module of the class is untouched); put back on exit."""
    saved = {m: m.__dict__.get("forward") for m in forwards}
    try:
        for m, fn in forwards.items():
            m.forward = fn
        yield
    finally:
        for m, old in saved.items():
            if old is None:
                m.__dict__.pop("forward", None)
            else:
                m.forward = old


def channel_attention(
    model,
    cache: LayerCache,
    layer: int,
    hidden,
    channels=CHANNELS,
    rows: slice | None = None,
    projections=None,
    copies: int | None = None,
    clean_probs: torch.Tensor | None = None,
) -> ChannelAttention:
    """See the module docstring. hidden: [copy * batch, piece, hidden], what layer `layer`'s
    projections read (after its norm on pre-norm families); or None with `projections` and
    `copies` (`recall`: the projections' outputs given, `model.projected`). rows: only these
    query rows (`slice`), every one by default. clean_probs: [batch, head, query (rows), key]
    the clean probabilities (`clean_attention`), so that the value channel need not recompute
    them; its `probs["v"]` is then None (the value leaves the pattern as it is)."""
    call = cache.calls[layer]
    batch = call.hidden().shape[0]
    copies = hidden.shape[0] // batch if hidden is not None else copies
    clean = [repeated(t, batch, copies) for t in (call.query, call.key)]
    out = ChannelAttention({}, {}, ())

    def attention(module, q, k, v, mask, scaling, extra):
        if not not_understood(extra):
            probs = eager_probs(module, q, k, mask, scaling, extra, rows=rows)
            return probs, _attend(probs, v, copies)
        probs, z = probs_and_output(module, q, k, _full(v, copies), mask, scaling, 0.0, extra)
        probs = probs.float()
        return (probs, z) if rows is None else (probs[:, :, rows], z[:, rows])

    def handler(module, query, key, value, mask, scaling, extra):
        out.qkv = (query, key, value)
        for c in channels:
            if c == "v":
                probs = clean_probs
                if probs is None:
                    probs, _ = attention(module, *clean, call.value, mask, scaling, extra)
                out.probs["v"] = None if clean_probs is not None else probs.float()
                out.z["v"] = _attend(probs.float(), value.float(), copies, clean=False)
                continue
            qk = (query, clean[1]) if c == "q" else (clean[0], key)
            probs, z = attention(module, *qk, call.value, mask, scaling, extra)
            out.probs[c], out.z[c] = probs.float(), z.float()
        first = query
        shape = (first.shape[0], first.shape[2], first.shape[1], value.shape[-1])
        zero = torch.zeros((1,) * 4, dtype=first.dtype, device=first.device).expand(shape)
        return zero, None

    recall(model, cache, layer, hidden, handler, projections, copies)
    return out


def _full(value: torch.Tensor, copies: int) -> torch.Tensor:
    """The clean value [batch, kv_head, key, d_head] repeated for `copies` copies."""
    return repeated(value, value.shape[0], copies)


def _attend(probs: torch.Tensor, value: torch.Tensor, copies: int, clean: bool = True):
    """[copy * batch, query, head, d_head]: `attention.attend` where one side is shared by
    every copy (broadcast, not repeated). clean: `value` [batch, kv_head, key, d_head] is the
    clean one and probs [copy * batch, head, query, key] changed; else `probs` [batch, ...]
    are the clean ones and `value` [copy * batch, ...] changed."""
    batch = value.shape[0] if clean else probs.shape[0]
    groups = probs.shape[1] // value.shape[1]
    if groups > 1:
        value = value.repeat_interleave(groups, dim=1)  # [.., head, key, d_head]
    p = probs.view(-1, batch, *probs.shape[1:])  # [copy or 1, batch, head, query, key]
    v = value.view(-1, batch, *value.shape[1:])  # [copy or 1, batch, head, key, d_head]
    if p.dtype != v.dtype:
        p = p.to(v.dtype)
    z = torch.matmul(p, v)  # [copy, batch, head, query, d_head]
    return z.transpose(2, 3).flatten(0, 1)  # [copy * batch, query, head, d_head]


def clean_attention(model, cache: LayerCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs [batch, head, query, key], z [batch, query, head, d_head]) float32 of the clean call,
    computed as `channel_attention` computes the changed ones."""
    call = cache.calls[layer]
    probs, z = probs_and_output(
        cache.sites[layer].module,
        call.query,
        call.key,
        call.value,
        call.mask,
        call.scaling,
        0.0,
        call.extra,
    )
    return probs.float(), z.float()


def layer_input(cache: LayerCache, layer: int, x: torch.Tensor) -> torch.Tensor:
    """What layer `layer`'s projections read when the residual stream entering it is x
    [..., piece, hidden]: its norm of x (pre-norm), else x itself."""
    norm = cache.sites[layer].norm_in
    return x if norm is None else norm(x.to(cache.calls[layer].hidden().dtype))


@torch.no_grad()
def projection_weights(model, cache: LayerCache, layer: int) -> tuple:
    """(W_Q [head, hidden, d_head], W_K [kv_head, hidden, d_head], W_V [kv_head, hidden, d_head])
    of layer `layer`, read off its own projections: the module called on the basis vectors at one
    position (`cache` of a one-piece input, where RoPE is the identity), biases taken out. A
    family that normalises each head's query or key (Qwen-3's, Gemma-3's q/k norms) has no such
    matrices: UsageError (one line)."""
    call = cache.calls[layer]
    hidden = call.hidden().shape[-1]
    if call.hidden().shape[:2] != (1, 1):
        raise ValueError("projection_weights needs the cache of a one-piece input")
    basis = torch.eye(hidden, dtype=torch.float32, device=call.hidden().device)
    probe = torch.cat([basis, 2 * basis[:1], torch.zeros_like(basis[:1])])  # [hidden + 2, hidden]
    got = {}

    def handler(module, query, key, value, mask, scaling, extra):
        got["qkv"] = (query, key, value)
        shape = (query.shape[0], query.shape[2], query.shape[1], value.shape[-1])
        return torch.zeros(shape, dtype=query.dtype, device=query.device), None

    recall(model, cache, layer, probe[:, None, :], handler)
    out = []
    for t in got["qkv"]:  # [hidden + 2, head, 1, d_head]
        t = t[:, :, 0].float() - t[-1:, :, 0].float()  # bias out
        if not torch.allclose(t[hidden], 2 * t[0], rtol=1e-4, atol=1e-5):
            raise UsageError(
                f"composition weights: {type(model).__name__} normalises each head's query or key "
                "(q/k norms), so its heads have no W_Q, W_K matrices"
            )
        out.append(t[:hidden].transpose(0, 1))  # [head, hidden, d_head]
    return tuple(out)
