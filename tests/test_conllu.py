"""CoNLL-U reader (METHODS §1-§2): syntactic words only, subtypes cut, errors name file and line."""

from __future__ import annotations

import gzip
import warnings
from pathlib import Path

import pytest

from headprobe.inputs.corpora.base import CorpusError, file_chunks, file_lines
from headprobe.inputs.corpora.conllu import (
    count_word_lines,
    iter_blocks,
    read_conllu,
    stream_conllu,
)
from headprobe.studies.dependency.analysis import scored_arcs


def write(tmp_path, text: str, name: str = "t.conllu") -> Path:
    path = tmp_path / name
    path.write_text(text.lstrip("\n"), encoding="utf-8")
    return path


def row(*cols) -> str:
    return "\t".join(str(c) for c in cols)


# line numbers (1-based) are given on the right
GOOD = "\n".join(
    [
        "# newdoc id = d1",  # 1
        "# sent_id = s1",  # 2
        "# text = The cats' toys.",  # 3
        row(1, "The", "the", "DET", "DT", "Definite=Def", 2, "det", "_", "_"),  # 4
        row(
            "2-3", "cats'", "_", "_", "_", "_", "_", "_", "_", "_"
        ),  # 5  multiword range: not a word
        row(2, "cats", "cat", "NOUN", "NNS", "Number=Plur", 4, "nmod:poss", "_", "_"),  # 6
        row(3, "'", "'", "PART", "POS", "_", 2, "case", "_", "_"),  # 7
        row(4, "toys", "toy", "NOUN", "NNS", "Number=Plur", 0, "root", "_", "_"),  # 8
        row(
            "4.1", "are", "be", "AUX", "_", "_", "_", "_", "4:cop", "_"
        ),  # 9  empty node: not a word
        row(5, ".", ".", "PUNCT", ".", "_", 4, "punct", "_", "_"),  # 10
        "",  # 11
        "# sent_id = s2",  # 12
        row(1, "It", "it", "PRON", "PRP", "_", 2, "nsubj", "_", "_"),  # 13
        row(2, "rained", "rain", "VERB", "VBD", "_", 0, "root", "_", "_"),  # 14
        row(3, "yesterday", "yesterday", "NOUN", "NN", "_", 2, "obl:tmod", "_", "_"),  # 15
        row(4, ".", ".", "PUNCT", ".", "_", 2, "punct", "_", "_"),  # 16
        "",  # 17 (blank)
        "",
    ]
)

S3_OK = "\n".join(
    [
        "# sent_id = s3",
        row(1, "Go", "go", "VERB", "VB", "_", 0, "root", "_", "_"),
        row(2, "!", "!", "PUNCT", ".", "_", 1, "punct", "_", "_"),
        "",
        "",
    ]
)


def test_reads_syntactic_words(tmp_path):
    path = write(tmp_path, GOOD)
    corpus = read_conllu(path)
    assert len(corpus) == 2 and corpus.skipped == []
    s1, s2 = corpus
    assert s1.words == ["The", "cats", "'", "toys", "."]  # no "cats'" range, no "are" empty node
    assert s1.heads == [1, 3, 1, -1, 3]  # 0-based, root -1
    assert s1.deprels == ["det", "nmod", "case", "root", "punct"]  # nmod:poss -> nmod
    assert s1.upos == ["DET", "NOUN", "PART", "NOUN", "PUNCT"]
    assert s1.feats[0] == {"Definite": "Def"} and s1.feats[2] == {}
    assert s1.unit == s2.unit == "d1"  # the document is the unit (METHODS §5)
    assert (s1.sent_id, s2.sent_id) == ("s1", "s2")
    assert s1.source == f"{path}:1"
    assert s1.meta["doc_id"] == "d1"
    assert s2.words == ["It", "rained", "yesterday", "."]
    assert s2.heads == [1, -1, 1, 1]
    assert s2.deprels == ["nsubj", "root", "obl", "punct"]  # obl:tmod -> obl
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
    text = "\n".join(
        [
            "# sent_id = bad",  # 1
            row(1, "It", "it", "PRON", "PRP", "_", 2, "nsubj", "_", "_"),  # 2
            row(2, "rained", "rain", "VERB", "VBD", "_", 0, "root", "_", "_"),  # 3
            row(3, "all", "all", "DET", "DT", "_", 4, "det", "_", "_"),  # 4
            row(
                4, "day", "day", "NOUN", "NN", "_", 9, "obl", "_", "_"
            ),  # 5  head 9 in a 4-word sentence
            "",
        ]
    )
    path, message = error_of(tmp_path, text)
    assert message == f"{path}:5: head '9' of word 4 ('day') is not a word index in 0..4"


