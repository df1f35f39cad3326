"""Attention as eager attention computes it, and the one attention function headprobe
registers with transformers.

    probs = eager_probs(module, query, key, mask, scaling, kwargs)   # [batch, head, query, key]
    with routed(model, "sdpa", {module: handler}):                   # every call of `module`
        model(**inputs)                                              # goes to `handler`

transformers (>= 5) routes every attention call through its `AttentionInterface`:
`attention_function(module, query, key, value, attention_mask, scaling=, dropout=, **kwargs)`.
headprobe registers `headprobe_sdpa` / `headprobe_eager` (with the matching mask builders);
`routed` switches a model's configs to one of them and routes the calls of chosen modules
(or of every module) to a handler; everything else goes to `fallback(module)`, the
function the model itself would have used. Everything is undone on exit.

Extra terms (`EXTRA_TERMS`) are computed here exactly as eager attention does: T5's
relative `position_bias` (added to the scores), Gemma-2's `softcap` (tanh soft-capping),
`is_causal`; sliding windows (Mistral, Gemma, ModernBERT's local layers) and ALiBi-style
biases arrive inside the mask. Keyword arguments that do not change the numbers
(`HARMLESS`) are ignored. Any other keyword with a value is not understood: the
probabilities then come from the model family's own `eager_attention_forward` (its
modeling module's), never computed without it (`probs_and_output`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

from headprobe.core.errors import CaptureError

# keyword arguments `eager_probs` computes with
EXTRA_TERMS = ("position_bias", "softcap", "is_causal", "sliding_window")
# keyword arguments that do not change eager attention's numbers (positions are already in q/k;
# caches, flash-attention varlen bookkeeping and output flags do not enter the softmax)
HARMLESS = frozenset(
    {
        "position_ids",
        "use_cache",
        "cache_position",
        "past_key_values",
        "past_key_value",
        "layer_idx",
        "encoder_hidden_states",
        "deterministic",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
        "token_type_ids",
        "attention_type",
    }
)

# attention module -> handler(module, query, key, value, mask, scaling, dropout, kwargs) -> (output, weights)
_ROUTES: dict[nn.Module, Callable] = {}
_EVERY: list[Callable] = []  # handlers for every module (discovery), innermost last
_FALLBACK: dict[nn.Module, Callable] = {}  # module -> the function the model would have used


def not_understood(kwargs: dict) -> list[str]:
    """Keyword arguments with a value that `eager_probs` does not compute with."""
    return sorted(
        k for k, v in kwargs.items() if v is not None and k not in EXTRA_TERMS and k not in HARMLESS
    )


def family_eager(module) -> Callable | None:
    """The `eager_attention_forward` of the module's modeling module (its family's eager
    attention: `(output [batch, query, head, dim], weights [batch, head, query, key])`), or None."""
    return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)


def _rebuild_causal(scores, module, kwargs, start: int, n_total: int) -> None:
    """No mask given (SDPA's is_causal fast path): mask the keys after each query, if causal."""
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", False) if causal is None else causal
    n_rows, n_key = scores.shape[-2], scores.shape[-1]
    if causal and n_total > 1:
        keep = torch.ones(n_rows, n_key, dtype=torch.bool, device=scores.device).tril(
            start + n_key - n_total
        )
        scores.masked_fill_(~keep, torch.finfo(scores.dtype).min)


def _apply_mask(scores, attention_mask, module, kwargs, start: int, n_total: int) -> None:
    """Mask `scores` [batch, head, rows, key] in place: a boolean mask (True = attend), an
    additive float mask, or none (the causal mask rebuilt where the call is causal)."""
    n_key = scores.shape[-1]
    if attention_mask is None:
        _rebuild_causal(scores, module, kwargs, start, n_total)
    elif attention_mask.dtype == torch.bool:  # [batch, 1, query, key], True = attend
        scores.masked_fill_(~attention_mask[..., :n_key], torch.finfo(scores.dtype).min)
    else:  # additive float mask
        mask = attention_mask if attention_mask.shape[-1] == n_key else attention_mask[..., :n_key]
        if mask.dtype != torch.float32:
            mask = mask.float()
        scores.add_(mask.clamp_min(torch.finfo(scores.dtype).min))


def eager_probs(
    module,
    query,
    key,
    attention_mask,
    scaling,
    kwargs,
    rows: slice | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(Q K^T * scale [softcapped] + position_bias + mask) as eager attention computes
    it, in float32: `[batch, head, query, key]`.

    rows: only these query rows (`slice(start, stop)`, a query block); the mask and the bias
    are cut to them and a rebuilt causal mask is shifted by `start`. None: every row.
    out: a float32 tensor of that shape to write the probabilities into (a slot of a buffer
    that holds several layers, so that stacking them costs no copy)."""
    # query: [batch, head, query, dim]; key: [batch, kv_head, key, dim]
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention
        key = key.repeat_interleave(groups, dim=1)  # [batch, head, key, dim]
    n_total = query.shape[-2]
    start, stop = (0, n_total) if rows is None else (rows.start, rows.stop)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    # scores in float32 even when the model runs in bfloat16/float16: the probabilities we hand on
    # are as exact as the inputs allow (eager attention in fp32 is matched to <= 1e-5)
    if rows is not None:
        query = query[:, :, start:stop]
    if query.dtype != torch.float32:  # no op where the model runs in float32
        query, key = query.float(), key.float()
    scores = torch.matmul(query, key.transpose(-1, -2)).mul_(scaling)  # [batch, head, rows, key]
    softcap = kwargs.get("softcap")
    if softcap is not None:
        scores = torch.tanh(scores / softcap).mul_(softcap)
    n_key = scores.shape[-1]
    bias = kwargs.get("position_bias")  # [batch or 1, head, query, key]
    if bias is not None:
        scores.add_(
            bias[..., start:stop, :n_key].float()
            if bias.shape[-2] == n_total
            else bias[..., :n_key].float()
        )
    if (
        attention_mask is not None
        and attention_mask.shape[-2] == n_total
        and n_total > 1
        and rows is not None
    ):
        attention_mask = attention_mask[..., start:stop, :]  # the block's rows of the mask
    _apply_mask(scores, attention_mask, module, kwargs, start, n_total)
    if out is not None:  # `_softmax.out`: the probabilities written where the caller keeps them
        return torch._softmax(scores, -1, False, out=out)  # [batch, head, rows, key]
    return torch.softmax(scores, dim=-1, dtype=torch.float32)  # [batch, head, rows, key]


def visible_keys(module, attention_mask, kwargs, n_query: int, n_key: int) -> torch.Tensor:
    """[query, key] bool: the keys each query may attend to under this call's mask (its own
    mask, else its `is_causal`), first example, first head; extra terms left out."""
    zeros_q = torch.zeros(1, 1, n_query, 1)
    zeros_k = torch.zeros(1, 1, n_key, 1)
    mask = None if attention_mask is None else attention_mask[:1, :1].cpu()
    probs = eager_probs(module, zeros_q, zeros_k, mask, 1.0, {"is_causal": kwargs.get("is_causal")})
    return probs[0, 0] > 0  # [query, key]


def attend(probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Attention output from probabilities: [batch, query, head, dim]."""
    # probs: [batch, head, query, key]; value: [batch, kv_head, key, dim]
    groups = probs.shape[1] // value.shape[1]
    if groups > 1:
        value = value.repeat_interleave(groups, dim=1)  # [batch, head, key, dim]
    if probs.dtype != value.dtype:
        probs = probs.to(value.dtype)
    output = torch.matmul(probs, value)  # [batch, head, query, dim]
    return output.transpose(1, 2).contiguous()


def probs_and_output(module, query, key, value, attention_mask, scaling, dropout, kwargs):
    """(probs [batch, head, query, key] float32, output [batch, query, head, dim]) of one call:
    computed here when every keyword is understood, else by the family's eager attention."""
    strange = not_understood(kwargs)
    if not strange:
        probs = eager_probs(module, query, key, attention_mask, scaling, kwargs)
        return probs, attend(probs, value)
    eager = family_eager(module)
    if eager is None:
        raise CaptureError(
            f"{type(module).__name__}: attention keyword {', '.join(strange)} is not understood "
            f"and {type(module).__module__} has no eager_attention_forward to compute it"
        )
    output, weights = eager(
        module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
    )
    if weights is None:
        raise CaptureError(f"{type(module).__name__}: its eager attention returned no weights")
    return weights.float(), output


def fallback(module) -> Callable:
    """The attention function the model would have called for `module` (SDPA, or its eager)."""
    return _FALLBACK.get(module, sdpa_attention_forward)


def headprobe_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
):
    """Attention function registered with transformers while a model is `routed`."""
    handler = _ROUTES.get(module) or (_EVERY[-1] if _EVERY else None)
    if handler is None:
        return fallback(module)(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    return handler(module, query, key, value, attention_mask, scaling, dropout, kwargs)


def _eager(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """A model's eager attention: its family's function, else `probs_and_output`'s."""
    eager = family_eager(module)
    if eager is not None:
        return eager(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    probs, output = probs_and_output(
        module, query, key, value, attention_mask, scaling, dropout, kwargs
    )
    return output, probs


for _impl, _mask in (("sdpa", sdpa_mask), ("eager", eager_mask)):
    AttentionInterface.register(f"headprobe_{_impl}", headprobe_attention)
    AttentionMaskInterface.register(f"headprobe_{_impl}", _mask)


def configs(model) -> list:
    """Every distinct config object inside `model` that names an attention implementation."""
    seen = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation_internal"):
            seen[id(config)] = config
    return list(seen.values())


def implementation(model) -> str:
    """The model's attention implementation as headprobe runs it: "eager" or "sdpa"
    (flash and flex attention run as SDPA while captured)."""
    config = (
        model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    )
    name = (config._attn_implementation or "eager").removeprefix("headprobe_")
    return "eager" if name == "eager" else "sdpa"


@contextlib.contextmanager
def implementation_set(model, name: str):
    """Every config of `model` set to attention implementation `name`; put back on exit."""
    saved = [(config, config._attn_implementation_internal) for config in configs(model)]
    try:
        for config, _ in saved:
            config._attn_implementation_internal = name
        yield
    finally:
        for config, value in saved:
            config._attn_implementation_internal = value


@contextlib.contextmanager
def routed(model, routes: dict[nn.Module, Callable] | None = None, every: Callable | None = None):
    """`model` runs headprobe's attention function: calls of the modules in `routes` go to
    their handler, any other module's to `every` if given, else to the function the model
    would have used. Undone on exit, also after an exception."""
    impl = implementation(model)
    routes = routes or {}
    added = [m for m in routes if m not in _ROUTES]
    own = _eager if impl == "eager" else AttentionInterface()["sdpa"]  # as registered now
    fallbacks = {m: own for m in model.modules() if m not in _FALLBACK}
    try:
        _ROUTES.update({m: routes[m] for m in added})
        _FALLBACK.update(fallbacks)
        if every is not None:
            _EVERY.append(every)
        with implementation_set(model, f"headprobe_{impl}"):
            yield
    finally:
        if every is not None:
            _EVERY.remove(every)
        for m in added:
            _ROUTES.pop(m, None)
        for m in fallbacks:
            _FALLBACK.pop(m, None)


# ---------------------------------------------------------------- measures (METHODS §7)


def norm_attention(
    probs: torch.Tensor, value_norms: torch.Tensor, rows: bool = False
) -> torch.Tensor:
    """N = a * ||v W_O|| per head: probs [..., batch, head, query, key] (or a block of query
    rows; leading axes such as layers kept), value_norms [..., batch, head, key]; with `rows`,
    each row divided by its sum (zero rows stay 0)."""
    if value_norms.dtype != probs.dtype:
        value_norms = value_norms.to(probs.dtype)
    n = probs * value_norms[..., None, :]  # [..., batch, head, query, key]
    return row_shares(n) if rows else n


def row_shares(n: torch.Tensor) -> torch.Tensor:
    """Each row of n [..., query, key] divided by its sum; a row summing to 0 stays 0."""
    total = n.sum(-1, keepdim=True)  # [..., query, 1]
    return torch.where(
        total > 0, n / total.clamp_min(torch.finfo(n.dtype).tiny), torch.zeros_like(n)
    )
