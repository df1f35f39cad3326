"""Property tests of the CoNLL-U and CorefUD readers on mutated real sentences.

Real sentences (the first sentences of UD English EWT dev, the first documents of GUM
dev, read from ../shared/data at test time) are mutated at random: lines deleted,
duplicated or swapped, a tab dropped, a head, id or relation corrupted, invalid bytes
inserted, Entity brackets dropped or duplicated, `# newdoc` lines removed, BOMs, blank
lines added or removed, whole sentences repeated. Under `skip_bad=True` every file is
either read, every sentence block accounted for (read + rejected == blocks), or refused
with a `CorpusError` whose message starts with "path:LINE:"; no other exception, ever.
Without `skip_bad` a file is read or refused the same way.
"""

from __future__ import annotations

import re
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headprobe.inputs.corpora.base import ALL, CorpusError
from headprobe.inputs.corpora.conllu import read_conllu
from headprobe.inputs.corpora.coref_windows import coref_examples
from headprobe.inputs.corpora.corefud import read_corefud

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
EWT_DEV = DATA / "en_ewt-ud-dev.conllu"
GUM_DEV = DATA / "en_gum-ud-dev.conllu"
N_EWT_SENTENCES = 40
N_GUM_DOCUMENTS = 2
BOM = b"\xef\xbb\xbf"

FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def first_blocks(path: Path, keep) -> list[bytes]:
    """The file's lines (bytes, no b"\\n") up to the block for which `keep(block_index, lines)` is False."""
    out, block, index = [], [], 0
    for raw in path.read_bytes().split(b"\n"):
        if raw.strip():
            block.append(raw)
            continue
        if block:
            if not keep(index, block):
                break
            out.extend(block + [b""])
            block, index = [], index + 1
    return out


@pytest.fixture(scope="module")
def ewt_lines() -> list[bytes]:
    if not EWT_DEV.is_file():
        pytest.skip(f"{EWT_DEV} not present")
    return first_blocks(EWT_DEV, lambda index, block: index < N_EWT_SENTENCES)


@pytest.fixture(scope="module")
def gum_lines() -> list[bytes]:
    if not GUM_DEV.is_file():
        pytest.skip(f"{GUM_DEV} not present")
    seen = []

    def keep(index, block):
        seen.extend(line for line in block if line.startswith(b"# newdoc"))
        return len(seen) <= N_GUM_DOCUMENTS

    return first_blocks(GUM_DEV, keep)


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory() as name:
        yield Path(name)


# --------------------------------------------------------------------------- mutations


def token_lines(lines):
    return [
        k for k, line in enumerate(lines) if line.count(b"\t") == 9 and not line.startswith(b"#")
    ]


def set_column(lines, a, b, column, values):
    rows = token_lines(lines)
    if rows:
        k = rows[a % len(rows)]
        columns = lines[k].split(b"\t")
        columns[column] = values[b % len(values)]
        lines[k] = b"\t".join(columns)


def entity_lines(lines):
    return [k for k, line in enumerate(lines) if b"Entity=" in line]


def change_bracket(lines, a, b, duplicate):
    rows = entity_lines(lines)
    if not rows:
        return
    k = rows[a % len(rows)]
    match = re.search(rb"Entity=([^|\t]*)", lines[k])
    chunks = re.findall(rb"\([^()]*\)?|[^()]+\)", match.group(1))
    if not chunks:
        return
    i = b % len(chunks)
    chunks[i : i + 1] = [chunks[i]] * (2 if duplicate else 0)
    value = b"".join(chunks)
    lines[k] = (
        lines[k][: match.start()]
        + (b"Entity=" + value if value else b"_")
        + lines[k][match.end() :]
    )


def blocks_of(lines):
    spans, start = [], None
    for k, line in enumerate(lines + [b""]):
        if line.strip() and start is None:
            start = k
        elif not line.strip() and start is not None:
            spans.append((start, k))
            start = None
    return spans


