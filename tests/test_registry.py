"""A new analysis is one module: registered, it appears in counts, best heads, roles and the
report, with no other file touched (tests/toy_analysis.py)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import headprobe
from headprobe.scoring import registry

SAMPLE = Path(__file__).resolve().parents[1] / "headprobe/inputs/samples/sample.conllu"


@pytest.fixture
def toy():
    import toy_analysis

    registry.register(toy_analysis.ANALYSIS)
    yield toy_analysis
    registry.unregister("self_attention")


def test_builtin_analyses_are_registered():
    assert {"dependency", "positional", "surface", "coreference"} <= set(registry.names())
    assert registry.names("coreference") == ["coreference"]
    assert registry.get("dependency").baselines[-1] == "first"
    order = [rule.role for _, rule in registry.role_rules()]
    spec6 = ["positional", "syntactic", "coreference", "sink", "broad"]  # METHODS §6 order
    assert [role for role in order if role in spec6] == spec6
    with pytest.raises(ValueError, match="unknown analysis 'nope'; choose from dependency"):
        registry.get("nope")


def test_a_toy_analysis_appears_everywhere(toy, bert_family, tmp_path):
    from headprobe.report import build_report

    assert "self_attention" in registry.names()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = headprobe.run(
            treebank=SAMPLE,
            analyses=["self_attention", "positional"],
            n_boot=50,
            loaded=(bert_family.sdpa, bert_family.tokenizer, "tiny"),
            pictures=False,
            progress=False,
            out=tmp_path / "r",
        )
    counts = results.counts
    toy_rows = counts[counts["analysis"] == "self_attention"]
    assert set(toy_rows["label"]) == {"self"}
    n_words = sum(
        int(line.split("\t")[0].isdigit())
        for line in SAMPLE.read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert (
        toy_rows.loc[(toy_rows["fold"] == "") & (toy_rows["variant"] == ""), "n"] == n_words
    ).all()
    assert set(toy_rows.loc[toy_rows["variant"] != "", "variant"]) == {"next"}
    best = results.best_heads
    assert set(best.loc[best["analysis"] == "self_attention", "selection"]) == {
        "in-sample",
        "held-out",
    }
    # the role rule is in use: its evidence column exists, and heads that meet it say so
    roles = results.roles
    assert "selfish_evidence" in roles.columns
    expected = set(
        map(
            tuple,
            results.head_scores("self_attention", "self")
            .query("accuracy >= 0.5")[["layer", "head"]]
            .to_numpy(),
        )
    )
    got = set(
        map(
            tuple,
            roles.loc[roles["all_roles"].str.contains("selfish"), ["layer", "head"]].to_numpy(),
        )
    )
    assert got == expected
    # the report has a section for it, and prints its rule
    paths = build_report(tmp_path / "r")
    text = paths["markdown"].read_text()
    assert "self_attention" in text and "selfish: a word's argmax is itself" in text


GENERIC = [
    "headprobe/results/query.py",
    "headprobe/stats/roles.py",
    "headprobe/results/store.py",
    "headprobe/report",
]


def named_analyses(path: Path, names: set[str]) -> list[str]:
    """String constants of a module that are an analysis's name, as `file:line 'name'`. A role
    rule's own role name (`RoleRule("sink", ...)`) and its cell label (`"short": "sink"`) are the
    rule's facts, not references to an analysis, and are skipped."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "RoleRule"
            and node.args
        ):
            skipped.add(id(node.args[0]))
        if isinstance(node, ast.Dict):
            skipped.update(
                id(v)
                for k, v in zip(node.keys, node.values)
                if isinstance(k, ast.Constant) and k.value == "short"
            )
    return [
        f"{path}:{node.lineno} {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in names
        and id(node) not in skipped
    ]


def test_generic_modules_name_no_analysis():
    """results, roles, store and report/ read analysis names from the registry: none is spelled there."""
    root = Path(__file__).resolve().parents[1]
    names = set(registry.names())
    assert {"dependency", "coreference", "surface", "positional"} <= names
    files = [
        p
        for entry in GENERIC
        for p in sorted((root / entry).rglob("*.py") if (root / entry).is_dir() else [root / entry])
    ]
    assert len(files) > 4
    found = [hit for path in files for hit in named_analyses(path, names)]
    assert not found, "analysis names spelled out in generic modules:\n" + "\n".join(found)
    probe = root / "tests" / "toy_analysis.py"  # the check itself sees a name where one is
    assert any("'self_attention'" in hit for hit in named_analyses(probe, {"self_attention"}))


def test_a_second_register_of_a_name_is_refused(toy):
    """Registering a name twice is refused unless replacement is asked for."""
    from dataclasses import replace

    twin = replace(toy.ANALYSIS, description="another self_attention")
    with pytest.raises(ValueError, match="'self_attention' is registered already"):
        registry.register(twin)
    assert registry.get("self_attention") is toy.ANALYSIS
    assert registry.register(twin, replace=True) is twin
    assert registry.get("self_attention") is twin
    registry.register(toy.ANALYSIS, replace=True)


def test_analyses_are_ordered_by_their_declared_order():
    """Discovery finds every folder of headprobe/studies; the order is each analysis's `order`."""
    analyses = registry.analyses()
    orders = [a.order for a in analyses]
    assert orders == sorted(orders)
    builtin = [a.name for a in analyses if a.scorer.__module__.startswith("headprobe.studies.")]
    assert builtin[:4] == ["dependency", "coreference", "positional", "surface"]
    assert registry.ordered(["ov_copying", "dependency", "sink"]) == [
        "dependency",
        "sink",
        "ov_copying",
    ]


def test_a_plugin_that_fails_to_import_is_one_line(tmp_path):
    """A broken entry point of the `headprobe.analyses` group: `headprobe run --help` prints one
    warning line naming the plugin and its entry point, then the help; a run that names it
    stops in one line (exit 2). (tests/test_plugin_isolation.py: an unrelated run goes on.)"""
    import subprocess
    import sys

    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[headprobe.analyses]\nmy_heads = broken_plugin_module:ANALYSIS\n"
    )
    (tmp_path / "broken_plugin_module.py").write_text("raise RuntimeError('a bug in the plugin')\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path)}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] += ":" + str(root)
    helped = subprocess.run(
        [sys.executable, "-m", "headprobe", "run", "--help"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert helped.returncode == 0
    lines = [line for line in helped.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, helped.stderr
    assert lines[0].startswith("headprobe: warning: analysis plugin 'my_heads'")
    assert "broken_plugin_module:ANALYSIS" in lines[0]
    assert "RuntimeError: a bug in the plugin" in lines[0]
    assert "--analyses" in helped.stdout
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "headprobe",
            "run",
            "--analyses",
            "my_heads",
            "--out",
            str(tmp_path / "out"),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        env=env,
    )
    said = [line for line in ran.stderr.splitlines() if line.strip()]
    assert ran.returncode == 2 and len(said) == 1, ran.stderr
    assert said[0].startswith("headprobe: error: analysis 'my_heads' is not available: ")
    assert "broken_plugin_module:ANALYSIS" in said[0]
    assert "Traceback" not in ran.stderr and not (tmp_path / "out").exists()
