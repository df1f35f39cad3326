"""Tidy results: build from unit counts, save, load, merge (SPEC section 5).

Files in a results directory:
- `unit_counts.parquet`  per unit (sentence / document) counts: what everything is derived from
- `counts.parquet/.csv`  tidy counts, whole data (fold "") and halves ("0", "1")
- `best_heads.parquet/.csv`  best head per analysis x label, in-sample and held-out, with intervals
- `baselines.parquet/.csv`, `positional_heads.parquet/.csv`, `surface.parquet/.csv`
- `summary.json`  model, corpus, counts of skipped inputs, notes, headline best heads
- `examples.json`  word-level attention of top heads on example sentences (for reports)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from headprobe import stats
from headprobe.scorers.base import compact, concat_compact, sum_duplicates

TABLES = ("counts", "best_heads", "baselines", "positional_heads", "surface")


class Results:
    """All tables of one run, as pandas DataFrames, plus `summary` (dict) and `examples` (list)."""

    def __init__(self, unit_counts: pd.DataFrame, tables: dict[str, pd.DataFrame], summary: dict,
                 examples: list | None = None):
        self.unit_counts = unit_counts
        for name in TABLES:
            setattr(self, name, tables[name])
        self.summary = summary
        self.examples = examples or []

    @classmethod
    def from_unit_counts(cls, unit_counts: pd.DataFrame, summary: dict | None = None, examples=None,
                         seed: int = stats.SEED, n_boot: int = stats.N_BOOT) -> "Results":
        counts = stats.tidy_counts(unit_counts, seed)
        best_heads, baselines = stats.selection_tables(unit_counts, seed, n_boot)
        tables = {
            "counts": counts,
            "best_heads": best_heads,
            "baselines": baselines,
            "positional_heads": stats.positional_heads(counts),
            "surface": stats.surface_table(counts),
        }
        summary = dict(summary or {}, seed=seed, bootstrap_resamples=n_boot)
        return cls(unit_counts, tables, summary, examples)

    def save(self, out: str | Path) -> dict[str, Path]:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"unit_counts": out / "unit_counts.parquet"}
        self.unit_counts.to_parquet(paths["unit_counts"], index=False)
        for name in TABLES:
            table = getattr(self, name)
            table.to_parquet(out / f"{name}.parquet", index=False)
            table.to_csv(out / f"{name}.csv", index=False)
            paths[name] = out / f"{name}.parquet"
        paths["summary"] = out / "summary.json"
        paths["summary"].write_text(json.dumps(self.summary, indent=2, default=_json_default))
        paths["examples"] = out / "examples.json"
        paths["examples"].write_text(json.dumps(self.examples, default=_json_default))
        return paths

    @classmethod
    def load(cls, directory: str | Path) -> "Results":
        directory = Path(directory)
        if not (directory / "summary.json").is_file():
            raise FileNotFoundError(f"{directory} is not a headprobe results directory (no summary.json)")
        tables = {name: pd.read_parquet(directory / f"{name}.parquet") for name in TABLES}
        examples_path = directory / "examples.json"
        examples = json.loads(examples_path.read_text()) if examples_path.is_file() else []
        return cls(pd.read_parquet(directory / "unit_counts.parquet"), tables,
                   json.loads((directory / "summary.json").read_text()), examples)

    @classmethod
    def merge(cls, *parts: "Results", seed: int | None = None, n_boot: int | None = None) -> "Results":
        """Add the counts of several runs (shards of one corpus, or two devices) together.

        Folds and intervals use `seed` and `n_boot`, by default those the first part was made with.
        """
        first = parts[0].summary
        seed = first.get("seed", stats.SEED) if seed is None else seed
        n_boot = first.get("bootstrap_resamples", stats.N_BOOT) if n_boot is None else n_boot
        unit_counts = merge_unit_counts([p.unit_counts for p in parts])
        summary = dict(parts[0].summary, merged_from=len(parts))
        return cls.from_unit_counts(unit_counts, summary, parts[0].examples, seed, n_boot)


def merge_unit_counts(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate per-unit counts and sum rows with the same key."""
    return sum_duplicates(concat_compact([compact(f) for f in frames]))


def load_results(directory: str | Path) -> Results:
    return Results.load(directory)


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")