def mutate(lines: list[bytes], kind: str, a: int, b: int) -> None:
    """Apply one mutation in place; `a` and `b` pick where and how."""
    n = len(lines)
    if n == 0:
        return
    k = a % n
    if kind == "delete_line":
        del lines[k]
    elif kind == "duplicate_line":
        lines.insert(k, lines[k])
    elif kind == "swap_lines":
        j = b % n
        lines[k], lines[j] = lines[j], lines[k]
    elif kind == "drop_tab":
        tabs = [m.start() for m in re.finditer(b"\t", lines[k])]
        if tabs:
            t = tabs[b % len(tabs)]
            lines[k] = lines[k][:t] + lines[k][t + 1 :]
    elif kind == "head":
        set_column(
            lines, a, b, 6, [b"0", b"-1", b"999", b"x", b"_", b"", b"1", b"2", b"3", b"5", b"8"]
        )
    elif kind == "id":
        set_column(
            lines,
            a,
            b,
            0,
            [b"0", b"x", b"1.", b"2-", b"99", b"1-2", b"3.1", b"1", b"4", b"\xd9\xa3"],
        )
    elif kind == "deprel":
        set_column(lines, a, b, 7, [b"", b"_", ALL.encode(), ALL.encode() + b":x", b"root", b" "])
    elif kind == "feats":
        set_column(lines, a, b, 5, [b"Broken", b"=x", b"A=B|", b"_", b""])
    elif kind == "invalid_bytes":
        bad = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80", b"\xf0\x9f"][b % 5]
        p = b % (len(lines[k]) + 1)
        lines[k] = lines[k][:p] + bad + lines[k][p:]
    elif kind == "drop_bracket":
        change_bracket(lines, a, b, duplicate=False)
    elif kind == "duplicate_bracket":
        change_bracket(lines, a, b, duplicate=True)
    elif kind == "remove_newdoc":
        docs = [j for j, line in enumerate(lines) if line.startswith(b"# newdoc")]
        for j in docs if b % 2 else docs[a % len(docs) : a % len(docs) + 1] if docs else []:
            lines[j] = b"# removed"
    elif kind == "bom":
        j = 0 if b % 2 else k
        lines[j] = BOM + lines[j]
    elif kind == "insert_blank":
        lines.insert(k, [b"", b"  ", b"\r", b"\t"][b % 4])
    elif kind == "delete_blank":
        blanks = [j for j, line in enumerate(lines) if not line.strip()]
        if blanks:
            del lines[blanks[a % len(blanks)]]
    elif kind == "insert_comment":
        lines.insert(
            k,
            [
                b"# note = x",
                b"# sent_id = dup",
                b"# newdoc id = extra",
                b"#",
                b"# global.Entity = ",
            ][b % 5],
        )
    elif kind == "duplicate_block":
        spans = blocks_of(lines)
        if spans:
            s, e = spans[a % len(spans)]
            lines[e:e] = [b""] + lines[s:e]
    elif kind == "crlf":
        lines[k] = lines[k] + b"\r"
    elif kind == "truncate":
        lines[k] = lines[k][: b % (len(lines[k]) + 1)]
        del lines[k + 1 :]


MUTATIONS = [
    "delete_line",
    "duplicate_line",
    "swap_lines",
    "drop_tab",
    "head",
    "id",
    "deprel",
    "feats",
    "invalid_bytes",
    "drop_bracket",
    "duplicate_bracket",
    "remove_newdoc",
    "bom",
    "insert_blank",
    "delete_blank",
    "insert_comment",
    "duplicate_block",
    "crlf",
    "truncate",
]
mutation_lists = st.lists(
    st.tuples(st.sampled_from(MUTATIONS), st.integers(0, 10_000), st.integers(0, 10_000)),
    min_size=1,
    max_size=4,
)


def mutated_file(workdir: Path, lines: list[bytes], mutations, name: str) -> tuple[Path, bytes]:
    lines = list(lines)
    for kind, a, b in mutations:
        mutate(lines, kind, a, b)
    data = b"\n".join(lines) + b"\n"
    path = workdir / name
    path.write_bytes(data)
    return path, data


