"""The examples of docs/EXTENDING.md are packages (docs/examples/<name>/, each with its own
pyproject.toml declaring the `headprobe.analyses` entry point): installed here from their
pyproject with pip (offline: --no-index, --no-deps, --no-build-isolation) into a directory on
PYTHONPATH, and run end to end through `headprobe run` and `headprobe report`. They import only
`headprobe.extend`, and the docs show each file as it is (issue 52)."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs/examples"
PACKAGES = sorted(p.parent for p in EXAMPLES.glob("*/pyproject.toml"))
SAMPLE = ROOT / "headprobe/inputs/samples/sample.conllu"


def python(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> dict:
    """The environment of a subprocess that has every example installed (pip builds each from
    a copy, so the checkout gets no build/ or *.egg-info)."""
    where = tmp_path_factory.mktemp("examples")
    sources = [shutil.copytree(package, where / "src" / package.name) for package in PACKAGES]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
         "--no-build-isolation", "--target", str(where / "site"), *map(str, sources)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {**os.environ, "PYTHONPATH": f"{where / 'site'}{os.pathsep}{ROOT}"}


def test_there_are_the_three_examples_each_a_package():
    assert [p.name for p in PACKAGES] == ["offset_back", "ordinal_probe", "ov_circuits"]
    for package in PACKAGES:
        assert (
            '[project.entry-points."headprobe.analyses"]'
            in (package / "pyproject.toml").read_text()
        )


def test_they_import_only_headprobe_extend():
    files = sorted(EXAMPLES.rglob("*.py"))
    assert len(files) == 4
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                if name.split(".")[0] == "headprobe":
                    assert name == "headprobe.extend", f"{path.name} imports {name}"


def test_the_docs_show_each_example_as_it_is():
    """docs/EXTENDING.md shows every file of docs/examples in a block headed by its path."""
    text = (ROOT / "docs/EXTENDING.md").read_text()
    blocks = dict(re.findall(r"```(?:python|toml)\n# (docs/examples/\S+)\n(.*?)```", text, re.S))
    shown = sorted(blocks)
    files = sorted(
        str(p.relative_to(ROOT)) for p in EXAMPLES.rglob("*") if p.suffix in (".py", ".toml")
    )
    assert shown == files
    for path, code in blocks.items():
        assert code == (ROOT / path).read_text(), path


def test_plugins_lists_the_examples_and_the_builtins(site):
    listed = python(site, "-m", "headprobe", "plugins")
    assert listed.returncode == 0 and not listed.stderr.strip(), listed.stderr
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()[1:-1]}
    expected = {
        "offset_back": ("analysis", "headprobe-offset-back"),
        "item_successor": ("analysis", "headprobe-ordinal"),
        "ordinal": ("probe", "headprobe-ordinal"),
        "ov_norms": ("analysis", "headprobe-ov-circuits"),
        "ov_composition": ("analysis", "headprobe-ov-circuits"),
    }
    for name, (kind, package) in expected.items():
        assert rows[name][:6] == [name, kind, package, "0.1.0", "plugin", "loaded"], rows[name]
    assert "--offset-back K" in " ".join(rows["offset_back"])
    assert " ".join(rows["ordinal"][6:]) == "--ordinal-separator TOKEN; reads probe_n, probe_length"
    for name in ("dependency", "induction", "ov_copying"):
        assert rows[name][1] == "analysis" and rows[name][4:6] == ["built-in", "loaded"]
    assert rows["repeated-random"][1] == "probe"


def test_the_ordinal_probe_is_recorded_like_a_builtin(site, tiny_model, tmp_path):
    out = tmp_path / "ordinal"
    ran = python(
        site, "-m", "headprobe", "run", "--model", tiny_model, "--probe", "ordinal",
        "--analyses", "item_successor", "--n", "12", "--length", "6", "--seed", "3",
        "--bootstrap", "20", "--quiet", "--out", str(out),
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    words = 12 * (2 * 6 - 1)
    assert f"data: ordinal (12 sequences, {words:,} words)" in ran.stdout
    assert ran.stdout.count("12 sequences") == 1
    summary = json.loads((out / "summary.json").read_text())
    probe = {"name": "ordinal", "length": 6, "n": 12, "ordinal_separator": ","}
    assert summary["options"]["probe"] == probe and summary["options"]["seed"] == 3
    assert json.loads((out / "manifest.json").read_text())["options"] == summary["options"]
    assert summary["runs"]["probe"]["examples"] == 12 and summary["runs"]["probe"]["words"] == words
    heads = pd.read_parquet(out / "item_successor_heads.parquet")
    assert len(heads) == 2 * 12 and (heads["n"] == 12 * 5).all()  # 5 items after the first
    made = python(site, "-m", "headprobe", "report", str(out), "--out", str(tmp_path / "report"))
    assert made.returncode == 0, made.stderr
    assert "item_successor" in (tmp_path / "report/report.md").read_text()


def test_the_ordinal_options_are_checked(site, tiny_model, tmp_path):
    early = python(
        site, "-m", "headprobe", "run", "--model", str(tmp_path / "no-model"),
        "--ordinal-separator", ";", "--out", str(tmp_path / "a"),
    )  # fmt: skip
    said = [line for line in early.stderr.splitlines() if line.strip()]
    assert early.returncode == 2 and len(said) == 1, early.stderr
    assert said[0] == (
        "headprobe: error: --ordinal-separator is an option of --probe ordinal: add --probe ordinal"
    )
    two = python(
        site, "-m", "headprobe", "run", "--model", tiny_model, "--probe", "ordinal",
        "--analyses", "item_successor", "--ordinal-separator", "hello world", "--quiet",
        "--out", str(tmp_path / "b"),
    )  # fmt: skip
    said = [line for line in two.stderr.splitlines() if line.strip()]
    assert two.returncode == 2 and len(said) == 1, two.stderr
    assert said[0] == "headprobe: error: --ordinal-separator 'hello world' is not one token"


def test_the_weights_only_examples_run_and_report(site, tiny_model, bert_family, tmp_path):
    out = tmp_path / "ov"
    ran = python(
        site, "-m", "headprobe", "run", "--model", tiny_model,
        "--analyses", "ov_norms,ov_composition", "--quiet", "--out", str(out),
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    norms = pd.read_parquet(out / "ov_norms_heads.parquet")
    assert len(norms) == 12 and list(norms.columns) == ["measure", "layer", "head", "ov_norm"]
    model = bert_family.sdpa  # the same weights, read here without headprobe
    layer = model.encoder.layer[1].attention
    d = model.config.hidden_size // model.config.num_attention_heads
    w_v = layer.self.value.weight[2 * d : 3 * d].T  # head 2: [d_model, d_head]
    w_o = layer.output.dense.weight[:, 2 * d : 3 * d].T  # [d_head, d_model]
    (mine,) = norms.loc[(norms["layer"] == 1) & (norms["head"] == 2), "ov_norm"]
    assert np.isclose(mine, float((w_v @ w_o).norm()), rtol=1e-5)
    pairs = pd.read_parquet(out / "ov_composition_pairs.parquet")
    assert list(pairs.columns) == [
        "measure",
        "layer",
        "head",
        "sender_layer",
        "sender_head",
        "score",
    ]
    assert len(pairs) == 4 * 4 + 4 * 8  # receivers in layers 1 and 2, senders in earlier ones
    assert (pairs["sender_layer"] < pairs["layer"]).all()
    assert ((pairs["score"] > 0) & (pairs["score"] <= 1)).all()
    made = python(site, "-m", "headprobe", "report", str(out))
    assert made.returncode == 0, made.stderr
    report = (out / "report/report.md").read_text()
    assert "OV circuit norms" in report and "V-composition of pairs of heads" in report
