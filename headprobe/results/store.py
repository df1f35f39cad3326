"""The results directory: its layout and file names, manifest, save and load, fingerprints.

    paths = store.save(results, "out/")                     # whole or not at all
    paths = store.save(results, "out/", extra=lambda stage: {...})   # more files, inside the save
    parts = store.read("out/")                              # Results(**parts); verified first
    store.SUMMARY, store.table_file("counts"), ...          # the one spelling of every file name

Every module that needs a file of a results directory takes its name from here. Layout:

- `tallies/<analysis>.npz`  streaming counts per fold and resample: what everything derives from
- `<table>.parquet` and `<table>.csv` for every table of `Results` (`counts`, `best_heads`,
  `baselines`, `head_tests`, `roles` and each analysis's declared tables)
- `summary.json`  model, corpora, skipped inputs, options, notes, headline, table list
- `examples.json`  word-level attention of top heads on example sentences (for reports)
- `head_attention.npz`  every scored head's word-level attention on a seeded handful of example
  sentences, uint8 (`headprobe.results.head_attention`; the report's head explorer), when drawn
- `unit_counts.parquet`  per-unit rows, only with `keep_unit_counts`
- `manifest.json`  run id, inputs with their SHA-256, options, version, and every file above
  with its size and SHA-256; `read` (and so `Results.load`) refuses a directory that does not
  match it
- `report/`  `report.html`, `report.md`, `roles.csv`, `figures/*.png`, when asked for; not in
  the manifest (`headprobe report` may rebuild it), but written inside the save when the run
  builds it, and never left over from an earlier run

A directory is saved whole or not at all (`headprobe.core.atomic`: staging, swap, lock): a kill
during `save` leaves the old results as they were, and a new save leaves nothing of them.
`save` writes what it is given (`Results` or any object with `tallies`, `tables`, `summary`,
`examples` and `unit_counts`); building a report is the caller's (`extra`).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from headprobe.core import atomic
from headprobe.core.errors import UsageError
from headprobe.scoring.tally import Tally

MANIFEST = "manifest.json"
SUMMARY = "summary.json"
EXAMPLES = "examples.json"
HEAD_ATTENTION = "head_attention.npz"  # every head's attention on a few sentences (the explorer's)
TALLIES = "tallies"  # tallies/<analysis>.npz
TALLY_SUFFIX = ".npz"
TABLE_SUFFIXES = (".parquet", ".csv")  # every table in both; read back from the first
UNIT_COUNTS = "unit_counts"  # unit_counts.parquet
REPORT_DIR = "report"
REPORT_HTML, REPORT_MARKDOWN, REPORT_ROLES, REPORT_FIGURES = (
    "report.html",
    "report.md",
    "roles.csv",
    "figures",
)
REPORT_TABLES = "tables"  # report/tables/*.csv: the columns the report's narrow tables leave out
RESULT_SUFFIXES = (".parquet", ".csv", ".json", ".npz")
FORMAT = "headprobe-results"
FORMAT_VERSION = 1


class ResultsError(ValueError):
    """A results directory that is incomplete, changed after it was written, or foreign."""


def table_file(name: str, suffix: str = TABLE_SUFFIXES[0]) -> str:
    """The file name of table `name`: `counts.parquet`."""
    return f"{name}{suffix}"


def tally_file(analysis: str) -> str:
    """The path of an analysis's tally inside a results directory: `tallies/<analysis>.npz`."""
    return f"{TALLIES}/{analysis}{TALLY_SUFFIX}"


def looks_like_results(directory: Path) -> bool:
    return (directory / MANIFEST).is_file() or (directory / SUMMARY).is_file()


# ----------------------------------------------------------------------------------------
# what a run is: its id, the version, the fingerprints of its inputs
# ----------------------------------------------------------------------------------------
def new_run_id() -> str:
    return f"{_dt.datetime.now().strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def version() -> str:
    """The installed headprobe's version ('unknown' in a source checkout)."""
    try:
        from importlib.metadata import version as installed

        return installed("headprobe")
    except Exception:  # not installed (a source checkout)
        return "unknown"


def model_fingerprint(path: str, display: str) -> dict:
    """What identifies the model cheaply: for a local directory, its config's SHA-256 and the
    sizes of its weight files; a hub name as it is."""
    from transformers.utils import CONFIG_NAME

    info = {"name": display, "path": str(path)}
    root = Path(path)
    if root.is_dir():
        if (root / CONFIG_NAME).is_file():
            info["config_sha256"] = atomic.sha256_file(root / CONFIG_NAME)
        info["weights"] = {
            p.name: p.stat().st_size
            for p in sorted(root.iterdir())
            if p.suffix in (".safetensors", ".bin", ".gguf", ".pt", ".pth")
        }
    return info


