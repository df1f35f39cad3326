"""Does a head matter? Ablation effects and gradient importance per example row (SPEC 8).

    objective = Objective.for_model(model, tokenizer)
    for batch in batches:
        delta, tokens = ablation_rows(model, batch, objective, heads=[(0, 1), (2, 3)])
        # delta [batch, 2]: objective(head ablated) - objective(intact), summed over the row
        score, tokens = importance_rows(model, batch, objective)
        # score [batch, layer, head]: |d L_row / d g_h| at g = 1, one backward pass

    head_importance(model, batches, objective)      # DataFrame: layer, head, importance, ...

Both give per-row sums with the row's piece count, so they add up per unit (SPEC 5) and
stream: a set of units reports `sum delta / sum tokens` and `sum importance / sum tokens`.

Importance (Michel et al. 2019) is taken per example (a sentence, or a coreference window):
a gate per row and head, [batch, layer, head], so one backward pass of the summed loss gives
each row its own gradient (rows of a batch do not interact); `I_h(u)` of a unit is the sum
over its examples of `|dL_x / dg_h|`, Michel et al.'s expectation over examples. (For a
document unit this is not `|dL_u / dg_h|` with one gate shared by the document's sentences,
which could not stream: the signs of sentences in different batches would have to meet.)
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd
import torch

from headprobe.capture import n_layers_heads
from headprobe.gates import HeadGates
from headprobe.objectives import Objective, Targets


def importance_rows(model, batch, objective: Objective, means: torch.Tensor | None = None,
                    targets: Targets | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """([batch, layer, head] |dL_row/dg| at g = 1, [batch] pieces scored): one backward pass.
    `means`: differentiate the mean-ablation gate instead (slice = mean + g (slice - mean))."""
    if objective.kind == "representation":
        raise ValueError("importance needs a language-model loss: the representation change "
                         "1 - cos has zero gradient at g = 1 (load the model with its LM head)")
    targets = targets if targets is not None else objective.targets(model, batch)
    n_layers, n_heads = n_layers_heads(model)
    rows = targets.inputs["input_ids"].shape[0]
    gates = torch.ones(rows, n_layers, n_heads, device=targets.inputs["input_ids"].device,
                       requires_grad=True)                                  # [batch, layer, head]
    with torch.enable_grad(), HeadGates(model, gates, means):
        values, tokens = objective.per_row(model, targets)                  # [batch], [batch]
        grad, = torch.autograd.grad(values.sum(), gates)                    # [batch, layer, head]
    return grad.abs().detach(), tokens.detach()


def _tile(targets: Targets, copies: int) -> Targets:
    """The batch `copies` times over (copy-major: rows c * batch .. (c + 1) * batch)."""
    rep = lambda t: None if t is None else t.repeat(copies, *([1] * (t.dim() - 1)))
    return Targets({k: rep(v) for k, v in targets.inputs.items()}, rep(targets.labels), rep(targets.reference))


@torch.no_grad()
def ablation_rows(model, batch, objective: Objective, heads: Iterable[tuple[int, int]] | None = None,
                  means: torch.Tensor | None = None, copies: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """([batch, ablated head] objective(ablated) - objective(intact), summed over each row;
    [batch] pieces scored). Each head in `heads` (default: every (layer, head), layer-major)
    is ablated alone: zeroed, or replaced by its mean where `means` ([layer, head, d_head],
    `gates.head_means`) is given. `copies` heads run in one forward pass on a batch repeated
    that many times (a gate per row)."""
    n_layers, n_heads = n_layers_heads(model)
    heads = [(l, h) for l in range(n_layers) for h in range(n_heads)] if heads is None else list(heads)
    targets = objective.targets(model, batch)
    intact, tokens = objective.per_row(model, targets)                      # [batch], [batch]
    rows = intact.shape[0]
    out = torch.empty(rows, len(heads), dtype=intact.dtype, device=intact.device)   # [batch, ablated]
    for start in range(0, len(heads), max(1, copies)):
        group = heads[start:start + max(1, copies)]
        gates = torch.ones(len(group), rows, n_layers, n_heads, device=intact.device)  # [copy, batch, layer, head]
        for copy, (layer, head) in enumerate(group):
            gates[copy, :, layer, head] = 0.0
        tiled = _tile(targets, len(group)) if len(group) > 1 else targets
        with HeadGates(model, gates.flatten(0, 1), means):
            values, _ = objective.per_row(model, tiled)                     # [copy * batch]
        out[:, start:start + len(group)] = (values.view(len(group), rows) - intact).T
    return out, tokens


def head_importance(model, batches: Iterable, objective: Objective, means: torch.Tensor | None = None,
                    progress: bool = False) -> pd.DataFrame:
    """Per head: importance = sum over rows of |dL_row/dg_h| / sum of pieces scored (whole
    data, no intervals; `tokens`, `total` keep the sums), with the objective named."""
    from tqdm.auto import tqdm

    n_layers, n_heads = n_layers_heads(model)
    total = torch.zeros(n_layers, n_heads, dtype=torch.float64)             # [layer, head]
    pieces = 0.0
    for batch in tqdm(batches, desc="importance", unit="batch", disable=not progress):
        score, tokens = importance_rows(model, batch, objective, means)
        total += score.sum(0).double().cpu()
        pieces += float(tokens.sum())
    layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    summed = total.numpy().ravel()
    return pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(), "total": summed, "tokens": pieces,
                         "importance": summed / pieces if pieces else np.nan, "objective": objective.description})
