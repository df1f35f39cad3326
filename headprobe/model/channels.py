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

from dataclasses import dataclass

import torch

from headprobe.core.errors import UsageError
from headprobe.model.attention import attend, probs_and_output, routed
from headprobe.model.layer_cache import CACHE_KWARGS, LayerCache

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


def recall(model, cache: LayerCache, layer: int, hidden: torch.Tensor, handler):
    """Call layer `layer`'s attention module on `hidden` [copy * batch, piece, hidden] with its
    clean call's other arguments repeated; `handler(module, q, k, v, mask, scaling, kwargs)`
    takes its attention function's call and returns what the module receives back."""
    site, call = cache.sites[layer], cache.calls[layer]
    batch = call.hidden().shape[0]
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

    with routed(model, {site.module: intercept}):
        site.module(*args, **kwargs)


def channel_attention(
    model, cache: LayerCache, layer: int, hidden: torch.Tensor, channels=CHANNELS
) -> ChannelAttention:
    """See the module docstring. hidden: [copy * batch, piece, hidden], what layer `layer`'s
    projections read (after its norm on pre-norm families)."""
    call = cache.calls[layer]
    batch = call.hidden().shape[0]
    copies = hidden.shape[0] // batch
    clean = [repeated(t, batch, copies) for t in (call.query, call.key, call.value)]
    out = ChannelAttention({}, {}, ())

    def handler(module, query, key, value, mask, scaling, extra):
        changed = (query, key, value)
        out.qkv = changed
        for c in channels:
            i = CHANNELS.index(c)
            qkv = [changed[j] if j == i else clean[j] for j in range(3)]
            if c == "v":
                probs, _ = probs_and_output(module, *clean, mask, scaling, 0.0, extra)
                out.probs["v"] = probs.float()
                out.z["v"] = attend(probs.float(), qkv[2].float()).float()
                continue
            probs, z = probs_and_output(module, *qkv, mask, scaling, 0.0, extra)
            out.probs[c], out.z[c] = probs.float(), z.float()
        first = changed[0]
        shape = (first.shape[0], first.shape[2], first.shape[1], changed[2].shape[-1])
        return torch.zeros(shape, dtype=first.dtype, device=first.device), None

    recall(model, cache, layer, hidden, handler)
    return out


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
