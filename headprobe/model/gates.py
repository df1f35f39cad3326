"""Head gates (METHODS §8): scale each head's slice of the attention output projection's input.

    gates = torch.ones(n_layers, n_heads)             # [layer, head]; 1 = intact
    gates[3, 5] = 0.0                                 # zero-ablate head 5 of layer 3
    with HeadGates(model, gates):
        out = model(**inputs)                         # head 3-5 contributes nothing

    means = head_means(model, batches)                # [layer, head, d_head], one pass
    with HeadGates(model, gates, means=means):        # mean ablation: head 3-5's slice
        out = model(**inputs)                         # is its corpus mean instead

    gates = torch.ones(batch, n_layers, n_heads, requires_grad=True)   # a gate per example row
    with HeadGates(model, gates):
        loss_per_row = ...                            # [batch]
    grad, = torch.autograd.grad(loss_per_row.sum(), gates)   # [batch, layer, head]: row b's own dL_b/dg

A head's output reaches the residual stream only through the output projection
(`o_proj`, `attention.output.dense`, `c_proj`, SqueezeBERT's pointwise convolution, ...),
whose input is the heads' outputs side by side: features `h*d_head .. (h+1)*d_head` are
head `h`'s (channels, for a convolution reading [batch, channel, piece]: `projections.features_last`).
A forward pre-hook on that module rewrites its input as

    slice_h <- g * slice_h                        (no means: g = 0 is zero ablation)
    slice_h <- mean_h + g * (slice_h - mean_h)    (with means: g = 0 is mean ablation)

which is what `head_mask` did before transformers 5 removed it. Gates are per *query*
head, so grouped-query models (fewer key/value heads) gate each query head alone.
Gates may be any float and may require grad; rows of one batch do not interact, so
with a gate per row one backward pass gives every row its own gradient. On exit
(exceptions included) the hooks are removed.

Where the projection is: each attention site's `output` (`headprobe.model.sites`), found
beside the attention call for every family the capture supports, legacy path included. A
shared module called several times per pass (ALBERT's one layer) is one site per call: its
hook counts the calls, so gating layer k gates call k only. `stack` picks an encoder-decoder's
stack ("encoder", "decoder" or "cross"; default as the capture's); the other stacks run intact.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from headprobe.model.discovery import attention_sites
from headprobe.model.projections import features_last, projection_in_features
from headprobe.model.sites import AttentionSite, model_device


def output_projections(model, stack: str | None = None) -> list[nn.Module]:
    """The attention output projection of every layer of `stack`, in layer order (one per site:
    ALBERT's shared projection once per call), each `heads x d_head` wide."""
    sites = attention_sites(model)
    found = []
    for site in sites.of(stack):
        width = projection_in_features(site.output) if site.output is not None else None
        if not width or width % site.heads:
            raise ValueError(
                f"{sites.model_class}: no attention output projection {site.heads} heads wide "
                f"at {site.stack} layer {site.layer} ({site.name or 'unnamed'}; found "
                f"{'none' if site.output is None else type(site.output).__name__})"
            )
        found.append(site.output)
    return found


def call_order(model) -> dict[nn.Module, list[AttentionSite]]:
    """Output projection -> the sites whose heads it reads, in call order (several for a
    module shared between layers); one forward pass calls each once per site."""
    out: dict[nn.Module, list[AttentionSite]] = {}
    for site in attention_sites(model).sites:
        if site.output is not None:
            out.setdefault(site.output, []).append(site)
    return out


def _gate_view(gates: torch.Tensor, layer: int, x: torch.Tensor) -> torch.Tensor:
    """The gates of `layer`, shaped to broadcast over x viewed as [batch, ..., head, d_head]."""
    g = gates[layer] if gates.dim() == 2 else gates[:, layer]  # [head] or [batch, head]
    if gates.dim() == 3 and g.shape[0] != x.shape[0]:
        raise ValueError(f"per-row gates for {g.shape[0]} rows, but the batch has {x.shape[0]}")
    g = g.to(device=x.device, dtype=x.dtype)
    if g.dim() == 1:
        return g[:, None]  # [head, 1]
    return g.reshape(g.shape[0], *([1] * (x.dim() - 2)), g.shape[1], 1)  # [batch, 1.., head, 1]


def _checked_means(means, n_layers: int, n_heads: int, d_head: int):
    """`means` as HeadGates takes them: None, [layer, head, d_head] (one mean per head),
    [layer, piece, head, d_head] (one per head and position) or [batch, layer, piece, head,
    d_head] (one baseline per row: resample ablation); anything else is refused."""
    if means is None:
        return None
    shape = tuple(means.shape)
    if means.dim() not in (3, 4, 5) or shape[-2:] != (n_heads, d_head):
        raise ValueError(
            f"means must be [layer, head, d_head], [layer, piece, head, d_head] or [batch, layer, "
            f"piece, head, d_head] with {n_heads} heads of {d_head}, not {list(shape)}"
        )
    if shape[means.dim() == 5] != n_layers:
        raise ValueError(f"means of {shape[means.dim() == 5]} layers, but the model has {n_layers}")
    return means


def _means_of(means: torch.Tensor, layer: int) -> torch.Tensor:
    """Layer `layer`'s baseline, broadcasting over [batch, piece, head, d_head]."""
    return means[:, layer] if means.dim() == 5 else means[layer]


class HeadGates:
    """Context manager: gate every head's output (see the module docstring).

    gates: [layer, head] (one gate per head) or [batch, layer, head] (one per example row);
      1 = intact, 0 = ablated, any float; may require grad.
    means: None (g = 0 zeroes the slice), or [layer, head, d_head] (`head_means`): g = 0
      replaces the slice by the head's mean; [layer, piece, head, d_head]: by its mean at that
      position (`head_means(per_position=True)`); [batch, layer, piece, head, d_head]: by the
      row's own baseline (resample ablation: the partner's slices, `head_slices`).
    stack: the attention stack gated (`headprobe.model.sites`; None: the capture's default).
    """

    def __init__(self, model, gates: torch.Tensor, means: torch.Tensor | None = None, stack=None):
        self.model = model
        sites = attention_sites(model)
        self.stack = sites.resolve(stack)
        self.n_layers, self.n_heads = sites.n_layers(self.stack), sites.n_heads(self.stack)
        if gates.dim() not in (2, 3) or tuple(gates.shape[-2:]) != (self.n_layers, self.n_heads):
            raise ValueError(
                f"gates must be [layer, head] = [{self.n_layers}, {self.n_heads}] or "
                f"[batch, {self.n_layers}, {self.n_heads}], not {list(gates.shape)}"
            )
        self.gates = gates
        self.projections = output_projections(model, self.stack)
        self.d_head = projection_in_features(self.projections[0]) // self.n_heads
        self.means = _checked_means(means, self.n_layers, self.n_heads, self.d_head)
        self._handles: list = []

    def _gate(self, layer: int, args):
        projection = self.projections[layer]
        x = features_last(projection, args[0])  # [batch, piece, head * d_head]
        heads = x.unflatten(-1, (self.n_heads, self.d_head))  # [batch, piece, head, d_head]
        g = _gate_view(self.gates, layer, x)
        if self.means is None:
            heads = heads * g
        else:
            mean = _means_of(self.means, layer).to(device=x.device, dtype=x.dtype)
            heads = mean + g * (heads - mean)
        return (features_last(projection, heads.flatten(-2)), *args[1:])

    def __enter__(self):
        try:
            for module, sites in call_order(self.model).items():
                if any(site.stack == self.stack for site in sites):
                    hook = _counted(sites, self.stack, self._gate)
                    self._handles.append(module.register_forward_pre_hook(hook))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        while self._handles:
            self._handles.pop().remove()
        return False


def model_inputs(batch, device=None, model=None, stack: str | None = None) -> dict:
    """The forward pass's keyword arguments for a headprobe `Batch` or a mapping, on `device`:
    `input_ids` ([batch, piece]) and, where the batch is padded, `attention_mask`; for an
    encoder-decoder `model` and a `Batch`, as the capture feeds `stack` (`Sites.model_inputs`,
    decoder inputs included). A mapping is fed as given, with a mask of ones where it has none."""
    if isinstance(batch, dict):
        ids = batch["input_ids"]  # [batch, piece]
        mask = batch.get("attention_mask")  # [batch, piece]
        inputs = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids) if mask is None else mask,
        }
    elif model is not None:
        sites = attention_sites(model)
        inputs = sites.model_inputs(batch, sites.resolve(stack))
    else:
        inputs = {"input_ids": batch.input_ids}  # [batch, piece]
        if getattr(batch, "padded", True):
            inputs["attention_mask"] = batch.attention_mask
    return {k: v.to(device) for k, v in inputs.items()} if device is not None else inputs


