"""The named per-head quantities a capture can hand on (`QUANTITIES`: probs, value_norms,
head_output, last_row) and how each is computed from what the attention call or the output
projection sees; which a model can give (`check_capturable`); `Heads`, one layer's quantities by
name. `headprobe.model.capture.AttentionCapture` calls these (its docstring says when).

    norms = value_norms(site, value, n_heads)    # value [batch, kv_head, key, d_head] -> [batch, head, key]
    writes = head_output(site, z, n_heads)       # z [batch, query, heads * d_head] -> [batch, head, query, hidden]
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from headprobe.model.attention import (
    CaptureError,
    eager_probs,
    not_understood,
    probs_and_output,
)
from headprobe.model.discovery import attention_sites
from headprobe.model.projections import (
    features_last,
    projection_in_features,
    projection_weight,
    stored_weight,
)

# the named per-head quantities a capture can hand on (what `needs` may name)
QUANTITIES = {
    "probs": "[batch, head, query, key] float32: softmax(Q K^T * scale + mask), the attention weights",
    "value_norms": "[batch, head, key] float32: ||v_j^h W_O^h||, what head h passes on of key j per unit "
    "of weight (METHODS §7)",
    "head_output": "[batch, head, query, hidden] float32: c_h = z_h W_O^h, head h's write into the "
    "residual stream (its slice of the output projection's input times its block of W_O, bias "
    "left out; METHODS §9)",
    "last_row": "[batch, head, key] float32: the last query row of probs alone (a decoding step's new "
    "token over every cached key; `headprobe.model.decoding`), O(heads x keys); the model's own "
    "attention computes the layer's output",
}


class CaptureUnavailable(CaptureError):
    """A quantity asked for cannot be captured from this model (e.g. values on the legacy path
    where no value projection is found)."""


def check_needs(needs) -> frozenset[str] | None:
    """`needs` as a frozenset of known quantity names (None stays None: the probs-only API)."""
    if needs is None:
        return None
    needs = frozenset([needs] if isinstance(needs, str) else needs)
    for name in sorted(needs):
        if name not in QUANTITIES:
            raise ValueError(
                f"unknown capture quantity {name!r}; choose from {', '.join(QUANTITIES)}"
            )
    if not needs:
        raise ValueError("needs names no quantity")
    return needs


# what a legacy site needs for each quantity beyond the probabilities, and what it is for
LEGACY_NEEDS = {
    "value_norms": (("value", "output"), "the norms measure"),
    "head_output": (("output",), "head outputs"),
}


def check_capturable(model, needs) -> None:
    """Raise `CaptureUnavailable` (naming the model) when `needs` asks a model on the legacy
    `output_attentions` path for a quantity one of its sites lacks the projections for (the
    value and output projections for `value_norms`, the output projection for `head_output`)."""
    sites = attention_sites(model)
    if sites.path == "interface":
        return
    for need in sorted(set(needs or ()) & set(LEGACY_NEEDS)):
        parts, use = LEGACY_NEEDS[need]
        for site in sites.sites:
            lacking = [part for part in parts if getattr(site, part) is None]
            if lacking:
                raise CaptureUnavailable(
                    f"{type(model).__name__} computes attention itself (read from "
                    f"output_attentions) and headprobe finds no {' or '.join(lacking)} projection "
                    f"for its {site.stack} layer {site.layer} ({site.name}), so {need} ({use}) "
                    "cannot be captured for it"
                )


class Heads(dict):
    """The quantities of one captured layer (or query block), by name; also as attributes
    (`heads.probs`, `heads.value_norms`)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"{name!r} was not asked for (needs: {', '.join(self)})") from None


# ------------------------------------------------------------------------- value norms
_R_CACHE: weakref.WeakKeyDictionary[nn.Module, tuple] = weakref.WeakKeyDictionary()


