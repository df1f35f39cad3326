"""Seeds from content, not paths: the same corpus read from two directories gives byte-identical
tables, the token patterns' random baselines included (METHODS §5; `headprobe.core.seeds`)."""

from __future__ import annotations

from pathlib import Path

from test_cli import conllu_text

import headprobe
from headprobe.core.seeds import example_key, keyed_hash
from headprobe.inputs.corpora.base import Example

# the token analyses read the sentences at piece level; previous_token and sink draw the random
# baseline per example, the draw that used to be keyed by the example's file path
ANALYSES = ["dependency", "positional", "previous_token", "sink"]


def run_from(directory: Path, model: str, out: Path) -> Path:
    directory.mkdir(parents=True)
    corpus = directory / "corpus.conllu"
    corpus.write_text(conllu_text())
    headprobe.run(
        model=model,
        treebank=str(corpus),
        analyses=ANALYSES,
        out=str(out),
        report=False,
        progress=False,
        device="cpu",
    )
    return out


def test_same_corpus_two_directories_byte_identical_tables(tiny_model, tmp_path):
    first = run_from(tmp_path / "one", tiny_model, tmp_path / "out1")
    second = run_from(tmp_path / "two" / "deeper", tiny_model, tmp_path / "out2")
    tables = sorted(p.name for p in first.iterdir() if p.suffix in (".csv", ".parquet"))
    assert "previous_token_heads.csv" in tables and "sink_heads.csv" in tables
    assert tables == sorted(p.name for p in second.iterdir() if p.suffix in (".csv", ".parquet"))
    differ = [n for n in tables if (first / n).read_bytes() != (second / n).read_bytes()]
    assert not differ, f"tables differ between the two directories: {differ}"
    # the random baseline took part: its column holds numbers
    heads = (first / "previous_token_heads.csv").read_text()
    assert "random" in heads


def example(words, source, unit="doc1", sent_id="s1"):
    return Example(words, unit, source, sent_id=sent_id)


def test_example_key_reads_ids_not_the_directory():
    a = example(["The", "cat", "sat"], "/one/corpus.conllu:3")
    b = example(["The", "cat", "sat"], "/two/deeper/corpus.conllu:3")
    assert example_key(0, a) == example_key(0, b)
    assert example_key(0, a) == example_key(0, example(a.words, "corpus.conllu:3"))
    assert example_key(0, a) != example_key(1, a)  # the seed
    assert example_key(0, a) != example_key(0, example(a.words, "/one/corpus.conllu:9"))
    assert example_key(0, a) != example_key(0, example(a.words, a.source, sent_id="s2"))
    assert example_key(0, a) != example_key(0, example(a.words, a.source, unit="doc2"))
    # the key is METHODS §5's keyed hash of "unit:sentence:file:line"
    assert example_key(7, a) == keyed_hash(7, "random-key", "doc1:s1:corpus.conllu:3")
