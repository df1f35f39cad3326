"""The model's parameters held out of autograd for a gradient pass taken with respect to
activations alone.

    with torch.enable_grad(), FrozenWeights(model):
        m = ...                      # autograd keeps no layer input for a weight's gradient
        torch.autograd.grad(m, activations)

A backward pass with respect to activations needs no parameter's gradient; while a parameter
requires one, autograd keeps every linear map's input for it (one more tensor of each layer's
activations per pass) and `backward()` computes it (about half the backward's work).
"""

from __future__ import annotations


class FrozenWeights:
    """Context manager: the model's parameters need no gradient inside, as they were after."""

    def __init__(self, model):
        self.model, self.kept = model, []

    def __enter__(self):
        self.kept = [(p, p.requires_grad) for p in self.model.parameters()]
        for p, _ in self.kept:
            p.requires_grad_(False)
        return self

    def __exit__(self, *exc):
        for p, wanted in self.kept:
            p.requires_grad_(wanted)
        return False


__all__ = ["FrozenWeights"]
