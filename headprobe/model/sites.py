"""Where a model's attention is: one `AttentionSite` per attention call of a forward pass.

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
MPNet, DeBERTa-v2; ALiBi models such as BLOOM) takes the legacy path: the sites come from
`output_attentions=True` under eager attention (`module` is then None, `causal` is read off
the probabilities). A model that gives neither is an error, never a silent zero.

Encoder-decoder inputs (`Sites.model_inputs`): the encoder reads the sentence's pieces; the
decoder reads the model's `decoder_start_token_id` followed by the same pieces (the sentence
shifted right, nothing dropped: the sequence the decoder reads when it is taught this
sentence). For the encoder stack the decoder gets the start token alone. The decoder stack is
scored on the decoder's input (the start token a CLS/BOS-like special, `scoring_alignment`);
cross-attention on the sentence: the start token's query row is dropped (`query_offset`), so
row i is the decoder position that reads piece i, over the encoder's pieces.
"""

from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

from headprobe.inputs.align import CLS_LIKE, Alignment
from headprobe.model.attention import (
    CaptureError,
    fallback,
    implementation_set,
    routed,
    visible_keys,
)

STACKS = ("encoder", "decoder", "cross")
ENCODER_LENGTH, DECODER_LENGTH = 6, 4  # the discovery pass's input lengths (they must differ)
# names of an attention module's output projection (Llama, BART/OPT, T5, GPT-2, DistilBERT,
# ModernBERT, GPT-NeoX/ALBERT); BERT-style models keep it beside the module (`output.dense`)
OUTPUT_NAMES = ("o_proj", "out_proj", "o", "c_proj", "out_lin", "Wo", "dense")
LEGACY_FIELDS = {
    "encoder": "encoder_attentions",
    "decoder": "decoder_attentions",
    "cross": "cross_attentions",
}


@dataclass(frozen=True, eq=False)
class AttentionSite:
    """One attention call of a forward pass: layer `layer` of stack `stack`."""

    stack: str  # "encoder", "decoder" or "cross"
    layer: int  # 0-based, in call order within the stack
    module: nn.Module | None  # the attention module (None on the legacy path)
    causal: bool  # no key after the query is visible (this call's own mask)
    heads: int  # query heads
    kv_heads: int  # key/value heads (fewer under grouped-query attention)
    name: str = ""  # the module's name in the model, or the output field (legacy)
    output: nn.Module | None = None  # its output projection, where one is found


@dataclass(eq=False)
class Sites:
    """Every attention site of one model, and how to feed the model for a stack."""

    model_class: str
    path: str  # "interface" or "legacy"
    sites: tuple[AttentionSite, ...]
    encoder_decoder: bool = False
    decoder_start: int | None = None
    fields: dict = field(default_factory=dict)  # legacy: stack -> output field

    @property
    def stacks(self) -> list[str]:
        return [s for s in STACKS if any(site.stack == s for site in self.sites)]

    @property
    def default_stack(self) -> str:
        """The stack sentence analyses read unless told: the encoder where there is one."""
        return "encoder" if "encoder" in self.stacks else self.stacks[0]

    def resolve(self, stack: str | None) -> str:
        stack = stack or self.default_stack
        if stack not in self.stacks:
            raise CaptureError(
                f"--stack {stack}: {self.model_class} has no {stack} attention "
                f"(its attention stacks: {', '.join(self.stacks)})"
            )
        return stack

    def of(self, stack: str | None = None) -> list[AttentionSite]:
        stack = self.resolve(stack)
        return [site for site in self.sites if site.stack == stack]

    def causal(self, stack: str | None = None) -> bool:
        return any(site.causal for site in self.of(stack))

    def n_layers(self, stack: str | None = None) -> int:
        return len(self.of(stack))

    def n_heads(self, stack: str | None = None) -> int:
        return self.of(stack)[0].heads

    def n_kv_heads(self, stack: str | None = None) -> int:
        return self.of(stack)[0].kv_heads

    def calls(self) -> dict[nn.Module, list[AttentionSite]]:
        """Attention module -> its sites, in call order (a shared module has several)."""
        out: dict[nn.Module, list[AttentionSite]] = {}
        for site in self.sites:
            if site.module is not None:
                out.setdefault(site.module, []).append(site)
        return out

    def describe(self) -> dict:
        """{stack: {layers, heads, kv_heads, causal}} and the capture path, for the summary."""
        stacks = {
            s: {
                "layers": self.n_layers(s),
                "heads": self.n_heads(s),
                "kv_heads": self.n_kv_heads(s),
                "causal": self.causal(s),
            }
            for s in self.stacks
        }
        return {"stacks": stacks, "capture_path": self.path}

    # -- feeding the model ---------------------------------------------------------------
    def query_offset(self, stack: str) -> int:
        """Query rows to drop in front of a captured block: 1 (the start token) for cross-attention."""
        return 1 if self.encoder_decoder and stack == "cross" else 0

    def scoring_alignment(self, alignment: Alignment, stack: str) -> Alignment:
        """The pieces a stack's attention rows and columns stand for: the decoder's (start
        token first, CLS/BOS-like) for an encoder-decoder's decoder, else the sentence's."""
        if not (self.encoder_decoder and stack == "decoder"):
            return alignment
        return Alignment(
            [self.decoder_start] + list(alignment.input_ids),
            [-1] + list(alignment.piece_word),
            [CLS_LIKE] + list(alignment.piece_kind),
            alignment.n_words,
        )

    def model_inputs(self, batch, stack: str) -> dict:
        """The forward pass's keyword arguments for `batch` (built on `scoring_alignment`)."""
        ids, mask = batch.input_ids, batch.attention_mask  # [batch, piece]
        if not self.encoder_decoder:
            return dict(input_ids=ids, attention_mask=mask)
        if stack == "decoder":  # ids: start + sentence
            return dict(
                input_ids=ids[:, 1:],
                attention_mask=mask[:, 1:],
                decoder_input_ids=ids,
                decoder_attention_mask=mask,
            )
        start = ids.new_full((ids.shape[0], 1), self.decoder_start)  # [batch, 1]
        if stack == "encoder":
            return dict(input_ids=ids, attention_mask=mask, decoder_input_ids=start)
        return dict(
            input_ids=ids,
            attention_mask=mask,
            decoder_input_ids=torch.cat([start, ids], dim=1),
            decoder_attention_mask=torch.cat([torch.ones_like(start), mask], dim=1),
        )


