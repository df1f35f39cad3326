"""`headprobe.timeline`: score a model's checkpoints with one set of options (METHODS §17).

    tl = headprobe.timeline(["ckpt/step_0", "ckpt/step_500"], out="T", probe="repeated-random",
                            probe_length=32, probe_n=200, analyses=["induction"])
    tl.heads, tl.best, tl.roles, tl.objective, tl.onsets        # DataFrames
    Timeline.load("T")                                          # the same, read back

Every `headprobe.run` option (`RunConfig`) applies to every checkpoint; `out` is required. Each
checkpoint is one whole results directory, `OUT/checkpoints/<label>/` (saved atomically, as
`headprobe run --no-report` saves one; `headprobe report` renders it), so a timeline run again
skips the checkpoints it finished. The checkpoints' architecture and tokenizer are checked from
their config and tokenizer files before any weights load (`series.check_series`). The objective
is the ablation study's intact model (its groups' analysis with no group named): the model's
own loss on what was scored. Then the tables (`tables.timeline_tables`, from the saved results)
and the timeline report (`OUT/report/`, `page.build_timeline_report`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd

from headprobe.config import RunConfig
from headprobe.core import atomic
from headprobe.core.errors import UsageError
from headprobe.results import store
from headprobe.training import series as checkpoints_of
from headprobe.training.timeline_tables import (
    CHECKPOINTS,
    FORMAT,
    RECORD,
    TABLES,
    objective_analysis,
    timeline_tables,
)


class Timeline:
    """A timeline's tables (`tables.TABLES`) and checkpoints ({checkpoint, step, model}, by step)."""

    def __init__(self, directory: Path, checkpoints: list[dict], tables: dict, summary: dict):
        self.directory, self.checkpoints = Path(directory), checkpoints
        self.tables, self.summary = tables, summary

    heads = property(lambda self: self.tables["timeline_heads"])
    best = property(lambda self: self.tables["timeline_best"])
    roles = property(lambda self: self.tables["timeline_roles"])
    objective = property(lambda self: self.tables["timeline_objective"])
    onsets = property(lambda self: self.tables["timeline_onsets"])

    def results(self, checkpoint: str):
        """One checkpoint's `Results` (its label, as in the tables' `checkpoint` column)."""
        from headprobe.results.query import Results

        return Results.load(self.directory / CHECKPOINTS / checkpoint)

    @classmethod
    def load(cls, directory) -> Timeline:
        """A timeline written by `timeline` (FileNotFoundError: none there)."""
        directory = Path(directory)
        summary = read_record(directory)
        if summary is None:
            raise FileNotFoundError(f"{directory}: not a headprobe timeline (no {RECORD})")
        tables = {name: pd.read_parquet(directory / store.table_file(name)) for name in TABLES}
        return cls(directory, summary["checkpoints"], tables, summary)


def read_record(directory: Path) -> dict | None:
    path = Path(directory) / RECORD
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    return record if record.get("format") == FORMAT else None


def timeline(checkpoints, /, *, revisions=None, steps=None, **options) -> Timeline:
    """Score every checkpoint (paths, hub names, `NAME@REVISION`; `revisions` applied to one name;
    `steps` given, else parsed from the names) with the run options `options` (`out` required),
    skip those already scored, and write the timeline's tables and report. See the module."""
    series = checkpoints_of.checkpoints(checkpoints, revisions, steps)
    config = RunConfig.of(None, **options)
    if config.out is None:
        raise UsageError("timeline needs --out DIR: each checkpoint's results are kept there")
    root = Path(config.out).expanduser()
    if root.exists() and not root.is_dir():
        raise UsageError(f"--out {root}: a file, not a directory")
    shared = checkpoints_of.check_series(series)  # before any model loads
    base = per_checkpoint(config, series[0].model)
    first = dataclasses.replace(base, model=series[0].model, out=None).checked()
    summary = {
        "format": FORMAT,
        "options": first.options_record(""),
        "series": shared,
        "checkpoints": [c.record() for c in series],
    }
    root.mkdir(parents=True, exist_ok=True)
    with atomic.OutLock(root):
        _check_resumable(root, summary)
        atomic.write_json(root / RECORD, summary)
        _score_all(base, series, root)
        return _finish(root, series, summary, config)


def per_checkpoint(config: RunConfig, model: str) -> RunConfig:
    """The run of one checkpoint (checked with `model`, the first): the options given, the
    objective's analysis added (its one group: the intact model), no report of its own (the
    timeline has one)."""
    checked = dataclasses.replace(config, model=model, out=None, report=False).checked()
    wanted = list(dict.fromkeys([*checked.analyses, objective_analysis()]))
    return dataclasses.replace(config, analyses=wanted, report=False)


def _check_resumable(root: Path, summary: dict) -> None:
    """A timeline directory run again must hold this timeline: the same options and series."""
    before = read_record(root)
    if before is None:
        if any(p for p in root.iterdir() if p.name != RECORD):
            if not (root / CHECKPOINTS).is_dir():
                raise UsageError(
                    f"--out {root}: a directory that holds something else than a timeline"
                )
        return
    now = json.loads(json.dumps(summary, default=atomic.json_default))  # as written
    for key in ("options", "series"):
        if before.get(key) != now[key]:
            raise UsageError(
                f"--out {root}: holds a timeline of other {key} (see its {RECORD}): give a new --out"
            )


def _score_all(base: RunConfig, series, root: Path) -> None:
    """Each checkpoint not yet finished, scored and saved; a failure stops with one line naming it."""
    from tqdm.auto import tqdm

    from headprobe.api import run

    bar = tqdm(series, desc="checkpoints", unit="checkpoint", disable=not base.progress)
    for c in bar:
        out = root / CHECKPOINTS / c.label
        bar.set_postfix_str(f"step {c.step}")
        if finished(out):
            continue
        try:
            run(dataclasses.replace(base, model=c.model, out=out))
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as err:
            line = " ".join(str(err).split()) or type(err).__name__
            raise UsageError(f"checkpoint {c.spec}: {line}") from err


def finished(out: Path) -> bool:
    """A checkpoint's results directory, whole (its manifest verified)."""
    if not store.looks_like_results(out):
        return False
    try:
        store.verify(out)
    except Exception:
        return False
    return True


def _finish(root: Path, series, summary: dict, config: RunConfig) -> Timeline:
    """The tables from the saved results (written .parquet and .csv), then the report."""
    from headprobe.results.query import Results

    runs = [(c.record(), Results.load(root / CHECKPOINTS / c.label)) for c in series]
    tables = timeline_tables(runs, objective_analysis())
    for name, table in tables.items():
        write_table(table, root, name)
    found = Timeline(root, summary["checkpoints"], tables, summary)
    if config.report:
        from headprobe.training.page import build_timeline_report

        build_timeline_report(root, formats=config.figures)
    return found


def write_table(table: pd.DataFrame, root: Path, name: str) -> None:
    """`name`.parquet and .csv in `root`, each written beside and renamed into place."""
    for suffix in store.TABLE_SUFFIXES:
        path = root / store.table_file(name, suffix)
        partial = path.with_name(f".{path.name}.partial")
        if suffix == ".parquet":
            table.to_parquet(partial, index=False)
        else:
            table.to_csv(partial, index=False)
        partial.replace(path)
