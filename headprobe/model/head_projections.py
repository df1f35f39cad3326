"""Each head's query, key and value projected from an input of its own, where a family projects
them with three separate linear maps of the attention module's input (Llama, Mistral, Qwen,
gpt-oss): a circuit's forward (`model.circuit_forward`) then calls the attention module once,
not once per distinct input.

    found = separate_projections(nodes, ids)      # [layer] -> (q, k, v) modules, or None
    with per_head(found[l], inputs, index, heads):  # inputs [input, batch, piece, hidden] normed
        attention_module(...)                     # q_proj returns head h's slice from inputs[index[0, h]]

The key and value projections then return one key (value) per query head, each from its own
input: the module's `view(..., -1, head_dim)` makes them `heads` heads, and the attention
function gets them ungrouped (a key edge into one head of a group changes that head's key
alone). A family is used this way only where a clean call with one key and value per query head
gives the attention function exactly that (`separate_projections` checks it on layer 0); any
other family keeps the copies of `model.channels.recall`.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from headprobe.model.attention import routed
from headprobe.model.channels import returning


def separate_projections(nodes, ids: torch.Tensor) -> list:
    """Per layer, (q, k, v) nn.Linear modules that read the attention module's input, or None
    everywhere where the family has no such three or fails the check (module docstring)."""
    found, calls = [], {}
    for site in nodes.sites:
        linear = [m for m in site.module.children() if isinstance(m, nn.Linear)]
        width = nodes.n_heads * nodes.d_head
        kv = site.kv_heads * nodes.d_head
        q = [
            m for m in linear if m.out_features == width and m is not nodes.projections[site.layer]
        ]
        value = site.value if isinstance(site.value, nn.Linear) else None
        k = [m for m in linear if m.out_features == kv and m is not value]
        if len(q) != 1 or len(k) != 1 or value is None or value.out_features != kv:
            return [None] * len(nodes.sites)
        found.append((q[0], k[0], value))
    site = nodes.sites[0]

    def keep(module, args, kwargs):
        calls.setdefault("call", (args, kwargs))

    handle = site.module.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        with torch.no_grad():
            nodes.model(input_ids=ids[:1], use_cache=False)
    finally:
        handle.remove()
    return (
        found
        if _ungrouped_call_works(site, found[0], calls["call"], nodes)
        else [None] * len(found)
    )


def _ungrouped_call_works(site, projections, call, nodes) -> bool:
    """Whether layer 0's attention module, its key and value projections returning one head per
    query head, hands its attention function `heads` keys and values."""
    q, k, v = projections
    groups = nodes.n_heads // site.kv_heads
    seen = {}

    def widened(module):
        def forward(x):
            out = nn.Linear.forward(module, x).unflatten(-1, (site.kv_heads, nodes.d_head))
            return out.repeat_interleave(groups, dim=-2).flatten(-2)

        return forward

    def handler(module, query, key, value, mask, scaling, dropout, extra):
        seen["heads"] = (key.shape[1], value.shape[1])
        shape = (query.shape[0], query.shape[2], query.shape[1], value.shape[-1])
        return torch.zeros(shape, dtype=query.dtype, device=query.device), None

    args, kwargs = call
    try:
        with torch.no_grad(), routed(nodes.model, {site.module: handler}):
            with returning({k: widened(k), v: widened(v)}):
                site.module(*args, **kwargs)
    except (RuntimeError, ValueError):
        return False
    return seen.get("heads") == (nodes.n_heads, nodes.n_heads)


@contextlib.contextmanager
def per_head(projections, inputs: torch.Tensor, index: torch.Tensor, heads: int):
    """Inside: the three projections return each query head's slice computed from its own input:
    inputs [input, batch, piece, hidden] (already through the layer's norm), index [3, head] the
    input of each head's q, k and v."""
    q, k, v = projections

    def forward(module, channel: int):
        return lambda x: _project(module, inputs, index[channel], heads, q)

    with returning({q: forward(q, 0), k: forward(k, 1), v: forward(v, 2)}):
        yield


def _d(q: nn.Linear, heads: int) -> int:
    return q.out_features // heads


def _project(module: nn.Linear, inputs, picks, heads: int, q: nn.Linear) -> torch.Tensor:
    """[batch, piece, heads * d_head]: head h's slice of `module` applied to inputs[picks[h]]."""
    d = _d(q, heads)
    groups = heads // (module.out_features // d)
    h = torch.arange(heads, device=picks.device)
    weight = module.weight.view(-1, d, module.weight.shape[-1])[h // groups]  # [head, d, hidden]
    x = inputs[picks.to(inputs.device)]  # [head, batch, piece, hidden]
    out = torch.einsum("hbpo,hdo->bphd", x.to(weight.dtype), weight)
    if module.bias is not None:
        out = out + module.bias.view(-1, d)[h // groups]
    return out.flatten(-2)
