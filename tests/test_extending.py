"""Analyses from other packages (docs/EXTENDING.md): the built-in studies are entry points of the
`headprobe.analyses` group, and the third-party analysis of docs/EXTENDING.md
(docs/examples/offset_back), installed from a test-only `*.dist-info` on the path, runs through
the CLI and the API (tests/test_docs_examples.py installs every example with pip): its option is in
`--help`, a bad value is refused in one line (exit 2) before the model loads, and its table and
report section are written. No file of `headprobe/` names it (tests/test_owners.py scans the
package for names; this one checks its own)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "headprobe/inputs/samples/sample.conllu"
NAME, MODULE = "offset_back", "offset_heads"


def studies() -> list[str]:
    return sorted(p.parent.name for p in (ROOT / "headprobe/studies").glob("*/__init__.py"))


def install(where: Path, entries: str, modules: dict[str, str] | None = None) -> dict:
    """A package installed the way pip leaves one: `modules` and a dist-info whose
    entry_points.txt holds `entries` (lines of the `headprobe.analyses` group), on PYTHONPATH
    before this source tree. Returns the environment of a subprocess that sees it."""
    dist = where / "test_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: test-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[headprobe.analyses]\n" + entries)
    for name, text in (modules or {}).items():
        (where / f"{name}.py").write_text(text)
    return {**os.environ, "PYTHONPATH": f"{where}{os.pathsep}{ROOT}"}


def python(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )


def test_every_study_is_a_declared_entry_point():
    """pyproject.toml declares one entry point per folder of headprobe/studies/ (a fresh
    install registers them all through the group)."""
    text = (ROOT / "pyproject.toml").read_text()  # (tomllib is Python 3.11+)
    (block,) = re.findall(
        r'^\[project\.entry-points\."headprobe\.analyses"\]\n(.*?)(?:\n\n|\Z)', text, re.S | re.M
    )
    group = dict(re.fullmatch(r'(\w+) = "([\w.]+)"', line).groups() for line in block.splitlines())
    assert group == {name: f"headprobe.studies.{name}" for name in studies()}


def test_builtins_load_whatever_the_installed_metadata_says(tmp_path):
    """With no entry points at all (a source tree, no metadata) and with metadata that lacks
    folders and names one this tree does not have, the same built-in analyses load, in the same
    order, and no plugin error is reported."""
    show = (
        "from headprobe.scoring import registry; "
        "print(registry.names()); print(registry.plugin_errors())"
    )
    bare = "import importlib.metadata as m; m.entry_points = lambda **kw: []; " + show
    stale = install(tmp_path, "gone = headprobe.studies.gone_long_ago\n")
    normal = python({**os.environ, "PYTHONPATH": str(ROOT)}, "-c", show)
    without = python({**os.environ, "PYTHONPATH": str(ROOT)}, "-c", bare)
    older = python(stale, "-c", show)
    for ran in (normal, without, older):
        assert ran.returncode == 0, ran.stderr
    assert normal.stdout == without.stdout == older.stdout
    assert normal.stdout.splitlines()[1] == "[]"


def example() -> str:
    """The first package of docs/EXTENDING.md (docs/examples/offset_back, shown there whole)."""
    code = (ROOT / "docs/examples/offset_back" / f"{MODULE}.py").read_text()
    assert len(code.splitlines()) < 80
    return code


@pytest.fixture
def plugin(tmp_path) -> dict:
    return install(tmp_path / "site", f"{NAME} = {MODULE}\n", {MODULE: example()})


def test_the_package_is_named_nowhere_in_headprobe():
    for path in (ROOT / "headprobe").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert NAME not in text and MODULE not in text, path


def test_its_option_is_in_help_and_a_bad_value_stops_before_the_model(plugin, tmp_path):
    helped = python(plugin, "-m", "headprobe", "run", "--help")
    assert helped.returncode == 0 and not helped.stderr.strip(), helped.stderr
    assert "--offset-back K" in helped.stdout and NAME in helped.stdout
    out = tmp_path / "out"
    bad = python(
        plugin, "-m", "headprobe", "run", "--model", str(tmp_path / "no-such-model"),
        "--analyses", NAME, "--offset-back", "0", "--out", str(out),
    )  # fmt: skip
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert bad.returncode == 2 and len(lines) == 1, bad.stderr
    assert "--offset-back must be at least 1, got 0" in lines[0]
    assert "no-such-model" not in bad.stderr and not out.exists()


def test_it_runs_from_the_cli_and_the_api(plugin, tiny_model, tmp_path):
    cli_out, api_out = tmp_path / "cli", tmp_path / "api"
    ran = python(
        plugin, "-m", "headprobe", "run", "--model", tiny_model, "--treebank", str(SAMPLE),
        "--analyses", NAME, "--offset-back", "3", "--bootstrap", "50",
        "--quiet", "--out", str(cli_out),
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    api = f"""
import headprobe
from headprobe.core.errors import UsageError
from headprobe.report import build_report
try:
    headprobe.run(model={tiny_model!r}, treebank={str(SAMPLE)!r}, analyses=[{NAME!r}], offset_back=-1)
except UsageError as error:
    print("refused:", error)
results = headprobe.run(model={tiny_model!r}, treebank={str(SAMPLE)!r}, analyses=[{NAME!r}],
                        offset_back=1, n_boot=50, pictures=False, progress=False, out={str(api_out)!r})
print(results.table({NAME + "_top"!r}).shape[0])
print(build_report({str(api_out)!r})["markdown"])
"""
    ran = python(plugin, "-c", api)
    assert ran.returncode == 0, ran.stderr
    said = ran.stdout.splitlines()
    assert said[0] == "refused: --offset-back must be at least 1, got -1"
    assert said[1] == "12"  # 3 layers x 4 heads
    for out, k in ((cli_out, 3), (api_out, 1)):
        assert json.loads((out / "summary.json").read_text())["options"][NAME] == k
        report = next(out.rglob("report.md")).read_text()
        assert "Heads that look a fixed offset back" in report
        assert "The five heads with the largest share" in report
