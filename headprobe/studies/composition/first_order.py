"""The first-order estimate of every edge's effect through the model (METHODS §18 "Through the
model"), and its check against exact path patching on the validation sample.

    grad_z = slice_gradients(model, cache, objective, targets)   # [batch, layer, piece, head, d_head]
    grads = input_gradients(model, cache, layer, grad_z)         # [channel, head, batch, piece, hidden]
    sums = edge_sums(model, cache, layer, baseline=means, grads=grads)
    sums.estimate                                                # [batch, sender, head, channel]

The objective (METHODS §8, per example row) depends on receiver r's channel c only through r's
slice z_r of its layer's output projection's input. So one backward pass gives every slice's
gradient dO/dz (`slice_gradients`: a zero added to every slice, every layer above live), and
the gradient with respect to the residual stream x entering r's layer, as r's channel c reads it
(through the layer's own norm, projection, q/k norms and position encoding), is one local
vector-Jacobian product through the recomputed attention (`input_gradients`: z_r as
`model.channels` computes it, the other channels clean). The estimate of edge (s, r, c) is that
gradient dotted with the sender's change d_s = b_s - c_s as it reaches r's layer (the same d_s
`intervention.sender_changes` gives the exact intervention), summed over the row's pieces.

The representation change (a model without a language-model head, METHODS §8) is at its
minimum, 0, at the intact model, so its gradient there is 0 for every edge: its estimate
carries no information. `has_estimate` says so, the sweep computes no gradient for it (the
estimate is NaN), and the check lists the exact values alone with `NO_ESTIMATE` as its warning.

The check (`check_frames`) puts the estimate beside the exact change (`path_patching.exact_rows`)
for each edge of the validation sample, both per unit, with Spearman's rho over the sample and
its interval over the units' bootstrap resamples, as the importance check does (its helpers are
reused: `_spearman`, `WEAK`; the interval's ends from `stats.estimates.percentiles`).
"""

from __future__ import annotations

import copy
import inspect

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from headprobe.model.channels import CHANNELS, channel_attention, layer_input
from headprobe.model.frozen_weights import FrozenWeights
from headprobe.model.gates import _counted, call_order
from headprobe.model.objectives import IGNORE
from headprobe.model.projections import features_last
from headprobe.stats.estimates import percentiles, ratio
from headprobe.studies.ablation.validation import WEAK, _spearman
from headprobe.studies.composition.intervention import BUDGET, block_size
from headprobe.studies.composition.run_options import EDGE_KEYS, KIND

CHECK_COLUMNS = [
    *EDGE_KEYS,
    "sample",
    "estimate",
    "exact",
    "ci_low",
    "ci_high",
    "objective",
]
CORRELATION_COLUMNS = [KIND, "edges", "spearman", "ci_low", "ci_high", "warning"]
ROWS = 4  # example rows per backward pass of `slice_gradients`
ZERO_GRADIENT = "representation"  # the objective kind whose gradient at the intact model is 0
NO_ESTIMATE = (
    "no first-order estimate: the representation change 1 - cos(h', h) is at its minimum, 0, "
    "at the intact model, so its gradient there is 0 for every edge; the exact values stand alone"
)


def has_estimate(objective) -> bool:
    """Whether `objective` has a first-order estimate (module docstring): every kind but the
    representation change."""
    return getattr(objective, "kind", None) != ZERO_GRADIENT


class SliceProbe:
    """Context manager: adds `delta` [batch, layer, piece, head, d_head] (zeros that require
    grad) to every head's slice of its output projection's input, in the stack `stack`."""

    def __init__(self, model, delta: torch.Tensor, stack: str):
        self.model, self.delta, self.stack, self.handles = model, delta, stack, []

    def _add(self, layer: int, args):
        projection = self.projections[layer]
        z = features_last(projection, args[0])  # [batch, piece, head * d_head]
        z = z + self.delta[:, layer].flatten(-2).to(z)
        return (features_last(projection, z), *args[1:])

    def __enter__(self):
        self.projections = {}
        for module, sites in call_order(self.model).items():
            for site in sites:
                if site.stack == self.stack:
                    self.projections[site.layer] = module
            if any(site.stack == self.stack for site in sites):
                hook = _counted(sites, self.stack, self._add)
                self.handles.append(module.register_forward_pre_hook(hook))
        return self

    def __exit__(self, *exc):
        while self.handles:
            self.handles.pop().remove()
        return False


