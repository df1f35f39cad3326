"""A task's nodes and what a forward pass holds at them (METHODS §19, heads on a task).

    nodes = TaskNodes(model)                          # where every node is (one owner: the sites)
    with nodes.recording() as rec:                    # one forward pass, nothing changed
        model(input_ids=ids)
    rec.slices[l]       # [batch, piece, head, d_head] each head's slice of layer l's output projection input
    rec.mlp[l]          # [batch, piece, hidden] layer l's MLP write
    rec.embed           # [batch, piece, hidden] the token embeddings' output
    rec.blocks[b]       # layer block b's output (replayed below a patched layer)
    rec.final           # [batch, piece, hidden] the final norm's input (pre-norm), else None
    rec.x0              # [batch, piece, hidden] the residual stream entering layer 0
    with nodes.patching(layer, source, copies, rows): model(...)   # copy c patches node c of `layer`
    with nodes.replacing(source): model(...)          # every node's value from `source`
    with nodes.probing(values) as probe: m = ...; m.sum().backward()  # probe.grads: d m / d node
    with two_logits(model, ids):                      # the LM head gives [.., 2] logits: ids' columns
        model(...).logits

A node is a head (its slice of the attention output projection's input, as the gates of METHODS §8
read it), a layer's MLP (the module whose output is its write, `model.mlp_writes`) or the
embeddings (the input embedding module's output). Patching replaces a node's value in some
rows of a batch by another forward's value; the rows are copies of the batch, copy-major (row
`c * batch + b` is copy c of example b), and copy c of layer l patches head c, copy `heads`
the MLP, and, in layer 0, copy `heads + 1` the embeddings (`group_nodes`). Every patch is a
`torch.where`, so an unpatched row is bit for bit the forward's own.

Families whose layers share modules (ALBERT: one layer called several times) are refused in
one line: a node there is one call of a shared module, which these hooks cannot tell apart.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from headprobe.core.errors import UsageError
from headprobe.model.discovery import attention_sites
from headprobe.model.gates import output_projections
from headprobe.model.layer_blocks import layer_blocks
from headprobe.model.mlp_writes import mlp_modules
from headprobe.model.projections import features_last, final_norm, projection_in_features

EMBED = "embed"


@dataclass
class NodeValues:
    """What one forward pass held at every node (module docstring)."""

    slices: dict = field(default_factory=dict)  # layer -> [batch, piece, head, d_head]
    mlp: dict = field(default_factory=dict)  # layer -> [batch, piece, hidden]
    embed: torch.Tensor | None = None  # [batch, piece, hidden]
    blocks: dict = field(default_factory=dict)  # block module -> its output
    final: torch.Tensor | None = None  # [batch, piece, hidden] the final norm's input
    x0: torch.Tensor | None = None  # [batch, piece, hidden] the residual stream entering layer 0


def _first(output):
    """A module's main output: the tensor, or the first item of a tuple."""
    return output[0] if isinstance(output, tuple) else output


def _with_first(output, value):
    return (value, *output[1:]) if isinstance(output, tuple) else value