def gzip_copy(path: Path, data: bytes, cut: int = 0) -> Path:
    """`data` gzip-compressed into `path`, its last `cut` bytes cut off (a broken file)."""
    packed = gzip.compress(data, mtime=0)
    path.write_bytes(packed[: len(packed) - cut])
    return path


def test_gzip_file_reads_like_the_plain_one(tmp_path):
    """A `.conllu.gz` gives the same sentences as the text inside; sources and errors number the
    lines of that text."""
    plain = write(tmp_path, GOOD)
    packed = gzip_copy(tmp_path / "t.conllu.gz", plain.read_bytes())

    def rows(path):
        return [(e.words, e.heads, e.deprels, e.unit, e.sent_id) for e in read_conllu(path)]

    assert rows(packed) == rows(plain) and len(rows(plain)) == 2
    assert [e.source for e in stream_conllu(packed)] == [f"{packed}:1", f"{packed}:12"]
    assert count_word_lines(packed) == count_word_lines(plain) == 9  # 5 + 4 words, no 2-3, no 4.1
    bad = plain.read_text().replace(
        "4\ttoys\ttoy\tNOUN\tNNS\tNumber=Plur\t0", "4\ttoys\ttoy\tNOUN\tNNS\tNumber=Plur\t7"
    )
    bad_packed = gzip_copy(tmp_path / "bad.conllu.gz", bad.encode("utf-8"))
    with pytest.raises(CorpusError) as info:
        read_conllu(bad_packed)
    assert (
        str(info.value)
        == f"{bad_packed}:8: head '7' of word 4 ('toys') is not a word index in 0..5"
    )


def test_broken_gzip_file_names_the_line_where_reading_stopped(tmp_path):
    """A gzip file without its 8-byte trailer (CRC, size): every line is read, then one error
    naming the file and the line after the last one read."""
    data = write(tmp_path, GOOD).read_bytes()
    n_lines = data.count(b"\n")
    broken = gzip_copy(tmp_path / "cut.conllu.gz", data, cut=8)
    with pytest.raises(CorpusError) as info:
        read_conllu(broken, skip_bad=True)  # not a sentence's fault: never skipped
    assert str(info.value).startswith(
        f"{broken}:{n_lines + 1}: the gzip-compressed file cannot be read past line {n_lines} ("
    )


def test_missing_column_names_file_and_line(tmp_path):
    text = GOOD + "\n".join(
        [
            "# sent_id = short",  # 18
            row(1, "Hi", "hi", "INTJ", "UH", "_", 0, "root", "_", "_"),  # 19
            row(2, "!", "!", "PUNCT", ".", "_", 1, "punct", "_"),  # 20  nine columns
            "",
        ]
    )
    path, message = error_of(tmp_path, text)
    assert message == f"{path}:20: expected 10 tab-separated columns, found 9"


def test_non_consecutive_ids_name_file_and_line(tmp_path):
    text = "\n".join(
        [
            "# sent_id = gap",  # 1
            row(1, "It", "it", "PRON", "PRP", "_", 2, "nsubj", "_", "_"),  # 2
            row(2, "rained", "rain", "VERB", "VBD", "_", 0, "root", "_", "_"),  # 3
            row(
                4, ".", ".", "PUNCT", ".", "_", 2, "punct", "_", "_"
            ),  # 4  id 4 where 3 was expected
            "",
        ]
    )
    path, message = error_of(tmp_path, text)
    assert message == f"{path}:4: word id '4' where 3 was expected"