def slice_gradients(model, cache, objective, targets, rows: int = ROWS) -> torch.Tensor:
    """[batch, layer, piece, head, d_head] float32: d objective_b / d z_b for every head's slice
    z of every layer of `cache.stack` (row b's own summed objective; rows do not interact), with
    every layer above each slice recomputed. `cache` must be of `targets.inputs`. The backward
    passes take `rows` example rows at a time (rows do not interact), which bounds their
    memory (a language model's logits and every layer's saved activations)."""
    first = cache.slices[0]  # [batch, piece, head, d_head]
    batch = first.shape[0]
    # [batch, layer, piece, head, d_head], filled a chunk of rows at a time (no second copy)
    out = torch.empty(batch, len(cache.sites), *first.shape[1:], device=first.device)
    for start in range(0, batch, rows):
        part = _rows_of(targets, batch, slice(start, start + rows))
        n = min(rows, batch - start)
        shape = (n, len(cache.sites), *first.shape[1:])
        delta = torch.zeros(shape, device=first.device, requires_grad=True)
        with torch.enable_grad(), FrozenWeights(model), SliceProbe(model, delta, cache.stack):
            values, _ = objective_rows(objective, model, part)  # [rows]
            (grad,) = torch.autograd.grad(values.sum(), delta)
        out[start : start + n] = grad
    return out


def _rows_of(targets, batch: int, rows: slice):
    """`targets` (any object whose tensors lead with the batch axis, in `inputs` too) cut to
    `rows`; itself where that is every row."""
    if rows.start == 0 and rows.stop >= batch:
        return targets
    cut = lambda v: v[rows] if torch.is_tensor(v) and v.dim() and v.shape[0] == batch else v
    fields = dict(vars(targets))
    fields = {
        k: ({n: cut(t) for n, t in v.items()} if k == "inputs" else cut(v))
        for k, v in fields.items()
    }
    part = copy.copy(targets)
    part.__dict__.update(fields)
    return part


def objective_rows(objective, model, targets) -> tuple[torch.Tensor, torch.Tensor]:
    """`objective.per_row(model, targets)`, with a causal language-model loss computed from the
    logits of the scored pieces alone where the model takes `logits_to_keep` (transformers'
    causal LMs: the head is applied at those positions only; each position's loss is the
    same). The objective's other kinds, and models without that argument: `per_row` itself."""
    kind = getattr(objective, "kind", None)
    labels = getattr(targets, "labels", None)
    takes = "logits_to_keep" in inspect.signature(type(model).forward).parameters
    if kind != "causal_lm" or labels is None or not takes:
        return objective.per_row(model, targets)
    scored = objective.scored_labels(targets)  # [batch, piece - 1]
    keep = torch.nonzero((scored != IGNORE).any(0)).flatten()  # [kept] positions
    logits = model(**targets.inputs, logits_to_keep=keep).logits.float()  # [batch, kept, vocab]
    nll = F.cross_entropy(
        logits.transpose(1, 2), scored[:, keep], ignore_index=IGNORE, reduction="none"
    )
    return nll.sum(-1), (scored != IGNORE).sum(-1).to(nll.dtype)  # [batch], [batch]


