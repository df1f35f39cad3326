"""CoNLL-U reading: one layer of blocks, rows and validation for treebanks and CorefUD.

    corpus = read_conllu("en_ewt-ud-dev.conllu")               # Corpus of Examples (gold arcs)
    stream = stream_conllu("en_ewt-ud-dev.conllu")             # the same, read lazily (a Stream)
    corpus = read_conllu(path, skip_bad=True)                  # bad sentences skipped, counted
    for block in iter_blocks(path):                            # the layer readers build on
        sentence = read_sentence(block, ids)                   # validated rows, heads, sent_id

Lines are read as bytes and decoded one by one (invalid UTF-8 names its line; a UTF-8
BOM at the start of the file is dropped); a gzip-compressed file (`en_ewt-ud-dev.conllu.gz`)
is read the same way, decompressed as it goes, its lines numbered as in the text inside. Blank (whitespace-only) lines separate
sentence blocks. Syntactic words only: multiword range lines (`3-4`) and empty nodes
(`5.1`) are rows but not words. A malformed sentence raises a `CorpusError`
("path:line: what is wrong"); with `skip_bad=True` it is skipped, warned about and
counted, and every other sentence is kept. Checked per sentence: ten tab-separated
columns; ids `N`, `N-M` or `N.M`; word ids 1, 2, ... in order; comments before the
word lines; FEATS as `Key=Value|...`; a tree (`base.check_tree`: heads in 0..n, one
root, no cycle, a relation other than `_` and the reserved `ALL`); and a `# sent_id`
not used before in the file.

Units (METHODS §5): `Example.unit` is the `# newdoc id` of the sentence's document
where the file marks documents, else its `sent_id`, else "<file name>#<ordinal>" (the
sentence block's 1-based ordinal in the file); `Example.sent_id` is the sentence's own
id (`sent_id`, else the same "<file name>#<ordinal>").

Why hand-written and not the `conllu` package: `conllu.parse` (checked with conllu
6.0.0) accepts, without a word, a head pointing outside the sentence, two roots and a
word line of 8 columns, and gives no line numbers. The errors promised here
("path:line: what is wrong", counted skips under `--skip-bad`) need the checks and the
line numbers this reader keeps, in one pass over the bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from headprobe.inputs.corpora.base import (
    Corpus,
    CorpusError,
    Example,
    SentIds,
    Stream,
    check_tree,
    decode_lines,
    file_lines,
)

N_COLUMNS = 10
WORD, RANGE, EMPTY = "word", "range", "empty"
_ID_KINDS = (
    (re.compile(r"[0-9]+"), WORD),
    (re.compile(r"[0-9]+-[0-9]+"), RANGE),
    (re.compile(r"[0-9]+\.[0-9]+"), EMPTY),
)


@dataclass
class Block:
    """The raw lines of one sentence and where they stand in the file."""

    path: str
    first_line: int  # 1-based line number of the block's first line
    lines: list[str]  # decoded (an undecodable line: with U+FFFD, and `error` set)
    ordinal: int  # 1-based position of the block among the file's blocks
    doc_id: str | None  # id of the latest `# newdoc` seen, this block's included (None: none yet)
    doc_line: int | None  # line of that `# newdoc` (tells apart documents that share an id)
    globals: dict = field(default_factory=dict)  # latest `# global.KEY = value` seen: KEY -> value
    error: CorpusError | None = None  # the block's first undecodable line

    def where(self, offset: int = 0) -> str:
        return f"{self.path}:{self.first_line + offset}"

    def comments(self) -> Iterator[tuple[int, str, str]]:
        """(line, key, value) of each `# key = value` comment (value "" without `=`)."""
        for offset, line in enumerate(self.lines):
            if line.startswith("#"):
                key, _, value = line[1:].partition("=")
                yield self.first_line + offset, key.strip(), value.strip()


@dataclass
class Row:
    """One non-comment line of a block: a word, a multiword range or an empty node."""

    line: int  # 1-based line number in the file
    id: str
    kind: str  # WORD, RANGE or EMPTY
    form: str
    upos: str
    feats: dict  # parsed for words ({} for `_`), {} otherwise
    head: str  # the raw HEAD column
    deprel: str
    misc: str


@dataclass
class Sentence:
    """A validated sentence block: its rows, words and (if asked for) tree."""

    block: Block
    rows: list[Row]  # every row, in file order
    words: list[Row]  # the syntactic words, ids 1..n
    heads: list[int] | None  # 0-based, -1 for root (None: heads not read)
    sent_id: str  # `# sent_id`, else "<file name>#<ordinal>"
    meta: dict  # `# key = value` comments

    @property
    def unit(self) -> str:
        """METHODS §5: the document id where the file marks documents, else the sentence id."""
        return self.block.doc_id or self.sent_id


# ------------------------------------------------------------------------------- lines


def iter_blocks(path: str | Path, raw_lines: Iterable[bytes] | None = None) -> Iterator[Block]:
    """Split a CoNLL-U file (or `raw_lines` named `path`) into sentence blocks.

    Blocks are separated by lines of whitespace only. Each block knows its document
    (the latest `# newdoc id`, whatever block it stood in) and the latest `# global.*`
    headers, so a skipped block still opens its document and sets its headers.
    """
    path = str(path)
    if raw_lines is None:
        raw_lines = file_lines(path)
    doc_id = doc_line = None
    n_docs = 0
    headers: dict[str, str] = {}
    lines: list[str] = []
    first, ordinal, error = 0, 0, None
    for number, line, line_error in decode_lines(raw_lines, path):
        if line.strip() == "":
            if lines:
                ordinal += 1
                yield Block(path, first, lines, ordinal, doc_id, doc_line, headers, error)
                lines, error = [], None
            continue
        if not lines:
            first = number
        error = error or line_error
        if line.startswith("#"):
            key, sep, value = (part.strip() for part in line[1:].partition("="))
            if key == "newdoc id" or (key == "newdoc" and not sep):
                n_docs += 1
                doc_id = value or f"{Path(path).name}#doc{n_docs}"
                doc_line = number
            elif key.startswith("global.") and sep:
                headers = {**headers, key[len("global.") :]: value}
        lines.append(line)
    if lines:
        yield Block(path, first, lines, ordinal + 1, doc_id, doc_line, headers, error)


# ---------------------------------------------------------------------------- validation


def parse_feats(text: str, where: str) -> dict:
    """FEATS `Key=Value|...` -> dict (`_` -> {})."""
    if text in ("_", ""):
        return {}
    feats = {}
    for item in text.split("|"):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CorpusError(f"{where}: malformed FEATS item {item!r} (expected Key=Value)")
        feats[key] = value
    return feats


def block_rows(block: Block) -> list[Row]:
    """The validated rows of a block (see the module docstring for what is checked)."""
    if block.error is not None:
        raise block.error
    rows: list[Row] = []
    n_words = 0
    for offset, line in enumerate(block.lines):
        where = block.where(offset)
        if line.startswith("#"):
            if rows:
                raise CorpusError(f"{where}: comment line after the sentence's word lines")
            continue
        columns = line.split("\t")
        if len(columns) != N_COLUMNS:
            raise CorpusError(
                f"{where}: expected {N_COLUMNS} tab-separated columns, found {len(columns)}"
            )
        token_id = columns[0]
        kind = next((kind for pattern, kind in _ID_KINDS if pattern.fullmatch(token_id)), None)
        if kind is None:
            raise CorpusError(f"{where}: bad word id {token_id!r} (expected N, N-M or N.M)")
        feats = {}
        if kind == WORD:
            n_words += 1
            if int(token_id) != n_words:
                raise CorpusError(f"{where}: word id {token_id!r} where {n_words} was expected")
            feats = parse_feats(columns[5], where)
        rows.append(
            Row(
                block.first_line + offset,
                token_id,
                kind,
                columns[1],
                columns[3],
                feats,
                columns[6],
                columns[7],
                columns[9],
            )
        )
    if n_words == 0:
        raise CorpusError(f"{block.where()}: sentence has no words")
    return rows


def check_heads(block: Block, words: list[Row]) -> list[int]:
    """0-based heads (-1 for root) of a block's words, the tree validated (`base.check_tree`)."""
    return check_tree(
        [w.form for w in words],
        [w.head for w in words],
        [w.deprel for w in words],
        block.where(),
        [f"{block.path}:{w.line}" for w in words],
    )


