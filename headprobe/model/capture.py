"""Capture per-head attention probabilities, one layer at a time.

    with AttentionCapture(model, layers=[2, 3], callback=fn):
        model(**inputs)            # fn(layer, probs) for layers 2 and 3, in order

`probs` is `[batch, head, query, key]` float32: softmax(Q K^T * scale + extra terms + mask),
the same numbers `output_attentions=True` gives under eager attention. It is handed on as
soon as the layer computes it and is not kept.

Which layers: those of one attention stack (`stack=`: "encoder", "decoder" or "cross" of an
encoder-decoder; a model with one stack has just that one; None: the encoder where there is
one), as `headprobe.model.discovery.attention_sites` found them: every attention module wherever it
sits, a shared module (ALBERT) one layer per call. An encoder-decoder is run with the inputs
`Sites.model_inputs` forms.

Interface path: every attention call of the model goes through headprobe's attention
function (`headprobe.model.attention.routed`); for an asked-for layer the probabilities are
computed here (grouped query heads repeated, causal mask rebuilt where the fast path left it
out, extra terms such as T5's position bias or Gemma-2's soft-capping added as eager does;
a keyword not understood: the family's own eager attention computes them). Every other layer
runs the model's own implementation (SDPA, or its eager attention; flash/flex run as SDPA).

Legacy path (models that call no attention function: MPNet, DeBERTa-v2, SqueezeBERT, BLOOM):
the model runs under eager attention for the capture, with `output_attentions=True`; the
stack's field of the output is handed on layer by layer (all layers of one batch held at once),
softmaxed where the site says the field holds scores (`AttentionSite.softmax`: SqueezeBERT).

Never a silent zero: after every forward pass each asked-for layer must have been
captured; otherwise `CaptureError` (one line naming the model class and the path).
Everything is undone on exit.

Stopping early (`AttentionCapture(..., stop=True)`, the scoring pass's): once every asked-for
layer has been handed on (its head outputs too, where asked), the forward pass ends there
(`StopForward`, raised inside the model and swallowed on exit, as baukit's `Trace(stop=True)`
does): the layers above the last asked-for one, the last one's MLP and any decoder after an
encoder are not run, and the model's output is never made. Only for a caller that reads
nothing but the captured quantities; on the legacy path, and for a model with modules
offloaded by accelerate (whose hooks must see every forward through), the pass runs whole.

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

Named captures (`AttentionCapture(..., needs={"probs", "value_norms"})`): a fixed set of
named per-head quantities (`head_quantities.QUANTITIES`, the idea of TransformerLens's hook points); only
the ones asked for are computed, and the callback gets them as a `Heads` mapping,
`callback(layer, heads)` (`heads.probs`, `heads.value_norms`; with query blocks
`callback(layer, heads, block)`, `value_norms` covering every key in each block). Without
`needs` the callback gets the probabilities tensor as above. `value_norms[b, h, j]` is
`||v_j^h W_O^h||` (METHODS §7, Kobayashi et al. 2020), computed inside the attention function
where the values are: `v` as the model computed it (bias included; in grouped-query
attention the value of h's KV group), `W_O^h` the block of the site's output projection
(`AttentionSite.output`: `o_proj`, GPT-2's Conv1D `c_proj`, BERT's `attention.output.dense`)
that reads head h's slice of the concatenated head outputs; cost O(heads x keys x d_head^2)
per example, nothing of size keys^2. `head_output[b, h, q]` is c_h = z_h W_O^h (METHODS §9):
head h's slice of the output projection's input times its block of W_O, bias left out,
`[batch, head, query, hidden]`; it is computed in a forward pre-hook on `AttentionSite.output`,
where the projection reads its input, and arrives in its own callback call after the layer's
attention (with query blocks: one block of every row). A pointwise nn.Conv1d output projection
(SqueezeBERT) reads channels first: its input is read as `features_last` gives it. On the
legacy path the values are the output of the site's value projection (`AttentionSite.value`,
found by `headprobe.model.sites`), read in a forward hook and handed on with the layer's
probabilities after the pass; head outputs arrive during the pass, before the probabilities. A
legacy site without a value projection (BLOOM's and Falcon's fused ones) or without an output
projection refuses `value_norms` or `head_output` with one line naming the model
(`CaptureUnavailable`).

`last_row[b, h, j]` is the last query row of `probs` alone, `[batch, head, key]`: at a decoding
step (one new token over the KV cache; `headprobe.model.decoding`) the whole of that step's
attention. It is computed from the call's query and keys as `eager_probs` computes any row (each
query head its own row: grouped-query heads read their KV group's keys), O(heads x keys), while
the model's own attention (SDPA) computes the layer's output; on the legacy path it is the last
row of `output_attentions`.

For notebooks, `capture_heads(model, needs=...)` keeps the quantities of one forward pass:

    with headprobe.capture_heads(model, needs={"probs", "value_norms"}) as heads:
        model(**tokenizer("The cat sat .", return_tensors="pt"))
    heads.probs[2]              # layer 2: [batch, head, query, key]
    heads.value_norms[2]        # [batch, head, key]
    heads.norms(2)              # N = probs * value_norms: [batch, head, query, key]

    with headprobe.capture_heads(model, needs={"head_output"}) as heads:
        model(**inputs)
    heads.head_output[2]        # [batch, head, query, hidden]: what each head writes
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from headprobe.model.attention import (
    CaptureError,
    attend,
    eager_probs,
    fallback,
    implementation_set,
    norm_attention,
    not_understood,
    probs_and_output,
    routed,
)
from headprobe.model.discovery import LEGACY_FIELDS, attention_sites
from headprobe.model.head_quantities import (
    CaptureUnavailable,
    Heads,
    check_capturable,
    check_needs,
    head_output,
    last_row,
    value_norms,
)
from headprobe.model.projections import (
    features_last,
)

Callback = Callable[[int, torch.Tensor], None]


class StopForward(Exception):  # noqa: N818 (a signal, not an error)
    """Raised inside the model by `AttentionCapture(stop=True)` once it has every asked-for
    layer, and swallowed by its exit."""


def n_layers_heads(model, stack: str | None = None) -> tuple[int, int]:
    """(layers, query heads) of one attention stack (default: the encoder where there is one)."""
    sites = attention_sites(model)
    return sites.n_layers(stack), sites.n_heads(stack)


def n_kv_heads(model, stack: str | None = None) -> int:
    """Key/value heads per layer: fewer than the query heads in grouped-query attention
    (query head h reads KV head h // (heads // kv_heads), as `eager_probs` repeats them)."""
    return attention_sites(model).n_kv_heads(stack)


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
    stack: "encoder", "decoder" or "cross" (`headprobe.model.sites`); None: the model's default.
    needs: None (the callback gets the probabilities), or names from `QUANTITIES`: the
      callback gets a `Heads` mapping of exactly those (`(layer, heads)`, or with query
      blocks `(layer, heads, QueryBlock)`); nothing not asked for is computed.
    into: None, or `into(layer, shape, device)` -> a float32 tensor of `shape` [batch, head, query, key]
      (or None) where a whole layer's probabilities are written as they are computed (a slot of
      the caller's buffer of several layers: stacked without a copy).
    stop: end the forward pass once every asked-for layer is handed on (module docstring); the
      caller reads nothing of the model's output.
    After use, `calls_` counts the captured calls per layer.
    """

    def __init__(
        self,
        model,
        layers: Iterable[int] | None = None,
        callback: Callback | None = None,
        query_block: int | None = None,
        stack: str | None = None,
        needs=None,
        into: Callable | None = None,
        stop: bool = False,
    ):
        self.model = model
        self.into = into
        self.needs = check_needs(needs)
        self.wanted = self.needs if self.needs is not None else frozenset({"probs"})
        check_capturable(model, self.wanted)
        self.sites = attention_sites(model)
        self.stack = self.sites.resolve(stack)
        self.n_layers, self.n_heads = (
            self.sites.n_layers(self.stack),
            self.sites.n_heads(self.stack),
        )
        self.layers = set(range(self.n_layers)) if layers is None else {int(x) for x in layers}
        bad = sorted(x for x in self.layers if not 0 <= x < self.n_layers)
        if bad:
            raise ValueError(
                f"layers {bad} out of range: the model has layers 0..{self.n_layers - 1}"
            )
        self.callback = callback or (lambda layer, probs, block=None: None)
        if query_block is not None and int(query_block) < 1:
            raise ValueError(f"query_block must be at least 1, not {query_block}")
        self.query_block = int(query_block) if query_block else None
        self.calls_: dict[int, int] = {}
        self.interface = self.sites.path == "interface"
        self._seen: dict = {}  # this forward pass: module -> calls so far
        self._out_seen: dict = {}  # this forward pass: output projection -> calls so far
        self._values_seen: dict = {}  # this forward pass (legacy): value projection -> calls so far
        self._legacy_norms: dict[int, torch.Tensor] = {}  # this pass (legacy): layer -> value_norms
        self._got: set[int] = set()  # this forward pass: layers captured
        self._outs_got: set[int] = set()  # this forward pass: layers whose head outputs were given
        self.stop = bool(stop) and self.interface and not offloaded(model)
        self._exit = contextlib.ExitStack()

    # -- interface path -------------------------------------------------------------
    def _handle(self, module, query, key, value, mask, scaling, dropout, kwargs):
        """One attention call of a site module: captured if it is an asked-for layer; with `stop`,
        the pass ends after the last one (and its head outputs, where asked)."""
        output = self._attention(module, query, key, value, mask, scaling, dropout, kwargs)
        if self.stop and "head_output" not in self.wanted and self._got == self.layers:
            raise StopForward
        return output

    def _attention(self, module, query, key, value, mask, scaling, dropout, kwargs):
        sites = self._calls[module]
        n = self._seen[module] = self._seen.get(module, 0) + 1
        if n > len(sites):
            raise CaptureError(
                f"{self.sites.model_class}: {type(module).__name__} ran {n} times in one forward "
                f"pass, {len(sites)} when its attention was found (interface path)"
            )
        site = sites[n - 1]
        if site.stack != self.stack or site.layer not in self.layers:
            return fallback(module)(
                module, query, key, value, mask, scaling=scaling, dropout=dropout, **kwargs
            )
        layer = site.layer
        self.calls_[layer] = self.calls_.get(layer, 0) + 1
        self._got.add(layer)
        extra = {}
        if "last_row" in self.wanted:
            extra["last_row"] = last_row(module, query, key, value, mask, scaling, dropout, kwargs)
        if "value_norms" in self.wanted:
            extra["value_norms"] = value_norms(site, value, query.shape[1])  # [batch, head, key]
        if "probs" not in self.wanted:  # nothing else to compute here
            n = query.shape[-2]
            if extra:
                self._give(layer, None, extra, QueryBlock(0, n, n) if self.query_block else None)
            return fallback(module)(
                module, query, key, value, mask, scaling=scaling, dropout=dropout, **kwargs
            )
        if not_understood(kwargs):  # the family's eager attention
            probs, output = probs_and_output(
                module, query, key, value, mask, scaling, dropout, kwargs
            )
            self._hand_on(layer, probs, extra)
            return output, None
        if self.query_block:
            return self._attend_in_blocks(
                layer, module, query, key, value, mask, scaling, kwargs, extra
            ), None
        shape = (query.shape[0], query.shape[1], query.shape[-2], key.shape[-2])
        out = self.into(layer, shape, query.device) if self.into is not None else None
        probs = eager_probs(module, query, key, mask, scaling, kwargs, out=out)  # [b, h, q, k]
        output = attend(probs, value)
        self._give(layer, probs, extra)
        return output, None

    def _head_output(self, module, args):
        """Forward pre-hook on an output projection: hand on `head_output` of an asked-for layer
        (its own callback call, after the layer's attention; one block of every row)."""
        sites = self._outputs[module]
        n = self._out_seen[module] = self._out_seen.get(module, 0) + 1
        if n > len(sites):
            raise CaptureError(
                f"{self.sites.model_class}: {type(module).__name__} ran {n} times in one forward "
                f"pass, {len(sites)} when its attention was found (head_output)"
            )
        site = sites[n - 1]
        if site.stack != self.stack or site.layer not in self.layers:
            return None
        output = head_output(site, args[0], site.heads)  # [batch, head, query, hidden]
        rows = output.shape[-2]
        block = QueryBlock(0, rows, rows) if self.query_block else None
        self._give(site.layer, None, {"head_output": output}, block)
        self._outs_got.add(site.layer)
        if self.stop and self._outs_got == self.layers:
            raise StopForward
        return None

    def _output_hooks(self) -> None:
        """Register `_head_output` on every output projection (a shared one once, its sites in
        call order); an asked-for layer without one is `CaptureUnavailable` (one line)."""
        self._outputs: dict[nn.Module, list] = {}
        for site in self.sites.sites:
            if site.output is None and site.stack == self.stack and site.layer in self.layers:
                raise CaptureUnavailable(
                    f"head_output: {self.sites.model_class} {site.name or site.stack} has no "
                    "output projection headprobe can find"
                )
            if site.output is not None:
                self._outputs.setdefault(site.output, []).append(site)
        for module in self._outputs:
            self._exit.callback(module.register_forward_pre_hook(self._head_output).remove)

    def _give(
        self, layer: int, probs: torch.Tensor | None, extra: dict, block: QueryBlock | None = None
    ):
        """Call the callback with the probabilities (no `needs`) or a `Heads` of what was asked."""
        if self.needs is None:
            payload = probs
        else:
            payload = Heads({"probs": probs} if probs is not None else {})
            payload.update(extra)
        if block is None:
            self.callback(layer, payload)
        else:
            self.callback(layer, payload, block)

    def _attend_in_blocks(
        self, layer, module, query, key, value, attention_mask, scaling, kwargs, extra
    ):
        """One captured layer, `query_block` query rows at a time: each block's probabilities
        are handed on and dropped before the next is computed."""
        groups = query.shape[1] // key.shape[1]
        if groups > 1:  # repeated once, not per block
            key = key.repeat_interleave(groups, dim=1)
            value = value.repeat_interleave(groups, dim=1)
        n_query = query.shape[-2]
        outputs = []
        for start in range(0, n_query, self.query_block):
            stop = min(start + self.query_block, n_query)
            probs = eager_probs(
                module, query, key, attention_mask, scaling, kwargs, rows=slice(start, stop)
            )
            outputs.append(attend(probs, value))  # [batch, rows, head, dim]
            self._give(layer, probs, extra, QueryBlock(start, stop, n_query))
            del probs
        return torch.cat(outputs, dim=1) if len(outputs) > 1 else outputs[0]

    def _whole(self, n_query: int) -> QueryBlock | None:
        """The block of every query row where the callback takes blocks, else None."""
        return QueryBlock(0, n_query, n_query) if self.query_block else None

    def _hand_on(self, layer: int, probs: torch.Tensor, extra: dict | None = None) -> None:
        """A whole layer's probabilities [batch, head, query, key], in blocks if asked."""
        if not self.query_block:
            self._give(layer, probs, extra or {})
            return
        n_query = probs.shape[-2]
        for start in range(0, n_query, self.query_block):
            stop = min(start + self.query_block, n_query)
            self._give(
                layer, probs[:, :, start:stop], extra or {}, QueryBlock(start, stop, n_query)
            )

    # -- legacy path: output_attentions under eager ---------------------------------
    def _take_legacy(self, output) -> None:
        attentions = (
            getattr(output, self.sites.fields[self.stack], None) or ()
        )  # per layer [b, h, q, k]
        sites = self.sites.of(self.stack)
        for layer, probs in enumerate(attentions):
            if layer in self.layers and probs is not None:
                self.calls_[layer] = self.calls_.get(layer, 0) + 1
                self._got.add(layer)
                probs = probs.float().softmax(-1) if sites[layer].softmax else probs.float()
                extra = {"last_row": probs[:, :, -1]} if "last_row" in self.wanted else {}
                if "value_norms" in self.wanted:
                    extra["value_norms"] = self._legacy_norms.pop(layer)  # [batch, head, key]
                if "probs" in self.wanted:
                    self._hand_on(layer, probs, extra)
                else:
                    self._give(layer, None, extra, self._whole(probs.shape[-2]))
        for name in ("attentions", *LEGACY_FIELDS.values()):  # not kept on the output
            if getattr(output, name, None) is not None:
                setattr(output, name, None)

    def _legacy_values(self, module, args, output):
        """Forward hook on a legacy site's value projection: keep `value_norms` of an asked-for
        layer for `_take_legacy` (the output read as heads side by side by `value_index`)."""
        sites = self._values[module]
        n = self._values_seen[module] = self._values_seen.get(module, 0) + 1
        site = sites[(n - 1) % len(sites)]
        if site.stack != self.stack or site.layer not in self.layers:
            return None
        y = features_last(module, output)  # [batch, key, feature]
        v = y[..., site.value_index.to(y.device)].unflatten(-1, (site.kv_heads, site.d_head))
        v = v.transpose(1, 2)  # [batch, kv_head, key, d_head]
        self._legacy_norms[site.layer] = value_norms(site, v, site.heads)  # [batch, head, key]
        return None

    def _legacy_hooks(self) -> None:
        """The legacy path: eager attention, a value hook per value projection (`value_norms`)
        and the output projections' hooks (`head_output`)."""
        self._exit.enter_context(implementation_set(self.model, "eager"))
        if "value_norms" in self.wanted:
            self._values: dict[nn.Module, list] = {}
            for site in self.sites.sites:
                self._values.setdefault(site.value, []).append(site)
            for module in self._values:
                self._exit.callback(module.register_forward_hook(self._legacy_values).remove)
        if "head_output" in self.wanted:
            self._output_hooks()

    # -- every forward pass -----------------------------------------------------------
    def _begin(self, module, args, kwargs):
        self._seen.clear()
        self._out_seen.clear()
        self._values_seen.clear()
        self._legacy_norms.clear()
        self._got.clear()
        self._outs_got.clear()
        if not self.interface:
            kwargs["output_attentions"] = True
        return args, kwargs

    def _end(self, module, args, kwargs, output):
        if not self.interface:
            self._take_legacy(output)
        missing = sorted(self.layers - self._got)
        if missing:
            path = "interface" if self.interface else "legacy (output_attentions under eager)"
            raise CaptureError(
                f"{self.sites.model_class}: {len(self._got)} of the {len(self.layers)} asked-for "
                f"layers of its {self.stack} attention were captured in a forward pass ({path} "
                f"path); missing layers {missing[:10]}"
            )
        return output

    def __enter__(self):
        try:
            if self.interface:
                self._calls = self.sites.calls()
                self._exit.enter_context(routed(self.model, {m: self._handle for m in self._calls}))
                if "head_output" in self.wanted:
                    self._output_hooks()
            else:
                self._legacy_hooks()
            for handle in (
                self.model.register_forward_pre_hook(self._begin, with_kwargs=True),
                self.model.register_forward_hook(self._end, with_kwargs=True),
            ):
                self._exit.callback(handle.remove)
        except BaseException:
            self._exit.close()
            raise
        return self

    def __exit__(self, kind, value, traceback):
        self._exit.close()
        return kind is not None and issubclass(kind, StopForward)  # the pass ended as asked


def offloaded(model) -> bool:
    """Whether accelerate runs some of `model`'s modules from offloaded weights (its map places
    them on "cpu" or "disk" beside an accelerator, or on "disk")."""
    places = {str(v) for v in (getattr(model, "hf_device_map", None) or {}).values()}
    return "disk" in places or ("cpu" in places and len(places) > 1)


class Captured:
    """What `capture_heads` kept of the last forward pass: per quantity, {layer: tensor}.

    `heads.probs[layer]` [batch, head, query, key], `heads.value_norms[layer]` [batch, head, key]
    (also `heads["probs"]`); `heads.norms(layer)` is N = probs * value_norms (METHODS §7), and
    `heads.norms(layer, rows=True)` its rows normalised to sum to 1."""

    def __init__(self, needs: frozenset[str], to=None):
        self.needs = needs
        self.to = torch.device(to) if to is not None else None
        self._kept: dict[str, dict[int, torch.Tensor]] = {name: {} for name in sorted(needs)}

    def keep(self, layer: int, heads: Heads) -> None:
        for name, value in heads.items():
            value = value.detach()
            self._kept[name][layer] = value.to(self.to) if self.to is not None else value.clone()

    def __getitem__(self, name: str) -> dict[int, torch.Tensor]:
        if name not in self._kept:
            raise KeyError(f"{name!r} was not asked for (needs: {', '.join(self._kept)})")
        return self._kept[name]

    def __getattr__(self, name: str) -> dict[int, torch.Tensor]:
        kept = self.__dict__.get("_kept", {})
        if name in kept:
            return kept[name]
        raise AttributeError(name)

    def norms(self, layer: int, rows: bool = False) -> torch.Tensor:
        """[batch, head, query, key]: N = a * ||v W_O|| of one layer (needs probs and value_norms)."""
        return norm_attention(self["probs"][layer], self["value_norms"][layer], rows=rows)


@contextlib.contextmanager
def capture_heads(
    model, needs=("probs",), layers: Iterable[int] | None = None, to=None, stack: str | None = None
):
    """Keep named per-head quantities (`QUANTITIES`) of every asked-for layer for your own inputs.

        with headprobe.capture_heads(model, needs={"probs", "value_norms"}) as heads:
            model(**tokenizer("The cat sat .", return_tensors="pt"))
        heads.probs[0]                  # [batch, head, query, key]
        heads.value_norms[0]            # [batch, head, key]
        heads.norms(0)                  # N = probs * value_norms

    Only what `needs` names is computed (`needs={"value_norms"}` leaves the model's own fast
    attention in place); a second forward pass in the block replaces the first's. `layers`:
    0-based layers of the stack (default all; `stack` as `AttentionCapture`); `to`: a device to
    move the tensors to (default: where each layer ran, copied). The model runs unchanged (same
    outputs); wrap it in `torch.inference_mode()` yourself if you like."""
    kept = Captured(check_needs(needs), to)
    with AttentionCapture(
        model, layers, lambda layer, heads: kept.keep(layer, heads), needs=kept.needs, stack=stack
    ):
        yield kept