def input_fingerprint(option: str, path) -> dict | None:
    """{path, bytes, sha256} of an input file (or directory: one hash over its files)."""
    if path is None:
        return None
    p = Path(str(path).split("::", 1)[0]).expanduser()
    if p.is_file():
        return {
            "option": option,
            "path": str(path),
            "bytes": p.stat().st_size,
            "sha256": atomic.sha256_file(p),
        }
    if p.is_dir():
        return {"option": option, "path": str(path), "sha256": atomic.sha256_tree(p)}
    return {
        "option": option,
        "path": str(path),
        "sha256": None,
        "note": "not a local file: not hashed",
    }


# ----------------------------------------------------------------------------------------
# where results may go
# ----------------------------------------------------------------------------------------
def _probe_writable(directory: Path) -> str | None:
    """None when a file can be created in `directory`, else why not."""
    try:
        fd, name = tempfile.mkstemp(prefix=".headprobe-probe-", dir=directory)
    except OSError as err:
        return err.strerror or type(err).__name__
    os.close(fd)
    os.unlink(name)
    return None


def check_out(out) -> Path:
    """`--out` can be written: not an existing file; an existing directory is empty or holds
    headprobe results (it will be replaced whole) and can be moved; the nearest existing
    parent is a writable directory. Returns the absolute, resolved path; `UsageError` if not."""
    path = Path(out).expanduser()
    if str(out).strip() == "":
        raise UsageError("--out is empty")
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {out}: is an existing file, not a directory")
    path = path.resolve()
    if path.is_dir():
        if any(path.iterdir()) and not looks_like_results(path):
            raise UsageError(
                f"--out {out}: a non-empty directory that does not hold headprobe results; "
                "it would be replaced whole, so choose a new or empty directory"
            )
        why = _probe_writable(path)
        if why:
            raise UsageError(f"--out {out}: cannot write in this directory ({why})")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"--out {out}: {parent} is a file, not a directory")
    why = _probe_writable(parent)
    if why:
        raise UsageError(f"--out {out}: cannot write in {parent} ({why})")
    return path


# ----------------------------------------------------------------------------------------
# the manifest
# ----------------------------------------------------------------------------------------
def result_files(directory: Path) -> list[str]:
    """Relative names of the files a manifest covers: everything but itself and `report/`."""
    names = []
    for path in sorted(Path(directory).rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if path.is_file() and rel != MANIFEST and rel.split("/", 1)[0] != REPORT_DIR:
            names.append(rel)
    return names


def write_manifest(directory: Path, info: dict) -> dict:
    files = {
        name: {
            "bytes": (directory / name).stat().st_size,
            "sha256": atomic.sha256_file(directory / name),
        }
        for name in result_files(directory)
    }
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, **info, "files": files}
    atomic.write_json(directory / MANIFEST, manifest)
    return manifest


