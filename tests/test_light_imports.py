"""Reading results imports no run library: `headprobe report`, `headprobe compare` and their
--help, `import headprobe` (its exports are imported on first use, PEP 562), and a tally read
from a file (NumPy arrays until something adds to it).

Each command runs in a fresh interpreter (this one has imported torch already, for the
fixtures): a small runner imports `headprobe.cli`, calls `main(argv)` and prints, as its last
line, the exit status and which of `RUN_ONLY` are in `sys.modules` at the end.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import headprobe
from headprobe.scoring.tally import Tally, unit_fold

try:
    from tests.fixtures_results import make_results_dir
except ImportError:  # tests/ itself on sys.path (pytest's default rootdir handling)
    from fixtures_results import make_results_dir

ROOT = Path(__file__).resolve().parents[1]
RUN_ONLY = ("torch", "transformers", "tokenizers", "accelerate", "datasets", "spacy")
RUNNER = f"""
import json, sys
from headprobe.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as stop:  # --help
    status = stop.code
print(json.dumps({{"status": status, "loaded": [m for m in {RUN_ONLY!r} if m in sys.modules]}}))
"""
SNIPPET = (
    "import json, sys\n{code}\nprint(json.dumps([m for m in {run_only!r} if m in sys.modules]))"
)


def fresh(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def headprobe_command(argv: list[str], cwd: Path) -> dict:
    """{"status", "loaded"} of `headprobe ARGV` run by `main` in a fresh interpreter."""
    done = fresh(["-c", RUNNER, *argv], cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def loaded_after(code: str, cwd: Path) -> list[str]:
    done = fresh(["-c", SNIPPET.format(code=code, run_only=RUN_ONLY)], cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory):
    return make_results_dir(tmp_path_factory.mktemp("results"), seed=0)


def test_report_imports_no_run_library(results_dir, tmp_path):
    out = tmp_path / "report"
    got = headprobe_command(["report", str(results_dir), "--out", str(out)], tmp_path)
    assert got == {"status": 0, "loaded": []}
    assert (out / "report.html").stat().st_size > 0 and (out / "report.md").stat().st_size > 0
    assert list((out / "figures").glob("*.png"))


def test_compare_imports_no_run_library(results_dir, tmp_path):
    out = tmp_path / "compare"
    got = headprobe_command(
        ["compare", str(results_dir), str(results_dir), "--out", str(out)], tmp_path
    )
    assert got == {"status": 0, "loaded": []}
    assert list(out.glob("*.html")) and list(out.glob("*.md"))


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["report", "--help"], ["compare", "--help"], ["run", "--help"], ["plugins"]],
)
def test_help_imports_no_run_library(argv, tmp_path):
    """`run --help` too: its options are read from the analyses' declarations, none of which
    imports torch (what keeps it quick, issue 52: under 2 s)."""
    assert headprobe_command(argv, tmp_path) == {"status": 0, "loaded": []}


def test_import_headprobe_and_read_results_import_no_run_library(results_dir, tmp_path):
    code = (
        "import headprobe\n"
        f"results = headprobe.load_results({str(results_dir)!r})\n"
        "assert isinstance(results, headprobe.Results) and len(results.best_heads)"
    )
    assert loaded_after(code, tmp_path) == []


def test_lazy_exports_are_the_modules_objects():
    """Every export resolves on first use to the object its module defines, `dir` lists it,
    and `from headprobe import run` works as before."""
    assert set(headprobe.__all__) <= set(dir(headprobe))
    for name, (module, attribute) in headprobe._EXPORTS.items():
        assert getattr(headprobe, name) is getattr(importlib.import_module(module), attribute)
    from headprobe import load_model, run

    assert run is importlib.import_module("headprobe.api").run
    assert load_model is importlib.import_module("headprobe.model.loading").load
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        headprobe.nonexistent  # noqa: B018


def test_lazy_exports_match_the_type_checking_imports():
    """The `if TYPE_CHECKING:` imports of headprobe/__init__.py (what type checkers and the
    import graph of tests/test_imports.py see) name exactly the lazy exports."""
    tree = ast.parse((ROOT / "headprobe" / "__init__.py").read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
    )
    imported = {
        alias.asname or alias.name: (node.module, alias.name)
        for node in block.body
        for alias in node.names
    }
    assert imported == headprobe._EXPORTS


def test_a_loaded_tally_holds_arrays_until_it_is_added_to(tmp_path):
    """Two units, one label, two heads: unit a hits with both heads, unit b with head 0 only;
    the baseline hits for a only. Whole-data totals (resample 0, both folds): hits [2, 1],
    trials 2, baseline 1. Loaded, the totals are NumPy arrays (no torch needed to read them);
    merging the original in doubles them, as tensors."""
    tally = Tally(
        "light", directions=("d",), variants=("v",), layers=[0], n_heads=2, bootstrap=False
    )
    values = torch.tensor([[[[1.0], [1.0]]], [[[1.0], [0.0]]]])  # [row, layer, head, direction]
    tally.add(["a", "b"], ["x", "x"], values, n=[[1.0], [1.0]], base=[[1.0], [0.0]])
    tally.save(tmp_path / "light.npz")
    loaded = Tally.load(tmp_path / "light.npz")
    counts = loaded.labels["x"]
    assert all(isinstance(getattr(counts, name), np.ndarray) for name in counts.TOTALS)
    a = loaded.arrays("x")
    per_fold = np.zeros((2, 2))  # [fold, head]: each unit's hits in its own fold
    per_fold[unit_fold("a")] += [1, 1]
    per_fold[unit_fold("b")] += [1, 0]
    assert a["hits"][:, 0, 0, :, 0].tolist() == per_fold.tolist()
    assert a["n"][:, 0, 0].sum() == 2 and a["base"][:, 0, 0].sum() == 1
    for key, value in tally.arrays("x").items():
        np.testing.assert_array_equal(a[key], value)
    loaded.merge(tally)
    assert isinstance(loaded.labels["x"].hits, torch.Tensor)
    assert loaded.arrays("x")["hits"][:, 0, 0, :, 0].sum(0).tolist() == [4, 2]
    assert all(isinstance(t, torch.Tensor) for t in loaded.tensors())
