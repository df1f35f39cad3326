"""Capture per-head attention probabilities, one layer at a time.

    with AttentionCapture(model, layers=[2, 3], callback=fn):
        model(**inputs)            # fn(layer, probs) for layers 2 and 3, in order

`probs` is `[batch, head, query, key]` float32: softmax(Q K^T * scale + mask),
the same numbers `output_attentions=True` gives under eager attention. It is
handed on as soon as the layer computes it and is not kept.

How: transformers (>= 5) routes every attention call through its
`AttentionInterface`. On entry we register a `headprobe_<impl>` attention
function, switch the model to it, and map each attention module to its layer.
For an asked-for layer the function computes the probabilities itself (grouped
query heads repeated, causal mask rebuilt where the fast path left it out);
every other layer is passed, untouched, to the model's own implementation
(SDPA; flash/flex fall back to SDPA). On exit everything is undone.

Models that do not use the interface (older code such as MPNet) fall back to
`output_attentions=True`, taken from the model's output and handed on layer by
layer; that path needs the model loaded with eager attention and holds all
layers of one batch at once.

Query blocks (`AttentionCapture(..., query_block=N)`): an asked-for layer's
probabilities are computed N query rows at a time, so one layer holds
O(N x keys) per head instead of O(queries x keys); the callback is then called
once per block as `callback(layer, probs_rows, block)`, `block` a `QueryBlock`
(rows `start:stop` of `total`), in row order, and the layer's output is
assembled from the blocks. Without `query_block` nothing changes (the callback
gets `(layer, probs)` for all rows). The legacy path hands one block of all rows.

Models spread over devices (accelerate's `device_map` / `dispatch_model`): each
layer's probabilities are computed, and handed on, on the device where that
layer runs (`probs.device`); nothing here moves them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

Callback = Callable[[int, torch.Tensor], None]

# attention module -> (capture, layer index), for every capture now open
_ACTIVE: dict[nn.Module, tuple["AttentionCapture", int]] = {}


def text_config(model):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def n_layers_heads(model) -> tuple[int, int]:
    config = text_config(model)
    n_layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer")
    n_heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head")
    return int(n_layers), int(n_heads)


def n_kv_heads(model) -> int:
    """Key/value heads per layer: fewer than the query heads in grouped-query attention
    (query head h reads KV head h // (heads // kv_heads), as `eager_probs` repeats them)."""
    config = text_config(model)
    kv = getattr(config, "num_key_value_heads", None)
    return int(kv) if isinstance(kv, int) and kv > 0 else n_layers_heads(model)[1]


def find_blocks(model) -> nn.ModuleList:
    """The model's list of Transformer blocks (the ModuleList with one entry per layer)."""
    n_layers, _ = n_layers_heads(model)
    for _, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == n_layers:
            return module
    raise ValueError(f"cannot find the {n_layers} Transformer blocks of {type(model).__name__}")


def uses_attention_interface(model) -> bool:
    return bool(getattr(model, "_supports_attention_backend", False))


def model_device(model) -> torch.device:
    """Where a model's inputs go: its parameters' device, or for a model dispatched over devices
    by accelerate (`hf_device_map`) its main device (the first GPU of the map, else the CPU;
    modules offloaded to "cpu"/"disk" run there, their weights on the "meta" device)."""
    device_map = getattr(model, "hf_device_map", None)
    if device_map:
        on = [d for d in device_map.values() if d not in ("cpu", "disk", "meta")]
        if not on:
            return torch.device("cpu")
        first = on[0]
        return torch.device(f"cuda:{first}" if isinstance(first, int) else first)
    return next(model.parameters()).device


@dataclass(frozen=True)
class QueryBlock:
    """Query rows `start:stop` of `total` (one block of a layer captured in query blocks)."""

    start: int
    stop: int
    total: int

    @property
    def first(self) -> bool:
        return self.start == 0

    @property
    def last(self) -> bool:
        return self.stop >= self.total


def eager_probs(module, query, key, attention_mask, scaling, kwargs, rows: slice | None = None) -> torch.Tensor:
    """softmax(Q K^T * scale + mask) as eager attention computes it, in float32.

    rows: only these query rows (`slice(start, stop)`, a query block); the mask is cut to
    them and a rebuilt causal mask is shifted by `start`. None: every row (the default path,
    unchanged)."""
    # query: [batch, head, query, dim]; key: [batch, kv_head, key, dim]
    groups = query.shape[1] // key.shape[1]
    if groups > 1:                                                   # grouped-query attention
        key = key.repeat_interleave(groups, dim=1)                   # [batch, head, key, dim]
    if rows is not None:
        return _block_probs(module, query, key, attention_mask, scaling, kwargs, rows)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    # scores in float32 even when the model runs in bfloat16/float16: the probabilities we hand on
    # are as exact as the inputs allow (eager attention in fp32 is matched to <= 1e-5)
    query, key = query.float(), key.float()
    scores = torch.matmul(query, key.transpose(-1, -2)).mul_(scaling)   # [batch, head, query, key]
    softcap = kwargs.get("softcap")
    if softcap is not None:
        scores = torch.tanh(scores / softcap).mul_(softcap)
    n_query, n_key = scores.shape[-2], scores.shape[-1]
    if attention_mask is None:
        causal = kwargs.get("is_causal")
        causal = getattr(module, "is_causal", False) if causal is None else causal
        if causal and n_query > 1:
            keep = torch.ones(n_query, n_key, dtype=torch.bool, device=scores.device).tril(n_key - n_query)
            scores.masked_fill_(~keep, torch.finfo(scores.dtype).min)
    elif attention_mask.dtype == torch.bool:                         # [batch, 1, query, key], True = attend
        scores.masked_fill_(~attention_mask[..., :n_key], torch.finfo(scores.dtype).min)
    else:                                                            # additive float mask
        scores.add_(attention_mask[..., :n_key].float().clamp_min(torch.finfo(scores.dtype).min))
    return torch.softmax(scores, dim=-1, dtype=torch.float32)        # [batch, head, query, key]


def _block_probs(module, query, key, attention_mask, scaling, kwargs, rows: slice) -> torch.Tensor:
    """`eager_probs` for query rows `rows` only ([batch, head, rows, key]); `key` has its
    grouped heads repeated already."""
    n_total = query.shape[-2]
    start, stop = rows.start, rows.stop
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    query, key = query[:, :, start:stop].float(), key.float()
    scores = torch.matmul(query, key.transpose(-1, -2)).mul_(scaling)   # [batch, head, rows, key]
    softcap = kwargs.get("softcap")
    if softcap is not None:
        scores = torch.tanh(scores / softcap).mul_(softcap)
    n_key = scores.shape[-1]
    if attention_mask is not None and attention_mask.shape[-2] == n_total and n_total > 1:
        attention_mask = attention_mask[..., start:stop, :]           # the block's rows of the mask
    if attention_mask is None:
        causal = kwargs.get("is_causal")
        causal = getattr(module, "is_causal", False) if causal is None else causal
        if causal and n_total > 1:
            keep = torch.ones(stop - start, n_key, dtype=torch.bool, device=scores.device).tril(
                start + n_key - n_total)
            scores.masked_fill_(~keep, torch.finfo(scores.dtype).min)
    elif attention_mask.dtype == torch.bool:
        scores.masked_fill_(~attention_mask[..., :n_key], torch.finfo(scores.dtype).min)
    else:
        scores.add_(attention_mask[..., :n_key].float().clamp_min(torch.finfo(scores.dtype).min))
    return torch.softmax(scores, dim=-1, dtype=torch.float32)


def attend(probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Attention output from probabilities: [batch, query, head, dim]."""
    # probs: [batch, head, query, key]; value: [batch, kv_head, key, dim]
    groups = probs.shape[1] // value.shape[1]
    if groups > 1:
        value = value.repeat_interleave(groups, dim=1)                # [batch, head, key, dim]
    output = torch.matmul(probs.to(value.dtype), value)               # [batch, head, query, dim]
    return output.transpose(1, 2).contiguous()


def headprobe_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention function registered with transformers while a capture is open."""
    capture, layer = _ACTIVE.get(module, (None, -1))
    if capture is None or layer not in capture.layers:
        fallback = capture.fallback if capture is not None else sdpa_attention_forward
        return fallback(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    capture.calls_[layer] = capture.calls_.get(layer, 0) + 1
    if capture.query_block:
        return _attend_in_blocks(capture, layer, module, query, key, value, attention_mask, scaling, kwargs), None
    probs = eager_probs(module, query, key, attention_mask, scaling, kwargs)   # [batch, head, query, key]
    output = attend(probs, value)
    capture.callback(layer, probs)
    return output, None


def _attend_in_blocks(capture, layer, module, query, key, value, attention_mask, scaling, kwargs):
    """One captured layer, `capture.query_block` query rows at a time: each block's
    probabilities are handed on and dropped before the next is computed."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:                                                   # repeated once, not per block
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    n_query = query.shape[-2]
    outputs = []
    for start in range(0, n_query, capture.query_block):
        stop = min(start + capture.query_block, n_query)
        probs = eager_probs(module, query, key, attention_mask, scaling, kwargs, rows=slice(start, stop))
        outputs.append(attend(probs, value))                          # [batch, rows, head, dim]
        capture.callback(layer, probs, QueryBlock(start, stop, n_query))
        del probs
    return torch.cat(outputs, dim=1) if len(outputs) > 1 else outputs[0]


for _impl, _mask in (("sdpa", sdpa_mask), ("eager", eager_mask)):
    AttentionInterface.register(f"headprobe_{_impl}", headprobe_attention)
    AttentionMaskInterface.register(f"headprobe_{_impl}", _mask)


class AttentionCapture:
    """Context manager: hand each asked-for layer's attention to `callback(layer, probs)`.

    layers: iterable of 0-based layer indices, or None for all.
    query_block: None (the callback gets `(layer, probs)`, all query rows at once), or a
      number of query rows: the callback gets `(layer, probs_rows, QueryBlock)` per block.
    After use, `calls_` counts the captured calls per layer.
    """

    def __init__(self, model, layers: Iterable[int] | None = None, callback: Callback | None = None,
                 query_block: int | None = None):
        self.model = model
        self.n_layers, self.n_heads = n_layers_heads(model)
        self.layers = set(range(self.n_layers)) if layers is None else {int(x) for x in layers}
        bad = sorted(x for x in self.layers if not 0 <= x < self.n_layers)
        if bad:
            raise ValueError(f"layers {bad} out of range: the model has layers 0..{self.n_layers - 1}")
        self.callback = callback or (lambda layer, probs, block=None: None)
        if query_block is not None and int(query_block) < 1:
            raise ValueError(f"query_block must be at least 1, not {query_block}")
        self.query_block = int(query_block) if query_block else None
        self.calls_: dict[int, int] = {}
        self.interface = uses_attention_interface(model)
        self._undo: list[Callable[[], None]] = []

    # -- interface path -------------------------------------------------------------
    def _configs(self):
        seen = {}
        for module in self.model.modules():
            config = getattr(module, "config", None)
            if config is not None and hasattr(config, "_attn_implementation_internal"):
                seen[id(config)] = config
        return list(seen.values())

    def _enter_interface(self):
        original = text_config(self.model)._attn_implementation or "eager"
        impl = original if original in ("sdpa", "eager") else "sdpa"
        self.fallback = AttentionInterface()[impl] if impl != "eager" else _eager_fallback
        for config in self._configs():
            saved = config._attn_implementation_internal
            config._attn_implementation_internal = f"headprobe_{impl}"
            self._undo.append(lambda config=config, saved=saved: setattr(config, "_attn_implementation_internal", saved))
        for layer, block in enumerate(find_blocks(self.model)):
            for module in block.modules():
                _ACTIVE[module] = (self, layer)
                self._undo.append(lambda module=module: _ACTIVE.pop(module, None))

    # -- legacy path: output_attentions ---------------------------------------------
    def _enter_legacy(self):
        def ask(module, args, kwargs):
            kwargs["output_attentions"] = True
            return args, kwargs

        def hand_on(module, args, kwargs, output):
            attentions = output.attentions                           # per layer [batch, head, query, key]
            for layer, probs in enumerate(attentions):
                if layer in self.layers:
                    self.calls_[layer] = self.calls_.get(layer, 0) + 1
                    if self.query_block:                             # one block: every row
                        self.callback(layer, probs.float(), QueryBlock(0, probs.shape[-2], probs.shape[-2]))
                    else:
                        self.callback(layer, probs.float())
            output.attentions = None
            return output

        for handle in (
            self.model.register_forward_pre_hook(ask, with_kwargs=True),
            self.model.register_forward_hook(hand_on, with_kwargs=True),
        ):
            self._undo.append(handle.remove)

    def __enter__(self):
        if self.interface:
            self._enter_interface()
        else:
            self._enter_legacy()
        return self

    def __exit__(self, *exc):
        while self._undo:
            self._undo.pop()()
        return False


def _eager_fallback(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention for the layers not captured when the model itself runs eager."""
    return attend(eager_probs(module, query, key, attention_mask, scaling, kwargs), value), None