def test_skip_bad_warns_and_keeps_the_rest(tmp_path):
    bad = "\n".join(
        [
            "# sent_id = bad",  # 18
            row(1, "It", "it", "PRON", "PRP", "_", 2, "nsubj", "_", "_"),  # 19
            row(2, "ended", "end", "VERB", "VBD", "_", 9, "root", "_", "_"),  # 20  head 9
            "",  # 21 (blank)
            "",
        ]
    )
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
    text = "\n".join(
        [
            "# sent_id = x",
            row(1, "Hi", "hi", "INTJ", "UH", "_", 7, "root", "_", "_"),
            "",
        ]
    )
    path = write(tmp_path, text)
    (example,) = read_conllu(path, require_heads=False)
    assert example.words == ["Hi"] and example.heads is None and scored_arcs(example) == []


# ------------------------------------------------------------------ reader validation


def two_words(first=(2, "nsubj"), second=(0, "root"), sent_id="x") -> str:
    """One sentence 'It rained' with the given (head, deprel) per word; word lines are 2 and 3."""
    return "\n".join(
        [
            f"# sent_id = {sent_id}",
            row(1, "It", "it", "PRON", "PRP", "_", first[0], first[1], "_", "_"),
            row(2, "rained", "rain", "VERB", "VBD", "_", second[0], second[1], "_", "_"),
            "",
            "",
        ]
    )


def test_bom_is_accepted(tmp_path):
    path = tmp_path / "bom.conllu"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.encode("utf-8"))
    corpus = read_conllu(path)
    assert [e.sent_id for e in corpus] == ["s1", "s2"] and corpus.skipped == []
    assert corpus[0].meta["doc_id"] == "d1"  # the BOM does not hide the first comment


def test_crlf_line_ends(tmp_path):
    path = tmp_path / "crlf.conllu"
    path.write_bytes(GOOD.replace("\n", "\r\n").encode("utf-8"))
    assert [e.words for e in read_conllu(path)] == [
        e.words for e in read_conllu(write(tmp_path, GOOD))
    ]


def test_invalid_utf8_names_its_line(tmp_path):
    path = tmp_path / "bytes.conllu"
    data = GOOD.encode("utf-8").replace(b"yesterday\tyesterday", b"yester\xffday\tyesterday")
    path.write_bytes(data + S3_OK.encode("utf-8"))
    with pytest.raises(CorpusError) as info:
        read_conllu(path)
    assert str(info.value).startswith(f"{path}:15: invalid UTF-8 (byte 0xff")
    with pytest.warns(UserWarning, match="invalid UTF-8"):
        corpus = read_conllu(path, skip_bad=True)
    assert [e.sent_id for e in corpus] == ["s1", "s3"]
    assert corpus.counts == {"malformed_sentence": 1} and corpus.skipped[0].startswith(
        f"{path}:15:"
    )


