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
"""

from __future__ import annotations

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


def eager_probs(module, query, key, attention_mask, scaling, kwargs) -> torch.Tensor:
    """softmax(Q K^T * scale + mask) as eager attention computes it, in float32."""
    # query: [batch, head, query, dim]; key: [batch, kv_head, key, dim]
    groups = query.shape[1] // key.shape[1]
    if groups > 1:                                                   # grouped-query attention
        key = key.repeat_interleave(groups, dim=1)                   # [batch, head, key, dim]
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
    probs = eager_probs(module, query, key, attention_mask, scaling, kwargs)   # [batch, head, query, key]
    output = attend(probs, value)
    capture.calls_[layer] = capture.calls_.get(layer, 0) + 1
    capture.callback(layer, probs)
    return output, None


for _impl, _mask in (("sdpa", sdpa_mask), ("eager", eager_mask)):
    AttentionInterface.register(f"headprobe_{_impl}", headprobe_attention)
    AttentionMaskInterface.register(f"headprobe_{_impl}", _mask)


class AttentionCapture:
    """Context manager: hand each asked-for layer's attention to `callback(layer, probs)`.

    layers: iterable of 0-based layer indices, or None for all.
    After use, `calls_` counts the captured calls per layer.
    """

    def __init__(self, model, layers: Iterable[int] | None = None, callback: Callback | None = None):
        self.model = model
        self.n_layers, self.n_heads = n_layers_heads(model)
        self.layers = set(range(self.n_layers)) if layers is None else {int(x) for x in layers}
        bad = sorted(x for x in self.layers if not 0 <= x < self.n_layers)
        if bad:
            raise ValueError(f"layers {bad} out of range: the model has layers 0..{self.n_layers - 1}")
        self.callback = callback or (lambda layer, probs: None)
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
