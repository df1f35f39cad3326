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
(`o_proj`, `attention.output.dense`, `c_proj`, ...), whose input is the heads'
outputs side by side: features `h*d_head .. (h+1)*d_head` are head `h`'s. A
forward pre-hook on that module rewrites its input as

    slice_h <- g * slice_h                        (no means: g = 0 is zero ablation)
    slice_h <- mean_h + g * (slice_h - mean_h)    (with means: g = 0 is mean ablation)

which is what `head_mask` did before transformers 5 removed it. Gates are per *query*
head, so grouped-query models (fewer key/value heads) gate each query head alone.
Gates may be any float and may require grad; rows of one batch do not interact, so
with a gate per row one backward pass gives every row its own gradient. On exit
(exceptions included) the hooks are removed.

Adding a model family: put the path of its output projection, relative to one
Transformer block, in `OUTPUT_PROJECTIONS` (the module must take the concatenated
head outputs `[..., head * d_head]` as its first input, as `nn.Linear` and
transformers' `Conv1D` do), and add the family to tests/test_gates.py.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from headprobe.model.capture import (
    find_blocks,
    model_device,
    n_layers_heads,
    projection_in_features,
)

# The attention output projection, relative to one Transformer block (`capture.find_blocks`).
OUTPUT_PROJECTIONS = (
    "attention.output.dense",  # BERT, RoBERTa, XLM-R, ELECTRA, DeBERTa-v2 (the SelfOutput's dense)
    "attn.c_proj",  # GPT-2 (Conv1D: weight [in, out])
    "self_attn.o_proj",  # Llama, Mistral, Qwen2, Gemma, SmolLM2 (grouped-query too)
    "self_attn.out_proj",  # OPT
    "self_attn.dense",  # Phi
    "attention.dense",  # GPT-NeoX, Pythia
    "self_attention.dense",  # Falcon, BLOOM
    "attn.out_proj",  # GPT-J
    "attn.attention.out_proj",  # GPT-Neo
    "attention.out_lin",  # DistilBERT
    "attention.attn.o",  # MPNet
)


def in_features(module: nn.Module) -> int:
    """Input width of a projection (`capture.projection_in_features`), or an error naming it."""
    width = projection_in_features(module)
    if width is None:
        raise ValueError(f"cannot tell the input width of {type(module).__name__}")
    return int(width)


def output_projections(model) -> list[nn.Module]:
    """The attention output projection of every layer, in layer order (see `OUTPUT_PROJECTIONS`)."""
    n_layers, n_heads = n_layers_heads(model)
    found = []
    for layer, block in enumerate(find_blocks(model)):
        for path in OUTPUT_PROJECTIONS:
            try:
                module = block.get_submodule(path)
            except AttributeError:
                continue
            break
        else:
            raise ValueError(
                f"{type(model).__name__}: no attention output projection in layer {layer} "
                f"(looked for {', '.join(OUTPUT_PROJECTIONS)}); add its path to "
                "headprobe.model.gates.OUTPUT_PROJECTIONS"
            )
        if in_features(module) % n_heads:
            raise ValueError(
                f"{type(model).__name__} layer {layer}: output projection input "
                f"{in_features(module)} is not {n_heads} heads wide"
            )
        found.append(module)
    return found


def head_dim(model) -> int:
    """Width of one head's slice of the output projection's input."""
    return in_features(output_projections(model)[0]) // n_layers_heads(model)[1]


def _gate_view(gates: torch.Tensor, layer: int, x: torch.Tensor) -> torch.Tensor:
    """The gates of `layer`, shaped to broadcast over x viewed as [batch, ..., head, d_head]."""
    g = gates[layer] if gates.dim() == 2 else gates[:, layer]  # [head] or [batch, head]
    if gates.dim() == 3 and g.shape[0] != x.shape[0]:
        raise ValueError(f"per-row gates for {g.shape[0]} rows, but the batch has {x.shape[0]}")
    g = g.to(device=x.device, dtype=x.dtype)
    if g.dim() == 1:
        return g[:, None]  # [head, 1]
    return g.reshape(g.shape[0], *([1] * (x.dim() - 2)), g.shape[1], 1)  # [batch, 1.., head, 1]