def head_factors(projection: nn.Module, n_heads: int, d_head: int) -> torch.Tensor:
    """[head, d_head, d_head] float32: R of the QR factorisation of each head's block
    W_O^h = W[:, h*d_head:(h+1)*d_head] ([hidden, d_head]), so that ||W_O^h v|| = ||R_h v||
    without forming v W_O^h ([hidden] per key). Kept per projection while its weight is
    unchanged (same storage and version)."""
    stored = stored_weight(projection)  # the module's own tensor (`projection_weight` may copy)
    stamp = (stored.data_ptr(), stored._version, str(stored.device), stored.dtype, n_heads, d_head)
    kept = _R_CACHE.get(projection)
    if kept is not None and kept[0] == stamp:
        return kept[1]
    weight = projection_weight(projection)  # [hidden, heads * d_head]
    blocks = (
        weight.detach().double().reshape(weight.shape[0], n_heads, d_head).transpose(0, 1)
    )  # [head, hidden, d]
    factor = torch.linalg.qr(blocks, mode="r").R.float()  # [head, d_head, d_head]
    _R_CACHE[projection] = (stamp, factor)
    return factor


def value_norms(site, value: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[batch, head, key] float32: ||v_j^h W_O^h|| for every query head h and key j of one
    attention site; `value` [batch, kv_head, key, d_head] as the attention function gets it
    (query head h reads KV head h // (heads // kv_heads)); W_O is `site.output`."""
    projection = site.output
    in_features = n_heads * value.shape[-1]
    if projection is None or projection_in_features(projection) != in_features:
        found = (
            "none"
            if projection is None
            else f"{type(projection).__name__} with {projection_in_features(projection)}"
        )
        raise CaptureUnavailable(
            f"value_norms: {type(site.module).__name__} ({site.name}) has no output projection "
            f"with {in_features} input features (heads x d_head; found: {found})"
        )
    factor = head_factors(projection, n_heads, value.shape[-1]).to(value.device)  # [head, d, d]
    groups = n_heads // value.shape[1]
    v = value.float()  # [batch, kv_head, key, d]
    if groups > 1:
        v = v.repeat_interleave(groups, dim=1)  # [batch, head, key, d]
    return torch.linalg.vector_norm(
        torch.einsum("bhkd,hed->bhke", v, factor), dim=-1
    )  # [batch, head, key]


def head_output(site, z: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[batch, head, query, hidden] float32: c_h = z_h W_O^h (METHODS §9) for every head h of one
    attention site; `z` the input of the site's output projection (`site.output`) as the model
    hands it over, [batch, query, heads * d_head] (channels first, [batch, heads * d_head, query],
    for a pointwise nn.Conv1d; head h's features h*d_head..(h+1)*d_head); the projection's bias
    belongs to no head. Summed over heads, plus the bias, it is the projection's output."""
    projection = site.output
    z = features_last(projection, z) if projection is not None else z  # [batch, query, features]
    width = z.shape[-1]
    if projection is None or projection_in_features(projection) != width or width % n_heads:
        raise CaptureUnavailable(
            f"head_output: {type(site.module).__name__} ({site.name}) has no output projection "
            f"reading {n_heads} heads' outputs side by side"
        )
    weight = projection_weight(projection).to(z.device).float()  # [hidden, heads * d_head]
    blocks = weight.reshape(weight.shape[0], n_heads, width // n_heads)  # [hidden, head, d_head]
    z = z.float().reshape(*z.shape[:-1], n_heads, width // n_heads)  # [batch, query, head, d_head]
    return torch.einsum("bqhd,ohd->bhqo", z, blocks)  # [batch, head, query, hidden]


def last_row(module, query, key, value, mask, scaling, dropout, kwargs) -> torch.Tensor:
    """[batch, head, key] float32: the probabilities of the call's last query row alone (a decoding
    step's single row), as `eager_probs` computes them (grouped query heads repeated: each query
    head its own row over its KV group's keys); a keyword not understood: the family's eager
    attention's last row."""
    if not_understood(kwargs):
        probs, _ = probs_and_output(module, query, key, value, mask, scaling, dropout, kwargs)
        return probs[:, :, -1]
    n = query.shape[-2]
    return eager_probs(module, query, key, mask, scaling, kwargs, rows=slice(n - 1, n))[:, :, 0]
