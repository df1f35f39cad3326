"""Where a language model reads its residual stream out: the final norm, W_U and W_E (METHODS §9).

    out = unembedding(model)                 # Unembedding, or UsageError (one line) naming the model
    out.norm, out.kind, out.gain, out.eps    # the final norm: "rms" or "layer", g [hidden], eps
    out.scale(residual)                      # [...]: s(t) of the real residual stream, frozen
    out.directions(targets)                  # [n, hidden]: g * (W_U[y] - mean_v W_U[v]) (centred for LN)
    out.w_u, out.w_e                         # [vocab, hidden] each: the LM head (else W_E) and W_E

The final norm is the base model's own (`model.projections.final_norm`: Llama `norm`, GPT-2 `ln_f`,
OPT/T5 `final_layer_norm`, ...). Its kind and gain are read off the module itself (`fit_norm`):
eight test vectors with a non-zero mean go through it, and per feature the affine map from each
candidate normalisation, (x - mean) / std or x / rms, to its output is fitted by least squares;
the one that fits is the norm's, so Gemma's `1 + weight`, a bias, or a norm class of any name are read as they compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from headprobe.core.errors import UsageError
from headprobe.model.projections import FINAL_NORMS, final_norm

EPS_NAMES = ("eps", "variance_epsilon", "epsilon", "layer_norm_eps")
NORM_KINDS = ("layer", "rms")


def normalise(x: torch.Tensor, kind: str, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_hat [..., hidden], s [...]): x / s, x centred first for `layer`; s the norm's scale
    (LayerNorm: the standard deviation; RMSNorm: sqrt(mean(x^2) + eps))."""
    if kind == "layer":
        x = x - x.mean(-1, keepdim=True)
    s = torch.sqrt(x.pow(2).mean(-1) + eps)  # [...]
    return x / s[..., None], s


@torch.no_grad()
def fit_norm(norm: nn.Module, hidden: int) -> tuple[str, torch.Tensor, float]:
    """(kind, gain [hidden] float32, eps) of a norm module, read off what it computes."""
    eps = next((float(getattr(norm, n)) for n in EPS_NAMES if hasattr(norm, n)), 1e-6)
    weight = norm.weight
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8, hidden, generator=generator, dtype=torch.float64) * 2 + 1.5  # [8, hidden]
    y = norm(x.to(weight.device, weight.dtype)).double().cpu()  # [8, hidden]
    best = None
    for kind in NORM_KINDS:
        x_hat, _ = normalise(x, kind, eps)  # [8, hidden]
        dx, dy = x_hat - x_hat.mean(0), y - y.mean(0)  # per feature: least squares y = g x + b
        gain = (dx * dy).sum(0) / dx.pow(2).sum(0)  # [hidden]
        miss = float((dy - gain * dx).abs().max() / y.abs().max())
        if best is None or miss < best[0]:
            best = (miss, kind, gain)
    miss, kind, gain = best
    if miss > 1e-2:
        raise UsageError(
            f"{type(norm).__name__}: the final norm is neither a LayerNorm nor an RMSNorm "
            "(its output is no affine map of either normalisation)"
        )
    return kind, gain.float(), eps


@dataclass
class Unembedding:
    """The final norm and the (un)embedding matrices of one model (see the module docstring)."""

    norm: nn.Module | None  # None: no final norm (gain 1)
    kind: str  # "layer" or "rms"
    gain: torch.Tensor  # [hidden] float32
    eps: float
    w_u: torch.Tensor  # [vocab, hidden]: the LM head's weight, else W_E
    w_e: torch.Tensor  # [vocab, hidden]: the input embedding
    has_head: bool  # w_u is a language-model head's weight

    def scale(self, residual: torch.Tensor) -> torch.Tensor:
        """[...] float32: s(t) of the residual stream `residual` [..., hidden] (frozen)."""
        return normalise(residual.float(), self.kind, self.eps)[1]

    def directions(self, targets: torch.Tensor) -> torch.Tensor:
        """[n, hidden] float32: g * (W_U[y] - mean_v W_U[v]) for target ids `targets` [n], centred
        over the hidden features for a LayerNorm (so that c . w == (c - mean c) . w)."""
        mean = self.centre  # [hidden]
        rows = self.w_u.index_select(0, targets.to(self.w_u.device)).float() - mean  # [n, hidden]
        w = rows * self.gain.to(rows.device)  # [n, hidden]
        return w - w.mean(-1, keepdim=True) if self.kind == "layer" else w

    @property
    def centre(self) -> torch.Tensor:
        """[hidden] float32: mean_v W_U[v] (computed once)."""
        if getattr(self, "_centre", None) is None:
            self._centre = self.w_u.float().mean(0)
        return self._centre


def base_of(model: nn.Module) -> nn.Module:
    """The base model under a language-model head (the model itself where it has none)."""
    return getattr(model, "base_model", None) or model


def unembedding(model: nn.Module, what: str, need_norm: bool = True) -> Unembedding:
    """The model's `Unembedding`; `what` (an analysis name) starts the one-line refusal of a model
    without a final norm headprobe can find (`need_norm`; else such a model gets norm None,
    gain 1: a post-norm model such as BERT ends in its last block's norm)."""
    base = base_of(model)
    norm = final_norm(base)
    w_e = model.get_input_embeddings().weight.detach()  # [vocab, hidden]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    w_u = head.weight.detach() if head is not None else w_e  # [vocab, hidden]
    if norm is None and not need_norm:
        ones = torch.ones(w_e.shape[1])  # [hidden]
        return Unembedding(None, "rms", ones, 0.0, w_u, w_e, head is not None)
    if norm is None:
        raise UsageError(
            f"{what}: {type(model).__name__} has no final norm before its output (looked for "
            f"{', '.join(FINAL_NORMS)} on {type(base).__name__})"
        )
    kind, gain, eps = fit_norm(norm, w_e.shape[1])
    return Unembedding(norm, kind, gain, eps, w_u, w_e, head is not None)
