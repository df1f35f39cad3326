"""torch's gradient modes as decorators that import torch only when the function runs.

    from headprobe.core.torch_modes import inference_mode, no_grad

    @inference_mode
    def flush(self): ...              # runs under torch.inference_mode()

    @no_grad
    def targets(self, model, batch): ...   # runs under torch.no_grad()

`@torch.inference_mode()` needs torch when the module is imported; these need it only when the
function is called, so a module that computes on tensors in some functions and declares tables,
labels or constants in others imports without torch (a report reads those, and never imports
torch or transformers: tests/test_light_imports.py).
"""

from __future__ import annotations

import functools


def inference_mode(function):
    """`function` run under `torch.inference_mode()`."""
    return _under("inference_mode", function)


def no_grad(function):
    """`function` run under `torch.no_grad()`."""
    return _under("no_grad", function)


def _under(mode: str, function):
    @functools.wraps(function)
    def run(*args, **kwargs):
        import torch

        with getattr(torch, mode)():
            return function(*args, **kwargs)

    return run
