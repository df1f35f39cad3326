"""CoNLL-U reading: one layer of blocks, rows and validation for treebanks and CorefUD.

    corpus = read_conllu("en_ewt-ud-dev.conllu")               # Corpus of Examples (gold arcs)
    stream = stream_conllu("en_ewt-ud-dev.conllu")             # the same, read lazily (a Stream)
    corpus = read_conllu(path, skip_bad=True)                  # bad sentences skipped, counted
    for block in iter_blocks(path):                            # the layer readers build on
        sentence = read_sentence(block, ids)                   # validated rows, heads, sent_id

Lines are read as bytes, a megabyte at a time, and decoded (invalid UTF-8 names its line; a
UTF-8 BOM at the start of the file is dropped); a gzip-compressed file (`en_ewt-ud-dev.conllu.gz`)
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
from functools import cached_property, lru_cache
from itertools import repeat
from pathlib import Path

from headprobe.inputs.conventions import get_conventions
from headprobe.inputs.corpora.base import (
    Corpus,
    CorpusError,
    Example,
    SentIds,
    Stream,
    check_tree,
    decode_chunk,
    file_chunks,
    file_lines,
    line_chunks,
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


@dataclass(slots=True)
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
class Table:
    """A block's validated rows as their fields (`block_table`): read for the whole block at
    once, a `Row` each only where one is asked for (`rows`)."""

    first: int  # the first row's line (the rows are consecutive lines)
    fields: list[str]  # every row's ten columns, row after row
    kinds: list[str]  # each row's kind: WORD, RANGE or EMPTY
    feats: list[dict]  # each row's FEATS, parsed for words ({} for `_`), {} otherwise

    def column(self, k: int) -> list[str]:
        """Column k (0-based: 0 ID, 1 FORM, ... 9 MISC) of every row."""
        return self.fields[k::N_COLUMNS]

    def rows(self) -> list[Row]:
        c = [self.column(k) for k in range(N_COLUMNS)]
        return [
            Row(self.first + k, c[0][k], kind, c[1][k], c[3][k], feats, c[6][k], c[7][k], c[9][k])
            for k, (kind, feats) in enumerate(zip(self.kinds, self.feats))
        ]

    def words(self, k: int) -> list:
        """Column k of the syntactic words, in order (FEATS: the parsed dicts)."""
        values = self.feats if k == 5 else self.column(k)
        if self._words_only:
            return values
        return [v for v, kind in zip(values, self.kinds) if kind == WORD]

    @cached_property
    def _words_only(self) -> bool:
        return len(self.kinds) == self.kinds.count(WORD)

    def word_line(self, k: int) -> int:
        """The line of word k (0-based)."""
        return self.first + [i for i, kind in enumerate(self.kinds) if kind == WORD][k]


class Sentence:
    """A validated sentence block: its rows, words and (if asked for) tree."""

    def __init__(self, block: Block, table: Table, heads, sent_id: str, meta: dict):
        self.block = block
        self.table = table
        self.heads: list[int] | None = heads  # 0-based, -1 for root (None: heads not read)
        self.sent_id = sent_id  # `# sent_id`, else "<file name>#<ordinal>"
        self.meta = meta  # `# key = value` comments

    @cached_property
    def rows(self) -> list[Row]:
        """Every row, in file order."""
        return self.table.rows()

    @cached_property
    def words(self) -> list[Row]:
        """The syntactic words, ids 1..n."""
        return [row for row in self.rows if row.kind == WORD]

    @property
    def unit(self) -> str:
        """METHODS §5: the document id where the file marks documents, else the sentence id."""
        return self.block.doc_id or self.sent_id


# ------------------------------------------------------------------------------- lines


def iter_blocks(
    path: str | Path, raw_lines: Iterable[bytes] | None = None, chunk_lines: int = 4096
) -> Iterator[Block]:
    """Split a CoNLL-U file (or `raw_lines` named `path`) into sentence blocks.

    Blocks are separated by lines of whitespace only. Each block knows its document
    (the latest `# newdoc id`, whatever block it stood in) and the latest `# global.*`
    headers, so a skipped block still opens its document and sets its headers.
    `chunk_lines`: `raw_lines` are taken this many at a time.

    The file is read and decoded a megabyte at a time (`base.file_chunks`, `base.decode_chunk`),
    and the blank and comment lines are found by a list comprehension over a chunk's lines:
    the reader's own Python runs per block and per comment, not per line.
    """
    path = str(path)
    chunks = file_chunks(path) if raw_lines is None else line_chunks(raw_lines, chunk_lines)
    state = _Documents(path)
    lines: list[str] = []  # the block being gathered (it may run on into the next chunk)
    first, ordinal, error = 0, 0, None
    for start, chunk in chunks:
        texts, errors = decode_chunk(chunk, path, start)
        blanks = [i for i, line in enumerate(texts) if not line or line.isspace()]
        begin = 0
        for end in [*blanks, len(texts)]:
            if end > begin:  # lines begin..end-1 belong to a block
                if not lines:
                    first = start + begin
                part = texts[begin:end]
                # only a comment that may open a document or set a header is read here
                for offset in [
                    k
                    for k, line in enumerate(part)
                    if line[:1] == "#" and ("newdoc" in line or "global." in line)
                ]:
                    state.comment(part[offset], start + begin + offset)
                if errors and error is None:
                    error = next(
                        (errors[n] for n in range(start + begin, start + end) if n in errors), None
                    )
                lines += part
            if end < len(texts) and lines:  # a blank line ends the block
                ordinal += 1
                yield Block(path, first, lines, ordinal, *state.now(), error)
                lines, error = [], None
            begin = end + 1
    if lines:
        yield Block(path, first, lines, ordinal + 1, *state.now(), error)


class _Documents:
    """The latest `# newdoc id` and `# global.*` headers seen in a file, as `iter_blocks` reads it."""

    def __init__(self, path: str):
        self.path, self.doc_id, self.doc_line, self.n_docs = path, None, None, 0
        self.headers: dict[str, str] = {}

    def comment(self, line: str, number: int) -> None:
        key, sep, value = (part.strip() for part in line[1:].partition("="))
        if key == "newdoc id" or (key == "newdoc" and not sep):
            self.n_docs += 1
            self.doc_id = value or f"{Path(self.path).name}#doc{self.n_docs}"
            self.doc_line = number
        elif key.startswith("global.") and sep:
            self.headers = {**self.headers, key[len("global.") :]: value}

    def now(self) -> tuple:
        """(doc_id, doc_line, headers): a block's `Block` fields."""
        return self.doc_id, self.doc_line, self.headers


