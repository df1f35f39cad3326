"""Every node of a task patched, exactly, and its first-order estimates (METHODS §19).

    pairs = TaskPairs.of(batch, device)                 # clean, corrupted, answer/distractor, position
    got = exact_effects(model, nodes, pairs)            # m_clean, m_corrupted [row]; noise, denoise [row, node]
    direct = direct_effects(model, nodes, pairs, got)   # direct, its answer and distractor parts [row, node]
    est = estimates(nodes, pairs, got, ("atp", "ig"), steps=5)      # kind -> (noise, denoise) [row, node]

Nodes are `TaskNodes.names()`: the embeddings, then per layer its heads and its MLP.

Cost. A patch at layer l leaves the layers below as they were, and the clean and corrupted
prompts agree up to their first differing piece. So (causal models) the shared prefix runs
once, its keys and values kept in the model's own cache, and every patched pass runs only the
pieces from the first difference on (`shared_prefix`); the layers below the patched one replay
their kept outputs (`model.layer_blocks`); and the nodes of one layer are patched together, one
copy of the batch per node (`TaskNodes.patching`). A batch's patched passes are one per layer and
direction, each over `copies x rows` rows of the suffix; the scorer splits a batch so that no
pass holds more than `ROW_PIECES` pieces.

Signs: noise = m_clean - m(clean, node from the corrupted pass); denoise = m(corrupted, node from
the clean pass) - m_corrupted; direct = m_clean - m(the final residual stream at the scored
piece with only the node's write changed from clean to corrupted, the final norm recomputed).
The estimates follow the same signs: atp's noise = g_clean . (a_clean - a_corrupted) and its
denoise = g_corrupted . (a_clean - a_corrupted), g the metric's gradient at the node's value a;
ig (Hanna et al. 2024's EAP-IG, at node level): the gradient averaged over k passes whose
embeddings lie on the straight line from the corrupted to the clean ones (at 1/k, ..., 1), dotted
with a_clean - a_corrupted, for both; atp* (GradDrop, Kramar et al. 2024): the mean over layers
l of the absolute estimate with the gradient through layer l's block dropped, signed as atp.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from dataclasses import dataclass

import numpy as np
import torch

from headprobe.model.channels import returning
from headprobe.model.frozen_weights import FrozenWeights
from headprobe.model.layer_blocks import replaying
from headprobe.model.projections import features_last, projection_weight
from headprobe.model.task_nodes import EMBED, TaskNodes, two_logits

ROW_PIECES = 16384  # pieces one patched pass holds at most (copies x rows x suffix pieces)
ESTIMATES = ("atp", "atp*", "ig")


@dataclass
class TaskPairs:
    """One batch of a task: tensors on the model's device."""

    clean: torch.Tensor  # [row, piece] ids
    corrupted: torch.Tensor  # [row, piece] ids
    targets: torch.Tensor  # [row, 2] the answer's and the distractor's token ids
    position: torch.Tensor  # [row] the scored piece

    @classmethod
    def of(cls, examples, device) -> TaskPairs:
        """From task examples (`inputs.tasks`: `meta` holds the ids, targets and position)."""
        meta = [e.meta for e in examples]
        take = lambda key: torch.tensor([m[key] for m in meta], dtype=torch.long, device=device)
        targets = torch.tensor(
            [[m["answer_id"], m["distractor_id"]] for m in meta], dtype=torch.long, device=device
        )
        return cls(take("input_ids"), take("corrupted_ids"), targets, take("position"))

    def rows(self, index) -> TaskPairs:
        return TaskPairs(
            self.clean[index], self.corrupted[index], self.targets[index], self.position[index]
        )

    def __len__(self) -> int:
        return int(self.clean.shape[0])


def _takes(model, name: str) -> bool:
    return name in inspect.signature(type(model).forward).parameters


def cache_keyword(model) -> str | None:
    """The keyword a model's forward takes its key/value cache by (`cache` in transformers 5,
    `past_key_values` before), or None."""
    return next((k for k in ("cache", "past_key_values") if _takes(model, k)), None)