def text_config(model):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


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

    def record(module, query, key, value, mask, scaling, dropout, kwargs):
        visible = visible_keys(module, mask, kwargs, query.shape[-2], key.shape[-2])  # [query, key]
        calls.append(
            (module, query.shape[1], key.shape[1], query.shape[-2], key.shape[-2], visible)
        )
        return fallback(module)(
            module, query, key, value, mask, scaling=scaling, dropout=dropout, **kwargs
        )

    try:
        with torch.no_grad(), routed(model, every=record):
            model(**inputs)
        if calls:
            return Sites(
                name,
                "interface",
                _interface_sites(model, calls, encoder_decoder),
                encoder_decoder,
                start,
            )
        with torch.no_grad(), implementation_set(model, "eager"):
            output = model(**inputs, output_attentions=True)
    except CaptureError:
        raise
    except Exception as exc:
        raise CaptureError(
            f"{name}: cannot run it on a token sequence to find its attention "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    sites, fields = _legacy_sites(output, encoder_decoder)
    if not sites:
        raise CaptureError(
            f"{name}: no attention found: it calls none of transformers' attention functions "
            "(interface path) and returns no attention with output_attentions=True (legacy path)"
        )
    return Sites(name, "legacy", sites, encoder_decoder, start, fields)


def _stack_of(n_query: int, n_key: int) -> str:
    """An encoder-decoder's call by its lengths in the discovery pass."""
    if n_query == ENCODER_LENGTH:
        return "encoder"
    return "cross" if n_key == ENCODER_LENGTH else "decoder"


def _is_causal(visible: torch.Tensor) -> bool:
    """visible [query, key] bool: a square pattern with no key after its query."""
    n_query, n_key = visible.shape
    return n_query == n_key > 1 and not visible.triu(1).any().item()


def _interface_sites(model, calls, encoder_decoder: bool) -> tuple[AttentionSite, ...]:
    names = {module: name for name, module in model.named_modules()}
    causal = [_is_causal(visible) for *_, visible in calls]
    single = "decoder" if any(causal) else "encoder"
    layers: dict[str, int] = {}
    sites = []
    for (module, heads, kv_heads, n_query, n_key, _), is_causal in zip(calls, causal):
        stack = _stack_of(n_query, n_key) if encoder_decoder else single
        layer = layers[stack] = layers.get(stack, -1) + 1
        name = names.get(module, "")
        sites.append(
            AttentionSite(
                stack,
                layer,
                module,
                is_causal,
                int(heads),
                int(kv_heads),
                name,
                _output_projection(model, name, module),
            )
        )
    return tuple(sites)


def _output_projection(model, name: str, module) -> nn.Module | None:
    for child in OUTPUT_NAMES:
        found = getattr(module, child, None)
        if isinstance(found, nn.Module) and hasattr(found, "weight"):
            return found
    parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else None
    dense = getattr(getattr(parent, "output", None), "dense", None)
    return dense if isinstance(dense, nn.Module) else None


def _legacy_sites(output, encoder_decoder: bool):
    """Sites from `output_attentions` fields: ((AttentionSite, ...), {stack: field})."""
    wanted = LEGACY_FIELDS if encoder_decoder else {None: "attentions"}
    sites, fields = [], {}
    for stack, name in wanted.items():
        layers = getattr(output, name, None) or ()  # per layer [batch, head, query, key]
        layers = [probs for probs in layers if probs is not None]
        if not layers:
            continue
        causal = [_is_causal(probs[0, 0] > 0) for probs in layers]
        stack = stack or ("decoder" if any(causal) else "encoder")
        fields[stack] = name
        sites += [
            AttentionSite(stack, layer, None, c, int(p.shape[1]), int(p.shape[1]), name)
            for layer, (p, c) in enumerate(zip(layers, causal))
        ]
    return tuple(sites), fields