class HeadGates:
    """Context manager: gate every head's output (see the module docstring).

    gates: [layer, head] (one gate per head) or [batch, layer, head] (one per example row);
      1 = intact, 0 = ablated, any float; may require grad.
    means: None (g = 0 zeroes the slice), or [layer, head, d_head] (`head_means`): g = 0
      replaces the slice by the head's mean.
    """

    def __init__(self, model, gates: torch.Tensor, means: torch.Tensor | None = None):
        self.model = model
        self.n_layers, self.n_heads = n_layers_heads(model)
        if gates.dim() not in (2, 3) or tuple(gates.shape[-2:]) != (self.n_layers, self.n_heads):
            raise ValueError(
                f"gates must be [layer, head] = [{self.n_layers}, {self.n_heads}] or "
                f"[batch, {self.n_layers}, {self.n_heads}], not {list(gates.shape)}"
            )
        self.gates = gates
        self.projections = output_projections(model)
        self.d_head = in_features(self.projections[0]) // self.n_heads
        if means is not None and tuple(means.shape) != (self.n_layers, self.n_heads, self.d_head):
            raise ValueError(
                f"means must be [layer, head, d_head] = [{self.n_layers}, {self.n_heads}, "
                f"{self.d_head}], not {list(means.shape)}"
            )
        self.means = means
        self._handles: list = []

    def _hook(self, layer: int):
        def gate(module, args):
            x = args[0]  # [batch, piece, head * d_head]
            heads = x.unflatten(-1, (self.n_heads, self.d_head))  # [batch, piece, head, d_head]
            g = _gate_view(self.gates, layer, x)
            if self.means is None:
                heads = heads * g
            else:
                mean = self.means[layer].to(device=x.device, dtype=x.dtype)  # [head, d_head]
                heads = mean + g * (heads - mean)
            return (heads.flatten(-2), *args[1:])

        return gate

    def __enter__(self):
        try:
            for layer, module in enumerate(self.projections):
                self._handles.append(module.register_forward_pre_hook(self._hook(layer)))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        while self._handles:
            self._handles.pop().remove()
        return False


def model_inputs(batch, device=None) -> dict[str, torch.Tensor]:
    """`input_ids` and `attention_mask` of a headprobe `Batch` or a mapping, on `device`."""
    get = batch.get if isinstance(batch, dict) else (lambda key: getattr(batch, key, None))
    ids = get("input_ids")  # [batch, piece]
    mask = get("attention_mask")  # [batch, piece]
    mask = torch.ones_like(ids) if mask is None else mask
    if device is not None:
        ids, mask = ids.to(device), mask.to(device)
    return {"input_ids": ids, "attention_mask": mask}


class _MeanPass:
    """Sums of each layer's output-projection input over non-padding pieces (for `head_means`)."""

    def __init__(self, n_layers: int, width: int):
        self.sums = torch.zeros(n_layers, width, dtype=torch.float64)  # [layer, head * d_head]
        self.count = 0
        self.mask = None  # [batch, piece], per batch

    def hook(self, layer: int):
        def add(module, args):
            x = args[0]  # [batch, piece, head * d_head]
            keep = self.mask.to(x.device).bool()  # [batch, piece]
            self.sums[layer] += x[keep].double().sum(0).cpu()

        return add


@torch.inference_mode()
def head_means(model, batches: Iterable, progress: bool = False) -> torch.Tensor:
    """[layer, head, d_head]: each head's slice of the output projection's input, averaged
    over every non-padding piece of `batches` (headprobe `Batch`es or mappings with
    `input_ids`, `attention_mask`), streaming; the `means` of mean ablation."""
    from tqdm.auto import tqdm

    n_layers, n_heads = n_layers_heads(model)
    projections = output_projections(model)
    state = _MeanPass(n_layers, in_features(projections[0]))
    handles = [
        m.register_forward_pre_hook(state.hook(layer)) for layer, m in enumerate(projections)
    ]
    try:
        for batch in tqdm(batches, desc="head means", unit="batch", disable=not progress):
            inputs = model_inputs(batch, model_device(model))
            state.mask = inputs["attention_mask"]
            state.count += int(inputs["attention_mask"].sum())
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    if state.count == 0:
        raise ValueError("head_means: no pieces in the batches")
    means = (state.sums / state.count).float()  # [layer, head * d_head]
    return means.unflatten(-1, (n_heads, means.shape[-1] // n_heads))  # [layer, head, d_head]
