"""A broken plugin never stops an unrelated run (issue 52): a plugin package whose import raises
`ImportError` is one warning line for `run --help`, an unrelated run and `headprobe report` on
results that named it (all exit 0); a run asking for it is refused in one line (exit 2);
`HEADPROBE_DISABLE_PLUGINS` switches it off; `headprobe plugins` lists it with its error; and a
report is swapped in whole or not at all."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.test_extending import SAMPLE, install, python

NAME, MODULE = "successor", "successor_heads"
GOOD = '''"""successor: heads that attend to the next token (a pattern with a role and a section)."""

import numpy as np

from headprobe.extend import Paragraph, PatternRule, Section, pattern_analysis


def next_token(example):
    return np.eye(len(example.ids), k=1, dtype=bool)


def section(results, name):
    return Section(name, "Heads that look one token ahead", [Paragraph("successor section")])


ANALYSIS = pattern_analysis(
    "successor", next_token, input="sentences",
    rule=PatternRule("successor", threshold=0.0, lower=0.0, what="attends ahead", baseline=False),
)
import dataclasses  # noqa: E402
from headprobe.extend import register  # noqa: E402

register(dataclasses.replace(ANALYSIS, report=section), replace=True)
'''
BROKEN = "import missing_dependency_of_successor  # noqa: F401\n" + GOOD


def run_args(model: str, out, analyses: str) -> list[str]:
    return [
        "-m", "headprobe", "run", "--model", model, "--treebank", str(SAMPLE),
        "--analyses", analyses, "--bootstrap", "20", "--quiet", "--out", str(out),
    ]  # fmt: skip


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def earlier(tiny_model, tmp_path_factory):
    """Results of a run with the working plugin (its analysis, role and section in them)."""
    where = tmp_path_factory.mktemp("good")
    env = install(where / "site", f"{NAME} = {MODULE}\n", {MODULE: GOOD})
    out = where / "results"
    ran = python(env, *run_args(tiny_model, out, f"{NAME},previous_token"))
    assert ran.returncode == 0, ran.stderr
    assert "Heads that look one token ahead" in (out / "report/report.md").read_text()
    assert NAME in json.loads((out / "summary.json").read_text())["analyses"]
    assert NAME in set(pd.read_parquet(out / "roles.parquet")["role"])  # in the role map
    return out


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> dict:
    where = tmp_path_factory.mktemp("broken")
    return install(where / "site", f"{NAME} = {MODULE}\n", {MODULE: BROKEN})


def one_warning(stderr: str) -> str:
    said = lines(stderr)
    assert len(said) == 1, stderr
    assert said[0].startswith("headprobe: warning: analysis plugin 'successor'"), said[0]
    assert "ModuleNotFoundError: No module named 'missing_dependency_of_successor'" in said[0]
    return said[0]


@pytest.mark.parametrize("argv", [["--help"], ["report", "--help"], ["compare", "--help"]])
def test_commands_that_need_no_analysis_import_no_plugin(broken, argv):
    """The entry points are imported when something needs the analyses, not at start-up."""
    helped = python(broken, "-m", "headprobe", *argv)
    assert helped.returncode == 0 and helped.stderr == "", helped.stderr


def test_help_warns_once_and_leaves_it_out(broken):
    helped = python(broken, "-m", "headprobe", "run", "--help")
    assert helped.returncode == 0
    one_warning(helped.stderr)
    assert "--analyses" in helped.stdout and "successor" not in helped.stdout


def test_an_unrelated_run_proceeds_and_one_asking_for_it_is_refused(broken, tiny_model, tmp_path):
    ran = python(broken, *run_args(tiny_model, tmp_path / "other", "previous_token"))
    assert ran.returncode == 0, ran.stderr
    one_warning(ran.stderr)
    assert (tmp_path / "other/summary.json").is_file()
    asked = python(broken, *run_args(tiny_model, tmp_path / "asked", f"previous_token,{NAME}"))
    said = lines(asked.stderr)
    assert asked.returncode == 2 and len(said) == 1, asked.stderr
    assert said[0].startswith("headprobe: error: analysis 'successor' is not available: ")
    assert "missing_dependency_of_successor" in said[0]
    assert not (tmp_path / "asked").exists()


def test_report_on_earlier_results_draws_the_rest(broken, earlier, tmp_path):
    out = tmp_path / "report"
    made = python(broken, "-m", "headprobe", "report", str(earlier), "--out", str(out))
    assert made.returncode == 0, made.stderr
    one_warning(made.stderr)
    report = (out / "report.md").read_text()
    assert "The successor section could not be drawn: analysis 'successor' is not available" in (
        report
    )
    assert "previous_token" in report and "Head-role map" in report
    assert (out / "report.html").is_file() and list((out / "figures").glob("*.png"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # no staging left


@pytest.mark.parametrize("switch", [NAME, "test-plugin", "all"])
def test_the_switch_silences_it(broken, switch):
    env = {**broken, "HEADPROBE_DISABLE_PLUGINS": switch}
    helped = python(env, "-m", "headprobe", "run", "--help")
    assert helped.returncode == 0 and not helped.stderr.strip(), helped.stderr
    listed = python(env, "-m", "headprobe", "plugins")
    assert listed.returncode == 0 and not listed.stderr.strip(), listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith(NAME)]
    assert row.split()[:6] == [NAME, "?", "test-plugin", "0.1", "plugin", "disabled"]


def test_plugins_lists_the_failure_and_the_builtins(broken):
    listed = python(broken, "-m", "headprobe", "plugins")
    assert listed.returncode == 0
    one_warning(listed.stderr)
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()[1:-1]}
    assert rows[NAME][:6] == [NAME, "?", "test-plugin", "0.1", "plugin", "failed"]
    assert "ModuleNotFoundError:" in listed.stdout
    assert rows["dependency"][:6] == ["dependency", "analysis", "headprobe", rows["dependency"][3],
                                      "built-in", "loaded"]  # fmt: skip
    assert rows["needle"][1] == "probe" and "--needle-depths" in " ".join(rows["needle"])


def test_a_failed_build_leaves_no_partial_report(earlier, tmp_path, monkeypatch):
    from headprobe.report import writer

    def fail(*args, **kwargs):
        raise RuntimeError("drawing failed")

    out = tmp_path / "report"
    monkeypatch.setattr(writer, "write_figures", fail)
    with pytest.raises(RuntimeError, match="drawing failed"):
        writer.build_report(earlier, out)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    first = writer.build_report(earlier, out)
    assert first["html"] == out / "report.html" and first["html"].is_file()
    (out / "figures/kept.svg").write_text("<svg/>")  # a vector figure of an earlier build
    monkeypatch.setattr(writer, "write_figures", fail)
    with pytest.raises(RuntimeError):
        writer.build_report(earlier, out)
    assert (out / "report.html").read_bytes() == first["html"].read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]
    monkeypatch.undo()
    writer.build_report(earlier, out)
    assert (out / "figures/kept.svg").is_file()  # carried over: an SVG build was not asked for