class TaskNodes:
    """Where a model's task nodes are, in one attention stack (module docstring)."""

    def __init__(self, model, stack: str | None = None):
        sites = attention_sites(model)
        self.model = model
        self.stack = sites.resolve(stack)
        self.sites = sites.of(self.stack)
        self.blocks = layer_blocks(model, self.sites)
        if self.blocks is None or len({id(s.output) for s in self.sites}) != len(self.sites):
            raise UsageError(
                f"{sites.model_class}: its layers share modules (one layer called several "
                "times), so a node of one layer cannot be patched alone; patching needs a "
                "model whose layers are modules of their own"
            )
        self.projections = output_projections(model, self.stack)
        self.mlps = mlp_modules(model, self.stack)
        self.embedding = model.get_input_embeddings()
        self.n_layers = len(self.sites)
        self.n_heads = self.sites[0].heads
        self.d_head = projection_in_features(self.projections[0]) // self.n_heads
        base = getattr(model, "base_model", model)
        self.final = final_norm(base)
        self.post_norm = all(site.norm_in is None for site in self.sites[1:])
        self.causal = bool(self.sites[0].causal)
        self._norms = None

    def write_norms(self, ids: torch.Tensor) -> tuple[dict, dict]:
        """({layer: the norm on its attention output}, {layer: the norm on its MLP output}) before
        the residual add (Gemma-2/3; empty elsewhere), found once by a clean pass on the first row
        of `ids` (`model.layer_cache`, which also checks that the MLP writes found are what the
        residual stream receives)."""
        if self._norms is None:
            from headprobe.model.layer_cache import clean_cache

            cache = clean_cache(self.model, {"input_ids": ids[:1]}, self.stack, mlp=True)
            self._norms = (dict(cache.write_norms), dict(cache.mlp_norms))
        return self._norms

    def names(self) -> list[str]:
        """Every node, in order: 'embed', then per layer its heads 'L-H' and 'mlp L'."""
        out = [EMBED]
        for layer in range(self.n_layers):
            out += [f"{layer}-{h}" for h in range(self.n_heads)] + [f"mlp {layer}"]
        return out

    def group_nodes(self, layer: int) -> list[str]:
        """The nodes patched together at `layer`, one per copy (module docstring)."""
        nodes = [f"{layer}-{h}" for h in range(self.n_heads)] + [f"mlp {layer}"]
        return nodes + ([EMBED] if layer == 0 else [])

    def _heads(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """[batch, piece, head, d_head] view of an output projection's input."""
        return features_last(self.projections[layer], x).unflatten(-1, (self.n_heads, self.d_head))

    def projection_input(self, layer: int, heads: torch.Tensor) -> torch.Tensor:
        """Layer `layer`'s output projection input from [batch, piece, head, d_head]."""
        return features_last(self.projections[layer], heads.flatten(-2))

    @contextlib.contextmanager
    def recording(self, blocks: bool = True):
        """Every node's value in the forward pass run inside (detached); `blocks`: each layer
        block's output too."""
        values, handles = NodeValues(), []

        def slice_hook(layer):
            def hook(module, args):
                values.slices[layer] = self._heads(layer, args[0]).detach()

            return hook

        def mlp_hook(layer):
            def hook(module, args, output):
                values.mlp[layer] = _first(output).detach().clone()  # Falcon adds to it in place

            return hook

        def block_hook(module, args, output):
            values.blocks[module] = output

        def embed_hook(module, args, output):
            values.embed = output.detach()

        def final_hook(module, args):
            values.final = args[0].detach()

        def x0_hook(module, args, kwargs):
            values.x0 = (args[0] if args else kwargs["hidden_states"]).detach()

        try:
            for layer in range(self.n_layers):
                handles.append(self.projections[layer].register_forward_pre_hook(slice_hook(layer)))
                handles.append(self.mlps[layer].register_forward_hook(mlp_hook(layer)))
                if blocks:
                    handles.append(self.blocks[layer].register_forward_hook(block_hook))
            handles.append(self.embedding.register_forward_hook(embed_hook))
            handles.append(self.blocks[0].register_forward_pre_hook(x0_hook, with_kwargs=True))
            if self.final is not None and not self.post_norm:
                handles.append(self.final.register_forward_pre_hook(final_hook))
            yield values
        finally:
            for handle in handles:
                handle.remove()
        for layer, write in values.mlp.items():  # OPT's MLP runs on [batch * piece, hidden]
            values.mlp[layer] = write.reshape(*values.embed.shape[:2], write.shape[-1])

    @contextlib.contextmanager
    def patching(self, layer: int, source: NodeValues, copies: int, rows: int):
        """Copy c of the batch (rows `c * rows .. (c + 1) * rows`) runs with node c of
        `group_nodes(layer)` taken from `source` (values of `rows` examples); `copies` may be
        fewer than the group's nodes (the first ones)."""
        nodes = self.group_nodes(layer)[:copies]
        handles = []

        def row_mask(copy: int, like: torch.Tensor) -> torch.Tensor:
            m = torch.zeros(copies * rows, dtype=torch.bool, device=like.device)
            m[copy * rows : (copy + 1) * rows] = True
            return m.view(-1, *([1] * (like.dim() - 1)))

        heads = [i for i, n in enumerate(nodes) if not n.startswith(("mlp", EMBED))]
        if heads:
            pick = torch.zeros(copies, self.n_heads, dtype=torch.bool)
            for c in heads:
                pick[c, c] = True

            def slice_hook(module, args):
                x = self._heads(layer, args[0])  # [copy * rows, piece, head, d_head]
                src = source.slices[layer].to(x.dtype).repeat(copies, 1, 1, 1)
                m = pick.to(x.device).repeat_interleave(rows, 0)[:, None, :, None]
                return (self.projection_input(layer, torch.where(m, src, x)), *args[1:])

            handles.append(self.projections[layer].register_forward_pre_hook(slice_hook))

        def replace(copy: int, values: torch.Tensor):
            def hook(module, args, output):
                out = _first(output)
                rowed = out.reshape(copies * rows, -1)  # [copy * rows, ...]: OPT's flat MLP too
                src = values.to(out.dtype).reshape(rows, -1).repeat(copies, 1)
                patched = torch.where(row_mask(copy, rowed), src, rowed).view(out.shape)
                return _with_first(output, patched)

            return hook

        for c, node in enumerate(nodes):
            if node.startswith("mlp"):
                handles.append(
                    self.mlps[layer].register_forward_hook(replace(c, source.mlp[layer]))
                )
            elif node == EMBED:
                handles.append(self.embedding.register_forward_hook(replace(c, source.embed)))
        try:
            yield nodes
        finally:
            for handle in handles:
                handle.remove()

    @contextlib.contextmanager
    def replacing(self, source: NodeValues):
        """Every node's value in the forward pass run inside taken from `source` (same rows)."""
        handles = []

        def slice_hook(layer):
            def hook(module, args):
                x = self._heads(layer, args[0])
                return (self.projection_input(layer, source.slices[layer].to(x.dtype)), *args[1:])

            return hook

        def put(values):
            def hook(module, args, output):
                out = _first(output)
                return _with_first(output, values.to(out.dtype).reshape(out.shape))

            return hook

        try:
            for layer in range(self.n_layers):
                handles.append(self.projections[layer].register_forward_pre_hook(slice_hook(layer)))
                handles.append(self.mlps[layer].register_forward_hook(put(source.mlp[layer])))
            handles.append(self.embedding.register_forward_hook(put(source.embed)))
            yield
        finally:
            for handle in handles:
                handle.remove()

    @contextlib.contextmanager
    def top_mlp_at_last_piece(self):
        """The last layer's MLP run on the last piece alone (its write elsewhere 0): where only
        the last piece's logits are read, nothing reads the last layer's other pieces, so its
        MLP there is work for nothing. A flat MLP input (OPT's [batch * piece, hidden]) runs whole."""
        mlp = self.mlps[-1]
        pieces = []

        def cut(module, args):
            x = args[0]
            if x.dim() != 3:
                return None
            pieces.append(x.shape[1])
            return (x[:, -1:], *args[1:])

        def pad(module, args, output):
            if not pieces:
                return None
            out = _first(output)  # [batch, 1, hidden]
            full = out.new_zeros(out.shape[0], pieces.pop(), out.shape[-1])
            full[:, -1:] = out
            return _with_first(output, full)

        handles = [  # first of the module's hooks: the others see the whole write
            mlp.register_forward_pre_hook(cut, prepend=True),
            mlp.register_forward_hook(pad, prepend=True),
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    @contextlib.contextmanager
    def probing(self, embed: torch.Tensor | None = None):
        """Zeros that require grad added to every node's value, so a backward pass of what the
        forward inside computes gives d m / d node (`probe.grads()`); `embed`: the embeddings'
        output replaced by it (an interpolated input, integrated gradients)."""
        probe, handles = _Probe(), []

        def add(key, value):
            zero = torch.zeros_like(value, requires_grad=True)
            probe.zeros[key] = zero
            return value + zero

        def slice_hook(layer):
            def hook(module, args):
                x = self._heads(layer, args[0])
                return (self.projection_input(layer, add(("head", layer), x)), *args[1:])

            return hook

        def mlp_hook(layer):
            def hook(module, args, output):
                return _with_first(output, add(("mlp", layer), _first(output)))

            return hook

        def embed_hook(module, args, output):
            value = output if embed is None else embed.to(output.dtype)
            return add((EMBED, 0), value)

        try:
            for layer in range(self.n_layers):
                handles.append(self.projections[layer].register_forward_pre_hook(slice_hook(layer)))
                handles.append(self.mlps[layer].register_forward_hook(mlp_hook(layer)))
            handles.append(self.embedding.register_forward_hook(embed_hook))
            yield probe
        finally:
            for handle in handles:
                handle.remove()


class _Probe:
    """The zeros a `probing` pass added, by node: ("head", layer) [batch, piece, head, d_head],
    ("mlp", layer) and ("embed", 0) [batch, piece, hidden]."""

    def __init__(self):
        self.zeros: dict = {}

    def grads(self, output: torch.Tensor) -> dict:
        """d output.sum() / d node for every node (one backward pass)."""
        keys = list(self.zeros)
        got = torch.autograd.grad(output.sum(), [self.zeros[k] for k in keys], allow_unused=True)
        grads = {
            k: (torch.zeros_like(self.zeros[k]) if g is None else g) for k, g in zip(keys, got)
        }
        shape = grads[(EMBED, 0)].shape[:2]  # [batch, piece]
        return {k: g.reshape(*shape, g.shape[-1]) if k[0] == "mlp" else g for k, g in grads.items()}


@contextlib.contextmanager
def two_logits(model, ids: torch.Tensor):
    """The model's output embeddings (its LM head's last linear map) give, per row, only the
    logits of `ids` [rows, 2] (answer, distractor): [rows, piece, 2]; what the model applies
    around that map (a prediction transform before it, soft-capping after it) runs as usual.
    The two columns are the full map's own rows, so each logit is the one it computes."""
    head = model.get_output_embeddings()
    if head is None or getattr(head, "weight", None) is None:
        raise UsageError(f"{type(model).__name__}: no language-model head to read logits from")
    weight, bias = head.weight, getattr(head, "bias", None)

    def forward(x, *args, **kwargs):
        w = weight[ids.to(weight.device)]  # [rows, 2, hidden]
        rows = x.shape[0]
        if w.shape[0] != rows:
            raise ValueError(f"two_logits: {w.shape[0]} rows of ids for {rows} rows of states")
        out = torch.einsum("rph,rkh->rpk", x, w.to(x.dtype))  # [rows, piece, 2]
        if bias is not None:
            out = out + bias[ids.to(bias.device)].to(x.dtype)[:, None, :]
        return out

    saved = head.__dict__.get("forward")
    head.forward = forward
    try:
        yield
    finally:
        if saved is None:
            head.__dict__.pop("forward", None)
        else:
            head.forward = saved


__all__ = ["EMBED", "NodeValues", "TaskNodes", "two_logits"]
