"""A task's graph of edges: its senders, its receivers and which sender reaches which (METHODS §20,
circuits on a task).

    graph = EdgeGraph.of(nodes, ids)     # checked by one clean pass on the first row of ids
    graph.receivers()                    # (node, channel) per receiver
    graph.reach()                        # [receiver, sender] bool: the edges
    graph.writes(values)                 # (kind, layer) -> [sender, batch, piece, hidden]

Senders are the embeddings (the residual stream entering layer 0), every head (its slice of the
output projection's input times that slice of the projection's weight) and every MLP (its
module's output). Receivers are each head's query, key and value inputs, each MLP's input and
the logits (the final norm's input). A sender reaches a receiver of a later layer, and an MLP
reads the heads of its own layer where the layer runs its MLP after its attention (found by a
clean pass, not by the family's name).

Families where the residual stream is not the sum of the writes (post-norm, a norm after a
sublayer), where an MLP's input is not a norm of the residual stream, or whose layers share
modules, are refused in one line: a circuit's forward (`model.circuit_forward`) rebuilds every
receiver input from the writes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headprobe.core.errors import UsageError
from headprobe.model.channels import CHANNELS
from headprobe.model.head_projections import separate_projections
from headprobe.model.projections import projection_weight
from headprobe.model.task_nodes import EMBED, NodeValues, TaskNodes

LOGITS = "logits"
TOLERANCE = 1e-3  # relative: the residual stream is the sum of the writes (checked once)


def first_output(output):
    return output[0] if isinstance(output, (tuple, list)) else output


def _hidden(args, kwargs):
    return args[0] if args else kwargs["hidden_states"]


@dataclass(eq=False)
class EdgeGraph:
    """Senders, receivers and which sender reaches which receiver (module docstring)."""

    nodes: TaskNodes
    mlp_norms: list  # [layer] the norm whose output the MLP reads
    sequential: list  # [layer] the MLP reads the layer's heads (else parallel: the layer input)
    head_writes: list  # [layer] [hidden, head, d_head] the output projection's weight per head
    separate: (
        list  # [layer] (q, k, v) linear maps of the attention's input, or None (`head_projections`)
    )

    @classmethod
    def of(cls, nodes: TaskNodes, ids: torch.Tensor) -> EdgeGraph:
        """The graph of `nodes`' model, checked by one clean pass on the first row of `ids`."""
        norms, sequential = _structure(nodes, ids[:1])
        writes = []
        for layer in range(nodes.n_layers):
            w = projection_weight(nodes.projections[layer]).detach()  # [hidden, head * d_head]
            writes.append(w.unflatten(1, (nodes.n_heads, nodes.d_head)))
        return cls(nodes, norms, sequential, writes, separate_projections(nodes, ids))

    @property
    def heads(self) -> int:
        return self.nodes.n_heads

    @property
    def layers(self) -> int:
        return self.nodes.n_layers

    def senders(self) -> list[str]:
        """'embed', then per layer 'L-H' for its heads and 'mlp L' (the nodes' own names)."""
        return self.nodes.names()

    def receivers(self) -> list[tuple[str, str]]:
        """(node, channel) per receiver: per layer ('L-H', q|k|v) channel-major, ('mlp L', ''),
        then ('logits', '')."""
        out = []
        for layer in range(self.layers):
            out += [(f"{layer}-{h}", c) for c in CHANNELS for h in range(self.heads)]
            out.append((f"mlp {layer}", ""))
        return out + [(LOGITS, "")]

    def attention_rows(self, layer: int) -> slice:
        start = layer * (3 * self.heads + 1)
        return slice(start, start + 3 * self.heads)

    def mlp_row(self, layer: int) -> int:
        return layer * (3 * self.heads + 1) + 3 * self.heads

    @property
    def logits_row(self) -> int:
        return self.layers * (3 * self.heads + 1)

    def bound(self, row: int) -> int:
        """How many senders (a prefix of `senders()`) reach receiver `row`."""
        if row == self.logits_row:
            return 1 + self.layers * (self.heads + 1)
        layer, within = divmod(row, 3 * self.heads + 1)
        below = 1 + layer * (self.heads + 1)
        if within == 3 * self.heads and self.sequential[layer]:
            return below + self.heads
        return below

    def reach(self) -> torch.Tensor:
        """[receiver, sender] bool: which sender reaches which receiver (an edge)."""
        n_r, n_s = len(self.receivers()), len(self.senders())
        bounds = torch.tensor([self.bound(r) for r in range(n_r)])
        return torch.arange(n_s)[None, :] < bounds[:, None]

    def sender_blocks(self) -> list[tuple[str, int, slice]]:
        """(kind, layer, senders) in order: the embeddings, then per layer its heads and its MLP."""
        out = [(EMBED, 0, slice(0, 1))]
        for layer in range(self.layers):
            start = 1 + layer * (self.heads + 1)
            out.append(("head", layer, slice(start, start + self.heads)))
            out.append(("mlp", layer, slice(start + self.heads, start + self.heads + 1)))
        return out

    def receiver_layer(self, row: int) -> int:
        """The layer receiver `row` reads in (the logits: `layers`, above the last)."""
        return self.layers if row == self.logits_row else row // (3 * self.heads + 1)

    def change(self, sender: int, after: NodeValues, before: NodeValues) -> torch.Tensor:
        """[batch, piece, hidden] float32: sender `sender`'s write in `after` less in `before`."""
        if sender == 0:
            return after.x0.float() - before.x0.float()
        layer, within = divmod(sender - 1, self.heads + 1)
        if within == self.heads:
            return after.mlp[layer].float() - before.mlp[layer].float()
        z = after.slices[layer][:, :, within].float() - before.slices[layer][:, :, within].float()
        w = self.head_writes[layer][:, within].to(z.device, torch.float32)  # [hidden, d_head]
        return z @ w.T

    def writes(self, values: NodeValues) -> dict:
        """Each sender block's writes in a recorded forward: (kind, layer) ->
        [sender, batch, piece, hidden] float32."""
        out = {(EMBED, 0): values.x0.float()[None]}
        for layer in range(self.layers):
            out[("head", layer)] = self.head_write(layer, values.slices[layer])
            out[("mlp", layer)] = values.mlp[layer].float()[None]
        return out

    def head_write(self, layer: int, slices: torch.Tensor) -> torch.Tensor:
        """[head, batch, piece, hidden] each head's write from [batch, piece, head, d_head]."""
        w = self.head_writes[layer].to(slices.device, torch.float32)
        return torch.einsum("bphd,ohd->hbpo", slices.float(), w)