def shared_prefix(model, nodes: TaskNodes, pairs: TaskPairs) -> int:
    """Pieces every row's clean and corrupted prompts share at the start, run once and kept in the
    model's cache: 0 where the model is not causal or takes no cache; at most the scored piece."""
    if not nodes.causal or cache_keyword(model) is None:
        return 0
    same = (pairs.clean == pairs.corrupted).cumprod(1).sum(1)  # [row] pieces equal at the start
    return int(min(int(same.min()), int(pairs.position.min())))


class _Runner:
    """The model's forward on a batch's suffix (after the shared prefix), `copies` copies of the
    rows at once; the metric's two logits at the scored piece of each row."""

    def __init__(self, model, nodes: TaskNodes, pairs: TaskPairs):
        self.model, self.nodes, self.pairs = model, nodes, pairs
        self.prefix = shared_prefix(model, nodes, pairs)
        self.cache = None
        if self.prefix:
            base = getattr(model, "base_model", model)
            with torch.no_grad():
                out = base(input_ids=pairs.clean[:, : self.prefix], use_cache=True)
            self.cache = getattr(out, cache_keyword(model))
        self.keep_last = _takes(model, "logits_to_keep") and bool(
            (pairs.position == pairs.clean.shape[1] - 1).all()
        )

    def logits(self, ids: torch.Tensor, copies: int = 1) -> torch.Tensor:
        """[copies * rows, 2] (copy-major): answer and distractor logits at the scored piece, for
        the suffix of `ids` [rows, piece]."""
        rows = ids.shape[0]
        feed = {"input_ids": ids[:, self.prefix :].repeat(copies, 1)}
        if self.cache is not None:
            cache = copy.deepcopy(self.cache)
            index = torch.arange(rows, device=ids.device).repeat(copies)
            for layer in cache.layers:
                layer.reorder_cache(index)
            feed.update({cache_keyword(self.model): cache, "use_cache": True})
        elif _takes(self.model, "use_cache"):
            feed["use_cache"] = False
        if self.keep_last:
            feed["logits_to_keep"] = 1
        last = self.nodes.top_mlp_at_last_piece() if self.keep_last else contextlib.nullcontext()
        with two_logits(self.model, self.pairs.targets.repeat(copies, 1)), last:
            logits = self.model(**feed).logits  # [copies * rows, piece, 2]
        if self.keep_last:
            return logits[:, -1].float()
        at = (self.pairs.position - self.prefix).repeat(copies)
        return logits[torch.arange(logits.shape[0], device=logits.device), at].float()


def metric(logits: torch.Tensor) -> torch.Tensor:
    """[...]: logit[answer] - logit[distractor] from [..., 2]."""
    return logits[..., 0] - logits[..., 1]


@dataclass
class Exact:
    """A batch's exact values: every tensor float32 on the CPU."""

    m_clean: torch.Tensor  # [row]
    m_corrupted: torch.Tensor  # [row]
    noise: torch.Tensor  # [row, node]
    denoise: torch.Tensor  # [row, node]
    clean: object  # NodeValues of the clean suffix pass
    corrupted: object  # NodeValues of the corrupted suffix pass
    prefix: int  # pieces run once (the shared prefix)
    logits_clean: torch.Tensor  # [row, 2]
    run: _Runner  # the batch's forward on the suffix (the estimates' passes run through it)


