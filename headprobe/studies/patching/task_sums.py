"""A task's per-unit sums (METHODS §19): what the patching pass streams, added unit by unit.

    sums = TaskSums(nodes=["embed", "0-0", ...], layers=30, heads=9)
    sums.add(units, {"noise": [row, node], ..., "m_clean": [row], "attention": [row, target, layer, head]})
    sums.units, sums.values["noise"]   # [unit, node] sums over each unit's examples
    sums.values["count"]               # [unit] examples

Every array is a sum over a unit's examples, so two shards' sums add, and every statistic (a
mean per example, a share of m_clean - m_corrupted) is a ratio of sums that the bootstrap over
units draws whole (METHODS §5).
"""

from __future__ import annotations

import numpy as np

# the attention from the scored piece in the clean prompt, per head (`TARGETS` order)
TARGETS = (
    "answer",
    "answer_first",
    "answer_last",
    "distractor",
    "distractor_first",
    "distractor_last",
    "first_position",
)


class TaskSums:
    """Per-unit sums, grown as units arrive (module docstring)."""

    def __init__(self, nodes: list[str], layers: int, heads: int):
        self.nodes, self.layers, self.heads = list(nodes), layers, heads
        self.units: list[str] = []
        self.index: dict[str, int] = {}
        self.values: dict[str, np.ndarray] = {}

    def add(self, units: list[str], rows: dict) -> None:
        """Add per-example rows (`rows[key]`: [row, ...]) into their units' sums; the example
        count goes to "count"."""
        for u in units:
            if u not in self.index:
                self.index[u] = len(self.units)
                self.units.append(u)
        at = np.array([self.index[u] for u in units])
        rows = dict(rows, count=np.ones(len(units)))
        for key, values in rows.items():
            values = np.asarray(values, dtype=np.float64)
            total = self.values.get(key)
            if total is None or total.shape[0] < len(self.units):
                grown = np.zeros((len(self.units), *values.shape[1:]))
                if total is not None:
                    grown[: total.shape[0]] = total
                total = grown
            np.add.at(total, at, values)
            self.values[key] = total

    def get(self, key: str) -> np.ndarray | None:
        """[unit, ...] the sums of `key` (None: never added)."""
        value = self.values.get(key)
        if value is None or value.shape[0] == len(self.units):
            return value
        grown = np.zeros((len(self.units), *value.shape[1:]))
        grown[: value.shape[0]] = value
        return grown

    def __len__(self) -> int:
        return len(self.units)