def _structure(nodes: TaskNodes, ids: torch.Tensor) -> tuple[list, list]:
    """Per layer, the norm the MLP reads and whether it reads the layer's heads, from one clean
    pass; UsageError (one line) where a circuit's forward cannot be built (module docstring)."""
    name = type(nodes.model).__name__
    if nodes.post_norm or nodes.final is None:
        raise UsageError(
            f"circuit: {name} normalises after its sublayers (post-norm), so its residual stream "
            "is not a sum of the heads' and MLPs' writes; circuits need a pre-norm model"
        )
    bare = [s.layer for s in nodes.sites if s.norm_in is None]
    if bare:
        raise UsageError(
            f"circuit: {name}'s attention in layer {bare[0]} reads the residual stream without a "
            "norm of its own, where a receiver's input is rebuilt; circuits need a norm before "
            "every attention"
        )
    seen = _clean_pass(nodes, ids)
    by_id = {id(m): m for layer in range(nodes.n_layers) for m in nodes.blocks[layer].modules()}
    found = [_layer_structure(nodes, seen, by_id, layer, name) for layer in range(nodes.n_layers)]
    return [norm for norm, _ in found], [sequential for _, sequential in found]


def _clean_pass(nodes: TaskNodes, ids: torch.Tensor) -> dict:
    """key -> (input, output, a copy of the output) of the modules a layer's structure is read
    from, in one clean forward: ("x", l) the attention's norm, ("o", l) the output projection,
    ("mlp", l) the MLP, ("sub", id) every other module of the block, ("final", 0) the final norm."""
    seen: dict = {}
    handles = []

    def keep(key):
        def hook(module, args, kwargs, output):
            out = first_output(
                output
            )  # kept, and copied (Falcon adds to its MLP's output in place)
            seen.setdefault(key, (_hidden(args, kwargs), out, out.detach().clone()))

        return hook

    def watch(module, key):
        handles.append(module.register_forward_hook(keep(key), with_kwargs=True))

    for layer in range(nodes.n_layers):
        site, block, mlp = nodes.sites[layer], nodes.blocks[layer], nodes.mlps[layer]
        watch(site.norm_in, ("x", layer))
        watch(nodes.projections[layer], ("o", layer))
        watch(mlp, ("mlp", layer))
        inner = {id(m) for m in site.module.modules()} | {id(m) for m in mlp.modules()}
        for sub in block.modules():
            if id(sub) not in inner and sub is not block:
                watch(sub, ("sub", id(sub)))
    watch(nodes.final, ("final", 0))
    try:
        with torch.no_grad():
            nodes.model(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return seen


def _layer_structure(nodes, seen: dict, by_id: dict, layer: int, name: str) -> tuple:
    """(the norm layer `layer`'s MLP reads, whether it reads the layer's heads) from `seen`."""
    x = seen[("x", layer)][0].float()
    attn = seen[("o", layer)][2].float()
    mlp_in, mlp_out = seen[("mlp", layer)][0], seen[("mlp", layer)][2].float()
    nxt = seen[("x", layer + 1)][0] if layer + 1 < nodes.n_layers else seen[("final", 0)][0]
    if mlp_out.shape != x.shape or not _close(nxt.float(), x + attn + mlp_out):
        raise UsageError(
            f"circuit: {name}'s residual stream after layer {layer} is not its input plus "
            "the attention's and the MLP's writes (a norm after a sublayer); circuits need "
            "a pre-norm model"
        )
    norm = next(
        (
            by_id[k[1]]
            for k, (_, out, _) in seen.items()
            if k[0] == "sub" and k[1] in by_id and out is mlp_in
        ),
        None,
    )
    if norm is None:
        raise UsageError(
            f"circuit: {name}'s MLP in layer {layer} does not read a norm of the residual "
            "stream, so its input cannot be rebuilt from the writes"
        )
    x_mid = seen[("sub", id(norm))][0].float()
    if torch.equal(x_mid, x):
        return norm, False
    if _close(x_mid, x + attn):
        return norm, True
    raise UsageError(
        f"circuit: {name}'s MLP in layer {layer} reads neither the layer's input nor it plus "
        "the attention's write"
    )


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    scale = float(b.abs().max()) or 1.0
    return bool((a - b).abs().max() <= TOLERANCE * scale)


__all__ = ["LOGITS", "TOLERANCE", "EdgeGraph", "first_output"]