def verify(directory: str | Path) -> dict:
    """The manifest of a complete results directory; raises `ResultsError` (one line) when a
    file it lists is missing, has another size or hash, or a results file it does not list
    is there, and FileNotFoundError when the directory holds no results at all."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such results directory")
    manifest = _read_manifest(directory)
    files = manifest["files"]
    for name, entry in files.items():
        file = directory / name
        if not file.is_file():
            raise ResultsError(f"{directory}: {name} listed in {MANIFEST} is missing")
        if file.stat().st_size != entry.get("bytes") or atomic.sha256_file(file) != entry.get(
            "sha256"
        ):
            raise ResultsError(
                f"{directory}: {name} does not match {MANIFEST} "
                "(changed or damaged after the run wrote it)"
            )
    extra = [
        name
        for name in result_files(directory)
        if name not in files and name.endswith(RESULT_SUFFIXES)
    ]
    if extra:
        raise ResultsError(
            f"{directory}: {extra[0]} is not in {MANIFEST} (left by another program or run)"
        )
    return manifest


def _read_manifest(directory: Path) -> dict:
    path = directory / MANIFEST
    if not path.is_file():
        if (directory / SUMMARY).is_file():
            raise ResultsError(
                f"{directory}: no {MANIFEST}: not a complete headprobe results directory "
                "(an interrupted save, or written by an older headprobe); run again"
            )
        raise FileNotFoundError(f"{directory} is not a headprobe results directory (no {MANIFEST})")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(manifest["files"], dict):
            raise TypeError("files is not a mapping")
        if manifest.get("format") != FORMAT:
            raise ValueError(f"format {manifest.get('format')!r}")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise ResultsError(f"{directory}: unreadable {MANIFEST} ({err})") from None
    return manifest


def _manifest_info(results) -> dict:
    summary = results.summary
    return {
        "run_id": summary.get("run_id") or new_run_id(),
        "created": atomic.now(),
        "headprobe_version": version(),
        "model": summary.get("model"),
        "inputs": summary.get("inputs", {}),
        "options": summary.get("options", {}),
        "tables": list(results.tables),
    }


# ----------------------------------------------------------------------------------------
# save and read
# ----------------------------------------------------------------------------------------
def save(
    results, out: str | Path, *, extra: Callable[[Path], dict] | None = None
) -> dict[str, Path]:
    """Write the tallies, every table (.parquet and .csv), summary.json, examples.json and
    manifest.json of `results` to `out`; returns {name: path} (paths under `out`).

    Atomic: everything is written into a staging directory in `out`'s lock area, then moved
    into place with one rename (an atomic exchange where the OS has one), so `out` holds the
    complete old results or the complete new ones, never a mix, and nothing of the old ones
    (an old report/ included) survives. `extra(stage)` writes more files into the staging
    directory before the manifest and the swap (the report: `headprobe.report.staged_report`)
    and returns their {name: path}. Refuses (`checks.UsageError`) an `out` that is a file or a
    non-empty directory without results, and (`atomic.OutInUse`) one that another live run holds."""
    out = check_out(out)
    with atomic.OutLock(out):
        atomic.recover(out)  # leftovers of a save that was killed
        with atomic.staging(out) as stage:
            paths = write(results, stage)
            if extra is not None:
                paths.update(extra(stage))
            paths["manifest"] = stage / MANIFEST
            write_manifest(stage, _manifest_info(results))
            atomic.fsync_tree(stage)
            atomic.replace_dir(stage, out)
    return {key: out / path.relative_to(stage) for key, path in paths.items()}


def write(results, directory: Path) -> dict[str, Path]:
    """The files of `results` (no manifest) in `directory`, in place; {name: path}."""
    paths = {}
    (directory / TALLIES).mkdir(exist_ok=True)
    for name, tally in results.tallies.items():
        paths[f"tally:{name}"] = directory / tally_file(name)
        tally.save(paths[f"tally:{name}"])
    atomic.test_pause("saving")  # tests kill the process here: half written
    for name, table in results.tables.items():
        table.to_parquet(directory / table_file(name, ".parquet"), index=False)
        table.to_csv(directory / table_file(name, ".csv"), index=False)
        paths[name] = directory / table_file(name)
    if results.unit_counts is not None:
        paths[UNIT_COUNTS] = directory / table_file(UNIT_COUNTS)
        results.unit_counts.to_parquet(paths[UNIT_COUNTS], index=False)
    paths["summary"] = directory / SUMMARY
    atomic.write_json(paths["summary"], results.summary)
    paths["examples"] = directory / EXAMPLES
    atomic.write_json(paths["examples"], results.examples, indent=None)
    if getattr(results, "head_attention", None) is not None:
        from headprobe.results import head_attention

        paths["head_attention"] = directory / HEAD_ATTENTION
        head_attention.save(results.head_attention, paths["head_attention"])
    return paths


def read(directory: str | Path, *, check: bool = True) -> dict:
    """The parts of saved results, as `Results(**read(directory))` takes them: tallies, summary,
    examples, unit_counts, tables, head_attention (None when not saved). With `check` (default) every file must match manifest.json
    (size and SHA-256): a directory that does not is refused with `ResultsError` saying which
    file and why (FileNotFoundError: no results there at all)."""
    directory = Path(directory)
    if check:
        verify(directory)
    summary_path = directory / SUMMARY
    if not summary_path.is_file():
        raise FileNotFoundError(f"{directory} is not a headprobe results directory (no {SUMMARY})")
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    tallies = {
        p.stem: Tally.load(p) for p in sorted((directory / TALLIES).glob(f"*{TALLY_SUFFIX}"))
    }
    names = summary.get("tables")
    if names is None:  # not listed: every table file there
        names = [
            p.stem for p in sorted(directory.glob(f"*{TABLE_SUFFIXES[0]}")) if p.stem != UNIT_COUNTS
        ]
    tables = {}
    for name in names:
        path = directory / table_file(name)
        if not path.is_file():
            raise FileNotFoundError(f"{directory}: table {path.name} named in {SUMMARY} is missing")
        tables[name] = pd.read_parquet(path)
    examples_path = directory / EXAMPLES
    examples = (
        json.loads(examples_path.read_text(encoding="utf-8")) if examples_path.is_file() else []
    )
    unit_path = directory / table_file(UNIT_COUNTS)
    unit_counts = pd.read_parquet(unit_path) if unit_path.is_file() else None
    from headprobe.results import head_attention

    return {
        "head_attention": head_attention.load(directory / HEAD_ATTENTION),
        "tallies": tallies,
        "summary": summary,
        "examples": examples,
        "unit_counts": unit_counts,
        "tables": tables,
    }
