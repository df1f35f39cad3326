"""The forward pass in which every receiver input of a task's graph is built from its senders
(METHODS §20, circuits on a task).

    graph = EdgeGraph.of(nodes, ids)          # senders, receivers, which sender reaches which
    with nodes.recording(blocks=False) as corrupted:
        model(input_ids=corrupted_ids)
    with CircuitForward(graph, corrupted, out):   # out [receiver, sender]: 1 = the corrupted write
        model(input_ids=clean_ids)                # m(C) for the circuit C = {out == 0}
    with CircuitForward(graph, grad=True) as run: # every receiver input's gradient, kept
        m = ...; run.backward(m.sum())
    run.grads[l]            # [3 * head, batch, piece, hidden]: d m / d each head channel's input
    run.grads[("mlp", l)]   # [1, batch, piece, hidden]: d m / d the MLP's input
    run.grads["logits"]     # [1, batch, piece, hidden]: d m / d the final norm's input

The graph (senders, receivers, edges, and the families refused) is `model.edge_graph`'s.

Receiver input = the input this forward gives the receiver + sum over out-of-circuit senders of
(the sender's corrupted write - its write in this forward): the residual stream is the sum of
the writes, so this is the sum over in-circuit senders of their writes here and over the others
of their corrupted writes, constant terms included once. A head's query, key and value each
read their own input: the layer's attention module is called once on the distinct inputs of its
heads' channels (copies of the batch, through its own norm, projections and position encoding),
and its attention function takes head h's query from its query input's copy, its key and value
from its key and value inputs' copies (a key/value group's projection computed once per copy,
so grouped-query attention is never ungrouped in the weights); where the family has three
separate q, k, v linear maps, each head's slices are projected from its inputs instead and the
module is called once (`model.head_projections`). The empty circuit gives the corrupted
forward's metric, the full one the clean one.

Gradients. A layer's attention reads its residual stream plus one zero; the backward pass gives
the metric's gradient at each head's query, key and value as the attention function received
them, and a batched vector-Jacobian product from each of the three through the norm, its own
projection and position encoding back to the zero (the local graph alone, one head's gradient at
a time: `is_grads_batched`) gives the gradient at that head's query, key or value input: a head's
query depends on its input through the query projection alone, so one input serves the three
channels. The MLP's and the logits' inputs get a zero each.
"""

from __future__ import annotations

import contextlib

import torch

from headprobe.model.attention import probs_and_output, routed
from headprobe.model.channels import repeated
from headprobe.model.edge_graph import LOGITS, EdgeGraph, first_output
from headprobe.model.head_projections import per_head
from headprobe.model.layer_cache import CACHE_KWARGS
from headprobe.model.task_nodes import EMBED, NodeValues


def _plain(module, x):
    """A module's own forward, without the hooks on it."""
    return type(module).forward(module, x)


GATHER = 16  # a gathered row of senders' changes costs about this many multiply-adds a value


def _gathers(rows: int, used: int, bound: int) -> bool:
    """Whether a product over `used` of `bound` senders gathers their rows first: a gather
    copies what it keeps, so it pays only where few senders are used (measured on 2 cores)."""
    return (rows + GATHER) * used < rows * bound


def _cost(weights: torch.Tensor, used: torch.Tensor, bound: int) -> int:
    """Multiply-adds per value of `_product(weights, used, ...)`, a gather counted as `GATHER`."""
    rows = weights.shape[0]
    return (rows + GATHER) * len(used) if _gathers(rows, len(used), bound) else rows * bound


