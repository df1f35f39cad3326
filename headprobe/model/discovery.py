"""How a model's attention sites are found: one `AttentionSite` per attention call of a forward
pass (`headprobe.model.sites` says what a site is).

    sites = attention_sites(model)          # found once per model, then cached
    sites.stacks                            # e.g. ["encoder", "decoder", "cross"]
    sites.of("encoder")                     # [AttentionSite(stack, layer, module, causal, ...)]

How they are found: one forward pass on a short token sequence (6 pieces; an encoder-
decoder's decoder gets 4, so cross-attention, 4 queries over 6 keys, tells itself apart)
with every attention call routed through headprobe's attention function (`attention.routed`),
which records the calling module, its heads, key/value heads and mask. Every attention
module is found wherever it sits; a module called several times in one pass (ALBERT's
shared layer) is one site per call, layers numbered by call order within their stack.

Stacks: an encoder-decoder (its forward takes `decoder_input_ids`) has `encoder`
(self-attention over the input), `decoder` (the decoder's self-attention) and `cross`
(decoder queries over encoder keys), each with its own layers. Any other model has one stack,
named `decoder` if its attention is causal, else `encoder`. `causal` is decided per site
from that call's own mask (else its `is_causal`): no key after the query is visible.

A model whose attention does not go through transformers' attention functions (older code:
MPNet, DeBERTa-v2, SqueezeBERT; ALiBi models such as BLOOM) takes the legacy path: the sites
come from `output_attentions=True` under eager attention (`module` is the innermost module that
returned the field, `causal` is read off the probabilities). A model that gives neither is an
error, never a silent zero. Each legacy site is checked against the model's own arithmetic: the
projection among its module's own whose output, read as heads side by side, times the field
gives the output projection's input is its value projection; where the field only gives that
once softmaxed (SqueezeBERT returns the scores, mask added), the site says so (`softmax`) and
the capture hands on their softmax. A field that is neither probabilities (non-negative, rows
summing to at most 1) nor so checked is an error.

The output projection is found by name beside the attention module (`OUTPUT_NAMES`), else as
the projection that reads what the attention returned (the heads side by side).
"""

from __future__ import annotations

import inspect
import weakref

import torch
from torch import nn

from headprobe.core.errors import CaptureError
from headprobe.model.attention import (
    fallback,
    implementation_set,
    routed,
    visible_keys,
)
from headprobe.model.projections import (
    features_last,
    is_norm,
    is_projection,
    projection_in_features,
    same_storage,
    tensors_of,
)
from headprobe.model.sites import AttentionSite, Sites, model_device, text_config

ENCODER_LENGTH, DECODER_LENGTH = 6, 4  # the discovery pass's input lengths (they must differ)


# names of an attention module's output projection (Llama, BART/OPT, T5, GPT-2, DistilBERT,
# ModernBERT, GPT-NeoX/ALBERT); BERT-style models keep it beside the module (`output.dense`)
OUTPUT_NAMES = ("o_proj", "out_proj", "o", "c_proj", "out_lin", "Wo", "dense")


LEGACY_FIELDS = {
    "encoder": "encoder_attentions",
    "decoder": "decoder_attentions",
    "cross": "cross_attentions",
}


_CACHE: weakref.WeakKeyDictionary[nn.Module, Sites] = weakref.WeakKeyDictionary()


def attention_sites(model) -> Sites:
    """The model's attention sites (one discovery pass the first time; cached per model)."""
    sites = _CACHE.get(model)
    if sites is None:
        sites = _CACHE[model] = discover(model)
    return sites


def is_encoder_decoder(model) -> bool:
    """Does the model's forward take a decoder input (T5Model, BartModel; not T5EncoderModel)?"""
    return "decoder_input_ids" in inspect.signature(type(model).forward).parameters


def decoder_start_id(model) -> int | None:
    for config in (model.config, getattr(model, "generation_config", None)):
        start = getattr(config, "decoder_start_token_id", None)
        if isinstance(start, int):
            return start
    return None