def query_mask(inputs: dict, stack: str) -> torch.Tensor:
    """[batch, piece]: the real query pieces of `stack`'s attention in these inputs (the
    decoder's for an encoder-decoder's decoder and cross-attention, else the input's)."""
    if stack != "encoder" and "decoder_input_ids" in inputs:
        mask = inputs.get("decoder_attention_mask")
        return torch.ones_like(inputs["decoder_input_ids"]) if mask is None else mask
    mask = inputs.get("attention_mask")  # None: an unpadded batch
    return torch.ones_like(inputs["input_ids"]) if mask is None else mask


@torch.no_grad()
def head_means(
    model, batches: Iterable, progress: bool = False, stack=None, per_position: bool = False
) -> torch.Tensor:
    """[layer, head, d_head]: each head's slice of the output projection's input, averaged
    over every non-padding piece of `batches` (headprobe `Batch`es or mappings with
    `input_ids`, `attention_mask`), streaming; the `means` of mean ablation (of `stack`).
    `per_position`: [layer, piece, head, d_head], the mean at each position over the rows
    (inputs of one length: a fixed-length probe)."""
    from tqdm.auto import tqdm

    stack = attention_sites(model).resolve(stack)
    sums, count = None, 0
    for batch in tqdm(batches, desc="head means", unit="batch", disable=not progress):
        inputs = model_inputs(batch, model_device(model), model, stack)
        mask = query_mask(inputs, stack).to(torch.float64).cpu()  # [batch, piece]
        slices = (
            head_slices(model, batch, stack).double().cpu()
        )  # [batch, layer, piece, head, d_head]
        weighted = slices * mask[:, None, :, None, None]
        part = weighted.sum(0) if per_position else weighted.sum((0, 2))
        if per_position and sums is not None and part.shape != sums.shape:
            raise ValueError("head_means(per_position=True): inputs of different lengths")
        sums = part if sums is None else sums + part
        count += mask.sum(0) if per_position else mask.sum()
    if sums is None or float(torch.as_tensor(count).min()) == 0:
        raise ValueError("head_means: no pieces in the batches")
    if per_position:
        return (sums / count[None, :, None, None]).float()  # [layer, piece, head, d_head]
    return (sums / count).float()  # [layer, head, d_head]