# ---------------------------------------------------------------------------- validation


def parse_feats(text: str, where: str) -> dict:
    """FEATS `Key=Value|...` -> a new dict (`_` -> {}). `where`: the line's "path:line" (written
    into the error of a malformed item)."""
    items = _feats_items(text)
    if items is None:
        for item in text.split("|"):
            key, sep, _ = item.partition("=")
            if not sep or not key:
                raise CorpusError(f"{where}: malformed FEATS item {item!r} (expected Key=Value)")
    return dict(items)


@lru_cache(maxsize=2**14)
def _feats_items(text: str) -> tuple | None:
    """The (key, value) items of a FEATS text, None where an item is malformed. Cached: a
    treebank has few distinct FEATS texts (EWT dev: 151 over 25,147 words), and a dict made
    from the cached items costs a fifth of parsing the text again."""
    if text in ("_", ""):
        return ()
    items = []
    for item in text.split("|"):
        key, sep, value = item.partition("=")
        if not sep or not key:
            return None
        items.append((key, value))
    return tuple(items)


def block_table(block: Block) -> Table:
    """The validated rows of a block (see the module docstring for what is checked).

    A block of comments then rows of ten columns, its words numbered 1..n, is read with a few
    list operations (the words' ids compared as one list); any other block is read line by line,
    to name what is wrong. A line's place ("path:line") is written only for an error."""
    if block.error is not None:
        raise block.error
    quick = _plain_table(block)
    if quick is not None:
        return quick
    fields, kinds, feats_of = [], [], []
    n_words = 0
    first = None
    for offset, line in enumerate(block.lines):
        if line[:1] == "#":
            if kinds:
                raise CorpusError(
                    f"{block.where(offset)}: comment line after the sentence's word lines"
                )
            continue
        columns = line.split("\t")
        if len(columns) != N_COLUMNS:
            raise CorpusError(
                f"{block.where(offset)}: expected {N_COLUMNS} tab-separated columns, "
                f"found {len(columns)}"
            )
        token_id = columns[0]
        kind = _id_kind(token_id)
        if kind is None:
            raise CorpusError(
                f"{block.where(offset)}: bad word id {token_id!r} (expected N, N-M or N.M)"
            )
        feats = {}
        if kind == WORD:
            n_words += 1
            if int(token_id) != n_words:
                raise CorpusError(
                    f"{block.where(offset)}: word id {token_id!r} where {n_words} was expected"
                )
            feats = parse_feats(columns[5], block.where(offset))
        if first is None:
            first = block.first_line + offset
        fields += columns
        kinds.append(kind)
        feats_of.append(feats)
    if n_words == 0:
        raise CorpusError(f"{block.where()}: sentence has no words")
    return Table(first, fields, kinds, feats_of)