def probe_inputs(model, encoder_decoder: bool, start: int | None) -> dict:
    """A short input of ordinary (not special) token ids from the middle of the vocabulary."""
    config = text_config(model)
    vocab = int(getattr(config, "vocab_size", 0) or 0) or 1000
    special = {
        getattr(config, name, None)
        for name in (
            "pad_token_id",
            "bos_token_id",
            "eos_token_id",
            "decoder_start_token_id",
            "sep_token_id",
            "cls_token_id",
        )
    }
    ids = [i for i in range(vocab // 2, vocab) if i not in special][:ENCODER_LENGTH]
    if len(ids) < ENCODER_LENGTH:
        ids = [i % vocab for i in range(vocab // 2, vocab // 2 + ENCODER_LENGTH)]
    device = model_device(model)
    inputs = {"input_ids": torch.tensor([ids], device=device)}
    if encoder_decoder:
        inputs["decoder_input_ids"] = torch.tensor(
            [[start] + ids[: DECODER_LENGTH - 1]], device=device
        )
    return inputs


def discover(model) -> Sites:
    """Find every attention site of `model` (see the module docstring)."""
    name = type(model).__name__
    encoder_decoder = is_encoder_decoder(model)
    start = decoder_start_id(model) if encoder_decoder else None
    if encoder_decoder and start is None:
        raise CaptureError(
            f"{name}: an encoder-decoder without decoder_start_token_id in its config: "
            "headprobe cannot form the decoder's input"
        )
    inputs = probe_inputs(model, encoder_decoder, start)
    calls = []
    names = {module: name for name, module in model.named_modules()}

    def record(module, query, key, value, mask, scaling, dropout, kwargs):
        visible = visible_keys(module, mask, kwargs, query.shape[-2], key.shape[-2])  # [query, key]
        parts = _value_parts(model, names.get(module, ""), module, value, trace)
        shapes = (query.shape[1], key.shape[1], query.shape[-2], key.shape[-2])
        result = fallback(module)(
            module, query, key, value, mask, scaling=scaling, dropout=dropout, **kwargs
        )
        calls.append((module, *shapes, visible, parts, result[0]))  # result[0]: the heads' outputs
        return result

    try:
        with torch.no_grad(), _Trace(model) as trace, routed(model, every=record):
            model(**inputs)
        if calls:
            sites = _interface_sites(model, names, calls, encoder_decoder, trace)
            return Sites(name, "interface", sites, encoder_decoder, start)
        with (
            torch.no_grad(),
            _Trace(model, keep_outputs=True) as trace,
            implementation_set(model, "eager"),
        ):
            output = model(**inputs, output_attentions=True)
            sites, fields = _legacy_sites(model, names, output, encoder_decoder, trace)
    except CaptureError:
        raise
    except Exception as exc:
        raise CaptureError(
            f"{name}: cannot run it on a token sequence to find its attention "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    if not sites:
        raise CaptureError(
            f"{name}: no attention found: it calls none of transformers' attention functions "
            "(interface path) and returns no attention with output_attentions=True (legacy path)"
        )
    return Sites(name, "legacy", sites, encoder_decoder, start, fields)


class _Trace:
    """Forward hooks for the discovery pass: when each module's current call began (a tick
    counter), every projection's and norm's last input and output, and (`keep_outputs`) for
    every tensor a module returned, the innermost module that returned it first."""

    def __init__(self, model, keep_outputs: bool = False):
        self.model, self.keep_outputs = model, keep_outputs
        self.tick = 0
        self.began: dict[nn.Module, int] = {}
        self.last: dict[
            nn.Module, tuple[int, object, object]
        ] = {}  # module -> (tick, input, output)
        self.returned: list[tuple[torch.Tensor, nn.Module]] = []  # in the order modules returned
        self.handles: list = []

    def __enter__(self):
        for module in self.model.modules():
            self.handles.append(module.register_forward_pre_hook(self._begin))
            if self.keep_outputs or is_projection(module) or is_norm(module):
                self.handles.append(module.register_forward_hook(self._end))
        return self

    def __exit__(self, *exc):
        while self.handles:
            self.handles.pop().remove()
        return False

    def _begin(self, module, args):
        self.tick += 1
        self.began[module] = self.tick

    def _end(self, module, args, output):
        self.tick += 1
        self.last[module] = (self.tick, args[0] if args else None, output)
        if self.keep_outputs:
            passed = {a.data_ptr() for a in args if torch.is_tensor(a)}  # handed through (dropout)
            self.returned += [(t, module) for t in tensors_of(output) if t.data_ptr() not in passed]

    def output_of(self, module) -> torch.Tensor | None:
        kept = self.last.get(module)
        return kept[2] if kept is not None and torch.is_tensor(kept[2]) else None

    def first_returned(self, tensor: torch.Tensor) -> nn.Module | None:
        """The innermost module that returned `tensor` (or a view of its storage, same size)."""
        for kept, module in self.returned:
            if same_storage(kept, tensor):
                return module
        return None

    def reader(self, tensors: list[torch.Tensor], after: int) -> nn.Module | None:
        """The first projection called after tick `after` whose input is one of `tensors` (or a
        view of its storage, same size)."""
        found = [
            (tick, module)
            for module, (tick, x, _) in self.last.items()
            if tick > after
            and is_projection(module)
            and torch.is_tensor(x)
            and any(same_storage(x, t) for t in tensors)
        ]
        return min(found, key=lambda pair: pair[0])[1] if found else None


def _value_parts(model, name: str, module, value, trace: _Trace) -> tuple:
    """(value projection, value_index, d_head, norm_in) of one attention call: the projection
    among `module`'s own whose last output holds, feature for feature, the `value` the attention
    function got ([batch, kv_head, key, d_head]; any fused layout: the index says which output
    features are the values, kv-head-major); the norm is the one whose output that projection
    read, called inside this call of the attention module's parent (so not a post-norm)."""
    v = value.detach().transpose(1, 2).flatten(2)  # [batch, key, kv_head * d_head]
    v = v.reshape(-1, v.shape[-1])  # [row, feature]
    for candidate in module.modules():
        out = trace.output_of(candidate) if is_projection(candidate) else None
        out = features_last(candidate, out) if out is not None else None  # [batch, key, feature]
        if out is None or out.shape[-1] < v.shape[-1] or out.numel() // out.shape[-1] != len(v):
            continue
        y = out.detach().reshape(len(v), -1)  # [row, out_feature]
        same = y[0][:, None] == v[0][None, :]  # [out_feature, feature], one row at a time
        for row in range(1, len(v)):
            same &= y[row][:, None] == v[row][None, :]
        if same.any(0).all():
            index = same.to(torch.int8).argmax(0).cpu()  # [feature]: the first equal column
            return candidate, index, int(value.shape[-1]), _norm_in(model, name, candidate, trace)
    return None, None, int(value.shape[-1]), None


def _norm_in(model, name: str, projection, trace: _Trace) -> nn.Module | None:
    x = trace.last[projection][1]  # the projection's input
    parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
    began = trace.began.get(parent, 0)
    found = [
        (tick, norm)
        for norm, (tick, _, out) in trace.last.items()
        if is_norm(norm) and tick > began and out is x
    ]
    return max(found, key=lambda pair: pair[0])[1] if found else None


def _stack_of(n_query: int, n_key: int) -> str:
    """An encoder-decoder's call by its lengths in the discovery pass."""
    if n_query == ENCODER_LENGTH:
        return "encoder"
    return "cross" if n_key == ENCODER_LENGTH else "decoder"


def _is_causal(visible: torch.Tensor) -> bool:
    """visible [query, key] bool: a square pattern with no key after its query."""
    n_query, n_key = visible.shape
    return n_query == n_key > 1 and not visible.triu(1).any().item()


def _interface_sites(
    model, names, calls, encoder_decoder: bool, trace: _Trace
) -> tuple[AttentionSite, ...]:
    causal = [_is_causal(call[5]) for call in calls]
    single = "decoder" if any(causal) else "encoder"
    layers: dict[str, int] = {}
    sites = []
    for call, is_causal in zip(calls, causal):
        module, heads, kv_heads, n_query, n_key, _, parts, returned = call
        stack = _stack_of(n_query, n_key) if encoder_decoder else single
        layer = layers[stack] = layers.get(stack, -1) + 1
        name = names.get(module, "")
        value, index, d_head, norm = parts
        sites.append(
            AttentionSite(
                stack,
                layer,
                module,
                is_causal,
                int(heads),
                int(kv_heads),
                name,
                _output_projection(model, name, module, trace, [returned]),
                value,
                index,
                d_head,
                norm,
            )
        )
    return tuple(sites)


def _output_projection(model, name: str, module, trace: _Trace, returned) -> nn.Module | None:
    """The output projection of attention module `module`: by name (`OUTPUT_NAMES` on it;
    BERT-style `output.dense` beside it), else the first projection called after the module
    began whose input is one of the tensors in `returned` (what the attention handed back: the
    heads' outputs side by side; SqueezeBERT's `post_attention.conv1d`)."""
    for child in OUTPUT_NAMES:
        found = getattr(module, child, None)
        if isinstance(found, nn.Module) and hasattr(found, "weight"):
            return found
    parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else None
    dense = getattr(getattr(parent, "output", None), "dense", None)
    if isinstance(dense, nn.Module):
        return dense
    return trace.reader(list(returned), trace.began.get(module, 0))


def _legacy_sites(model, names, output, encoder_decoder: bool, trace: _Trace):
    """Sites from `output_attentions` fields: ((AttentionSite, ...), {stack: field}); each
    site's module is the innermost module that returned its field (`_legacy_parts`)."""
    wanted = LEGACY_FIELDS if encoder_decoder else {None: "attentions"}
    sites, fields = [], {}
    for stack, field_name in wanted.items():
        layers = getattr(output, field_name, None) or ()  # per layer [batch, head, query, key]
        parts = [
            _legacy_parts(model, names, field_name, layer, field, trace)
            for layer, field in enumerate(f for f in layers if f is not None)
        ]
        if not parts:
            continue
        causal = [_is_causal(probs[0, 0] > 0) for *_, probs in parts]
        stack = stack or ("decoder" if any(causal) else "encoder")
        fields[stack] = field_name
        for layer, (part, is_causal) in enumerate(zip(parts, causal)):
            module, name, out, value, index, d_head, softmax, probs = part
            heads = int(probs.shape[1])
            sites.append(
                AttentionSite(
                    stack,
                    layer,
                    module,
                    is_causal,
                    heads,
                    heads,
                    name,
                    out,
                    value=value,
                    value_index=index,
                    d_head=d_head,
                    softmax=softmax,
                )
            )
    return tuple(sites), fields


def _legacy_parts(model, names, field_name: str, layer: int, field, trace: _Trace) -> tuple:
    """(module, name, output projection, value projection, value_index, d_head, softmax,
    probabilities [batch, head, query, key] float32) of one layer's `output_attentions` field:
    the module is the innermost one that returned the field; the value projection and whether
    the field holds scores (`softmax`) come from `_legacy_value`. A field that is not checked
    against the values must hold probabilities, else `CaptureError`."""
    module = trace.first_returned(field)
    name = names.get(module, field_name)
    heads = int(field.shape[1])
    out = None
    if module is not None:
        returned = tensors_of(trace.last[module][2]) if module in trace.last else []
        out = _output_projection(model, name, module, trace, returned)
    width = projection_in_features(out) if out is not None else None
    d_head = width // heads if width and width % heads == 0 else 0
    value, softmax = _legacy_value(module, out, field, d_head, trace) if d_head else (None, False)
    probs = field.float().softmax(-1) if softmax else field.float()  # [batch, head, query, key]
    tol = max(1e-5, 8 * torch.finfo(field.dtype).eps)
    if value is None and (probs.min() < -tol or probs.sum(-1).max() > 1 + tol):
        raise CaptureError(
            f"{type(model).__name__}: its output_attentions ({field_name}, layer {layer}) are "
            "not attention probabilities (negative, or rows summing past 1) and cannot be checked "
            "against its values: headprobe cannot tell what they are"
        )
    index = torch.arange(width) if value is not None else None
    return module, name, out, value, index, d_head, softmax, probs


def _legacy_value(module, out, field, d_head: int, trace: _Trace) -> tuple:
    """(value projection, softmax) of one legacy site: the projection among `module`'s own (not
    the output projection `out`) whose output, read as heads side by side (head-major, `d_head`
    each), times the field ([batch, head, query, key]), or where `softmax` times the field's
    softmax, is what `out` read; (None, False) where none is."""
    kept = trace.last.get(out)
    if module is None or kept is None or not torch.is_tensor(kept[1]):
        return None, False
    batch, heads, n_query, n_key = field.shape
    z = features_last(out, kept[1]).float()  # [batch, query, head * d_head]
    if tuple(z.shape) != (batch, n_query, heads * d_head):
        return None, False
    z = z.unflatten(-1, (heads, d_head)).transpose(1, 2)  # [batch, head, query, d_head]
    tol = max(1e-4, 16 * torch.finfo(kept[1].dtype).eps) * (1.0 + float(z.abs().max()))
    for candidate in module.modules():
        y = (
            trace.output_of(candidate)
            if is_projection(candidate) and candidate is not out
            else None
        )
        y = features_last(candidate, y) if y is not None else None  # [batch, key, feature]
        if y is None or tuple(y.shape) != (batch, n_key, heads * d_head):
            continue
        v = y.float().unflatten(-1, (heads, d_head)).transpose(1, 2)  # [batch, head, key, d_head]
        for softmax in (False, True):
            weights = field.float().softmax(-1) if softmax else field.float()
            if float((weights @ v - z).abs().max()) <= tol:
                return candidate, softmax
    return None, False