@pytest.mark.parametrize(
    "text, line, message",
    [
        (two_words(first=(0, "root")), 1, "2 roots: words 1 ('It'), 2 ('rained') all have head 0"),
        (two_words(second=(1, "dep")), 1, "no root: no word has head 0"),
        (two_words(first=(2, "_")), 2, "word 1 ('It') has no relation (DEPREL '_')"),
        (two_words(second=(0, "")), 3, "word 2 ('rained') has no relation (DEPREL '')"),
        (two_words(first=(2, "ALL")), 2, "relation 'ALL' of word 1 ('It'): 'ALL' is reserved"),
        (
            two_words(first=(2, "ALL:sub")),
            2,
            "relation 'ALL:sub' of word 1 ('It'): 'ALL' is reserved",
        ),
        (two_words(first=(1, "nsubj")), 2, "word 1 ('It') is its own head"),
        (
            two_words(first=(-1, "nsubj")),
            2,
            "head '-1' of word 1 ('It') is not a word index in 0..2",
        ),
        (
            two_words(first=("_", "nsubj")),
            2,
            "head '_' of word 1 ('It') is not a word index in 0..2",
        ),
        (
            "# sent_id = c\n"
            + "\n".join(
                [
                    row(1, "a", "a", "X", "_", "_", 0, "root", "_", "_"),
                    row(2, "b", "b", "X", "_", "_", 3, "dep", "_", "_"),
                    row(3, "c", "c", "X", "_", "_", 4, "dep", "_", "_"),
                    row(4, "d", "d", "X", "_", "_", 2, "dep", "_", "_"),
                ]
            )
            + "\n\n",
            1,
            "cycle in the heads: 2 ('b') -> 3 ('c') -> 4 ('d') -> 2 ('b')",
        ),
        ("# sent_id = x\n# text = only comments\n\n", 1, "sentence has no words"),
        (
            two_words().replace("\n\n", "\n# late comment\n\n", 1),
            4,
            "comment line after the sentence's word lines",
        ),
        (two_words().replace("1\tIt", "1x\tIt"), 2, "bad word id '1x' (expected N, N-M or N.M)"),
        (
            two_words().replace("\t_\t2\tnsubj", "\tBroken\t2\tnsubj"),
            2,
            "malformed FEATS item 'Broken'",
        ),
    ],
)
def test_tree_and_row_errors_name_file_and_line(tmp_path, text, line, message):
    path = write(tmp_path, text)
    with pytest.raises(CorpusError) as info:
        read_conllu(path)
    assert str(info.value).startswith(f"{path}:{line}: {message}")
    # under skip_bad the same sentence is skipped and counted, and the next one is read
    path = write(tmp_path, text + S3_OK, name="more.conllu")
    with pytest.warns(UserWarning, match="skipping malformed sentence"):
        corpus = read_conllu(path, skip_bad=True)
    assert [e.sent_id for e in corpus] == ["s3"] and corpus.counts == {"malformed_sentence": 1}
    assert corpus.skipped == [str(info.value).replace(str(tmp_path / "t.conllu"), str(path))]


def test_duplicate_sent_id(tmp_path):
    text = two_words(sent_id="a") + two_words(sent_id="b") + two_words(sent_id="a")  # lines 1, 5, 9
    path = write(tmp_path, text)
    with pytest.raises(CorpusError) as info:
        read_conllu(path)
    assert str(info.value) == f"{path}:9: duplicate sent_id 'a' (first used at line 1)"
    with pytest.warns(UserWarning, match="skipping duplicate sent id: .*duplicate sent_id 'a'"):
        corpus = read_conllu(path, skip_bad=True)
    assert [e.source for e in corpus] == [f"{path}:1", f"{path}:5"]  # the second 'a' is skipped
    assert corpus.counts == {"duplicate_sent_id": 1} and corpus.rejected_sentences == 1


def test_units_and_sentence_ids(tmp_path):
    """METHODS §5: the document where the file marks one, else the sent_id, else "<file name>#<ordinal>"."""
    no_id = two_words().replace("# sent_id = x\n", "")
    text = (
        two_words(sent_id="lead")
        + no_id  # before any document
        + "# newdoc id = D1\n"
        + two_words(sent_id="d1-a")
        + no_id  # blocks 3, 4
        + "# newdoc\n"
        + no_id
    )  # block 5: no id
    path = write(tmp_path, text, name="u.conllu")
    corpus = read_conllu(path)
    assert [e.unit for e in corpus] == ["lead", "u.conllu#2", "D1", "D1", "u.conllu#doc2"]
    assert [e.sent_id for e in corpus] == ["lead", "u.conllu#2", "d1-a", "u.conllu#4", "u.conllu#5"]
    assert [e.meta["doc_id"] for e in corpus] == [None, None, "D1", "D1", "u.conllu#doc2"]