@torch.no_grad()
def head_slices(model, batch, stack=None) -> torch.Tensor:
    """[batch, layer, piece, head, d_head]: every head's slice of the output projection's input
    in one intact forward pass over `batch` (a `Batch` or a mapping); resample ablation's
    baselines (a partner's slices) and the pieces of `head_means`."""
    sites = attention_sites(model)
    stack = sites.resolve(stack)
    n_heads = sites.n_heads(stack)
    projections = output_projections(model, stack)
    found: dict[int, torch.Tensor] = {}

    def keep(layer: int, args):
        x = features_last(projections[layer], args[0])  # [batch, piece, head * d_head]
        found[layer] = x.detach().unflatten(-1, (n_heads, x.shape[-1] // n_heads))

    handles = [
        module.register_forward_pre_hook(_counted(order, stack, keep))
        for module, order in call_order(model).items()
        if any(site.stack == stack for site in order)
    ]
    try:
        model(**model_inputs(batch, model_device(model), model, stack))
    finally:
        for handle in handles:
            handle.remove()
    return torch.stack([found[layer] for layer in sorted(found)], 1)


def _counted(sites: list[AttentionSite], stack: str, action):
    """A pre-hook for one output projection: call n of a pass is `sites[n]` (counted cyclically:
    a pass calls the projection once per site); `action(layer, args)` for `stack`'s sites."""
    calls = [0]

    def hook(module, args):
        site = sites[calls[0] % len(sites)]
        calls[0] += 1
        return action(site.layer, args) if site.stack == stack else None

    return hook