def read_sentence(block: Block, ids: SentIds, require_heads: bool = True) -> Sentence:
    """Validate one block into a `Sentence`; its `sent_id` is registered in `ids` (one use per file)."""
    rows = block_rows(block)
    words = [row for row in rows if row.kind == WORD]
    heads = check_heads(block, words) if require_heads else None
    meta, sent_id = {}, None
    for line, key, value in block.comments():
        meta.setdefault(key, value)
        if key == "sent_id" and value and sent_id is None:
            ids.add(value, f"{block.path}:{line}", f"line {line}")
            sent_id = value
    return Sentence(
        block, rows, words, heads, sent_id or f"{Path(block.path).name}#{block.ordinal}", meta
    )


# ------------------------------------------------------------------------------- treebank


def sentence_example(sentence: Sentence, conventions=None) -> Example:
    """A dependency `Example` of one sentence; relations with their subtype cut, or kept under
    conventions that keep them (`headprobe.inputs.conventions`, e.g. "joanacero")."""
    from headprobe.inputs.conventions import get_conventions

    relation = get_conventions(conventions).relation
    words, block = sentence.words, sentence.block
    return Example(
        words=[w.form for w in words],
        unit=sentence.unit,
        source=block.where(),
        heads=sentence.heads,
        deprels=[relation(w.deprel) for w in words] if sentence.heads is not None else None,
        upos=[w.upos for w in words],
        feats=[dict(w.feats) for w in words],
        meta={"doc_id": block.doc_id, "text": sentence.meta.get("text")},
        sent_id=sentence.sent_id,
    )