def input_gradients(
    model, cache, layer: int, grad_z: torch.Tensor, heads=None, budget: int = BUDGET
) -> torch.Tensor:
    """[channel, head, batch, piece, hidden]: the objective's gradient with respect to the
    residual stream entering `layer` (before its norm; post-norm: the module's input) as each
    receiver head's channel reads it, from `grad_z` (`slice_gradients`). Heads go in blocks,
    each head one copy of the batch."""
    site, x = cache.sites[layer], cache.x[layer]  # x [batch, piece, hidden]
    heads = list(range(site.heads)) if heads is None else list(heads)
    batch, piece, hidden = x.shape
    g = grad_z[:, layer].to(x)  # [batch, piece, head, d_head]
    step = block_size(batch, piece, hidden, site.heads, g.shape[-1], budget)
    # [channel, head, batch, piece, hidden], filled a block of heads at a time (no second copy)
    out = x.new_empty(len(CHANNELS), len(heads), batch, piece, hidden)
    for start in range(0, len(heads), step):
        block = heads[start : start + step]
        n = len(block)
        copies = x.repeat(n, 1, 1).requires_grad_()  # [head * batch, piece, hidden]
        mask = torch.zeros(n, *g.shape, device=g.device)  # [head, batch, piece, head, d_head]
        for i, h in enumerate(block):
            mask[i, :, :, h] = g[:, :, h]
        mask = mask.flatten(0, 1)
        with torch.enable_grad(), FrozenWeights(model):
            att = channel_attention(model, cache, layer, layer_input(cache, layer, copies))
            grads = [
                torch.autograd.grad(att.z[c], copies, mask, retain_graph=c != CHANNELS[-1])[0]
                for c in CHANNELS
            ]
        for c, grad in enumerate(grads):
            out[c, start : start + n] = grad.view(n, batch, piece, hidden)
        del grads, att
    return out


def per_resample(values: np.ndarray, count: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """[resample, ...]: sum_u w_u values_u / sum_u w_u count_u, values [unit, ...], count [unit]
    (or [unit, ...]), weights [resample, unit] (resample 0: all 1, the data itself)."""
    top = np.tensordot(weights, values, axes=(1, 0))
    bottom = np.tensordot(weights, count, axes=(1, 0))
    if bottom.ndim < top.ndim:
        bottom = bottom.reshape(bottom.shape + (1,) * (top.ndim - bottom.ndim))
    return ratio(top, bottom)


def check_frames(edges, sample, exact, estimate, tokens, weights, ablation: str, objective: str):
    """(composition_check, composition_check_correlation) DataFrames. edges: the sampled edges;
    sample: "top" / "random" per edge; exact, estimate [unit, edge] summed objective changes;
    tokens [unit] the pieces they are summed over; weights [resample, unit]. estimate None (no
    first-order estimate, `has_estimate`): the estimate column is NaN and the correlation's one
    row says why (`NO_ESTIMATE`)."""
    ex = per_resample(exact, tokens, weights)  # [resample, edge]
    est = (
        per_resample(estimate, tokens, weights)
        if estimate is not None
        else np.full_like(ex, np.nan)
    )
    low, high = percentiles(ex[1:])
    rows = []
    for i, ((sl, sh), (l, h), c) in enumerate(edges):
        rows.append(
            [l, h, c, sl, sh, ablation, sample[i], est[0, i], ex[0, i], low[i], high[i], objective]
        )
    check = pd.DataFrame(rows, columns=CHECK_COLUMNS)
    correlation = pd.DataFrame(columns=CORRELATION_COLUMNS)
    if estimate is None:
        nan = float("nan")
        row = [ablation, len(edges), nan, nan, nan, NO_ESTIMATE]
        correlation = pd.DataFrame([row], columns=CORRELATION_COLUMNS)
    elif len(edges) >= 3:
        rho = _spearman(est, ex)  # [resample]
        r_low, r_high = percentiles(rho[1:])
        warning = f"rank correlation {rho[0]:.2f} < {WEAK}" if not rho[0] >= WEAK else ""
        correlation = pd.DataFrame(
            [[ablation, len(edges), rho[0], float(r_low), float(r_high), warning]],
            columns=CORRELATION_COLUMNS,
        )
    return check, correlation
