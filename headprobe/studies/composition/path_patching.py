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

from headprobe.core.seeds import keyed_hash
from headprobe.model.channels import CHANNELS, channel_attention, layer_input
from headprobe.model.discovery import attention_sites
from headprobe.model.gates import HeadGates
from headprobe.model.layer_blocks import Kept, layer_blocks, replaying
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
    with Kept(layer_blocks(model, attention_sites(model).of(stack)), kept):
        cache = clean_cache(model, inputs, stack, mlp=mlp)
    return cache, kept


@torch.no_grad()
def exact_rows(model, cache, objective, targets, edges, baseline=None, kept=None):
    """([batch, edge] objective(patched) - objective(clean), [batch] pieces scored). kept: each
    layer's output of the cache's pass (`clean_pass`): then the clean objective replays every
    layer; else it is one more forward pass, which keeps them."""
    blocks = layer_blocks(model, cache.sites)
    if blocks and kept:
        with replaying({b: kept[b] for b in blocks}):
            clean, tokens = objective_rows(objective, model, targets)  # [batch], [batch]
    else:
        kept = {}
        with Kept(blocks, kept):
            clean, tokens = objective_rows(objective, model, targets)  # [batch], [batch]
    n_layers, n_heads = len(cache.sites), cache.sites[0].heads
    base = torch.stack([cache.slices[l] for l in range(n_layers)], 1)  # [b, layer, p, h, d]
    out = []
    for edge in edges:
        _, (layer, head), _ = edge
        base[:, layer, :, head] = changed_slice(model, cache, edge, baseline).to(base)
        gates = torch.ones(base.shape[0], n_layers, n_heads, device=base.device)
        gates[:, layer, head] = 0.0
        below = {blocks[l]: kept[blocks[l]] for l in range(layer)} if blocks else {}
        with HeadGates(model, gates, base, cache.stack), replaying(below):
            patched, _ = objective_rows(objective, model, targets)
        base[:, layer, :, head] = cache.slices[layer][:, :, head]  # clean again, for the next
        out.append(patched - clean)
    return torch.stack(out, 1), tokens


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


__all__ = [
    "CHANNELS",
    "changed_slice",
    "clean_pass",
    "exact_rows",
    "layer_blocks",
    "validation_sample",
]
