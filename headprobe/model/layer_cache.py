"""One clean forward pass kept per layer, so that a layer's attention can be recomputed from a
changed input without running the model again (METHODS §18, heads that work together).

    cache = clean_cache(model, inputs, stack="decoder")   # one forward pass, no gradient
    cache.x[l]             # [batch, piece, hidden] the residual stream entering layer l (before its norm)
    cache.slices[l]        # [batch, piece, head, d_head] each head's slice of the output projection's input
    cache.calls[l]         # AttentionCall: the attention module's own call and q, k, v as attention got them
    cache.residual_change(l, d)      # what a change d of layer l's attention output does to the residual
    cache.carried(l, to, d)          # ... and what reaches layer `to` (post-norm: frozen norms)
    cache = clean_cache(model, inputs, mlp=True)          # also each layer's MLP write
    cache.mlp_out[l]       # [batch, piece, hidden] layer l's MLP write (before a norm on it)
    cache.mlp_change(l, d), cache.carried(l, to, d, cache.mlp_after[l])   # as for the heads

Where things are comes from `model.sites` (the attention module, its output projection, the norm
its values read, `norm_in`); this module adds, per family, what the clean pass shows:

- the residual stream entering layer l: the input of `norm_in` (pre-norm), else the attention
  module's own `hidden_states` (post-norm: BERT's, whose projections read the residual);
- a norm applied to the attention's output before the residual add (Gemma-2/3's
  `post_attention_layernorm`: `write_norms`): its input is the output projection's output;
- post-norm families: the norms called between attention l and attention l + 1 of the stack,
  each with its clean scale (`FrozenNorm`), through which a write in layer l reaches the layers
  above (METHODS §18: the norm frozen at its clean scale, a linear map);
- with `mlp=True`, each layer's MLP write (`model.mlp_writes`), a norm the family applies to it
  before the residual add (Gemma-2/3's `post_feedforward_layernorm`: `mlp_norms`), and on
  post-norm families how many of the layer's norms come before it (`mlp_after`). The pass checks
  that the write found is what the residual stream receives (pre-norm: x[l + 1] = x[l] + the
  attention's write + the cross-attention's + the MLP's; post-norm: the norm after the MLP reads
  the norm before it plus the MLP's write); a family where it is not is refused in one line.

Only the "interface" path (attention through Transformers' attention functions) is supported: a
legacy family (its own attention code) is refused with one line naming it, never scored wrong.
Cross-attention is refused too (its keys and values read the encoder's output).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
from torch import nn

from headprobe.core.errors import UsageError
from headprobe.model.attention import fallback, routed
from headprobe.model.discovery import attention_sites
from headprobe.model.projections import features_last, is_norm, same_storage
from headprobe.model.sites import AttentionSite
from headprobe.model.unembed import fit_norm

CACHE_KWARGS = ("past_key_values", "past_key_value", "layer_past", "cache")


@dataclass
class AttentionCall:
    """One clean call of an attention module and what its attention function received."""

    args: tuple  # the module's positional arguments (hidden states first, or in `kwargs`)
    kwargs: dict  # the module's keyword arguments (mask, position embeddings, position bias, ...)
    query: torch.Tensor | None = None  # [batch, head, query, d_head] (after RoPE / q-norm)
    key: torch.Tensor | None = None  # [batch, kv_head, key, d_head]
    value: torch.Tensor | None = None  # [batch, kv_head, key, d_head]
    mask: torch.Tensor | None = None  # as the attention function got it
    scaling: float | None = None
    extra: dict = field(default_factory=dict)  # the attention function's other keywords

    def hidden(self) -> torch.Tensor:
        """[batch, piece, hidden]: the hidden states the module read."""
        return self.args[0] if self.args else self.kwargs["hidden_states"]


@dataclass
class FrozenNorm:
    """A norm frozen at its clean scale: d -> gain * (d - mean d) / scale (LayerNorm), or
    gain * d / scale (RMSNorm): linear in d (METHODS §18, post-norm families)."""

    kind: str  # "layer" or "rms"
    gain: torch.Tensor  # [hidden]
    scale: torch.Tensor  # [batch, piece] the clean scale (std, or rms), eps included

    def apply(self, d: torch.Tensor) -> torch.Tensor:
        # d: [..., batch, piece, hidden]
        if self.kind == "layer":
            d = d - d.mean(-1, keepdim=True)
        return d * self.gain / self.scale[..., None]


@dataclass
class LayerCache:
    """See the module docstring; every tensor float32 except the kept call arguments."""

    stack: str
    sites: list[AttentionSite]
    x: dict[int, torch.Tensor]  # [batch, piece, hidden]
    slices: dict[int, torch.Tensor]  # [batch, piece, head, d_head]
    attention_out: dict[int, torch.Tensor]  # [batch, piece, hidden] output projection's output,
    # kept for the layers with a write norm only (`residual_change` reads it; all of them while
    # the MLP writes are checked)
    calls: dict[int, AttentionCall]
    write_norms: dict[int, nn.Module]  # layer -> a norm on the attention output (Gemma-2/3)
    post_norms: dict[int, list[FrozenNorm]]  # post-norm: layer -> its norms after the attention
    shortcuts: dict = field(default_factory=dict)  # layer -> `model.projected.Shortcut` or None
    mlp_out: dict = field(default_factory=dict)  # layer -> [batch, piece, hidden] its MLP's write
    mlp_norms: dict = field(default_factory=dict)  # layer -> a norm on that write (Gemma-2/3)
    mlp_after: dict = field(default_factory=dict)  # post-norm: layer -> its norms before the MLP
    cross_out: dict = field(default_factory=dict)  # layer -> [batch, piece, hidden] cross-attention
    mlp_ok: dict = field(default_factory=dict)  # post-norm: layer -> its MLP write checked
    dtypes: dict = field(default_factory=dict)  # layer -> its attention output's dtype

    @property
    def post_norm(self) -> bool:
        """No layer above the first reads its input through a norm of its own (BERT); the
        first layer may have none (ModernBERT's is an identity)."""
        return all(site.norm_in is None for site in self.sites[1:])

    def residual_change(self, layer: int, d: torch.Tensor) -> torch.Tensor:
        """The change of the residual stream when layer `layer`'s attention output changes by
        d [..., batch, piece, hidden] (a norm on that output, where the family has one, is
        recomputed: exact)."""
        norm = self.write_norms.get(layer)
        if norm is None:
            return d
        a = self.attention_out[layer]  # [batch, piece, hidden]
        return norm(a + d) - norm(a)

    def mlp_change(self, layer: int, d: torch.Tensor) -> torch.Tensor:
        """The change of the residual stream when layer `layer`'s MLP write changes by d
        [..., batch, piece, hidden] (a norm on it, where the family has one, recomputed)."""
        norm = self.mlp_norms.get(layer)
        if norm is None:
            return d
        m = self.mlp_out[layer]  # [batch, piece, hidden]
        return norm(m + d.to(m.dtype)) - norm(m)

    def carried(self, layer: int, to: int, d: torch.Tensor, skip: int = 0) -> torch.Tensor:
        """What a residual change d [..., batch, piece, hidden] made at layer `layer`'s attention
        does to the stream entering layer `to`: itself (pre-norm), or through every norm in
        between, each frozen at its clean scale, MLPs and other heads clean (post-norm). skip:
        the first `skip` norms of layer `layer` are not passed (a change made after them: the
        MLP's write, `mlp_after`; the embeddings pass every norm of layer 0)."""
        if not self.post_norm:
            return d
        for between in range(layer, to):
            for norm in self.post_norms.get(between, [])[skip if between == layer else 0 :]:
                d = norm.apply(d)
        return d

    def carried_parts(self, layer: int, to: int, rows: torch.Tensor) -> tuple:
        """`carried` split into its linear part and its scale: (rows [..., hidden] through every
        norm's centring and gain, [batch, piece] the inverse product of their clean scales or
        None on pre-norm families), so that carried(d) = factor * (d through those parts)."""
        if not self.post_norm:
            return rows, None
        factor = None
        for between in range(layer, to):
            for norm in self.post_norms.get(between, []):
                if norm.kind == "layer":
                    rows = rows - rows.mean(-1, keepdim=True)
                rows = rows * norm.gain
                factor = 1 / norm.scale if factor is None else factor / norm.scale
        return rows, factor


def check_supported(model, stack: str | None = None) -> str:
    """The stack, or UsageError (one line) where its heads' writes cannot be reached."""
    sites = attention_sites(model)
    if sites.path != "interface":
        raise UsageError(
            f"composition: {sites.model_class} computes its attention in its own code (the legacy "
            "path), so a head's query, key and value cannot be recomputed; not supported"
        )
    stack = sites.resolve(stack)
    if stack == "cross":
        raise UsageError(
            f"composition: {sites.model_class} cross-attention reads the encoder's output; "
            "choose the encoder or decoder stack"
        )
    missing = [s.layer for s in sites.of(stack) if s.output is None]
    if missing:
        raise UsageError(
            f"composition: {sites.model_class} has no output projection found at layer "
            f"{missing[0]}, so its heads' writes cannot be reached"
        )
    return stack


class _Counter:
    """Call n of a module in a pass is its n-th site (cyclically: a shared module, ALBERT's)."""

    def __init__(self, by_module: dict):
        self.by_module, self.calls = by_module, {}

    def site(self, module) -> AttentionSite:
        n = self.calls.get(module, 0)
        self.calls[module] = n + 1
        order = self.by_module[module]
        return order[n % len(order)]


def _order(sites, what: str) -> dict:
    out: dict = {}
    for site in sites:
        out.setdefault(getattr(site, what), []).append(site)
    return out


@torch.no_grad()
def clean_cache(model, inputs: dict, stack: str | None = None, mlp: bool = False) -> LayerCache:
    """One clean forward pass of `model` on `inputs` (its keyword arguments), kept per layer of
    `stack` (see the module docstring); mlp: each layer's MLP write too."""
    stack = check_supported(model, stack)
    every = attention_sites(model).sites
    sites = [s for s in every if s.stack == stack]
    cache = LayerCache(stack, sites, {}, {}, {}, {}, {}, {})
    events: list = []  # ("attention", layer), ("norm", module, input, output or None), ("mlp", layer,
    # a copy of its output, the output), in call order
    modules, outputs = _Counter(_order(every, "module")), _Counter(_order(every, "output"))
    handlers = _hooks(model, cache, stack, events, modules, outputs, norm_outputs=mlp)
    if mlp:
        handlers += mlp_hooks(model, cache, stack, events)
    fn_counter = _Counter(_order(every, "module"))

    def attention(module, query, key, value, mask, scaling, dropout, kwargs):
        site = fn_counter.site(module)
        call = cache.calls.get(site.layer) if site.stack == stack else None
        if call is not None:
            call.query, call.key, call.value = query, key, value
            call.mask, call.scaling, call.extra = mask, scaling, dict(kwargs)
        return fallback(module)(
            module, query, key, value, mask, scaling=scaling, dropout=dropout, **kwargs
        )

    try:
        with routed(model, every=attention):
            model(**_no_cache(model, inputs), **_no_logits(model))
    finally:
        for handle in handlers:
            handle.remove()
    _read_events(cache, events)
    if mlp:
        check_mlp_writes(cache, attention_sites(model).model_class)
    for layer in list(cache.attention_out):  # [batch, piece, hidden]: read by write norms only
        cache.dtypes[layer] = cache.attention_out[layer].dtype
        if layer not in cache.write_norms:
            del cache.attention_out[layer]
    return cache


def _no_logits(model) -> dict:
    """A causal language model's head applied at the last piece only (`logits_to_keep`): the
    cache reads the layers, and [batch, piece, vocab] logits would be its largest tensor."""
    takes = inspect.signature(type(model).forward).parameters
    return {"logits_to_keep": 1} if "logits_to_keep" in takes else {}


def _no_cache(model, inputs: dict) -> dict:
    takes = inspect.signature(type(model).forward).parameters
    return dict(inputs, use_cache=False) if "use_cache" in takes else dict(inputs)


def _hooks(
    model, cache: LayerCache, stack: str, events: list, modules, outputs, norm_outputs: bool
) -> list:
    """Hooks on the attention modules (their call; the residual on post-norm families), the
    output projections (each head's slice, the output) and every norm (the event list; a norm's
    output only with `norm_outputs`, which the MLP writes' check reads)."""

    def on_attention(module, args, kwargs):
        site = modules.site(module)
        if site.stack == stack:
            cache.calls[site.layer] = AttentionCall(tuple(args), dict(kwargs))
            events.append(("attention", site.layer))

    def on_output(module, args, output):
        site = outputs.site(module)
        if site.stack == "cross" and stack == "decoder":  # its write (the MLP writes' check)
            cache.cross_out[site.layer] = features_last(module, output)
        if site.stack != stack:
            return
        z = features_last(module, args[0]).float()  # [batch, piece, head * d_head]
        cache.slices[site.layer] = z.unflatten(-1, (site.heads, -1))
        cache.attention_out[site.layer] = features_last(module, output)
        events.append(("output", site.layer, output))

    def on_norm(module, args, output):
        events.append(("norm", module, args[0] if args else None, output if norm_outputs else None))

    handles = []
    for module in {s.module for s in cache.sites}:
        handles.append(module.register_forward_pre_hook(on_attention, with_kwargs=True))
    crossing = [s for s in attention_sites(model).sites if s.stack == "cross"]
    for module in {s.output for s in cache.sites + (crossing if stack == "decoder" else [])}:
        if module is None:
            continue
        handles.append(module.register_forward_hook(on_output))
    for module in model.modules():
        if is_norm(module) and getattr(module, "weight", None) is not None:
            handles.append(module.register_forward_hook(on_norm))
    return handles


def _read_events(cache: LayerCache, events: list) -> None:
    """x per layer, the write norms and (post-norm) the frozen norms, from the pass's events."""
    layer, last_output, last_mlp, last_out = None, None, None, None
    last_norm: dict = {}  # module -> its last input before the current attention call
    for event in events:
        if event[0] == "attention":
            layer, last_mlp, last_out = event[1], None, None
            norm_in = cache.sites[layer].norm_in
            x = last_norm.get(norm_in) if norm_in is not None else cache.calls[layer].hidden()
            cache.x[layer] = x.float()
        elif event[0] == "output":
            last_output = event[2]
        elif event[0] == "mlp":
            if layer is not None and layer not in cache.mlp_out:
                last_mlp = event[3]
                cache.mlp_out[layer] = _as_stream(event[2], cache.x[layer], layer)
                cache.mlp_after[layer] = len(cache.post_norms.get(layer, []))
        else:
            _, module, x, out = event
            last_norm[module] = x
            if layer is None or x is None:
                continue
            if last_mlp is not None and same_storage(x, last_mlp):
                cache.mlp_norms[layer] = module
            elif last_output is not None and same_storage(x, last_output):
                cache.write_norms[layer] = module
            elif cache.post_norm:
                if last_mlp is not None and len(cache.post_norms.get(layer, [])) == (
                    cache.mlp_after.get(layer)
                ):  # the first norm after the MLP reads the one before it plus the MLP's write
                    want = None if last_out is None else last_out.float() + cache.mlp_out[layer]
                    # want: [batch, piece, hidden], what that norm reads if the write is right
                    cache.mlp_ok[layer] = want is not None and _close(x.float(), want)
                cache.post_norms.setdefault(layer, []).append(_frozen(module, x))
                last_out = out


def mlp_hooks(model, cache: LayerCache, stack: str, events: list) -> list:
    """Forward hooks on each layer's MLP write module (`model.mlp_writes`; call n of a shared
    module is its n-th layer), adding ("mlp", layer, a copy of its output, the output) to the
    events."""
    from headprobe.model.mlp_writes import mlp_modules

    found = mlp_modules(model, stack)
    order: dict = {}
    for site, module in zip(cache.sites, found):
        order.setdefault(module, []).append(site.layer)
    calls: dict = {}

    def on_mlp(module, args, output):
        n = calls.get(module, 0)
        calls[module] = n + 1
        layers = order[module]
        out = output[0] if isinstance(output, (tuple, list)) else output
        # its value copied (Falcon adds the attention's output to it in place), and the tensor
        # itself: a norm that reads it is found by its storage (Gemma-2/3)
        events.append(("mlp", layers[n % len(layers)], out.clone(), out))

    return [module.register_forward_hook(on_mlp) for module in order]


def _as_stream(out: torch.Tensor, x: torch.Tensor, layer: int) -> torch.Tensor:
    """An MLP's output as [batch, piece, hidden] like x (OPT's runs on [batch * piece, hidden])."""
    if out.numel() != x.numel():
        raise UsageError(
            f"composition: layer {layer}'s MLP output has {tuple(out.shape)} values, not one "
            f"per piece and hidden unit {tuple(x.shape)}, so it is not its write"
        )
    return out.reshape(x.shape)


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """got == want up to the rounding of the model's own precision (relative to max |want|)."""
    tol = max(1e-4, 16 * torch.finfo(got.dtype).eps)
    return float((got - want).abs().max()) <= tol * max(float(want.abs().max()), 1e-6)


def check_mlp_writes(cache: LayerCache, family: str) -> None:
    """Every layer below the last has an MLP write, and it is what the residual stream receives
    (module docstring); UsageError (one line, naming the family) else."""
    for layer in range(len(cache.sites) - 1):
        ok = layer in cache.mlp_out and layer + 1 in cache.x
        if ok and cache.post_norm:
            ok = cache.mlp_ok.get(layer, False)
        elif ok:
            norm = cache.mlp_norms.get(layer)
            mlp = cache.mlp_out[layer]  # [batch, piece, hidden]
            write = (norm(mlp) if norm is not None else mlp).float()  # [batch, piece, hidden]
            attention = cache.attention_out[layer]  # [batch, piece, hidden]
            norm = cache.write_norms.get(layer)
            write = write + (norm(attention) if norm is not None else attention).float()
            if layer in cache.cross_out:
                write = write + cache.cross_out[layer].float()
            ok = _close(cache.x[layer + 1], cache.x[layer] + write)
        if not ok:
            raise UsageError(
                f"composition: {family}'s MLP write of layer {layer} is not what its residual "
                "stream receives (the stream is not the sum of the layer's writes), so it "
                "cannot be reached; leave mlp out of the senders"
            )


def _frozen(norm: nn.Module, x: torch.Tensor) -> FrozenNorm:
    """`norm` frozen at its clean scale on input x [batch, piece, hidden]."""
    if isinstance(norm, nn.LayerNorm):
        kind, eps = "layer", norm.eps
        gain = norm.weight.float() if norm.weight is not None else torch.ones(x.shape[-1])
    else:
        kind, gain, eps = fit_norm(norm, x.shape[-1])
        gain = gain.to(x.device)
    x = x.float()
    if kind == "layer":
        x = x - x.mean(-1, keepdim=True)
    scale = torch.sqrt(x.pow(2).mean(-1) + eps)  # [batch, piece]
    return FrozenNorm(kind, gain.detach(), scale)
