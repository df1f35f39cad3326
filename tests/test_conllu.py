"""CoNLL-U reader (SPEC sections 1-2): syntactic words only, subtypes cut, errors name file and line."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from headprobe.corpora.base import CorpusError
from headprobe.corpora.conllu import read_conllu
from headprobe.scorers.dependency import scored_arcs


def write(tmp_path, text: str, name: str = "t.conllu") -> Path:
    path = tmp_path / name
    path.write_text(text.lstrip("\n"), encoding="utf-8")
    return path


def row(*cols) -> str:
    return "\t".join(str(c) for c in cols)


# line numbers (1-based) are given on the right
GOOD = "\n".join([
    "# newdoc id = d1",                                                   # 1
    "# sent_id = s1",                                                     # 2
    "# text = The cats' toys.",                                           # 3
    row(1, "The", "the", "DET", "DT", "Definite=Def", 2, "det", "_", "_"),    # 4
    row("2-3", "cats'", "_", "_", "_", "_", "_", "_", "_", "_"),          # 5  multiword range: not a word
    row(2, "cats", "cat", "NOUN", "NNS", "Number=Plur", 4, "nmod:poss", "_", "_"),  # 6
    row(3, "'", "'", "PART", "POS", "_", 2, "case", "_", "_"),            # 7
    row(4, "toys", "toy", "NOUN", "NNS", "Number=Plur", 0, "root", "_", "_"),  # 8
    row("4.1", "are", "be", "AUX", "_", "_", "_", "_", "4:cop", "_"),     # 9  empty node: not a word
    row(5, ".", ".", "PUNCT", ".", "_", 4, "punct", "_", "_"),            # 10
    "",                                                                   # 11
    "# sent_id = s2",                                                     # 12
    row(1, "It", "it", "PRON", "PRP", "_", 2, "nsubj", "_", "_"),         # 13
    row(2, "rained", "rain", "VERB", "VBD", "_", 0, "root", "_", "_"),    # 14
    row(3, "yesterday", "yesterday", "NOUN", "NN", "_", 2, "obl:tmod", "_", "_"),  # 15
    row(4, ".", ".", "PUNCT", ".", "_", 2, "punct", "_", "_"),            # 16
    "",                                                                   # 17 (blank)
    "",
])

S3_OK = "\n".join([
    "# sent_id = s3",
    row(1, "Go", "go", "VERB", "VB", "_", 0, "root", "_", "_"),
    row(2, "!", "!", "PUNCT", ".", "_", 1, "punct", "_", "_"),
    "",
    "",
])


def test_reads_syntactic_words(tmp_path):
    path = write(tmp_path, GOOD)
    corpus = read_conllu(path)
    assert len(corpus) == 2 and corpus.skipped == []
    s1, s2 = corpus
    assert s1.words == ["The", "cats", "'", "toys", "."]            # no "cats'" range, no "are" empty node
    assert s1.heads == [1, 3, 1, -1, 3]                             # 0-based, root -1
    assert s1.deprels == ["det", "nmod", "case", "root", "punct"]   # nmod:poss -> nmod
    assert s1.upos == ["DET", "NOUN", "PART", "NOUN", "PUNCT"]
    assert s1.feats[0] == {"Definite": "Def"} and s1.feats[2] == {}
    assert s1.unit == s2.unit == "d1"                               # the document is the unit (SPEC 5)
    assert (s1.sent_id, s2.sent_id) == ("s1", "s2")
    assert s1.source == f"{path}:1"
    assert s1.meta["doc_id"] == "d1"
    assert s2.words == ["It", "rained", "yesterday", "."]
    assert s2.heads == [1, -1, 1, 1]
    assert s2.deprels == ["nsubj", "root", "obl", "punct"]         # obl:tmod -> obl
    assert s2.source == f"{path}:12"
    # scored arcs: root and punct are not scored
    assert scored_arcs(s1) == [(0, 1, "det"), (1, 3, "nmod"), (2, 1, "case")]
    assert scored_arcs(s2) == [(0, 1, "nsubj"), (2, 1, "obl")]


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_conllu(tmp_path / "nope.conllu")


def error_of(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(CorpusError) as info:
        read_conllu(path)
    return path, str(info.value)


def test_bad_head_names_file_and_line(tmp_path):
    text = "\n".join([
        "# sent_id = bad",                                             # 1
        row(1, "It", "it", "PRON", "PRP", "_", 2, "nsubj", "_", "_"),  # 2
        row(2, "rained", "rain", "VERB", "VBD", "_", 0, "root", "_", "_"),  # 3
        row(3, "all", "all", "DET", "DT", "_", 4, "det", "_", "_"),    # 4
        row(4, "day", "day", "NOUN", "NN", "_", 9, "obl", "_", "_"),   # 5  head 9 in a 4-word sentence
        "",
    ])
    path, message = error_of(tmp_path, text)
    assert message == f"{path}:5: head '9' of word 4 ('day') is not a word index in 0..4"


def test_missing_column_names_file_and_line(tmp_path):
    text = GOOD + "\n".join([
        "# sent_id = short",                                            # 18
        row(1, "Hi", "hi", "INTJ", "UH", "_", 0, "root", "_", "_"),     # 19
        row(2, "!", "!", "PUNCT", ".", "_", 1, "punct", "_"),           # 20  nine columns
        "",
    ])
    path, message = error_of(tmp_path, text)
    assert message == f"{path}:20: expected 10 tab-separated columns, found 9"


def test_non_consecutive_ids_name_file_and_line(tmp_path):
    text = "\n".join([
        "# sent_id = gap",                                              # 1
        row(1, "It", "it", "PRON", "PRP", "_", 2, "nsubj", "_", "_"),   # 2
        row(2, "rained", "rain", "VERB", "VBD", "_", 0, "root", "_", "_"),  # 3
        row(4, ".", ".", "PUNCT", ".", "_", 2, "punct", "_", "_"),      # 4  id 4 where 3 was expected
        "",
    ])
    path, message = error_of(tmp_path, text)
    assert message == f"{path}:4: word id '4' where 3 was expected"


def test_skip_bad_warns_and_keeps_the_rest(tmp_path):
    bad = "\n".join([
        "# sent_id = bad",                                              # 18
        row(1, "It", "it", "PRON", "PRP", "_", 2, "nsubj", "_", "_"),   # 19
        row(2, "ended", "end", "VERB", "VBD", "_", 9, "root", "_", "_"),  # 20  head 9
        "",                                                             # 21 (blank)
        "",
    ])
    path = write(tmp_path, GOOD + bad + S3_OK)
    with pytest.warns(UserWarning, match="skipping"):
        corpus = read_conllu(path, skip_bad=True)
    assert [ex.sent_id for ex in corpus] == ["s1", "s2", "s3"]
    assert len(corpus.skipped) == 1 and corpus.counts == {"malformed_sentence": 1}
    assert corpus.skipped[0].startswith(f"{path}:20:")
    # and without skip_bad the same file raises
    with pytest.raises(CorpusError):
        read_conllu(path)


def test_without_heads(tmp_path):
    # require_heads=False: a bad head is not checked, the example has no arcs
    text = "\n".join([
        "# sent_id = x",
        row(1, "Hi", "hi", "INTJ", "UH", "_", 7, "root", "_", "_"),
        "",
    ])
    path = write(tmp_path, text)
    (example,) = read_conllu(path, require_heads=False)
    assert example.words == ["Hi"] and example.heads is None and scored_arcs(example) == []


EWT_DEV = Path(__file__).resolve().parents[2] / "shared/data/en_ewt-ud-dev.conllu"


@pytest.mark.slow
@pytest.mark.skipif(not EWT_DEV.is_file(), reason="shared EWT dev data not present")
def test_ewt_dev_counts():
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                 # nothing may be skipped
        corpus = read_conllu(EWT_DEV)
    assert corpus.skipped == []
    assert len(corpus) == 2001
    assert sum(len(ex.words) for ex in corpus) == 25_147
    assert sum(len(scored_arcs(ex)) for ex in corpus) == 20_085
    assert all(":" not in rel for ex in corpus for rel in ex.deprels)