def _id_kind(token_id: str) -> str | None:
    """WORD, RANGE or EMPTY for an ID column (a plain number told without a pattern), else None."""
    if token_id.isascii() and token_id.isdigit():
        return WORD
    return next((kind for pattern, kind in _ID_KINDS if pattern.fullmatch(token_id)), None)


_NUMBERS = [str(k) for k in range(1, 1025)]  # the ids of a plain sentence's words


def _plain_table(block: Block) -> Table | None:
    """`block_table` of a block of comments then rows of ten columns each, its words numbered
    1..n; None for any other block (or a malformed FEATS), which `block_table` reads line by line."""
    lines = block.lines
    start = 0
    while start < len(lines) and lines[start][:1] == "#":
        start += 1
    body = lines[start:]
    if not body or set(map(str.count, body, repeat("\t", len(body)))) != {N_COLUMNS - 1}:
        return None
    fields = "\t".join(body).split("\t")  # one split for the block: ten fields a row
    ids = fields[::N_COLUMNS]
    words_only = ids == _NUMBERS[: len(ids)]  # the usual case
    if words_only:
        kinds = [WORD] * len(ids)
    else:  # multiword ranges or empty nodes (a block of words alone has ids 1..n)
        kinds = list(map(_id_kind, ids))
        n = kinds.count(WORD)
        words = [i for i, kind in zip(ids, kinds) if kind == WORD]
        if None in kinds or not 0 < n <= len(_NUMBERS) or words != _NUMBERS[:n]:
            return None
    texts = fields[5::N_COLUMNS]
    if words_only:
        items = list(map(_feats_items, texts))
    else:
        items = [_feats_items(t) if kind == WORD else () for t, kind in zip(texts, kinds)]
    if None in items:  # a malformed FEATS
        return None
    return Table(block.first_line + start, fields, kinds, list(map(dict, items)))


class _WordLines:
    """ "path:line" of each word of a block, written only when a check names one."""

    def __init__(self, block: Block, table: Table):
        self.path, self.table = block.path, table

    def __getitem__(self, k: int) -> str:
        return f"{self.path}:{self.table.word_line(k)}"


def check_heads(block: Block, table: Table) -> list[int]:
    """0-based heads (-1 for root) of a block's words, the tree validated (`base.check_tree`)."""
    return check_tree(
        table.words(1),
        table.words(6),
        table.words(7),
        block.where(),
        _WordLines(block, table),
    )


def read_sentence(block: Block, ids: SentIds, require_heads: bool = True) -> Sentence:
    """Validate one block into a `Sentence`; its `sent_id` is registered in `ids` (one use per file)."""
    table = block_table(block)
    heads = check_heads(block, table) if require_heads else None
    meta, sent_id = {}, None
    for line, key, value in block.comments():
        meta.setdefault(key, value)
        if key == "sent_id" and value and sent_id is None:
            ids.add(value, f"{block.path}:{line}", f"line {line}")
            sent_id = value
    return Sentence(
        block, table, heads, sent_id or f"{Path(block.path).name}#{block.ordinal}", meta
    )


# ------------------------------------------------------------------------------- treebank


def sentence_example(sentence: Sentence, conventions=None) -> Example:
    """A dependency `Example` of one sentence; relations with their subtype cut, or kept under
    conventions that keep them (`headprobe.inputs.conventions`, e.g. "joanacero")."""
    relation = get_conventions(conventions).relation
    table, block = sentence.table, sentence.block
    deprels = None
    if sentence.heads is not None:
        raw = table.words(7)
        labels = {deprel: relation(deprel) for deprel in set(raw)}
        deprels = list(map(labels.__getitem__, raw))
    return Example(
        words=table.words(1),
        unit=sentence.unit,
        source=block.where(),
        heads=sentence.heads,
        deprels=deprels,
        upos=table.words(3),
        feats=table.words(5),  # the table's own dicts, made for it
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

    conventions = get_conventions(conventions)  # once, not per sentence

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