def _product(weights: torch.Tensor, used: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """weights [row, sender] @ flat [sender, n], where only the senders `used` have weights
    other than 0 (those rows of `flat` gathered first where that is cheaper: `_gathers`)."""
    if not len(used):
        return flat.new_zeros((weights.shape[0], flat.shape[1]))
    if not _gathers(weights.shape[0], len(used), flat.shape[0]):
        return weights.to(flat) @ flat
    return weights[:, used].to(flat) @ flat[used.to(flat.device)]


@contextlib.contextmanager
def _ungrouped(module):
    """The module's key/value groups read as 1 while its family's eager attention runs on keys
    and values already picked per query head (gpt-oss's sinks go through it)."""
    saved = module.__dict__.get("num_key_value_groups")
    if saved is None:
        yield
        return
    module.num_key_value_groups = 1
    try:
        yield
    finally:
        module.num_key_value_groups = saved


class CircuitForward:
    """Context manager: the model's forward run inside builds every receiver input from its
    senders (module docstring). `out` [receiver, sender] float (1: the edge is out of the circuit,
    its sender's corrupted write; 0: in, this forward's write) with `corrupted` the recorded
    corrupted forward; or `grad=True`: every receiver input gets a zero leaf of its own, whose
    gradient `grads` holds after a backward pass. `embed`: the token embeddings' output replaced
    (integrated gradients' path). `known`: {sender: its change (corrupted - this forward's write)
    [batch, piece, hidden]} given, for a sender whose layer replays its output and runs no hook."""

    def __init__(
        self,
        graph: EdgeGraph,
        corrupted: NodeValues | None = None,
        out=None,
        grad: bool = False,
        embed: torch.Tensor | None = None,
        known: dict | None = None,
    ):
        if (out is None) == (not grad) or (out is not None and corrupted is None):
            raise ValueError("CircuitForward: give `corrupted` and `out`, or grad=True")
        self.graph, self.grad, self.embed = graph, grad, embed
        self.known = known or {}  # sender -> its change [batch, piece, hidden], given
        self.out = None if out is None else out.float()
        self.corrupted = corrupted
        self.leaves: dict = {}  # receiver key -> zero leaf [1, batch, piece, hidden]
        self.picked: dict = {}  # layer -> (q, k, v) the attention function computed with
        self.grads: dict = {}
        self.handles: list = []
        self.stack = contextlib.ExitStack()

    def backward(self, total: torch.Tensor) -> None:
        """Backward from `total` (a scalar) to the receivers' inputs alone (no parameter's
        gradient), then every receiver's gradient into `grads`."""
        wanted = [
            t
            for key, leaf in self.leaves.items()
            for t in (self.picked[key] if key in self.picked else (leaf,))
        ]
        got = torch.autograd.grad(  # these alone: no parameter's gradient is computed
            total, wanted, retain_graph=bool(self.picked), allow_unused=True
        )
        found = {id(t): g for t, g in zip(wanted, got)}
        self.grads = {}
        for key, leaf in self.leaves.items():
            if key not in self.picked:
                g = found[id(leaf)]
                self.grads[key] = torch.zeros_like(leaf) if g is None else g
                continue
            picked = self.picked[key]  # q, k, v [batch, head, piece, d_head] as attention got them
            heads = picked[0].shape[1]
            eye = torch.eye(heads, dtype=picked[0].dtype, device=picked[0].device)
            per = []
            for t in picked:
                g = found[id(t)]
                g = torch.zeros_like(t) if g is None else g
                batched = eye[:, None, :, None, None] * g[None]  # [head, batch, head, piece, d]
                (got,) = torch.autograd.grad(
                    t, leaf, batched, retain_graph=True, is_grads_batched=True
                )  # [head, 1, batch, piece, hidden]
                per.append(got[:, 0])
            self.grads[key] = torch.cat(per)  # [3 * head, batch, piece, hidden] channel-major
        self.picked.clear()

    # -------------------------------------------------------------- what each receiver reads
    def _active(self, rows) -> bool:
        return self.grad or bool(self.out[rows].any())

    def _sends(self, block) -> bool:
        """Whether an edge out of the circuit leaves a sender of `block` ((kind, layer)): only
        those senders' changes are ever read (the others' stay 0 in `every`, and 0 is what every
        product gives them either way)."""
        return bool(self.out[:, self.spans[block]].any())

    def _delta(self, rows, like: torch.Tensor) -> torch.Tensor | None:
        """[row, batch, piece, hidden] sum over out-of-circuit senders of (corrupted - this
        forward's write) for receiver rows `rows` (receivers of one bound), or None (all 0).
        Where fewer senders are in the circuit of some row than out of it for some row, it is
        the sum over every sender less the in-circuit ones (the sum kept as the senders come);
        otherwise the out-masks [row, sender] times the out-of-circuit senders' changes. Either
        way a product over only the senders some row needs."""
        bound = max(self.graph.bound(r) for r in rows)
        mask = self.out[rows][:, :bound]  # [row, sender] 1: out of the circuit
        if not mask.any():
            return None
        inside = self.edges[rows][:, :bound] - mask  # [row, sender] 1: in the circuit
        outs, ins = mask.any(0).nonzero()[:, 0], inside.any(0).nonzero()[:, 0]
        flat = self.every[:bound].flatten(1)  # [sender, batch * piece * hidden]
        if _cost(mask, ins, bound) < _cost(mask, outs, bound):
            total = self._total(bound)[None] - _product(inside, ins, flat)
        else:
            total = _product(mask, outs, flat)
        return total.view(len(rows), *self.every.shape[1:]).to(like.device)

    def _total(self, bound: int) -> torch.Tensor:
        """[batch * piece * hidden] the sum of the first `bound` senders' changes, kept as a
        running sum (senders are stored in order, and bounds only grow through a forward)."""
        done, total = self.running
        if bound < done:
            return self.every[:bound].flatten(1).sum(0)
        if bound > done:
            total = total + self.every[done:bound].flatten(1).sum(0)
            self.running = (bound, total)
        return total

    def _store(self, senders: slice, diff: torch.Tensor) -> None:
        """Keep senders' write changes [sender, batch, piece, hidden] (corrupted - this forward)."""
        if self.every is None:
            shape = (len(self.graph.senders()), *diff.shape[1:])
            self.every = torch.zeros(shape, dtype=torch.float32, device=diff.device)
        self.every[senders] = diff.to(self.every.device)

    def _inputs(self, rows: list, x: torch.Tensor, layer_key) -> tuple:
        """(inputs [variant, batch, piece, hidden], index [row] -> variant): the distinct inputs
        of receivers `rows` whose residual stream here is x [batch, piece, hidden]."""
        if self.grad:  # one input for every receiver of the layer (module docstring)
            leaf = torch.zeros((1, *x.shape), dtype=x.dtype, device=x.device, requires_grad=True)
            self.leaves[layer_key] = leaf
            return x[None] + leaf, torch.zeros(len(rows), dtype=torch.long, device=x.device)
        bound = max(self.graph.bound(r) for r in rows)
        masks = self.out[rows][:, :bound]
        unique, index = torch.unique(masks, dim=0, return_inverse=True)
        rep = [int((index == v).nonzero()[0, 0]) for v in range(unique.shape[0])]
        delta = self._delta([rows[i] for i in rep], x)
        inputs = x[None].float() if delta is None else x[None].float() + delta
        return inputs.to(x.dtype), index.to(x.device)

    # ------------------------------------------------------------------------------ hooks
    def __enter__(self):
        g, nodes = self.graph, self.graph.nodes
        self.spans = {(kind, layer): s for kind, layer, s in g.sender_blocks()}
        self.every = None  # [sender, batch, piece, hidden] corrupted - this forward's writes
        self.running = (0, 0.0)  # (senders summed, their sum [batch * piece * hidden])
        for sender, change in self.known.items():  # a layer that replays its output runs no hook
            self._store(slice(sender, sender + 1), change.float()[None])
        if self.out is not None:
            self.edges = g.reach().float()  # [receiver, sender] 1: an edge of the graph
        self.x: dict = {}  # layer -> residual entering it; ("mid", layer) -> the MLP's norm input
        self.pending: dict = {}  # layer -> (index [3, head], variants, batch)
        self.open: dict = {}  # layer -> the per-head projections in force during its call
        corr = None if self.corrupted is None else self.corrupted
        add = self.handles.append
        routes = {}
        for layer in range(g.layers):
            site = nodes.sites[layer]
            rows = list(range(g.attention_rows(layer).start, g.attention_rows(layer).stop))
            add(site.norm_in.register_forward_pre_hook(self._keep_x(layer)))
            if self._active(rows):
                add(
                    site.module.register_forward_pre_hook(
                        self._attention_in(layer, rows), with_kwargs=True
                    )
                )
                add(site.module.register_forward_hook(self._attention_out(layer)))
                routes[site.module] = self._attention(layer)
            if self._active(rows):  # the copies' rows are zeros there: project the batch's
                add(nodes.projections[layer].register_forward_pre_hook(self._cut(layer)))
            if corr is not None and self._sends(("head", layer)):
                add(nodes.projections[layer].register_forward_pre_hook(self._head_diff(layer)))
            if corr is not None and self._sends(("mlp", layer)):
                add(nodes.mlps[layer].register_forward_hook(self._mlp_diff(layer)))
            add(g.mlp_norms[layer].register_forward_pre_hook(self._keep_mid(layer)))
            if self._active([g.mlp_row(layer)]):
                add(
                    nodes.mlps[layer].register_forward_pre_hook(
                        self._mlp_in(layer), with_kwargs=True
                    )
                )
        if self._active([g.logits_row]):
            add(nodes.final.register_forward_pre_hook(self._final_in()))
        if self.embed is not None:
            add(nodes.embedding.register_forward_hook(lambda m, a, o: self.embed.to(o.dtype)))
        if routes:
            self.stack.enter_context(routed(nodes.model, routes))
        return self

    def __exit__(self, *exc):
        while self.open:
            self.open.popitem()[1].close()
        while self.handles:
            self.handles.pop().remove()
        self.stack.close()
        return False

    def _keep_x(self, layer):
        def hook(module, args):
            x = args[0]
            if layer not in self.x:  # the first call: the layer's own (not a variant's)
                self.x[layer] = x
                if layer == 0 and self.corrupted is not None and self._sends((EMBED, 0)):
                    self._store(slice(0, 1), (self.corrupted.x0.float() - x.float())[None])

        return hook

    def _keep_mid(self, layer):
        def hook(module, args):
            self.x.setdefault(("mid", layer), args[0])

        return hook

    def _attention_in(self, layer, rows):
        norm = self.graph.nodes.sites[layer].norm_in

        def hook(module, args, kwargs):
            x = self.x[layer]
            inputs, index = self._inputs(rows, x, layer)
            variants, batch = inputs.shape[0], x.shape[0]
            normed = _plain(norm, inputs.flatten(0, 1))  # [variant * batch, piece, hidden]
            separate = self.graph.separate[layer]
            if separate is not None and not self.grad:  # each head projected from its input
                self.pending[layer] = (None, 1, batch)
                self.open[layer] = contextlib.ExitStack()
                normed = normed.unflatten(0, (variants, batch))
                self.open[layer].enter_context(
                    per_head(separate, normed, index.view(3, -1), self.graph.heads)
                )
                return None
            self.pending[layer] = (index.view(3, -1), variants, batch)
            args = repeated(args[1:], batch, variants)
            cache = {k: v for k, v in kwargs.items() if k in CACHE_KWARGS}  # a frozen prefix
            kwargs = repeated({k: v for k, v in kwargs.items() if k not in cache}, batch, variants)
            kwargs.update(cache)
            if "hidden_states" in kwargs:
                return args, {**kwargs, "hidden_states": normed}
            return (normed, *args), kwargs

        return hook

    def _attention(self, layer):
        heads = self.graph.heads

        def handler(module, q, k, v, mask, scaling, dropout, extra):
            index, variants, batch = self.pending.pop(layer)
            if index is None:  # q, k, v already one per head, each from its own input
                with _ungrouped(module):
                    _, z = probs_and_output(module, q, k, v, mask, scaling, 0.0, extra)
                return z.to(q.dtype), None
            kv = k.shape[1]
            h = torch.arange(heads, device=q.device)
            group = h // (heads // kv)
            idx = index.to(q.device)
            pick = lambda t, i, j: t.unflatten(0, (variants, batch))[i, :, j].transpose(0, 1)
            q1 = pick(q, idx[0], h)  # [batch, head, query, d_head]
            k1 = pick(k, idx[1], group)  # [batch, head, key, d_head]
            v1 = pick(v, idx[2], group)
            rows = variants * batch
            first = lambda t: (
                t[:batch] if torch.is_tensor(t) and t.dim() and t.shape[0] == rows else t
            )
            extra = {key: first(val) for key, val in extra.items()}
            with _ungrouped(module):
                _, z = probs_and_output(module, q1, k1, v1, first(mask), scaling, 0.0, extra)
            if self.grad:
                self.picked[layer] = (q1, k1, v1)
            full = torch.zeros((rows, *z.shape[1:]), dtype=q.dtype, device=q.device)
            full[:batch] = z.to(q.dtype)  # [variant * batch, query, head, d_head]
            return full, None

        return handler

    def _cut(self, layer):
        def hook(module, args):
            batch = self.x[layer].shape[0]
            return (args[0][:batch], *args[1:])

        return hook

    def _attention_out(self, layer):
        def hook(module, args, output):
            if layer in self.open:
                self.open.pop(layer).close()
            batch = self.x[layer].shape[0]
            if isinstance(output, tuple):
                return tuple(o[:batch] if torch.is_tensor(o) and o.dim() else o for o in output)
            return output[:batch]

        return hook

    def _head_diff(self, layer):
        def hook(module, args):
            batch = self.x[layer].shape[0]
            here = self.graph.nodes._heads(layer, args[0][:batch])  # [batch, piece, head, d_head]
            corr = self.corrupted.slices[layer].to(here.device)
            diff = self.graph.head_write(layer, corr.float() - here.float())
            self._store(self.spans[("head", layer)], diff)

        return hook

    def _mlp_diff(self, layer):
        def hook(module, args, output):
            out = first_output(output).float()
            corr = self.corrupted.mlp[layer].to(out.device).float().reshape(out.shape)
            self._store(self.spans[("mlp", layer)], (corr - out)[None])

        return hook

    def _mlp_in(self, layer):
        norm, row = self.graph.mlp_norms[layer], self.graph.mlp_row(layer)

        def hook(module, args, kwargs):
            x = self.x[("mid", layer)]
            inputs, _ = self._inputs([row], x, ("mlp", layer))
            normed = _plain(norm, inputs[0])
            if args:
                return (normed, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": normed}

        return hook

    def _final_in(self):
        row = self.graph.logits_row

        def hook(module, args):
            inputs, _ = self._inputs([row], args[0], LOGITS)
            return (inputs[0], *args[1:])

        return hook


__all__ = ["CircuitForward"]
