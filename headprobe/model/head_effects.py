"""Does a head matter? Ablation effects and gradient importance per example row (METHODS §8).

    objective = Objective.for_model(model, tokenizer)
    for batch in batches:
        delta, tokens = ablation_rows(model, batch, objective, heads=[(0, 1), (2, 3)])
        # delta [batch, 2]: objective(head ablated) - objective(intact), summed over the row
        grad, tokens = gate_gradients(model, batch, objective)
        # grad [batch, layer, head]: d L_row / d g_h at g = 1, one backward pass (|grad|: importance)

    steps = prune_steps(prune_order(scores))         # 0%, 10%, ... 100% of heads, least important first
    values = gated_rows(model, objective.targets(model, batch), objective, [heads for _, heads in steps])

The heads are those of `objective.stack` (an encoder-decoder's encoder, decoder or cross
attention; default the capture's). Ablation and importance give per-row sums with the row's piece count, so they add up per unit (METHODS §5) and
stream: a set of units reports `sum delta / sum tokens` and `sum importance / sum tokens`.

Importance (Michel et al. 2019) is taken per example (a sentence, or a coreference window):
a gate per row and head, [batch, layer, head], so one backward pass of the summed loss gives
each row its own gradient (rows of a batch do not interact); `I_h(u)` of a unit is the sum
over its examples of `|dL_x / dg_h|`, Michel et al.'s expectation over examples. (For a
document unit this is not `|dL_u / dg_h|` with one gate shared by the document's sentences,
which could not stream: the signs of sentences in different batches would have to meet.)

The pruning curve (Michel et al. 2019, figure 3): heads removed cumulatively, least
important first, 0%, 10%, ... 100% of them (`prune_steps`), the objective of each point
per row (`gated_rows`), so its points stream per unit with intervals like any mass.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from headprobe.model.capture import n_layers_heads
from headprobe.model.gates import HeadGates
from headprobe.model.objectives import Objective, Targets


def gate_gradients(
    model,
    batch,
    objective: Objective,
    means: torch.Tensor | None = None,
    targets: Targets | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """([batch, layer, head] dL_row/dg, signed, at g = 1, [batch] pieces scored): one backward
    pass, the gate g of `slice = b + g (slice - b)` with b = 0 or `means` (`HeadGates`). Then
    dL/dg = (a - b) . dL/da at the slice a, so -dL/dg is attribution patching's first-order
    estimate of the effect of setting the slice to b (`atp`), and |dL/dg| with b = 0 Michel
    et al.'s importance."""
    targets = targets if targets is not None else objective.targets(model, batch)
    n_layers, n_heads = n_layers_heads(model, objective.stack)
    rows = targets.inputs["input_ids"].shape[0]
    gates = torch.ones(
        rows, n_layers, n_heads, device=targets.inputs["input_ids"].device, requires_grad=True
    )  # [batch, layer, head]
    with torch.enable_grad(), HeadGates(model, gates, means, objective.stack):
        values, tokens = objective.per_row(model, targets)  # [batch], [batch]
        (grad,) = torch.autograd.grad(values.sum(), gates)  # [batch, layer, head]
    return grad.detach(), tokens.detach()


