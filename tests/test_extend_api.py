"""`headprobe.extend` is the supported API of extension (issue 52): every name a plugin may
import is listed here and must stay; the built-in studies import those names from it (the same
door); a pattern gets the example and the tokenizer (the two-argument form still works); and
declared tables add to a pattern analysis's own."""

from __future__ import annotations

import ast
import dataclasses
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import headprobe
import headprobe.extend as extend
from headprobe.scoring import registry

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "headprobe/inputs/samples/sample.conllu"

# the supported API: removing or renaming one of these breaks plugins (docs/EXTENDING.md)
SUPPORTED = """
register unregister Analysis RoleRule Probe register_probe
SENTENCES COREFERENCE PROBE ANY WEIGHTS_ONLY TASK ARCS MENTIONS PLUGIN_ORDER CIRCUIT_COLUMN
Option GIVEN ModelFacts UsageError
pattern_analysis PatternRule PatternScorer PatternExample
CountScorer BatchState RowIndex BothIndex masked_word_attention first_argmax WeightsScorer
Example Stream Corpus LOSS_WORDS wrap special_ids vocabulary
Section Table Paragraph Cell BulletList Details Figure head_name
Results head_table PAIR_KEYS
attention_sites value_weight output_weight
""".split()


def test_every_supported_name_is_exported():
    missing = [name for name in SUPPORTED if name not in extend.__all__]
    assert not missing, f"names of the extension API that disappeared: {missing}"
    for name in SUPPORTED:
        assert getattr(extend, name) is not None
    assert extend.Results is headprobe.Results
    assert extend.pattern_analysis is headprobe.pattern_analysis
    assert extend.register is registry.register and extend.Probe is registry.Probe


def defining_modules() -> dict[str, str]:
    """{exported name: the module that defines it} for the names extend imports eagerly."""
    tree = ast.parse((ROOT / "headprobe/extend/__init__.py").read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                found[alias.asname or alias.name] = node.module
    return {name: module for name, module in found.items() if name in extend.__all__}


def test_the_builtin_studies_use_the_same_door():
    """No module of headprobe/studies imports a name of the extension API from the module that
    defines it: they import it from headprobe.extend, as a plugin does."""
    where = defining_modules()
    assert where["register"] == "headprobe.scoring.registry"  # the scan sees what it scans
    around = []
    for path in sorted((ROOT / "headprobe/studies").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                around += [
                    f"{path.relative_to(ROOT)}: {alias.name} from {node.module}"
                    for alias in node.names
                    if where.get(alias.name) == node.module
                ]
    assert not around, "import these from headprobe.extend:\n" + "\n".join(around)


def test_importing_extend_imports_no_run_library():
    import subprocess
    import sys

    code = (
        "import sys, headprobe.extend\n"
        "print(sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# ------------------------------------------------------------------ patterns: both forms


def run(bert_family, tmp_path, analyses):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return headprobe.run(
            treebank=SAMPLE,
            analyses=analyses,
            n_boot=20,
            loaded=(bert_family.sdpa, bert_family.tokenizer, "tiny"),
            pictures=False,
            progress=False,
            out=tmp_path / "r",
        )


@pytest.fixture
def two_forms():
    seen = []

    def old(ids, token):  # the two-argument form
        return np.eye(len(ids), k=-1, dtype=bool)

    def new(example):  # the example, with the tokenizer
        seen.append(example)
        return np.eye(len(example.ids), k=-1, dtype=bool)

    made = [
        extend.pattern_analysis("prev_old_form", old, input=extend.SENTENCES),
        extend.pattern_analysis("prev_new_form", new, input=extend.SENTENCES),
    ]
    yield seen
    for analysis in made:
        registry.unregister(analysis.name)


def test_both_pattern_forms_score_the_same_and_the_new_one_sees_the_example(
    two_forms, bert_family, tmp_path
):
    results = run(bert_family, tmp_path, ["prev_old_form", "prev_new_form"])
    old = results.table("prev_old_form_heads")
    new = results.table("prev_new_form_heads")
    pd.testing.assert_frame_equal(old, new)
    assert (old["n"] > 0).all()
    example = two_forms[0]
    assert isinstance(example, extend.PatternExample)
    tokenizer = bert_family.tokenizer
    assert example.tokens == tokenizer.convert_ids_to_tokens(example.ids.tolist())
    assert example.tokens[0] == "[CLS]" and not example.token[0] and example.piece_word[0] == -1
    words = example.words
    pieces = [example.tokens[i] for i in np.flatnonzero(example.piece_word == 0)]
    assert "".join(p.removeprefix("##") for p in pieces) == words[0].lower()
    assert example.meta is example.example.meta
    from headprobe.report.build import examples_section  # a pattern draws no example picture

    (said,) = examples_section(results).blocks
    assert said.text.startswith("No example pictures: none of this run's analyses draws them")
    assert "dependency" in said.text and "prev_new_form" not in said.text


def test_the_form_is_read_from_the_signature():
    from headprobe.extend.patterns import takes_example

    assert takes_example(lambda example: None)
    assert takes_example(lambda example, k=2: None)
    assert not takes_example(lambda ids, token: None)
    assert not takes_example(lambda ids, token, k=2: None)

    class Bound:
        def pattern(self, example): ...

    assert takes_example(Bound().pattern)


# ------------------------------------------------------------------ tables add, never replace


def some_table(results):
    return pd.DataFrame({"x": [1]})


def test_declared_tables_add_to_a_patterns_own(monkeypatch):
    base = extend.pattern_analysis(
        "tables_test",
        lambda ids, token: np.eye(len(ids), k=-1),
        tables={"tables_test_top": some_table},
    )
    try:
        own = ["tables_test_heads", "tables_test_kv_groups"]
        assert list(base.tables) == [*own, "tables_test_top"]
        more = dataclasses.replace(base, tables={"tables_test_more": some_table})
        assert list(more.tables) == [*own, "tables_test_more"]  # replace() keeps the defaults
        mine = dataclasses.replace(base, tables={"tables_test_heads": some_table})
        assert mine.tables["tables_test_heads"] is some_table  # a table named: replaced, by name
        assert list(mine.tables) == own
        bare = dataclasses.replace(base, base_tables={}, tables={"tables_test_top": some_table})
        assert list(bare.tables) == ["tables_test_top"]  # dropping the defaults is explicit
    finally:
        registry.unregister("tables_test")
