"""Capture per-head attention probabilities, one layer at a time.

    with AttentionCapture(model, layers=[2, 3], callback=fn):
        model(**inputs)            # fn(layer, probs) for layers 2 and 3, in order

`probs` is `[batch, head, query, key]` float32: softmax(Q K^T * scale + extra terms + mask),
the same numbers `output_attentions=True` gives under eager attention. It is handed on as
soon as the layer computes it and is not kept.

Which layers: those of one attention stack (`stack=`: "encoder", "decoder" or "cross" of an
encoder-decoder; a model with one stack has just that one; None: the encoder where there is
one), as `headprobe.sites.attention_sites` found them: every attention module wherever it
sits, a shared module (ALBERT) one layer per call. An encoder-decoder is run with the inputs
`Sites.model_inputs` forms.

Interface path: every attention call of the model goes through headprobe's attention
function (`headprobe.attention.routed`); for an asked-for layer the probabilities are
computed here (grouped query heads repeated, causal mask rebuilt where the fast path left it
out, extra terms such as T5's position bias or Gemma-2's soft-capping added as eager does;
a keyword not understood: the family's own eager attention computes them). Every other layer
runs the model's own implementation (SDPA, or its eager attention; flash/flex run as SDPA).

Legacy path (models that call no attention function: MPNet, DeBERTa-v2, BLOOM): the model
runs under eager attention for the capture, with `output_attentions=True`; the stack's
field of the output is handed on layer by layer (all layers of one batch held at once).

Never a silent zero: after every forward pass each asked-for layer must have been
captured; otherwise `CaptureError` (one line naming the model class and the path).
Everything is undone on exit.

Query blocks (`AttentionCapture(..., query_block=N)`): an asked-for layer's
probabilities are computed N query rows at a time, so one layer holds
O(N x keys) per head instead of O(queries x keys); the callback is then called
once per block as `callback(layer, probs_rows, block)`, `block` a `QueryBlock`
(rows `start:stop` of `total`), in row order, and the layer's output is
assembled from the blocks. Without `query_block` nothing changes (the callback
gets `(layer, probs)` for all rows). The legacy path, and a layer whose attention
the family's eager function computes, hand the blocks of the whole matrix.

Models spread over devices (accelerate's `device_map` / `dispatch_model`): each
layer's probabilities are computed, and handed on, on the device where that
layer runs (`probs.device`); nothing here moves them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import nn

from headprobe.attention import (CaptureError, attend, eager_probs, fallback, implementation_set, not_understood,
                                 probs_and_output, routed)
from headprobe.sites import LEGACY_FIELDS, attention_sites, model_device, text_config  # noqa: F401 (re-exported)

Callback = Callable[[int, torch.Tensor], None]


def n_layers_heads(model, stack: str | None = None) -> tuple[int, int]:
    """(layers, query heads) of one attention stack (default: the encoder where there is one)."""
    sites = attention_sites(model)
    return sites.n_layers(stack), sites.n_heads(stack)


def n_kv_heads(model, stack: str | None = None) -> int:
    """Key/value heads per layer: fewer than the query heads in grouped-query attention
    (query head h reads KV head h // (heads // kv_heads), as `eager_probs` repeats them)."""
    return attention_sites(model).n_kv_heads(stack)


def find_blocks(model) -> nn.ModuleList:
    """The model's list of Transformer blocks (the ModuleList with one entry per layer of its
    default stack), for code that works block by block (`headprobe.gates`). The attention
    itself is found by `headprobe.sites`, which needs no such list (ALBERT has none)."""
    n_layers = attention_sites(model).n_layers()
    for _, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == n_layers:
            return module
    raise ValueError(f"cannot find the {n_layers} Transformer blocks of {type(model).__name__}")


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


class AttentionCapture:
    """Context manager: hand each asked-for layer's attention to `callback(layer, probs)`.

    layers: iterable of 0-based layer indices of the stack, or None for all.
    query_block: None (the callback gets `(layer, probs)`, all query rows at once), or a
      number of query rows: the callback gets `(layer, probs_rows, QueryBlock)` per block.
    stack: "encoder", "decoder" or "cross" (`headprobe.sites`); None: the model's default.
    After use, `calls_` counts the captured calls per layer.
    """

    def __init__(self, model, layers: Iterable[int] | None = None, callback: Callback | None = None,
                 query_block: int | None = None, stack: str | None = None):
        self.model = model
        self.sites = attention_sites(model)
        self.stack = self.sites.resolve(stack)
        self.n_layers, self.n_heads = self.sites.n_layers(self.stack), self.sites.n_heads(self.stack)
        self.layers = set(range(self.n_layers)) if layers is None else {int(x) for x in layers}
        bad = sorted(x for x in self.layers if not 0 <= x < self.n_layers)
        if bad:
            raise ValueError(f"layers {bad} out of range: the model has layers 0..{self.n_layers - 1}")
        self.callback = callback or (lambda layer, probs, block=None: None)
        if query_block is not None and int(query_block) < 1:
            raise ValueError(f"query_block must be at least 1, not {query_block}")
        self.query_block = int(query_block) if query_block else None
        self.calls_: dict[int, int] = {}
        self.interface = self.sites.path == "interface"
        self._seen: dict = {}                   # this forward pass: module -> calls so far
        self._got: set[int] = set()             # this forward pass: layers captured
        self._exit = contextlib.ExitStack()

    # -- interface path -------------------------------------------------------------
    def _handle(self, module, query, key, value, mask, scaling, dropout, kwargs):
        """One attention call of a site module: captured if it is an asked-for layer."""
        sites = self._calls[module]
        n = self._seen[module] = self._seen.get(module, 0) + 1
        if n > len(sites):
            raise CaptureError(f"{self.sites.model_class}: {type(module).__name__} ran {n} times in one forward "
                               f"pass, {len(sites)} when its attention was found (interface path)")
        site = sites[n - 1]
        if site.stack != self.stack or site.layer not in self.layers:
            return fallback(module)(module, query, key, value, mask, scaling=scaling, dropout=dropout, **kwargs)
        layer = site.layer
        self.calls_[layer] = self.calls_.get(layer, 0) + 1
        self._got.add(layer)
        if not_understood(kwargs):                                    # the family's eager attention
            probs, output = probs_and_output(module, query, key, value, mask, scaling, dropout, kwargs)
            self._hand_on(layer, probs)
            return output, None
        if self.query_block:
            return self._attend_in_blocks(layer, module, query, key, value, mask, scaling, kwargs), None
        probs = eager_probs(module, query, key, mask, scaling, kwargs)   # [batch, head, query, key]
        output = attend(probs, value)
        self.callback(layer, probs)
        return output, None

    def _attend_in_blocks(self, layer, module, query, key, value, attention_mask, scaling, kwargs):
        """One captured layer, `query_block` query rows at a time: each block's probabilities
        are handed on and dropped before the next is computed."""
        groups = query.shape[1] // key.shape[1]
        if groups > 1:                                               # repeated once, not per block
            key = key.repeat_interleave(groups, dim=1)
            value = value.repeat_interleave(groups, dim=1)
        n_query = query.shape[-2]
        outputs = []
        for start in range(0, n_query, self.query_block):
            stop = min(start + self.query_block, n_query)
            probs = eager_probs(module, query, key, attention_mask, scaling, kwargs, rows=slice(start, stop))
            outputs.append(attend(probs, value))                      # [batch, rows, head, dim]
            self.callback(layer, probs, QueryBlock(start, stop, n_query))
            del probs
        return torch.cat(outputs, dim=1) if len(outputs) > 1 else outputs[0]

    def _hand_on(self, layer: int, probs: torch.Tensor) -> None:
        """A whole layer's probabilities [batch, head, query, key], in blocks if asked."""
        if not self.query_block:
            self.callback(layer, probs)
            return
        n_query = probs.shape[-2]
        for start in range(0, n_query, self.query_block):
            stop = min(start + self.query_block, n_query)
            self.callback(layer, probs[:, :, start:stop], QueryBlock(start, stop, n_query))

    # -- legacy path: output_attentions under eager ---------------------------------
    def _take_legacy(self, output) -> None:
        attentions = getattr(output, self.sites.fields[self.stack], None) or ()   # per layer [b, h, q, k]
        for layer, probs in enumerate(attentions):
            if layer in self.layers and probs is not None:
                self.calls_[layer] = self.calls_.get(layer, 0) + 1
                self._got.add(layer)
                self._hand_on(layer, probs.float())
        for name in ("attentions", *LEGACY_FIELDS.values()):         # not kept on the output
            if getattr(output, name, None) is not None:
                setattr(output, name, None)

    # -- every forward pass -----------------------------------------------------------
    def _begin(self, module, args, kwargs):
        self._seen.clear()
        self._got.clear()
        if not self.interface:
            kwargs["output_attentions"] = True
        return args, kwargs

    def _end(self, module, args, kwargs, output):
        if not self.interface:
            self._take_legacy(output)
        missing = sorted(self.layers - self._got)
        if missing:
            path = "interface" if self.interface else "legacy (output_attentions under eager)"
            raise CaptureError(f"{self.sites.model_class}: {len(self._got)} of the {len(self.layers)} asked-for "
                               f"layers of its {self.stack} attention were captured in a forward pass ({path} "
                               f"path); missing layers {missing[:10]}")
        return output

    def __enter__(self):
        try:
            if self.interface:
                self._calls = self.sites.calls()
                self._exit.enter_context(routed(self.model, {m: self._handle for m in self._calls}))
            else:
                self._exit.enter_context(implementation_set(self.model, "eager"))
            for handle in (self.model.register_forward_pre_hook(self._begin, with_kwargs=True),
                           self.model.register_forward_hook(self._end, with_kwargs=True)):
                self._exit.callback(handle.remove)
        except BaseException:
            self._exit.close()
            raise
        return self

    def __exit__(self, *exc):
        self._exit.close()
        return False
