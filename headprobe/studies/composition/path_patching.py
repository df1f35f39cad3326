"""Through the model (METHODS §18 "Through the model"): the change of the model's objective when
only receiver r's channel c sees the ablated sender and every layer above r is recomputed.

    delta, tokens = exact_rows(model, cache, objective, targets, edges, baseline)
    # delta [batch, edge]: objective(patched) - objective(clean), summed over each row
    cache, kept = clean_pass(model, targets.inputs, stack)   # the cache, each layer's output kept
    delta, tokens = exact_rows(model, cache, objective, targets, edges, baseline, kept)

An edge is ((sender layer, sender head), (layer, head), channel). The receiver's changed write
z'_r is computed as `intervention.edge_sums` computes it (`model.channels`); the model then runs
with r's slice of its output projection's input set to z'_r (`HeadGates` with that slice as the
row's baseline and r's gate 0), so every layer above r reads r's changed write. The layers
below r are not run again: each returns its output of the clean pass (`layer_blocks`, where
each layer is a module of its own), so a patched pass costs the layers from r up. Where the
cache's own pass kept those outputs (`clean_pass`), the clean objective runs no layer either.
A language-
model loss computes logits at the scored pieces only (`first_order.objective_rows`). The validation
sample (`validation_sample`) and the comparison with a first-order estimate reuse the importance
check's statistics (`studies.ablation.validation`).
"""

from __future__ import annotations

import torch
from torch import nn

from headprobe.core.seeds import keyed_hash
from headprobe.model.channels import CHANNELS, channel_attention, layer_input, returning
from headprobe.model.discovery import attention_sites
from headprobe.model.gates import HeadGates
from headprobe.model.layer_cache import check_supported, clean_cache
from headprobe.studies.composition.first_order import objective_rows
from headprobe.studies.composition.intervention import sender_changes

TOP, RANDOM = 20, 10  # the validation sample: the top edges and edges drawn at random, seeded


@torch.no_grad()
def changed_slice(model, cache, edge, baseline=None) -> torch.Tensor:
    """[batch, piece, d_head]: receiver r's slice z'_r when its channel c reads x - w_s + b_s."""
    sender, (layer, head), channel = edge
    d = sender_changes(cache, layer, [sender], baseline)[0]  # [batch, piece, hidden]
    hidden = layer_input(cache, layer, cache.x[layer] + d)
    out = channel_attention(model, cache, layer, hidden, channels=(channel,))
    return out.z[channel][:, :, head]  # [batch, piece, d_head]


@torch.no_grad()
def clean_pass(model, inputs: dict, stack: str | None = None, mlp: bool = False) -> tuple:
    """(`clean_cache(model, inputs, stack, mlp)`, {layer's module: its output of that pass}):
    the outputs `exact_rows` replays, kept from the cache's own forward pass (empty where the
    layers are not modules of their own, `layer_blocks`)."""
    stack = check_supported(model, stack)
    kept: dict = {}
    with _Kept(layer_blocks(model, attention_sites(model).of(stack)), kept):
        cache = clean_cache(model, inputs, stack, mlp=mlp)
    return cache, kept


@torch.no_grad()
def exact_rows(model, cache, objective, targets, edges, baseline=None, kept=None):
    """([batch, edge] objective(patched) - objective(clean), [batch] pieces scored). kept: each
    layer's output of the cache's pass (`clean_pass`): then the clean objective replays every
    layer; else it is one more forward pass, which keeps them."""
    blocks = layer_blocks(model, cache.sites)
    if blocks and kept:
        with returning({b: _replay(kept[b]) for b in blocks}):
            clean, tokens = objective_rows(objective, model, targets)  # [batch], [batch]
    else:
        kept = {}
        with _Kept(blocks, kept):
            clean, tokens = objective_rows(objective, model, targets)  # [batch], [batch]
    n_layers, n_heads = len(cache.sites), cache.sites[0].heads
    base = torch.stack([cache.slices[l] for l in range(n_layers)], 1)  # [b, layer, p, h, d]
    out = []
    for edge in edges:
        _, (layer, head), _ = edge
        base[:, layer, :, head] = changed_slice(model, cache, edge, baseline).to(base)
        gates = torch.ones(base.shape[0], n_layers, n_heads, device=base.device)
        gates[:, layer, head] = 0.0
        below = {blocks[l]: _replay(kept[blocks[l]]) for l in range(layer)} if blocks else {}
        with HeadGates(model, gates, base, cache.stack), returning(below):
            patched, _ = objective_rows(objective, model, targets)
        base[:, layer, :, head] = cache.slices[layer][:, :, head]  # clean again, for the next
        out.append(patched - clean)
    return torch.stack(out, 1), tokens


def layer_blocks(model, sites) -> list | None:
    """The module each layer of a stack runs in (the item of a `ModuleList` that holds its
    attention module; `sites`: the stack's, as `LayerCache.sites`), one distinct module per layer
    in layer order; None where layers share one (ALBERT) or none is found: then every patched
    pass runs from the bottom."""
    found = []
    for site in sites:
        parts = site.name.split(".")
        block = None
        for i in range(len(parts) - 1, 0, -1):
            if parts[i].isdigit() and isinstance(
                model.get_submodule(".".join(parts[:i])), nn.ModuleList
            ):
                block = model.get_submodule(".".join(parts[: i + 1]))
                break
        if block is None:
            return None
        found.append(block)
    if len({id(b) for b in found}) != len(found):
        return None
    return found


class _Kept:
    """Context manager: each block's output of the clean pass, kept (first call only)."""

    def __init__(self, blocks, kept: dict):
        self.blocks, self.kept, self.handles = blocks or [], kept, []

    def __enter__(self):
        def keep(module, args, output):
            self.kept.setdefault(module, output)

        self.handles = [b.register_forward_hook(keep) for b in self.blocks]
        return self

    def __exit__(self, *exc):
        while self.handles:
            self.handles.pop().remove()
        return False


def _replay(output):
    """A block's stand-in forward: a copy of its clean output (the layers below the receiver
    read nothing the patch changes, so their outputs are the clean pass's)."""
    return lambda *args, **kwargs: _copied(output)


def _copied(value):
    if torch.is_tensor(value):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_copied(v) for v in value)
    if isinstance(value, dict):
        return type(value)({k: _copied(v) for k, v in value.items()})
    return value


def validation_sample(edges, effects, seed: int = 0, top: int = TOP, random: int = RANDOM):
    """The edges checked exactly: the `top` largest `effects` and `random` others drawn by a keyed
    hash of the seed and the edge (smallest first)."""
    order = sorted(range(len(edges)), key=lambda i: -float(effects[i]))
    chosen = order[:top]
    label = lambda e: f"{e[0][0]}-{e[0][1]}>{e[1][0]}-{e[1][1]}:{e[2]}"
    rest = sorted(
        (i for i in order[top:]), key=lambda i: keyed_hash(seed, "composition", label(edges[i]))
    )
    return [edges[i] for i in sorted(chosen + rest[:random])]


__all__ = ["CHANNELS", "changed_slice", "clean_pass", "exact_rows", "validation_sample"]