def count_blocks(data: bytes) -> int:
    """Sentence blocks as the readers define them: runs of lines that are not whitespace only
    (an undecodable line is not blank); a BOM at the start of the file is dropped."""
    if data.startswith(BOM):
        data = data[len(BOM) :]
    n, inside = 0, False
    for raw in data.split(b"\n"):
        try:
            blank = raw.decode("utf-8").strip() == ""
        except UnicodeDecodeError:
            blank = False
        if blank:
            inside = False
        elif not inside:
            n, inside = n + 1, True
    return n


def assert_located(error: CorpusError, path: Path) -> None:
    assert re.match(re.escape(str(path)) + r":[0-9]+: ", str(error)), str(error)


def read_quietly(reader, path, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return reader(path, **options)


def check_example_tree(heads, deprels, n):
    assert len(heads) == len(deprels) == n and heads.count(-1) == 1
    assert (
        all(-1 <= h < n for h in heads)
        and ALL not in deprels
        and "_" not in deprels
        and "" not in deprels
    )


# ------------------------------------------------------------------------------ properties


@FUZZ
@given(mutations=mutation_lists)
def test_treebank_reader_accounts_for_every_block(ewt_lines, workdir, mutations):
    path, data = mutated_file(workdir, ewt_lines, mutations, "ewt.conllu")
    try:
        corpus = read_quietly(read_conllu, path, skip_bad=True)
    except CorpusError as error:
        assert_located(error, path)
        return
    assert len(corpus) + corpus.rejected_sentences == count_blocks(data)
    assert len(corpus.skipped) == sum(corpus.counts.values())
    for message in corpus.skipped:
        assert re.match(re.escape(str(path)) + r":[0-9]+: ", message), message
    assert len({e.sent_id for e in corpus}) == len(corpus)
    for example in corpus:
        check_example_tree(example.heads, example.deprels, len(example.words))
        assert example.unit and example.source.startswith(f"{path}:")
    try:
        strict = read_conllu(path)
    except CorpusError as error:
        assert_located(error, path)
        assert (
            corpus.skipped and str(error) == corpus.skipped[0]
        )  # the first problem, the same words
    else:
        assert not corpus.skipped and [e.words for e in strict] == [e.words for e in corpus]


@FUZZ
@given(mutations=mutation_lists)
def test_corefud_reader_accounts_for_every_block(gum_lines, workdir, mutations):
    path, data = mutated_file(workdir, gum_lines, mutations, "gum.conllu")
    try:
        documents = read_quietly(read_corefud, path, skip_bad=True)
    except CorpusError as error:
        assert_located(error, path)
        assert "no '# newdoc id' line" in str(error)  # the one refusal of a whole file
        documents = read_quietly(read_corefud, path, skip_bad=True, single_document=True)
    n_sentences = sum(len(d.sentences) for d in documents)
    assert n_sentences + documents.rejected_sentences == count_blocks(data)
    for message in documents.skipped:
        assert re.match(re.escape(str(path)) + r":[0-9]+: ", message), message
    for document in documents:
        assert document.sentences and document.doc_id
        for s in document.sentences:
            check_example_tree(s.heads, s.deprels, len(s.words))
        for m in document.mentions:
            assert 0 <= m.start <= m.head < m.end <= document.n_words
    windows = coref_examples(documents, lambda words: len(words) + 2, window=64)
    assert windows.counts["sentences"] == n_sentences
    for window in windows:
        assert window.unit in {d.doc_id for d in documents}
        for m in window.mentions:
            assert 0 <= m.start <= m.head < m.end <= len(window.words)
    try:
        read_corefud(path)
    except CorpusError as error:
        assert_located(error, path)


def test_unmutated_samples_read_cleanly(ewt_lines, gum_lines, workdir):
    path, data = mutated_file(workdir, ewt_lines, [], "ewt.conllu")
    assert len(read_conllu(path)) == count_blocks(data) == N_EWT_SENTENCES
    path, data = mutated_file(workdir, gum_lines, [], "gum.conllu")
    documents = read_corefud(path)
    assert len(documents) == N_GUM_DOCUMENTS and documents.skipped == []
    assert sum(len(d.sentences) for d in documents) == count_blocks(data)
