"""Every edge of a task's graph scored, and circuits evaluated, on one batch (METHODS §20).

    got = edge_scores(model, graph, pairs, steps=5)   # m_clean, m_corrupted [row]; eap, eap_ig [row, receiver, sender]
    m = circuit_metric(model, graph, pairs, corrupted, out)   # [row] m(C) for out [receiver, sender]
    ex = edge_exact(model, graph, pairs, corrupted, edges)   # [row, edge] m_clean - m(every edge but one)

Signs follow the exact effect of taking an edge out (noising): exact = m_clean - m(all edges but
e), and the estimates g . (w_clean - w_corrupted), g the metric's gradient at the receiver's
input and w the sender's write, summed over pieces. EAP takes g on the clean prompt; EAP-IG
(Hanna et al. 2024) averages g over k passes whose token embeddings lie on the straight line
from the corrupted to the clean ones (at 1/k, ..., 1: the last is EAP's own pass, reused), as the
node-level `ig` of §19 does.

Memory: a gradient pass runs with the model's parameters needing no gradient (`FrozenWeights`:
no weight gradient, no layer input kept for one) and holds one zero per receiver input
(`model.circuit_forward`) and what autograd keeps through each attention module;
the integrated-gradient steps are summed in place into the first pass's gradients; the rows are
sized from a count of all that, checked by measurement (`gradient_rows`). The edges' scores are
[row, receiver, sender] per batch and are summed into per-unit totals at once; no tensor holds
every edge x piece x hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from headprobe.model.circuit_forward import CircuitForward
from headprobe.model.edge_graph import LOGITS, EdgeGraph
from headprobe.model.frozen_weights import FrozenWeights
from headprobe.model.task_nodes import EMBED, two_logits

CPU_BYTES = 1 << 30  # what a gradient pass or a circuit's forward may hold on the CPU
GPU_SHARE = 0.5  # of a GPU's free memory


@dataclass
class EdgeBatch:
    """One batch's values, float32 on the CPU."""

    m_clean: torch.Tensor  # [row]
    m_corrupted: torch.Tensor  # [row]
    eap: torch.Tensor  # [row, receiver, sender] (0 where no edge)
    eap_ig: torch.Tensor  # [row, receiver, sender]


class FrozenPrefix(DynamicCache):
    """The shared prefix's keys and values, never written: each layer's `update` returns them
    (repeated for copies of the rows, and per query head where the new pieces come one per query
    head) before the new pieces' own, and keeps nothing, so every forward of a batch reads the
    same prefix."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        layer = self.layers[layer_idx]
        copies = key_states.shape[0] // layer.keys.shape[0]
        keys, values = layer.keys.repeat(copies, 1, 1, 1), layer.values.repeat(copies, 1, 1, 1)
        groups = key_states.shape[1] // keys.shape[1]  # one key per query head (`per_head`)
        if groups > 1:
            keys, values = (t.repeat_interleave(groups, dim=1) for t in (keys, values))
        keys = torch.cat([keys.to(key_states.dtype), key_states], -2)
        return keys, torch.cat([values.to(value_states.dtype), value_states], -2)


class Prefix:
    """A batch's shared prefix (causal models whose cache is a plain `DynamicCache`): the pieces
    both prompts share before their first difference, run once. There every write is the same in
    the clean, the corrupted and any circuit's forward (the model is causal and nothing there
    differs), so every forward of the batch runs only the pieces after it."""

    def __init__(self, model, nodes, pairs):
        from headprobe.studies.patching.node_effects import cache_keyword, shared_prefix

        self.model, self.keyword, self.cache = model, cache_keyword(model), None
        self.pieces = shared_prefix(model, nodes, pairs)
        if self.pieces:
            base = getattr(model, "base_model", model)
            with torch.no_grad():
                out = base(input_ids=pairs.clean[:, : self.pieces], use_cache=True)
            cache = getattr(out, self.keyword)
            if type(cache) is not DynamicCache or any(
                type(layer).__name__ != "DynamicLayer" for layer in cache.layers
            ):
                self.pieces = 0  # sliding windows or another cache: the whole prompt runs
            else:
                self.cache = FrozenPrefix()
                self.cache.layers = cache.layers

    def rows(self, index: torch.Tensor) -> Prefix:
        """The same prefix for rows `index` of the batch."""
        import copy

        out = copy.copy(self)
        if self.cache is not None:
            out.cache = FrozenPrefix()
            out.cache.layers = []
            for layer in self.cache.layers:
                mine = copy.copy(layer)
                mine.keys, mine.values = layer.keys[index], layer.values[index]
                out.cache.layers.append(mine)
        return out

    def feed(self, ids: torch.Tensor) -> dict:
        if not self.pieces:
            return {"input_ids": ids, "use_cache": False}
        return {"input_ids": ids[:, self.pieces :], self.keyword: self.cache, "use_cache": True}


def metric_of(model, pairs, ids, context=None, prefix: Prefix | None = None) -> torch.Tensor:
    """[row] logit[answer] - logit[distractor] at the scored piece of `ids` [row, piece], the
    forward run inside `context` (a `CircuitForward`, or none) over the pieces after `prefix`."""
    import contextlib

    feed = prefix.feed(ids) if prefix is not None else {"input_ids": ids, "use_cache": False}
    start = prefix.pieces if prefix is not None else 0
    with two_logits(model, pairs.targets), context or contextlib.nullcontext():
        logits = model(**feed).logits  # [row, piece, 2]
    at = (pairs.position - start).to(logits.device)
    at = logits[torch.arange(ids.shape[0], device=logits.device), at]
    return (at[:, 0] - at[:, 1]).float()


def recorded(model, graph: EdgeGraph, pairs, ids, prefix: Prefix | None = None, blocks=False):
    """(NodeValues, m [row]) of a plain forward on `ids` (after `prefix`); `blocks`: each layer
    block's output kept too."""
    with torch.no_grad(), graph.nodes.recording(blocks=blocks) as values:
        m = metric_of(model, pairs, ids, prefix=prefix)
    return values, m