@torch.no_grad()
def exact_effects(model, nodes: TaskNodes, pairs: TaskPairs) -> Exact:
    """Noising and denoising of every node (module docstring), one patched pass per layer and
    direction over the suffix."""
    run = _Runner(model, nodes, pairs)
    rows, names = len(pairs), nodes.names()
    index = {name: i for i, name in enumerate(names)}
    with nodes.recording() as clean:
        lc = run.logits(pairs.clean)
    with nodes.recording() as corrupted:
        lx = run.logits(pairs.corrupted)
    m_clean, m_corrupted = metric(lc), metric(lx)
    noise = torch.zeros(rows, len(names))
    denoise = torch.zeros(rows, len(names))
    for layer in range(nodes.n_layers):
        group = nodes.group_nodes(layer)
        at = [index[n] for n in group]
        below = {nodes.blocks[l]: clean.blocks[nodes.blocks[l]] for l in range(layer)}
        with replaying(below, rows, len(group)), nodes.patching(layer, corrupted, len(group), rows):
            m = metric(run.logits(pairs.clean, len(group))).view(len(group), rows).T
        noise[:, at] = (m_clean[:, None] - m).cpu()
        below = {nodes.blocks[l]: corrupted.blocks[nodes.blocks[l]] for l in range(layer)}
        with replaying(below, rows, len(group)), nodes.patching(layer, clean, len(group), rows):
            m = metric(run.logits(pairs.corrupted, len(group))).view(len(group), rows).T
        denoise[:, at] = (m - m_corrupted[:, None]).cpu()
    return Exact(
        m_clean.cpu(),
        m_corrupted.cpu(),
        noise,
        denoise,
        clean,
        corrupted,
        run.prefix,
        lc.cpu(),
        run,
    )


