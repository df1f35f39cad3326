"""What an attention site is: one `AttentionSite` per attention call of a forward pass, and
`Sites`, every site of one model with how to feed the model for a stack; the weights of a site
(`value_weight`, `value_bias`, `output_weight`). `headprobe.model.discovery.attention_sites`
finds them.

    sites = attention_sites(model)          # found once per model, then cached
    sites.stacks                            # e.g. ["encoder", "decoder", "cross"]
    sites.of("encoder")                     # [AttentionSite(stack, layer, module, causal, ...)]

Encoder-decoder inputs (`Sites.model_inputs`): the encoder reads the sentence's pieces; the
decoder reads the model's `decoder_start_token_id` followed by the same pieces (the sentence
shifted right, nothing dropped: the sequence the decoder reads when it is taught this
sentence). For the encoder stack the decoder gets the start token alone. The decoder stack is
scored on the decoder's input (the start token a CLS/BOS-like special, `scoring_alignment`);
cross-attention on the sentence: the start token's query row is dropped (`query_offset`), so
row i is the decoder position that reads piece i, over the encoder's pieces.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from headprobe.core.errors import CaptureError
from headprobe.inputs.align import CLS_LIKE, Alignment
from headprobe.model.projections import projection_weight
from headprobe.model.stacks import STACKS as STACKS


@dataclass(frozen=True, eq=False)
class AttentionSite:
    """One attention call of a forward pass: layer `layer` of stack `stack`."""

    stack: str  # "encoder", "decoder" or "cross"
    layer: int  # 0-based, in call order within the stack
    module: nn.Module | None  # the attention module (None on the legacy path)
    causal: bool  # no key after the query is visible (this call's own mask)
    heads: int  # query heads
    kv_heads: int  # key/value heads (fewer under grouped-query attention)
    name: str = ""  # the module's name in the model
    output: nn.Module | None = None  # its output projection, where one is found
    value: nn.Module | None = None  # the projection whose output holds the values (interface path)
    value_index: torch.Tensor | None = None  # [kv_head * d_head] value features of `value`'s output
    d_head: int = 0  # width of one head's value (and of its slice of the output projection's input)
    norm_in: nn.Module | None = (
        None  # the norm the values read, inside the block (pre-norm); else None
    )
    softmax: bool = (
        False  # legacy: the output field holds scores; the probabilities are their softmax
    )


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
        """The forward pass's keyword arguments for `batch` (built on `scoring_alignment`).

        A batch with no padding (`batch.padded` False: every batch of the pass, which groups
        examples of one exact length) is fed no attention mask, as a plain forward would be: the
        model then makes no mask of its own to check (transformers reads a given mask back to the
        host to see whether it can skip it: one sync a forward pass), and the attention is the
        same (no key is masked either way)."""
        ids = batch.input_ids  # [batch, piece]
        mask = batch.attention_mask if batch.padded else None  # [batch, piece]
        if not self.encoder_decoder:
            return _given(input_ids=ids, attention_mask=mask)
        if stack == "decoder":  # ids: start + sentence
            return _given(
                input_ids=ids[:, 1:],
                attention_mask=None if mask is None else mask[:, 1:],
                decoder_input_ids=ids,
                decoder_attention_mask=mask,
            )
        start = ids.new_full((ids.shape[0], 1), self.decoder_start)  # [batch, 1]
        if stack == "encoder":
            return _given(input_ids=ids, attention_mask=mask, decoder_input_ids=start)
        return _given(
            input_ids=ids,
            attention_mask=mask,
            decoder_input_ids=torch.cat([start, ids], dim=1),
            decoder_attention_mask=None
            if mask is None
            else torch.cat([torch.ones_like(start), mask], dim=1),
        )


def _given(**inputs) -> dict:
    """The keyword arguments that are not None."""
    return {key: value for key, value in inputs.items() if value is not None}


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


def _need(site: AttentionSite, what: str) -> nn.Module:
    module = getattr(site, what)
    if module is None:
        raise CaptureError(
            f"{site.name or site.stack} (layer {site.layer}): no {what} projection found "
            + ("(legacy path: no values are seen)" if what == "value" else "")
        )
    return module


def value_weight(site: AttentionSite) -> torch.Tensor:
    """[kv_head, d_model, d_head]: W_V of each key/value head, `v = x @ W_V[g] + value_bias[g]`
    (query head h reads kv head h // (heads // kv_heads)); the value features of a fused
    projection (GPT-2's c_attn, ModernBERT's Wqkv, ...) picked by `site.value_index`."""
    weight = projection_weight(_need(site, "value"))  # [out, d_model]
    rows = weight[site.value_index.to(weight.device)]  # [kv_head * d_head, d_model]
    return rows.unflatten(0, (-1, site.d_head)).transpose(1, 2)  # [kv_head, d_model, d_head]


def value_bias(site: AttentionSite) -> torch.Tensor | None:
    """[kv_head, d_head]: the value projection's bias per kv head, or None (no bias)."""
    bias = getattr(_need(site, "value"), "bias", None)
    if bias is None:
        return None
    return bias[site.value_index.to(bias.device)].unflatten(0, (-1, site.d_head))


def output_weight(site: AttentionSite) -> torch.Tensor:
    """[head, d_head, d_model]: W_O of each query head, the output projection's block that
    reads head h's slice of the concatenated head outputs (`attention output = sum_h
    z_h @ W_O[h] + output bias`)."""
    weight = projection_weight(_need(site, "output"))  # [d_model, head * d_head]
    return weight.T.unflatten(0, (site.heads, -1))  # [head, d_head, d_model]