def gradient_rows(graph: EdgeGraph, pieces: int, device) -> int:
    """Rows one batch's edge scores may hold, counted in float32 vectors of [hidden] per layer
    and piece: two sets of receiver gradients (the sum and the pass's own: 3 x heads + 2 each),
    the batched vector-Jacobian product's (3 x heads), what autograd keeps through the attention
    module and the MLP (about 20), and the senders' write changes, their contraction's copy and
    the recorded writes (4 x (heads + 1)). Measured on SmolLM2 (9 heads, 4 pieces after a prefix
    of 10): 37.5 MiB a row, against the 38 MiB this counts."""
    vectors = 2 * (3 * graph.heads + 2) + 3 * graph.heads + 20 + 4 * (graph.heads + 1)
    per_row = vectors * graph.layers * pieces * _hidden(graph) * 4
    return max(1, _budget(device) // max(1, per_row))


def circuit_rows(graph: EdgeGraph, pieces: int, device) -> int:
    """Rows one circuit's forward may hold: every sender's write change [sender, row, piece,
    hidden] in float32, about three times over (it, a receiver's sums, the copies)."""
    per_row = len(graph.senders()) * pieces * _hidden(graph) * 4 * 3
    return max(1, _budget(device) // max(1, per_row))


def _budget(device) -> int:
    if torch.device(device).type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * GPU_SHARE)
    return CPU_BYTES


def _hidden(graph: EdgeGraph) -> int:
    return int(graph.head_writes[0].shape[0])


def _grads(model, graph, pairs, prefix, embed=None) -> dict:
    """receiver key -> d m / d its input [receiver, row, piece, hidden] at the clean prompt (its
    embeddings replaced by `embed` where given), over the pieces after the prefix."""
    with torch.enable_grad(), FrozenWeights(model):
        run = CircuitForward(graph, grad=True, embed=embed)
        m = metric_of(model, pairs, pairs.clean, run, prefix)
        run.backward(m.sum())
        return {k: g.detach().float() for k, g in run.grads.items()}


def _contract(graph: EdgeGraph, grads: dict, diff: dict) -> torch.Tensor:
    """[row, receiver, sender]: sum over pieces and features of each receiver's gradient times
    each sender's write change, for the edges of the graph."""
    blocks = graph.sender_blocks()
    rows = next(iter(grads.values())).shape[1]
    out = torch.zeros((rows, len(graph.receivers()), len(graph.senders())))
    every = torch.cat(
        [diff[(kind, layer)] for kind, layer, _ in blocks]
    )  # [sender, row, piece, hidden]
    every = every.flatten(2).transpose(0, 1).contiguous()  # [row, sender, piece * hidden]
    for key, g in grads.items():
        if key == LOGITS:
            receivers = [graph.logits_row]
        elif isinstance(key, tuple):  # ("mlp", layer)
            receivers = [graph.mlp_row(key[1])]
        else:
            span = graph.attention_rows(key)
            receivers = list(range(span.start, span.stop))
        bound = graph.bound(receivers[0])
        d = every[:, :bound].to(g.device)  # [row, sender, piece * hidden]
        got = torch.bmm(g.flatten(2).transpose(0, 1), d.transpose(1, 2))  # [row, receiver, sender]
        out[:, receivers[0] : receivers[-1] + 1, :bound] = got.cpu()
    return out


def edge_scores(model, graph: EdgeGraph, pairs, steps: int = 5) -> EdgeBatch:
    """EAP and EAP-IG for every edge, with the batch's metric (module docstring)."""
    prefix = Prefix(model, graph.nodes, pairs)
    clean, m_clean = recorded(model, graph, pairs, pairs.clean, prefix)
    corrupted, m_corrupted = recorded(model, graph, pairs, pairs.corrupted, prefix)
    w_clean, w_corrupted = graph.writes(clean), graph.writes(corrupted)  # views of the records
    diff = {k: w_clean[k] - w_corrupted[k] for k in w_clean}  # [sender, row, piece, hidden]
    del w_clean, w_corrupted
    total = _grads(model, graph, pairs, prefix)  # the clean prompt's: EAP's, then summed into
    eap = _contract(graph, total, diff)
    start, end = corrupted.embed.float(), clean.embed.float()
    for k in range(1, steps):
        g = _grads(model, graph, pairs, prefix, embed=start + (k / steps) * (end - start))
        for key in total:
            total[key] += g[key]
        del g
    for value in total.values():
        value /= steps
    eap_ig = _contract(graph, total, diff)
    return EdgeBatch(m_clean.cpu(), m_corrupted.cpu(), eap, eap_ig)


@torch.no_grad()
def circuit_metric(model, graph: EdgeGraph, pairs, corrupted, out: torch.Tensor, prefix=None):
    """[row] m(C): the clean forward with every edge where `out` [receiver, sender] is 1 taking its
    sender's corrupted write (`corrupted`: the recorded corrupted forward, over the same pieces
    as this one: after `prefix`)."""
    run = CircuitForward(graph, corrupted, out)
    return metric_of(model, pairs, pairs.clean, run, prefix).cpu()


@torch.no_grad()
def edge_exact(model, graph: EdgeGraph, pairs, corrupted, m_clean, edges, prefix=None, clean=None):
    """[row, edge]: m_clean - m(every edge but e) for each (receiver, sender) of `edges`. With
    one edge out, every layer below the receiver's is the clean forward's: those layers replay
    their clean outputs (`model.layer_blocks`; `clean`: the clean forward recorded with its
    blocks, recorded here where not given), and the sender's change is the recorded one."""
    from headprobe.model.layer_blocks import replaying

    shape = (len(graph.receivers()), len(graph.senders()))
    if clean is None:
        clean, _ = recorded(model, graph, pairs, pairs.clean, prefix, blocks=True)
    blocks = graph.nodes.blocks
    cols = []
    for r, s in edges:
        out = torch.zeros(shape)
        out[r, s] = 1.0
        below = {blocks[l]: clean.blocks[blocks[l]] for l in range(graph.receiver_layer(r))}
        run = CircuitForward(graph, corrupted, out, known={s: graph.change(s, corrupted, clean)})
        with replaying(below):
            cols.append(m_clean - metric_of(model, pairs, pairs.clean, run, prefix).cpu())
    return torch.stack(cols, 1) if cols else torch.zeros((len(m_clean), 0))


__all__ = [
    "EMBED",
    "EdgeBatch",
    "FrozenPrefix",
    "Prefix",
    "circuit_metric",
    "circuit_rows",
    "edge_exact",
    "edge_scores",
    "gradient_rows",
    "metric_of",
    "recorded",
]
