"""Results: the streaming tallies of a run and every table derived from them, computed once.

    results = headprobe.run(treebank="en_ewt-ud-dev.conllu")
    results.best_heads                       # DataFrame (METHODS §5 columns)
    results.head_scores("dependency", "nsubj")
    results.roles                            # METHODS §6 head roles
    results.save("out/"); Results.load("out/")  # headprobe.results.store: whole or not at all
    Results.merge(a, b)                      # shards add up: identical tables to one run

This is the query layer: the report, the notebook and `analyses/` read these
tables and views; nothing downstream recomputes them. Files are `headprobe.results.store`'s:
`save` and `load` are thin calls into it (the layout is listed there), and the report
is built by whoever asks for it (`headprobe.report`), not here.

The random-init control (`headprobe.model.control`): tallies whose `model` is "control" are the
control's; their tables are computed as for a run of that model alone (`results.control`),
saved prefixed `control_`, and the trained model's best heads carry the control's best
beside them. Every other table and view is the trained model's.

Measures (METHODS §7): `tallies` holds one tally per analysis and measure (`measures.tally_key`:
`dependency`, `dependency@norms`, `dependency@norms~control`); every table is computed per
measure, exactly as for a run of that measure alone (the control's beside it as above), and
carries a `measure` column. `results.for_measure("norms")`
is the results of one measure (tallies by analysis name, tables cut to its rows); the views
below (`head_scores`, `mass_per_head`, ...) read one measure, by default the first
(`weights` when present).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from headprobe.model.control import (
    CONTROL,
    TABLE_PREFIX,
    by_model,
    control_tables,
    with_control,
)
from headprobe.results import store
from headprobe.results.count_table import COUNT_COLUMNS, tidy_counts
from headprobe.scoring import registry
from headprobe.scoring.measures import MEASURES, WEIGHTS, tally_key
from headprobe.scoring.scorer_base import compact, concat_compact, sum_duplicates
from headprobe.scoring.tally import Tally
from headprobe.stats.estimates import ratio
from headprobe.stats.head_selection import (
    BASELINE_COLUMNS,
    BEST_COLUMNS,
    TEST_COLUMNS,
    min_trials,
    selection_tables,
)


class Results:
    """All tables of one run as pandas DataFrames, plus `summary` (dict), `examples` (list),
    `tallies` ({tally key: Tally}: the analysis, `@norms` for the norms measure, `~control` for the
    random-init control's) and, when kept, `unit_counts`."""

    def __init__(
        self,
        tallies: dict[str, Tally],
        summary: dict | None = None,
        examples: list | None = None,
        unit_counts: pd.DataFrame | None = None,
        tables: dict[str, pd.DataFrame] | None = None,
        head_attention: dict | None = None,
    ):
        self.tallies = dict(tallies)
        self.head_attention = head_attention  # `headprobe.results.head_attention`: the explorer's
        self.summary = dict(summary or {})
        self.examples = examples or []
        self.unit_counts = unit_counts
        self._tables: dict[str, pd.DataFrame] = {}
        self._control: Results | None = None
        # `best_head`'s index: (the best-heads table it indexes, its pooled rows, {(measure,
        # analysis, label, selection): the first one's position}); a report asks for hundreds
        self._best_rows: tuple = (None, None, {})
        if tables is None:
            self._compute()
        else:
            self._tables = dict(tables)
        self.summary["tables"] = list(self._tables)

    # -- computed once ------------------------------------------------------------------
    def _compute(self) -> None:
        """Every table, per measure: the tallies of one measure, keyed without the measure, give
        the same tables as a run of that measure alone; each gets a `measure` column."""
        groups: dict[str, dict[str, Tally]] = {}
        for tally in self.tallies.values():
            groups.setdefault(tally.measure, {})[tally_key(tally.analysis, model=tally.model)] = (
                tally
            )
        order = sorted(groups, key=measure_rank) or [WEIGHTS]
        if len(order) == 1 and all(
            key == tally_key(t.analysis, model=t.model) for key, t in self.tallies.items()
        ):
            self._compute_tables()
            self._tables = {
                name: with_measure(table, order[0]) for name, table in self._tables.items()
            }
        else:
            parts = [Results(groups[m], dict(self.summary), self.examples).tables for m in order]
            for name in dict.fromkeys(name for part in parts for name in part):
                self._tables[name] = _concat(
                    [part[name] for part in parts if name in part],
                    list(next(part[name] for part in parts if name in part).columns),
                )
        self._tables.update(
            {name: with_measure(t, order[0]) for name, t in self._weights_only_tables().items()}
        )

    def _weights_only_tables(self) -> dict[str, pd.DataFrame]:
        """The tables of the weights-only analyses the run computed: they have no tally (their
        record is the summary's entry under their name); they read no attention, so they are
        given once, under the first measure (as the gated passes are). None in the random-init
        control's own results (only control tallies): the weights read were the trained model's."""
        if self.tallies and all(t.model == CONTROL for t in self.tallies.values()):
            return {}
        done = self.summary.get("analyses", ())
        return {
            table: make(self)
            for analysis in registry.analyses(registry.WEIGHTS_ONLY)
            if analysis.name in done and self.summary.get(analysis.name)
            for table, make in analysis.tables.items()
        }

    def _compute_tables(self) -> None:
        """The tables of tallies of one measure, keyed by analysis name (`~control` for the control's)."""
        trained, control = by_model(self.tallies)
        counts, best, base, tests = [], [], [], []
        for name, tally in trained.items():
            if tally.senders:  # a pair tally: its analysis's pair table is its record
                continue
            counts.append(tidy_counts(tally))
            analysis = _registered(name)
            if analysis is not None and analysis.selection:
                b, bl, t = selection_tables(
                    tally, analysis.family, min_trials(analysis.name), analysis.selects
                )
                best.append(b), base.append(bl), tests.append(t)
        self._tables["counts"] = _concat(counts, COUNT_COLUMNS)
        self._tables["best_heads"] = _concat(best, BEST_COLUMNS)
        self._tables["baselines"] = _concat(base, BASELINE_COLUMNS)
        self._tables["head_tests"] = _concat(tests, TEST_COLUMNS)
        if control:  # the random-init control: its own tables, its best beside ours
            self._control = Results(control, dict(self.summary), self.examples)
            self._tables["best_heads"] = with_control(self.best_heads, self._control.best_heads)
            self._tables.update(
                {TABLE_PREFIX + name: t for name, t in self._control.tables.items()}
            )
        for name in trained:
            analysis = _registered(name)
            for table, make in analysis.tables.items() if analysis is not None else ():
                self._tables[table] = make(self)
        from headprobe.stats.roles import head_roles

        self._tables["roles"] = head_roles(self)

    # -- the tables -----------------------------------------------------------------------
    def table(self, name: str) -> pd.DataFrame:
        if name not in self._tables:
            raise KeyError(f"no table {name!r}; tables: {', '.join(self._tables)}")
        return self._tables[name]

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        return dict(self._tables)

    counts = property(lambda self: self.table("counts"))
    best_heads = property(lambda self: self.table("best_heads"))
    baselines = property(lambda self: self.table("baselines"))
    head_tests = property(lambda self: self.table("head_tests"))
    roles = property(lambda self: self.table("roles"))

    def __getattr__(self, name):  # derived tables by name: results.positional_heads
        tables = self.__dict__.get("_tables", {})
        if name in tables:
            return tables[name]
        if name.startswith("_") or "summary" not in self.__dict__:
            raise AttributeError(name)
        query = _query(name, self.summary.get("analyses") or ())
        if query is not None:  # an analysis's query: results.reads("3-1")
            return lambda *args, **kwargs: query(self, *args, **kwargs)
        raise AttributeError(name)

    @property
    def control(self) -> Results | None:
        """The random-init control's results (`headprobe.model.control`), or None without one (of the
        first measure where there are several: `for_measure(m).control` for another)."""
        if len(self.measures) > 1:
            return self.for_measure().control
        if self._control is None:
            tables = control_tables(self._tables)
            if tables:
                self._control = Results(
                    by_model(self.tallies)[1], dict(self.summary), self.examples, tables=tables
                )
        return self._control

    # -- measures (METHODS §7) ------------------------------------------------------------------
    @property
    def measures(self) -> list[str]:
        """The measures scored, in `measures.MEASURES` order (`weights` for results without any)."""
        found = {t.measure for t in self.tallies.values()}
        if not found and "measure" in self.counts:
            found = set(self.counts["measure"])
        return sorted(found, key=measure_rank) or [WEIGHTS]

    def for_measure(self, measure: str | None = None) -> Results:
        """The results of one measure (default: the first): its tallies keyed without the measure
        and every table cut to its rows (the `measure` column kept), for code that reads one measure."""
        measure = measure or self.measures[0]
        if measure not in self.measures:
            raise KeyError(
                f"no measure {measure!r} in these results; measures: {', '.join(self.measures)}"
            )
        if self.measures == [measure] and all(
            k == tally_key(t.analysis, model=t.model) for k, t in self.tallies.items()
        ):
            return self
        tallies = {
            tally_key(t.analysis, model=t.model): t
            for t in self.tallies.values()
            if t.measure == measure
        }
        unit_counts = self.unit_counts
        if unit_counts is not None and "measure" in unit_counts:
            unit_counts = unit_counts[unit_counts["measure"].astype(str) == measure].reset_index(
                drop=True
            )
        return Results(
            tallies,
            dict(self.summary),
            self.examples,
            unit_counts,
            {name: _rows_of(table, measure) for name, table in self._tables.items()},
        )

    def _one(self, table: pd.DataFrame, measure: str | None) -> pd.DataFrame:
        """A table's rows of one measure (default: the first)."""
        return _rows_of(table, measure or self.measures[0])

    # -- shape --------------------------------------------------------------------------
    @property
    def analyses(self) -> list[str]:
        """The analyses scored (the trained model's)."""
        return list(by_model(self.tallies)[0]) or sorted(set(self.counts["analysis"]))

    @property
    def n_heads(self) -> int:
        return int(
            self.summary.get("n_heads")
            or max((t.n_heads for t in self.tallies.values()), default=0)
        )

    @property
    def n_layers(self) -> int:
        return int(self.summary.get("n_layers") or (max(self.layers) + 1 if self.layers else 0))

    @property
    def layers(self) -> list[int]:
        found = sorted({layer for t in self.tallies.values() for layer in t.layers if layer >= 0})
        if not found and len(self.counts):
            found = sorted(int(x) for x in set(self.counts["layer"]) if x >= 0)
        return found

    # -- views (ratios of stored sums) ------------------------------------------------------
    def head_scores(
        self,
        analysis: str,
        label: str | None = None,
        direction: str | None = None,
        fold: str = "",
        measure: str | None = None,
    ) -> pd.DataFrame:
        """Per head: label, layer, head, direction, n, hits, mass, accuracy (hits / n)."""
        c = self._one(self.counts, measure)
        c = c[
            (c["analysis"] == analysis)
            & (c["variant"] == "")
            & (c["fold"] == fold)
            & (c["layer"] >= 0)
        ]
        if label is not None:
            c = c[c["label"] == label]
        if direction is not None:
            c = c[c["direction"] == direction]
        out = c[["label", "layer", "head", "direction", "n", "hits", "mass"]].reset_index(drop=True)
        return out.assign(accuracy=ratio(out["hits"], out["n"]))

    def best_head(
        self, analysis: str, label: str, selection: str = "in-sample", measure: str | None = None
    ) -> pd.Series | None:
        """The best-heads row of one label (held-out: the pooled row)."""
        table, pooled, first = self._best_rows
        if table is not self.best_heads:  # a new table (the control's columns added): index it
            table = self.best_heads
            pooled = table[table["fold"] == ""].reset_index(drop=True)
            measures = pooled["measure"] if "measure" in pooled else [None] * len(pooled)
            keys = zip(measures, pooled["analysis"], pooled["label"], pooled["selection"])
            first = {}
            for position, key in enumerate(keys):
                first.setdefault(key, position)  # the first row, as a filter's `iloc[0]`
            self._best_rows = table, pooled, first
        measure = measure or self.measures[0] if "measure" in table else None
        position = first.get((measure, analysis, label, selection))
        return None if position is None else pooled.iloc[position]

    def labels(self, analysis: str, measure: str | None = None) -> list[str]:
        """Labels of an analysis, most trials first, ALL first."""
        c = self._one(self.counts, measure)
        c = c[
            (c["analysis"] == analysis)
            & (c["fold"] == "")
            & (c["variant"] == "")
            & (c["layer"] >= 0)
        ]
        sizes = c.groupby("label")["n"].max().sort_values(ascending=False, kind="stable")
        labels = list(sizes.index)
        return (["ALL"] if "ALL" in labels else []) + [x for x in labels if x != "ALL"]

    def mass_per_head(self, analysis: str, measure: str | None = None) -> pd.DataFrame:
        """One row per head: the mean (mass / n, whole data) of each label of a mass analysis
        (such as the surface statistics), plus the analysis's derived views (`Analysis.views`:
        the surface analysis's `sink_mass` and `entropy_ratio`)."""
        c = self._one(self.counts, measure)
        c = c[(c["analysis"] == analysis) & (c["fold"] == "")]
        if not len(c):
            return pd.DataFrame(columns=["layer", "head"])
        c = c.assign(mean=c["mass"] / c["n"])
        wide = c.pivot_table(
            index=["layer", "head"], columns="label", values="mean", aggfunc="first"
        ).reset_index()
        wide.columns.name = None
        return _with_views(analysis, wide)

    def mass_per_layer(self, analysis: str, measure: str | None = None) -> pd.DataFrame:
        """Per layer and label of a mass analysis: summed mass over the layer's heads / summed n,
        plus the analysis's derived views (`Analysis.views`)."""
        c = self._one(self.counts, measure)
        c = c[(c["analysis"] == analysis) & (c["fold"] == "") & (c["layer"] >= 0)]
        if not len(c):
            return pd.DataFrame(columns=["layer"])
        g = c.groupby(["layer", "label"], as_index=False)[["n", "mass"]].sum()
        g["mean"] = ratio(g["mass"], g["n"])
        wide = g.pivot_table(
            index="layer", columns="label", values="mean", aggfunc="first"
        ).reset_index()
        wide.columns.name = None
        return _with_views(analysis, wide)

    def role_rules(self):
        from headprobe.stats.roles import rules_in_use

        return rules_in_use(self)

    def head_values(
        self,
        analysis: str,
        label: str | None = None,
        direction: str | None = None,
        fold: str = "",
        measure: str | None = None,
    ) -> pd.DataFrame:
        """Per head: label, layer, head, direction, n and `value`: hits / n for a counting
        analysis, mass / n (mean attention mass) for a mass analysis."""
        scores = self.head_scores(analysis, label, direction, fold, measure)
        is_mass = scores["hits"].isna() & scores["mass"].notna()
        value = np.where(is_mass, ratio(scores["mass"], scores["n"]), scores["accuracy"])
        return scores[["label", "layer", "head", "direction", "n"]].assign(value=value)

    def unreachable_arcs(self, analysis: str, measure: str | None = None) -> pd.DataFrame:
        """Per label and direction (labels() order): n, `unreachable` (items whose row or column
        holds no attention once specials and self are removed, METHODS §2) and their share; whole data."""
        columns = ["label", "direction", "n", "unreachable", "share"]
        c = self._one(self.counts, measure)
        if "unreachable" not in c:
            return pd.DataFrame(columns=columns)
        c = c[
            (c["analysis"] == analysis)
            & (c["variant"] == "")
            & (c["fold"] == "")
            & (c["layer"] >= 0)
            & c["unreachable"].notna()
        ]
        per = (
            c.groupby(["label", "direction"], sort=False)[["n", "unreachable"]]
            .first()
            .reset_index()
        )
        rank = {label: i for i, label in enumerate(self.labels(analysis, measure))}
        per = per.sort_values(
            ["label", "direction"],
            key=lambda s: s.map(rank) if s.name == "label" else s,
            kind="stable",
        ).reset_index(drop=True)
        return per.assign(share=ratio(per["unreachable"], per["n"]))[columns]

    def best_heads_wide(self, analysis: str, measure: str | None = None) -> pd.DataFrame:
        """One row per label (labels() order): the in-sample best-heads row, then the pooled
        held-out row's columns prefixed `heldout_`."""
        b = self._one(self.best_heads, measure)
        b = b[(b["analysis"] == analysis) & (b["fold"] == "")]
        ins = b[b["selection"] == "in-sample"].drop(columns=["selection", "fold"])
        held = (
            b[b["selection"] == "held-out"]
            .drop(columns=["analysis", "measure", "selection", "fold"], errors="ignore")
            .add_prefix("heldout_")
            .rename(columns={"heldout_label": "label"})
        )
        wide = ins.merge(held, on="label", how="left")
        rank = {label: i for i, label in enumerate(self.labels(analysis, measure))}
        order = wide["label"].map(lambda label: rank.get(label, len(rank)))
        return wide.iloc[np.argsort(order.to_numpy(), kind="stable")].reset_index(drop=True)

    # -- files (headprobe.results.store) ---------------------------------------------------------
    def save(self, out: str | Path) -> dict[str, Path]:
        """`store.save(self, out)`: the results, whole or not at all; {name: path}, also kept as
        `saved_paths`. With a report: `store.save(results, out, extra=report.staged_report(results))`."""
        self.saved_paths = store.save(self, out)
        return self.saved_paths

    @classmethod
    def load(cls, directory: str | Path, *, verify: bool = True) -> Results:
        """Results saved by `save` (`store.read`). With `verify` (default) every file must match
        manifest.json: a directory that does not is refused with `store.ResultsError` saying
        which file and why (FileNotFoundError: no results there at all)."""
        parts = store.read(directory, check=verify)
        if parts.get("tables") is not None:  # saved before measures: every row is weights
            parts["tables"] = {
                name: with_measure(table, WEIGHTS) for name, table in parts["tables"].items()
            }
        return cls(**parts)

    @classmethod
    def merge(cls, *parts: Results) -> Results:
        """Add the counts of several runs (shards of one corpus, or processes) together.

        Folds and weights are functions of unit ids, so the merged tables are identical
        to one run over all the units."""
        tallies: dict[str, Tally] = {}
        for part in parts:
            for name, tally in part.tallies.items():
                if name in tallies:
                    tallies[name].merge(tally)
                else:
                    tallies[name] = tally.copy()
        unit_counts = None
        if all(p.unit_counts is not None for p in parts):
            unit_counts = merge_unit_counts([p.unit_counts for p in parts])
        summary = dict(parts[0].summary, merged_from=len(parts))
        summary.pop("run_id", None)  # a new run id when saved; each part's inputs kept
        if any("inputs" in p.summary for p in parts):
            summary["inputs"] = {"parts": [p.summary.get("inputs", {}) for p in parts]}
        return cls(tallies, summary, parts[0].examples, unit_counts)


def _with_views(analysis: str, wide: pd.DataFrame) -> pd.DataFrame:
    """`wide` with the derived columns the analysis declares (`registry.views_of`)."""
    views = registry.views_of(analysis)
    return wide if views is None else views(wide)


def measure_rank(measure: str) -> int:
    """Measures in `measures.MEASURES` order (others after)."""
    return MEASURES.index(measure) if measure in MEASURES else len(MEASURES)


def with_measure(table: pd.DataFrame, measure: str) -> pd.DataFrame:
    """The table with a `measure` column (after `analysis` where it has one, else first)."""
    if "measure" in table:
        return table
    table = table.copy()
    columns = list(table.columns)
    table.insert(columns.index("analysis") + 1 if "analysis" in columns else 0, "measure", measure)
    return table


def _rows_of(table: pd.DataFrame, measure: str) -> pd.DataFrame:
    if "measure" not in table:
        return table
    return table[table["measure"] == measure].reset_index(drop=True)


def _query(name: str, analyses):
    """The query `name` an analysis of the run declares (`Analysis.queries`), or None."""
    from headprobe.scoring.registry import _resolve

    for analysis in analyses:
        found = _registered(analysis)
        if found is not None and name in found.queries:
            return _resolve(found.queries[name])
    return None


def _registered(name: str):
    try:
        return registry.get(name)
    except ValueError:
        return None


def _concat(frames, columns) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=columns)
    return pd.concat(frames, ignore_index=True)


def merge_unit_counts(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate per-unit counts and sum rows with the same key."""
    return sum_duplicates(concat_compact([compact(f) for f in frames]))


def load_results(directory: str | Path) -> Results:
    return Results.load(directory)