def graddrop_rows(
    model, batch, objective: Objective, means: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """([batch, layer, head] AtP* with GradDrop, [batch] pieces scored; Kramar et al. 2024): for
    each layer l, the attribution-patching estimate |(b - a) . dL/da| with l's residual gradient
    dropped (the gradient reaches l's input only through the skip connection), summed over the
    L layers and divided by L - 1 (a head's own layer gives it 0).

    Dropping l leaves dL/dy_l (y_l: block l's output) and every gradient above l as they are, and
    makes dL/dx_l = dL/dy_l at its input x_l; so one forward pass, one backward pass (the plain
    gradients and every dL/dy_l), and per layer a backward pass from x_l down with dL/dy_l as its
    seed give every layer's drop: about L / 2 backward passes, not L forward and L backward."""
    from headprobe.model.discovery import attention_sites

    targets = objective.targets(model, batch)
    found = attention_sites(model)
    stack = found.resolve(objective.stack)
    sites = [s for s in found.sites if s.stack == stack]
    n_layers, n_heads = n_layers_heads(model, objective.stack)
    ins, outs = {}, {}
    hooks = [
        _block_of(model, site).register_forward_hook(
            _keep_block(ins, outs, layer), with_kwargs=True
        )
        for layer, site in enumerate(sites)
    ]
    rows = targets.inputs["input_ids"].shape[0]
    gates = torch.ones(
        rows, n_layers, n_heads, device=targets.inputs["input_ids"].device, requires_grad=True
    )  # [batch, layer, head]
    try:
        with torch.enable_grad(), HeadGates(model, gates, means, objective.stack):
            values, tokens = objective.per_row(model, targets)  # [batch], [batch]
            ys = [outs[layer] for layer in range(n_layers)]
            plain, *seeds = torch.autograd.grad(values.sum(), [gates, *ys], retain_graph=True)
            total = torch.zeros_like(plain)
            for layer in range(n_layers):
                dropped = plain.clone()
                dropped[:, layer] = 0.0  # the block's own heads get no gradient
                if layer:
                    (below,) = torch.autograd.grad(
                        ins[layer], gates, grad_outputs=seeds[layer], retain_graph=True
                    )
                    dropped[:, :layer] = below[:, :layer]
                total += dropped.abs()
    finally:
        for hook in hooks:
            hook.remove()
    return (total / max(1, n_layers - 1)).detach(), tokens.detach()


def _block_of(model, site) -> torch.nn.Module:
    """The residual block an attention site sits in: its attention module's parent."""
    parent = site.name.rsplit(".", 1)[0] if "." in site.name else ""
    if not parent:
        raise ValueError(f"atp*: no residual block found around attention {site.name!r}")
    return model.get_submodule(parent)


def _keep_block(ins: dict, outs: dict, layer: int):
    """A forward hook keeping block `layer`'s input and output hidden states."""

    def hook(module, args, kwargs, output):
        ins[layer] = args[0] if args else kwargs["hidden_states"]
        outs[layer] = output[0] if isinstance(output, tuple) else output

    return hook


def _tile(targets: Targets, copies: int) -> Targets:
    """The batch `copies` times over (copy-major: rows c * batch .. (c + 1) * batch)."""
    rep = lambda t: None if t is None else t.repeat(copies, *([1] * (t.dim() - 1)))
    return Targets(
        {k: rep(v) for k, v in targets.inputs.items()}, rep(targets.labels), rep(targets.reference)
    )


@torch.no_grad()
def gated_rows(
    model,
    targets: Targets,
    objective: Objective,
    ablated: list,
    means: torch.Tensor | None = None,
    copies: int = 1,
) -> torch.Tensor:
    """[batch, set] the objective summed over each row with the heads of `ablated[k]` (a list of
    (layer, head)) ablated together, for each set k; `copies` sets run in one forward pass on
    the batch repeated that many times (a gate per row). An empty set is the intact model."""
    n_layers, n_heads = n_layers_heads(model, objective.stack)
    ids = targets.inputs["input_ids"]  # [batch, piece]
    rows = ids.shape[0]
    out = torch.empty(rows, len(ablated), dtype=torch.float32, device=ids.device)  # [batch, set]
    step = max(1, copies)
    for start in range(0, len(ablated), step):
        group = ablated[start : start + step]
        gates = torch.ones(
            len(group), rows, n_layers, n_heads, device=ids.device
        )  # [copy, batch, layer, head]
        for copy, heads in enumerate(group):
            for layer, head in heads:
                gates[copy, :, layer, head] = 0.0
        tiled = _tile(targets, len(group)) if len(group) > 1 else targets
        base = means  # a baseline per row (resample) is tiled with the rows
        if means is not None and means.dim() == 5 and len(group) > 1:
            base = means.repeat(len(group), *([1] * (means.dim() - 1)))
        with HeadGates(model, gates.flatten(0, 1), base, objective.stack):
            values, _ = objective.per_row(model, tiled)  # [copy * batch]
        out[:, start : start + len(group)] = values.view(len(group), rows).T.to(out.dtype)
    return out


@torch.no_grad()
def ablation_rows(
    model,
    batch,
    objective: Objective,
    heads: Iterable[tuple[int, int]] | None = None,
    means: torch.Tensor | None = None,
    copies: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """([batch, ablated head] objective(ablated) - objective(intact), summed over each row;
    [batch] pieces scored). Each head in `heads` (default: every (layer, head), layer-major)
    is ablated alone: zeroed, or replaced by its mean where `means` ([layer, head, d_head],
    `gates.head_means`) is given. `copies` heads run in one forward pass on a batch repeated
    that many times (a gate per row)."""
    n_layers, n_heads = n_layers_heads(model, objective.stack)
    heads = (
        [(l, h) for l in range(n_layers) for h in range(n_heads)] if heads is None else list(heads)
    )
    targets = objective.targets(model, batch)
    intact, tokens = objective.per_row(model, targets)  # [batch], [batch]
    ablated = gated_rows(
        model, targets, objective, [[head] for head in heads], means, copies
    )  # [batch, head]
    return ablated - intact[:, None], tokens


# ----------------------------------------------------------------------------- pruning
PRUNE_PERCENTS = tuple(range(0, 101, 10))  # share of heads removed at each point of the curve


def prune_order(scores) -> list[tuple[int, int]]:
    """Heads least important first (Michel et al. 2019): `scores` has columns layer, head, score;
    ties (and NaN, last) keep layer-major order."""
    frame = scores[["layer", "head", "score"]].reset_index(drop=True)
    order = np.lexsort(
        (
            frame["head"].to_numpy(),
            frame["layer"].to_numpy(),
            np.nan_to_num(frame["score"].to_numpy(np.float64), nan=np.inf),
        )
    )
    return [(int(frame["layer"][i]), int(frame["head"][i])) for i in order]


def removed_at(percent: int, total: int) -> int:
    """Heads removed at `percent` of `total`: the nearest whole number, halves up."""
    return (percent * total + 50) // 100


def prune_steps(order: list[tuple[int, int]], percents=PRUNE_PERCENTS) -> list[tuple[str, list]]:
    """[(label "10%", the first heads of `order` removed there)], cumulative: each point removes
    `removed_at(percent, len(order))` heads, the least important first."""
    return [(f"{p}%", list(order[: removed_at(p, len(order))])) for p in percents]