# ------------------------------------------------------------------------------ direct effect
class _Head:
    """The model's part after its base model: the final hidden state at one piece -> the two
    logits, by the model's own forward with its base model returning the given state."""

    def __init__(self, model, template):
        self.model, self.template = model, template
        self.base = getattr(model, "base_model", model)

    def logits(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """[rows, 2] from hidden [rows, hidden_size] (the base model's last hidden state)."""
        state = copy.copy(self.template)  # the base model's own output, its state replaced
        state.last_hidden_state = hidden[:, None]
        ids = torch.zeros(hidden.shape[0], 1, dtype=torch.long, device=hidden.device)
        with returning({self.base: lambda *a, **k: state}), two_logits(self.model, targets):
            return self.model(input_ids=ids).logits[:, -1].float()


def _write_changes(nodes: TaskNodes, exact: Exact, at: torch.Tensor, norms) -> dict:
    """Each node's change of write to the residual stream at the scored piece (`at`, in the
    suffix), clean to corrupted: {node: [row, hidden]}. A head's write is its slice times its
    block of W_O (the projection's bias belongs to no head); the MLP's is its module's output; the
    embeddings' is the residual stream entering layer 0. A norm the family applies to the
    attention's or the MLP's output before the residual add (Gemma-2/3: `norms`) is recomputed:
    the change of its output."""
    clean, corrupted = exact.clean, exact.corrupted
    attention_norms, mlp_norms = norms
    rows = torch.arange(len(at), device=at.device)
    out = {EMBED: (corrupted.x0[rows, at] - clean.x0[rows, at]).float()}
    for layer in range(nodes.n_layers):
        z_clean = clean.slices[layer][rows, at]  # [row, head, d_head]
        z = (corrupted.slices[layer][rows, at] - z_clean).float()
        w = projection_weight(nodes.projections[layer]).float()  # [hidden, head * d_head]
        w = w.view(w.shape[0], nodes.n_heads, nodes.d_head)  # [hidden, head, d_head]
        d = torch.einsum("rhd,ohd->hro", z, w)  # [head, row, hidden]
        norm = attention_norms.get(layer)
        if norm is not None:
            projection = nodes.projections[layer]
            a = projection(nodes.projection_input(layer, z_clean[:, None]))  # the clean output
            a = features_last(projection, a)[:, 0].float()  # [row, hidden]
            d = norm((a + d).to(a.dtype)).float() - norm(a).float()
        for h in range(nodes.n_heads):
            out[f"{layer}-{h}"] = d[h]
        before, after = clean.mlp[layer][rows, at], corrupted.mlp[layer][rows, at]
        norm = mlp_norms.get(layer)
        if norm is not None:
            before, after = norm(before), norm(after)
        out[f"mlp {layer}"] = (after - before).float()
    return out


@torch.no_grad()
def direct_effects(model, nodes: TaskNodes, pairs: TaskPairs, exact: Exact) -> dict | None:
    """{"direct", "direct_answer", "direct_distractor"}: [row, node] each (direct = answer part +
    distractor part; the answer part is the fall of the answer's logit, the distractor part the
    rise of the distractor's, when the node's write goes from clean to corrupted). None where
    the final residual stream is no sum of writes (post-norm families: METHODS §19) or the model
    has no final norm headprobe finds (`model.projections.final_norm`)."""
    if nodes.post_norm or nodes.final is None or exact.clean.final is None:
        return None
    at = pairs.position - exact.prefix
    rows = torch.arange(len(pairs), device=at.device)
    final = exact.clean.final[rows, at].float()  # [row, hidden] the clean final residual
    changes = _write_changes(nodes, exact, at, nodes.write_norms(pairs.clean))
    names = nodes.names()
    changed = torch.stack([final + changes[n] for n in names])  # [node, row, hidden]
    dtype = nodes.final.weight.dtype
    hidden = nodes.final(changed.flatten(0, 1).to(dtype))  # the final norm recomputed
    base = getattr(model, "base_model", model)
    head = _Head(model, base(input_ids=pairs.clean[:1, :1], use_cache=False))
    targets = pairs.targets.repeat(len(names), 1)
    logits = head.logits(hidden, targets).view(len(names), len(pairs), 2).transpose(0, 1)
    clean_logits = head.logits(nodes.final(final.to(dtype)), pairs.targets)  # [row, 2]
    answer = (clean_logits[:, None, 0] - logits[..., 0]).cpu()  # [row, node]
    distractor = (logits[..., 1] - clean_logits[:, None, 1]).cpu()
    return {"direct": answer + distractor, "direct_answer": answer, "direct_distractor": distractor}


# ------------------------------------------------------------------------------ estimates
def _dot(nodes: TaskNodes, grads: dict, diff: dict, rows: int) -> torch.Tensor:
    """[row, node]: each node's gradient dotted with its change, summed over pieces."""
    out = torch.zeros(rows, len(nodes.names()))
    col = 0
    out[:, col] = (grads[(EMBED, 0)] * diff[(EMBED, 0)]).flatten(1).sum(1).cpu()
    col += 1
    for layer in range(nodes.n_layers):
        heads = (grads[("head", layer)] * diff[("head", layer)]).sum((1, 3))  # [row, head]
        out[:, col : col + nodes.n_heads] = heads.cpu()
        col += nodes.n_heads
        out[:, col] = (grads[("mlp", layer)] * diff[("mlp", layer)]).flatten(1).sum(1).cpu()
        col += 1
    return out


def _differences(nodes: TaskNodes, clean, corrupted) -> dict:
    """a_clean - a_corrupted per node key, over the suffix's pieces."""
    diff = {(EMBED, 0): (clean.embed - corrupted.embed).float()}
    for layer in range(nodes.n_layers):
        diff[("head", layer)] = (clean.slices[layer] - corrupted.slices[layer]).float()
        diff[("mlp", layer)] = (clean.mlp[layer] - corrupted.mlp[layer]).float()
    return diff


def _gradients(nodes: TaskNodes, run: _Runner, ids, embed=None, drop=None) -> dict:
    """d m / d node at the suffix pass on `ids` (its embeddings replaced by `embed` where given;
    the gradient through layer `drop`'s block dropped where given). The shared prefix's keys and
    values come from the cache: no node there changes between the prompts, so none of its
    gradients enters an estimate."""
    with (
        torch.enable_grad(),
        FrozenWeights(run.model),
        nodes.probing(embed) as probe,
        _dropped(nodes, drop),
    ):
        m = metric(run.logits(ids))
        return {k: g.float() for k, g in probe.grads(m).items()}


class _dropped:
    """Context manager: layer `drop`'s block passes its output forward as it is, but its input's
    gradient is its output's (the skip connection alone) and nothing inside it gets one: GradDrop
    (Kramar et al. 2024), as the importance analysis's atp* drops a layer (METHODS §8)."""

    def __init__(self, nodes: TaskNodes, drop: int | None):
        self.nodes, self.drop, self.handle = nodes, drop, None

    def __enter__(self):
        if self.drop is not None:

            def hook(module, args, kwargs, output):
                out = output[0] if isinstance(output, tuple) else output
                inp = args[0] if args else kwargs["hidden_states"]
                cut = inp + (out - inp).detach()  # [row, piece, hidden]
                return (cut, *output[1:]) if isinstance(output, tuple) else cut

            block = self.nodes.blocks[self.drop]
            self.handle = block.register_forward_hook(hook, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        if self.handle is not None:
            self.handle.remove()
        return False


def estimates(nodes: TaskNodes, pairs: TaskPairs, exact: Exact, kinds, steps: int = 5) -> dict:
    """kind -> (noise [row, node], denoise [row, node]) first-order estimates (module docstring),
    every pass over the suffix of `exact`'s batch."""
    if not kinds:
        return {}
    run, rows, out, g_clean = exact.run, len(pairs), {}, None
    diff = _differences(nodes, exact.clean, exact.corrupted)
    if "atp" in kinds or "atp*" in kinds:
        g_clean = _gradients(nodes, run, pairs.clean)
        g_corrupted = _gradients(nodes, run, pairs.corrupted)
        atp = (_dot(nodes, g_clean, diff, rows), _dot(nodes, g_corrupted, diff, rows))
        if "atp" in kinds:
            out["atp"] = atp
        if "atp*" in kinds:
            out["atp*"] = tuple(
                _graddrop(nodes, run, ids, diff, sign)
                for ids, sign in ((pairs.clean, atp[0]), (pairs.corrupted, atp[1]))
            )
    if "ig" in kinds:
        total = None
        start, end = exact.corrupted.embed.float(), exact.clean.embed.float()
        for k in range(1, steps + 1):
            if k == steps and g_clean is not None:  # at 1 the embeddings are the clean ones
                g = g_clean
            else:
                g = _gradients(nodes, run, pairs.clean, embed=start + (k / steps) * (end - start))
            total = g if total is None else {key: total[key] + g[key] for key in total}
        ig = _dot(nodes, {key: value / steps for key, value in total.items()}, diff, rows)
        out["ig"] = (ig, ig.clone())
    return out


def _graddrop(nodes, run, ids, diff, signed) -> torch.Tensor:
    """AtP* with GradDrop: |estimate| with each layer's block gradient dropped in turn, summed
    over the layers and divided by L - 1 (a node's own layer gives it 0), signed as AtP."""
    total = torch.zeros_like(signed)
    for layer in range(nodes.n_layers):
        g = _gradients(nodes, run, ids, drop=layer)
        total += _dot(nodes, g, diff, len(ids)).abs()
    scale = max(1, nodes.n_layers - 1)
    return torch.sign(signed) * total / scale


def rows_per_pass(nodes: TaskNodes, pieces: int, prefix: int = 0) -> int:
    """Example rows one patched pass may hold: `ROW_PIECES` over copies x suffix pieces."""
    copies = nodes.n_heads + 2
    return max(1, ROW_PIECES // (copies * max(1, pieces - prefix)))


def node_frame_index(nodes: TaskNodes) -> list[tuple]:
    """(node, layer, head) per node in `names()` order: head -1 for an MLP, layer -1 for the
    embeddings."""
    out = []
    for name in nodes.names():
        if name == EMBED:
            out.append((name, -1, -1))
        elif name.startswith("mlp"):
            out.append((name, int(name.split()[1]), -1))
        else:
            layer, head = name.split("-")
            out.append((name, int(layer), int(head)))
    return out


def as_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().double().numpy()
