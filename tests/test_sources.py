"""Sentence sources other than CoNLL-U (spaCy text, Hugging Face datasets) and Results save/load."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from headprobe.inputs.corpora.base import CorpusError
from headprobe.inputs.corpora.hf_datasets import parse_spec, read_hf_dataset

# ----------------------------------------------------------------------------------------
# raw text through the bundled spaCy parser
# ----------------------------------------------------------------------------------------
TEXT = (
    "The cat sat on the mat. The dog ran.\n"  # line 1: paragraph 1, two sentences
    "\n"
    "It was a  big dog,\n"  # line 3: paragraph 2 (two lines, a double space)
    "and it saw the cat!\n"
    "\n\n"
)


@pytest.fixture(scope="module")
def nlp():
    from headprobe.inputs.corpora.spacy_text import load_parser

    return load_parser()


@pytest.fixture(scope="module")
def text_examples(nlp, tmp_path_factory):
    from headprobe.inputs.corpora.spacy_text import parse_text

    path = tmp_path_factory.mktemp("text") / "story.txt"
    path.write_text(TEXT)
    return path, parse_text(path, nlp=nlp)


def test_parse_text_sentences_and_arcs(text_examples):
    path, examples = text_examples
    assert [e.words for e in examples] == [
        ["The", "cat", "sat", "on", "the", "mat", "."],
        ["The", "dog", "ran", "."],
        ["It", "was", "a", "big", "dog", ",", "and", "it", "saw", "the", "cat", "!"],
    ]
    for e in examples:
        n = len(e.words)
        assert len(e.heads) == len(e.deprels) == len(e.upos) == len(e.feats) == n
        assert all(-1 <= h < n and h != i for i, h in enumerate(e.heads))
        roots = [i for i, h in enumerate(e.heads) if h == -1]
        assert len(roots) == 1
        assert e.deprels[roots[0]] == "root"
        assert e.deprels.count("root") == 1
        assert all(r == r.lower() and ":" not in r for r in e.deprels)
        assert not any(w.isspace() or w == "" for w in e.words)
        assert "punct" in e.deprels
    assert examples[0].heads[:3] == [1, 2, -1]  # The -> cat -> sat (root)
    assert examples[0].deprels[:3] == ["det", "nsubj", "root"]


def test_parse_text_units_and_sources(text_examples):
    path, examples = text_examples
    # a paragraph is a document: the unit (METHODS §5); sentences are named by their ordinal
    assert [e.unit for e in examples] == ["story.txt#1", "story.txt#1", "story.txt#2"]
    assert [e.sent_id for e in examples] == ["story.txt#1", "story.txt#2", "story.txt#3"]
    assert examples.skipped == [] and not examples.counts
    assert [e.source for e in examples] == [f"{path}:1", f"{path}:1", f"{path}:3"]
    assert examples[2].meta["text"].startswith("It was")


def test_parse_text_errors(nlp, tmp_path):
    from headprobe.inputs.corpora.spacy_text import parse_text

    with pytest.raises(FileNotFoundError):
        parse_text(tmp_path / "missing.txt", nlp=nlp)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n\n")
    with pytest.raises(CorpusError, match="no text"):
        parse_text(empty, nlp=nlp)


def test_parse_text_bytes_bom_and_skip_bad(nlp, tmp_path):
    from headprobe.inputs.corpora.spacy_text import parse_text

    path = tmp_path / "bytes.txt"
    path.write_bytes(b"\xef\xbb\xbfThe cat sat.\n\nA dog r\xffan.\n\nIt rained.\n")
    with pytest.raises(CorpusError) as info:
        parse_text(path, nlp=nlp)
    assert str(info.value).startswith(f"{path}:3: invalid UTF-8 (byte 0xff")
    with pytest.warns(UserWarning, match="skipping malformed paragraph"):
        corpus = parse_text(path, nlp=nlp, skip_bad=True)
    assert [e.words[0] for e in corpus] == ["The", "It"]  # the BOM is dropped
    assert [e.unit for e in corpus] == ["bytes.txt#1", "bytes.txt#3"]  # paragraph ordinals
    assert [e.sent_id for e in corpus] == ["bytes.txt#1", "bytes.txt#2"]
    assert corpus.counts == {"malformed_paragraph": 1} and corpus.skipped == [str(info.value)]


# ----------------------------------------------------------------------------------------
# Hugging Face datasets
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec, expected",
    [
        ("universal_dependencies", ("universal_dependencies", None, "validation")),
        ("universal_dependencies:en_ewt", ("universal_dependencies", "en_ewt", "validation")),
        ("universal_dependencies:en_ewt:test", ("universal_dependencies", "en_ewt", "test")),
        ("some/dir::train", ("some/dir", None, "train")),
        ("name:cfg:", ("name", "cfg", "validation")),
    ],
)
def test_parse_spec(spec, expected):
    assert parse_spec(spec) == expected


@pytest.mark.parametrize("spec", ["a:b:c:d", ":cfg", ""])
def test_parse_spec_rejects(spec):
    with pytest.raises(ValueError, match="NAME"):
        parse_spec(spec)


UPOS = [
    "NOUN",
    "PUNCT",
    "ADP",
    "NUM",
    "SYM",
    "SCONJ",
    "ADJ",
    "PART",
    "DET",
    "CCONJ",
    "PROPN",
    "PRON",
    "X",
    "_",
    "ADV",
    "INTJ",
    "VERB",
    "AUX",
]


def save(path: Path, columns: dict, features=None, split: str | None = "validation") -> str:
    import datasets

    ds = datasets.Dataset.from_dict(columns, features=features)
    (datasets.DatasetDict({split: ds}) if split else ds).save_to_disk(str(path))
    return str(path)


def ud_features():
    import datasets

    return datasets.Features(
        {
            "idx": datasets.Value("string"),
            "tokens": datasets.Sequence(datasets.Value("string")),
            "head": datasets.Sequence(datasets.Value("string")),
            "deprel": datasets.Sequence(datasets.Value("string")),
            "upos": datasets.Sequence(datasets.ClassLabel(names=UPOS)),
        }
    )


def ud_columns(rows):
    """rows: [(idx, [(form, upos, head, deprel), ...])] -> columns as in the UD datasets on the hub."""
    return {
        "idx": [r[0] for r in rows],
        "tokens": [[w[0] for w in r[1]] for r in rows],
        "head": [[str(w[2]) for w in r[1]] for r in rows],
        "deprel": [[w[3] for w in r[1]] for r in rows],
        "upos": [[UPOS.index(w[1]) for w in r[1]] for r in rows],
    }


ROWS = [
    (
        "a-1",
        [
            ("The", "DET", 2, "det"),
            ("cat", "NOUN", 3, "nsubj"),
            ("slept", "VERB", 0, "root"),
            (".", "PUNCT", 3, "punct"),
        ],
    ),
    (
        "a-2",
        [("It", "PRON", 2, "nsubj"), ("ran", "VERB", 0, "root"), ("home", "ADV", 2, "obl:npmod")],
    ),
]


def test_read_hf_dataset_ud_layout(tmp_path):
    spec = save(tmp_path / "ud", ud_columns(ROWS), ud_features())
    corpus = read_hf_dataset(spec)
    assert len(corpus) == 2 and corpus.skipped == []
    first, second = corpus
    assert first.words == ["The", "cat", "slept", "."]
    assert first.heads == [1, 2, -1, 2]  # 1-based strings -> 0-based, root -1
    assert first.upos == ["DET", "NOUN", "VERB", "PUNCT"]  # class labels -> names
    assert second.deprels == ["nsubj", "root", "obl"]  # subtype cut
    assert [e.unit for e in corpus] == ["a-1", "a-2"]  # idx column
    assert first.source == f"{spec} row 0"
    # the same with the split named, and a split that is not there
    assert [e.words for e in read_hf_dataset(f"{spec}::validation")] == [e.words for e in corpus]
    with pytest.raises(ValueError, match="no split 'train'"):
        read_hf_dataset(f"{spec}::train")


def test_read_hf_dataset_other_column_names_and_plain_dataset(tmp_path):
    columns = {
        "words": [["Dogs", "bark"]],
        "heads": [[2, 0]],
        "deprels": [["nsubj", "root"]],
        "pos": [["NOUN", "VERB"]],
    }
    spec = save(tmp_path / "plain", columns, split=None)  # a Dataset, not a DatasetDict
    (example,) = read_hf_dataset(spec)
    assert example.heads == [1, -1]
    assert example.upos == ["NOUN", "VERB"]
    assert example.unit == example.sent_id == f"{spec}#1"  # no sent_id / id / idx column: ordinal


def test_read_hf_dataset_missing_columns(tmp_path):
    spec = save(tmp_path / "nohead", {"tokens": [["a", "b"]], "deprel": [["det", "root"]]})
    with pytest.raises(ValueError) as info:
        read_hf_dataset(spec)
    message = str(info.value)
    assert spec in message and "no heads column" in message
    assert "'head'" in message and "'heads'" in message  # what it looked for
    assert "tokens" in message and "deprel" in message  # what the dataset has
    spec = save(tmp_path / "nowords", {"text": [["a"]], "head": [["0"]], "deprel": [["root"]]})
    with pytest.raises(ValueError, match="no words column"):
        read_hf_dataset(spec)


@pytest.mark.parametrize(
    "heads, message",
    [
        (["2", "7"], "head '7' of word 2 ('bark') is not a word index in 0..2"),
        (["2", "x"], "head 'x' of word 2 ('bark') is not a word index in 0..2"),
        (["2", "2"], "word 2 ('bark') is its own head"),
        (["0", "0"], "2 roots: words 1 ('Dogs'), 2 ('bark') all have head 0"),
        (["2", "1"], "no root"),
    ],
)
def test_read_hf_dataset_bad_rows(tmp_path, heads, message):
    columns = {
        "tokens": [["a", "b"], ["Dogs", "bark"], ["c", "d"]],
        "head": [["2", "0"], heads, ["0", "1"]],
        "deprel": [["det", "root"], ["nsubj", "root"], ["root", "obj"]],
    }
    spec = save(tmp_path / "bad", columns)
    with pytest.raises(CorpusError) as info:
        read_hf_dataset(spec)
    assert f"{spec} row 1" in str(info.value) and message in str(info.value)
    with pytest.warns(UserWarning, match="skipping malformed sentence"):
        corpus = read_hf_dataset(spec, skip_bad=True)
    assert [e.words for e in corpus] == [["a", "b"], ["c", "d"]]
    assert len(corpus.skipped) == 1 and f"{spec} row 1" in corpus.skipped[0]
    assert corpus.counts == {"malformed_sentence": 1}


def test_read_hf_dataset_tree_checks_and_duplicate_ids(tmp_path):
    columns = {
        "sent_id": ["a", "b", "a", "c", "d"],
        "tokens": [["x", "y"], ["x", "y", "z"], ["x", "y"], ["x", "y"], ["x", "y"]],
        "head": [["2", "0"], ["2", "3", "1"], ["0", "1"], ["0", "1"], ["0", "1"]],
        "deprel": [
            ["det", "root"],
            ["a", "b", "c"],
            ["root", "obj"],
            ["root", "_"],
            ["root", "ALL"],
        ],
    }
    spec = save(tmp_path / "tree", columns)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        corpus = read_hf_dataset(spec, skip_bad=True)
    assert [e.unit for e in corpus] == [e.sent_id for e in corpus] == ["a"]
    assert corpus.skipped == [
        f"{spec} row 1: no root: no word has head 0",  # 1 -> 2 -> 3 -> 1, no word has 0
        f"{spec} row 2: duplicate sent_id 'a' (first used at row 0)",
        f"{spec} row 3: word 2 ('y') has no relation (DEPREL '_')",
        f"{spec} row 4: relation 'ALL' of word 2 ('y'): 'ALL' is reserved for the row of all relations",
    ]
    assert corpus.counts == {"malformed_sentence": 3, "duplicate_sent_id": 1}


def test_read_hf_dataset_length_mismatch(tmp_path):
    spec = save(tmp_path / "short", {"tokens": [["a", "b"]], "head": [["0"]], "deprel": [["root"]]})
    with pytest.raises(CorpusError, match="2 words, 1 heads, 1 relations"):
        read_hf_dataset(spec)


def test_read_hf_dataset_multiword_tokens_and_empty_nodes(tmp_path):
    """The UD datasets on the hub keep CoNLL-U multiword-token lines and empty nodes as tokens
    (their head is the string "None", their UPOS "_"), exactly as `conllu.parse_incr` lists them.
    They are not syntactic words (METHODS §1): they must be dropped, and the integer heads of the
    words refer to word ids that do not count them.

        1    I       PRON   4  nsubj
        2-3  cannot  _      _  _        <- multiword token
        2    can     AUX    4  aux
        3    not     PART   4  advmod
        4    go      VERB   0  root
        4.1  went    VERB   _  _        <- empty node (enhanced graphs only)
        5    .       PUNCT  4  punct
    """
    rows = [
        (
            "mwt-1",
            [
                ("I", "PRON", 4, "nsubj"),
                ("cannot", "_", None, "None"),
                ("can", "AUX", 4, "aux"),
                ("not", "PART", 4, "advmod"),
                ("go", "VERB", 0, "root"),
                ("went", "VERB", None, "None"),
                (".", "PUNCT", 4, "punct"),
            ],
        )
    ]
    spec = save(tmp_path / "mwt", ud_columns(rows), ud_features())
    (example,) = read_hf_dataset(spec)
    assert example.words == ["I", "can", "not", "go", "."]
    assert example.heads == [3, 3, 3, -1, 3]
    assert example.deprels == ["nsubj", "aux", "advmod", "root", "punct"]
    assert example.upos == ["PRON", "AUX", "PART", "VERB", "PUNCT"]
