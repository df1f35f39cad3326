"""A batch's captured layers gathered into groups of consecutive layers that the pass scores
together (`LayerStack`): a group's probabilities are written by the capture into one buffer."""

from __future__ import annotations

import torch

from headprobe.model.head_quantities import Heads


def with_layer_axis(heads):
    """The capture's payload of one layer with a leading layer axis of 1 (probs, or a `Heads`)."""
    if isinstance(heads, torch.Tensor):
        return heads[None]
    return Heads({name: value[None] for name, value in heads.items()})


class LayerStack:
    """One batch's captured layers, gathered into groups of consecutive layers (`size` each) that
    are scored together: a group's probabilities are written by the capture straight into one
    buffer [layer, batch, head, query, key] (`into`: no copy to stack them), other quantities
    (value norms) stacked when the group is complete.

        stack = LayerStack([0, 1, 2, 3], size=2)
        stack.add(0, probs0)      # None: the group (0, 1) is not complete
        stack.add(1, probs1)      # ((0, 1), probs [2, batch, head, query, key])
    """

    def __init__(self, layers: list[int], size: int):
        self.groups = [tuple(layers[i : i + size]) for i in range(0, len(layers), size)]
        self.group_of = {layer: group for group in self.groups for layer in group}
        self.buffers: dict[tuple[int, ...], torch.Tensor] = {}  # [layer, b, h, q, k] per group
        self.slots: dict[tuple[int, ...], tuple] = {}  # each layer's view of its group's buffer
        self.written: set[int] = set()  # layers the capture wrote into their slot
        self.extra: dict[tuple[int, ...], dict[int, dict]] = {}  # group -> layer -> other names

    def _allocate(self, group, shape, device) -> torch.Tensor:
        buffer = self.buffers[group] = torch.empty(
            (len(group), *shape), dtype=torch.float32, device=device
        )
        self.slots[group] = buffer.unbind(0)  # one call for every layer's view
        return buffer

    def into(self, layer: int, shape, device) -> torch.Tensor | None:
        """The slot of `layer` in its group's buffer, allocated on `device` at the group's first
        layer; None where the group's buffer is elsewhere (a model over several devices: `add`
        copies the layer in)."""
        group = self.group_of.get(layer)
        if group is None:
            return None
        buffer = self.buffers.get(group)
        if buffer is None:
            buffer = self._allocate(group, shape, device)
        if tuple(buffer.shape[1:]) != tuple(shape) or buffer.device != torch.device(device):
            return None
        self.written.add(layer)
        return self.slots[group][group.index(layer)]

    def add(self, layer: int, heads):
        """Take one layer's payload; (layers, payload with a leading layer axis) when its group
        is complete, else None."""
        group = self.group_of[layer]
        probs = heads if isinstance(heads, torch.Tensor) else heads.get("probs")
        if probs is not None and layer not in self.written:  # not written in place: copy it in
            buffer = self.buffers.get(group)
            if buffer is None or buffer.shape[1:] != probs.shape:
                buffer = self._allocate(group, probs.shape, probs.device)
            # (across devices where the group's buffer is elsewhere)
            self.slots[group][group.index(layer)].copy_(probs)
        others = self.extra.setdefault(group, {})
        others[layer] = {} if isinstance(heads, torch.Tensor) else heads
        if len(others) < len(group):
            return None
        del self.extra[group]
        self.written.difference_update(group)
        self.slots.pop(group, None)
        buffer = self.buffers.pop(group, None)
        if isinstance(heads, torch.Tensor):
            return group, buffer
        names = [name for name in heads if name != "probs"]
        payload = Heads({name: torch.stack([others[x][name] for x in group]) for name in names})
        if buffer is not None:
            payload["probs"] = buffer
        return group, payload

    def leftovers(self):
        """(layers, payload) of each layer of a group that never completed (a layer the model did
        not run in this pass), one layer at a time."""
        for group, others in self.extra.items():
            buffer = self.buffers.get(group)
            for layer, heads in sorted(others.items()):
                probs = None if buffer is None else buffer[group.index(layer)]
                if not heads:  # the capture handed on the probabilities alone
                    yield (layer,), probs[None]
                else:
                    payload = with_layer_axis(Heads(heads))
                    if probs is not None:
                        payload["probs"] = probs[None]
                    yield (layer,), payload
        self.extra, self.buffers, self.slots, self.written = {}, {}, {}, set()
