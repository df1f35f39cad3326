"""What a scorer computed when its input ended, kept until the run's tables read it.

    KEPT = KeptTables("patching")              # one per analysis, at module level
    KEPT.put(scorer.token, {"patching_nodes": frame, ...})   # in the scorer's `finish`
    KEPT.of(results)                           # the dict, by the token the summary records
    tables = {"patching_nodes": KEPT.frame("patching_nodes")}   # a table function per name

Analyses that run the model after their pass (patching, circuits, composition) make their tables
once, in `finish`; the run's tables are made later from `Results`, which find them by the token
the scorer's `describe` writes under `summary[name]["kept"]`. Only the last `runs` runs are kept in
one process (results read again, or merged from shards, find none: their tables are then empty).
"""

from __future__ import annotations

import pandas as pd


class KeptTables:
    """See the module docstring."""

    def __init__(self, name: str, runs: int = 4):
        self.name, self.runs, self.kept = name, runs, {}

    def put(self, token: str, value: dict) -> None:
        self.kept[token] = value
        while len(self.kept) > self.runs:
            self.kept.pop(next(iter(self.kept)))

    def get(self, token: str | None) -> dict:
        """What was kept under `token`, or an empty dict."""
        return self.kept.get(token) or {}

    def of(self, results) -> dict | None:
        """What the run of `results` kept (None: results without it)."""
        info = results.summary.get(self.name) or {}
        return self.kept.get(info.get("kept"))

    def frame(self, name: str, within: str | None = None):
        """A table function: the kept DataFrame `name` (in the kept dict's `within` dict where
        given), or an empty one."""

        def table(results) -> pd.DataFrame:
            got = self.of(results)
            if got is not None and within is not None:
                got = got.get(within)
            frame = None if got is None else got.get(name)
            return pd.DataFrame() if frame is None else frame.reset_index(drop=True)

        table.__name__ = f"{name}_table"
        return table