def test_stream_reads_as_it_is_taken_and_counts_during_the_pass(tmp_path):
    """`stream_conllu` yields a sentence before it reads the next (a malformed sentence further on
    is met only when the pass gets there), fills its skip accounting during the pass, empties it
    at the start of each pass, and gives what `read_conllu` gives."""
    bad = two_words(sent_id="bad", first=(0, "root"))  # two roots, lines 18-20
    path = write(tmp_path, GOOD + bad + S3_OK)
    stream = stream_conllu(path)
    taken = iter(stream)
    assert next(taken).sent_id == "s1" and next(taken).sent_id == "s2"  # read before the error
    with pytest.raises(CorpusError, match=f"{path}:18: 2 roots"):
        next(taken)
    stream = stream_conllu(path, skip_bad=True)
    assert (
        stream.name == str(path) and stream.total_words() == 5 + 4 + 2 + 2
    )  # word lines, ids N only
    with pytest.warns(UserWarning, match="skipping malformed sentence"):
        first = [e.sent_id for e in stream]
    assert first == ["s1", "s2", "s3"] and stream.counts == {"malformed_sentence": 1}
    with pytest.warns(UserWarning):
        taken = iter(stream)
        assert (
            next(taken).sent_id == "s1" and stream.counts == {} and stream.skipped == []
        )  # a new pass
        assert [e.sent_id for e in taken] == ["s2", "s3"] and stream.counts == {
            "malformed_sentence": 1
        }
    with pytest.warns(UserWarning):
        corpus = read_conllu(path, skip_bad=True)
        again = [e.words for e in stream]
    assert [e.words for e in corpus] == again and corpus.skipped == stream.skipped


EWT_DEV = Path(__file__).resolve().parents[2] / "shared/data/en_ewt-ud-dev.conllu"


@pytest.mark.slow
@pytest.mark.skipif(not EWT_DEV.is_file(), reason="shared EWT dev data not present")
def test_ewt_dev_counts():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing may be skipped
        corpus = read_conllu(EWT_DEV)
    assert corpus.skipped == [] and not corpus.counts
    assert len(corpus) == 2001
    assert len({e.sent_id for e in corpus}) == 2001
    assert len({e.unit for e in corpus}) == 318  # `# newdoc id` documents
    assert sum(len(ex.words) for ex in corpus) == 25_147
    assert sum(len(scored_arcs(ex)) for ex in corpus) == 20_085
    assert all(":" not in rel for ex in corpus for rel in ex.deprels)


def test_blocks_are_the_same_wherever_the_chunks_end(tmp_path):
    """The reader takes lines a chunk at a time: a block cut by a chunk's end, a run of blank
    lines, a BOM, CRLF line ends, whitespace-only lines and an undecodable line come out as
    whole blocks with the same lines, line numbers, documents, headers and errors, for every
    chunk size (one line a chunk: the line-by-line reading)."""
    text = (
        "# global.columns = ID FORM\n"
        + GOOD.replace("\n\n", "\n \t\n\n", 1)
        + "# newdoc id = d2\n"
        + S3_OK
        + "\n\n\n"
        + GOOD.replace("s1", "s4").replace("s2", "s5")
    )
    data = b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8")
    data = data.replace(b"yesterday\tyesterday", b"yester\xffday\tyesterday", 1)
    path = tmp_path / "chunks.conllu"
    path.write_bytes(data)

    def seen(blocks):
        return [
            (b.first_line, b.lines, b.ordinal, b.doc_id, b.doc_line, b.globals, str(b.error))
            for b in blocks
        ]

    whole = seen(iter_blocks(path))
    # first lines, counted by hand: the whitespace-only line 12 and the blank lines 24-27
    assert [b[0] for b in whole] == [1, 14, 20, 28, 39]
    assert whole[0][1][0] == "# global.columns = ID FORM"  # the BOM dropped, the \r too
    assert whole[1][6].startswith(f"{path}:17: invalid UTF-8")
    assert [b[3] for b in whole] == ["d1", "d1", "d2", "d1", "d1"]
    for size in (1, 2, 3, 5, 8, 13):
        assert seen(iter_blocks(path, file_lines(path), chunk_lines=size)) == whole
    # a file read in chunks of a few bytes: whole lines, numbered as file_lines numbers them
    chunks = list(file_chunks(path, size=40))
    assert len(chunks) > 10 and b"".join(c for _, c in chunks) == data
    assert [n for n, _ in chunks] == [
        1 + sum(c.count(b"\n") for _, c in chunks[:k]) for k in range(len(chunks))
    ]
