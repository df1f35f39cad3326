"""Each layer's block module, and its output kept from one pass and replayed in another.

    blocks = layer_blocks(model, sites)          # [layer] -> the module the layer runs in, or None
    with Kept(blocks, kept):                     # kept[block]: its output of the pass run inside
        model(**inputs)
    with replaying({b: kept[b] for b in blocks[:l]}):   # the layers below l return those outputs
        model(**inputs)                          # ... so a patched pass costs the layers from l up
    with replaying(outputs, rows=batch, copies=4):      # each kept tensor repeated 4 times (copy-major)

A patch at layer l leaves every layer below it as it was, so a patched pass need not run them:
each returns its output of a clean pass instead (a fresh copy each call, so nothing in place
reaches the kept one). Where the layers share one module (ALBERT) or none is found,
`layer_blocks` is None and a patched pass runs from the bottom.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from headprobe.model.channels import repeated, returning


def layer_blocks(model, sites) -> list | None:
    """The module each layer of a stack runs in (the item of a `ModuleList` that holds its
    attention module; `sites`: the stack's), one distinct module per layer in layer order; None
    where layers share one (ALBERT) or none is found."""
    found = []
    for site in sites:
        parts = site.name.split(".")
        block = None
        for i in range(len(parts) - 1, 0, -1):
            if parts[i].isdigit() and isinstance(
                model.get_submodule(".".join(parts[:i])), nn.ModuleList
            ):
                block = model.get_submodule(".".join(parts[: i + 1]))
                break
        if block is None:
            return None
        found.append(block)
    if len({id(b) for b in found}) != len(found):
        return None
    return found


class Kept:
    """Context manager: each block's output of the pass run inside, kept (first call only)."""

    def __init__(self, blocks, kept: dict):
        self.blocks, self.kept, self.handles = blocks or [], kept, []

    def __enter__(self):
        def keep(module, args, output):
            self.kept.setdefault(module, output)

        self.handles = [b.register_forward_hook(keep) for b in self.blocks]
        return self

    def __exit__(self, *exc):
        while self.handles:
            self.handles.pop().remove()
        return False


@contextlib.contextmanager
def replaying(outputs: dict, rows: int | None = None, copies: int = 1):
    """Each block of `outputs` returns a copy of its kept output instead of running; with
    `copies` > 1, every tensor of `rows` rows in it repeated that many times (copy-major)."""
    if copies > 1:
        outputs = {b: repeated(out, rows, copies) for b, out in outputs.items()}
    with returning({b: _replay(out) for b, out in outputs.items()}):
        yield


def _replay(output):
    return lambda *args, **kwargs: _copied(output)


def _copied(value):
    if torch.is_tensor(value):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_copied(v) for v in value)
    if isinstance(value, dict):
        return type(value)({k: _copied(v) for k, v in value.items()})
    return value


__all__ = ["Kept", "layer_blocks", "replaying"]