def stream_conllu(
    path: str | Path, *, skip_bad: bool = False, require_heads: bool = True, conventions=None
) -> Stream:
    """The sentences of a CoNLL-U file as a lazy `Stream` of `Example`s with gold arcs: each pass
    reads the file again, one sentence at a time (`read_conllu` for the rules).

        stream = stream_conllu("en_ewt-ud-dev.conllu", skip_bad=True)
        for example in stream: ...
        stream.counts["malformed_sentence"]          # complete after the pass
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"no CoNLL-U file at {path}")

    def read(sink):
        ids = SentIds()
        for block in iter_blocks(path):
            try:
                sentence = read_sentence(block, ids, require_heads)
            except CorpusError as exc:
                sink.reject(exc, skip_bad)
                continue
            yield sentence_example(sentence, conventions)

    return Stream(read, name=str(path), total_words=lambda: count_word_lines(path))


def count_word_lines(path: str | Path) -> int:
    """Syntactic word lines of a CoNLL-U file (first column a whole number), counted without
    parsing: a cheap total for a progress bar (malformed sentences included)."""
    n = 0
    for line in file_lines(path):  # gzip-compressed files included
        if line[:1].isdigit() and line.split(b"\t", 1)[0].isdigit():
            n += 1
    return n


def read_conllu(
    path: str | Path, *, skip_bad: bool = False, require_heads: bool = True, conventions=None
) -> Corpus:
    """Read every sentence of a CoNLL-U file as an `Example` with gold arcs (a `Corpus`, in memory;
    `stream_conllu` reads it lazily).

    A malformed sentence raises `CorpusError` ("path:line: what is wrong"), or with
    `skip_bad=True` is skipped with a warning, listed in `corpus.skipped` and counted in
    `corpus.counts` by reason (`malformed_sentence`, `duplicate_sent_id`: the second use
    of an id is skipped). `require_heads=False` reads words only (no tree, no arcs).
    `conventions` (`headprobe.inputs.conventions` preset; default `headprobe`, METHODS §2) decides whether relation
    subtypes are cut (`obl:tmod` -> `obl`) or kept.
    """
    return stream_conllu(
        path, skip_bad=skip_bad, require_heads=require_heads, conventions=conventions
    ).collect()
