"""CoNLL-U treebanks -> dependency `Example`s (gold arcs).

Syntactic words only: multiword range lines (`3-4`) and empty nodes (`5.1`) are
skipped. Each sentence is validated line by line, so a malformed sentence
raises a `CorpusError` naming the file and line; with `skip_bad=True` it is
skipped, counted and warned about, and every other sentence is kept.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import conllu

from headprobe.corpora.base import CorpusError, Example, base_relation

N_COLUMNS = 10


@dataclass
class Block:
    """The raw lines of one sentence and where they stand in the file."""

    path: str
    first_line: int        # 1-based line number of the block's first line
    lines: list[str]
    doc_id: str | None     # the latest `# newdoc id` seen (None if there is none)

    def where(self, offset: int = 0) -> str:
        return f"{self.path}:{self.first_line + offset}"


@dataclass
class Token:
    """One syntactic word of a block, with the line it came from."""

    line: int              # 1-based line number in the file
    fields: dict           # parsed by the `conllu` library (id, form, head, deprel, feats, misc, ...)


class Corpus(list):
    """A list of `Example`s that also remembers what was skipped, and why."""

    def __init__(self, items=(), skipped=None):
        super().__init__(items)
        self.skipped: list[str] = list(skipped or [])

    def reject(self, error: CorpusError, skip_bad: bool) -> None:
        """Raise a malformed sentence's error, or with `skip_bad` warn, count it and go on."""
        if not skip_bad:
            raise error
        warnings.warn(f"skipping malformed sentence: {error}", stacklevel=3)
        self.skipped.append(str(error))


def iter_blocks(path: str | Path) -> Iterator[Block]:
    """Split a CoNLL-U file into sentence blocks (blank-line separated)."""
    path = str(path)
    doc_id = None
    lines: list[str] = []
    first = 0
    with open(path, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, start=1):
            line = raw.rstrip("\n").rstrip("\r")
            if line.strip() == "":
                if lines:
                    yield Block(path, first, lines, doc_id)
                    lines = []
                continue
            if not lines:
                first = number
            if line.startswith("# newdoc"):
                doc_id = line.split("=", 1)[1].strip() if "=" in line else f"doc@{number}"
            lines.append(line)
    if lines:
        yield Block(path, first, lines, doc_id)


def block_metadata(block: Block) -> dict[str, str]:
    """`# key = value` comments of a block."""
    meta = {}
    for line in block.lines:
        if line.startswith("#") and "=" in line:
            key, value = line[1:].split("=", 1)
            meta[key.strip()] = value.strip()
    return meta


def block_tokens(block: Block) -> list[Token]:
    """Validated syntactic words of a block (ranges and empty nodes dropped).

    Raises `CorpusError` naming file and line for a wrong column count, a bad id,
    ids that do not run 1..n, or a head outside 0..n.
    """
    tokens: list[Token] = []
    for offset, line in enumerate(block.lines):
        if line.startswith("#"):
            continue
        where = block.where(offset)
        columns = line.split("\t")
        if len(columns) != N_COLUMNS:
            raise CorpusError(f"{where}: expected {N_COLUMNS} tab-separated columns, found {len(columns)}")
        token_id = columns[0]
        if "-" in token_id or "." in token_id:
            continue                                   # multiword range or empty node: not a word
        if not token_id.isdigit():
            raise CorpusError(f"{where}: bad word id {token_id!r}")
        try:
            fields = conllu.parse_token_and_metadata(line + "\n").pop()
        except Exception as exc:  # the conllu library's own parse errors
            raise CorpusError(f"{where}: {exc}") from exc
        tokens.append(Token(block.first_line + offset, fields))
    if not tokens:
        raise CorpusError(f"{block.where()}: sentence has no words")
    n = len(tokens)
    for expected, token in enumerate(tokens, start=1):
        if token.fields["id"] != expected:
            raise CorpusError(
                f"{block.path}:{token.line}: word ids must run 1..{n} in order; found {token.fields['id']}"
                f" where {expected} was expected"
            )
    return tokens


def check_heads(block: Block, tokens: list[Token]) -> list[int]:
    """0-based heads (-1 for root), validated against the sentence length."""
    n = len(tokens)
    heads = []
    for token in tokens:
        head = token.fields["head"]
        if not isinstance(head, int) or not 0 <= head <= n:
            raise CorpusError(
                f"{block.path}:{token.line}: head {head!r} of word {token.fields['id']} "
                f"({token.fields['form']!r}) is not a word index in 0..{n}"
            )
        if head == token.fields["id"]:
            raise CorpusError(f"{block.path}:{token.line}: word {head} is its own head")
        heads.append(head - 1)
    return heads


def block_to_example(block: Block, tokens: list[Token], heads: list[int] | None) -> Example:
    meta = block_metadata(block)
    unit = meta.get("sent_id") or block.where()
    return Example(
        words=[t.fields["form"] for t in tokens],
        unit=unit,
        source=block.where(),
        heads=heads,
        deprels=[base_relation(str(t.fields["deprel"])) for t in tokens] if heads is not None else None,
        upos=[str(t.fields["upos"]) for t in tokens],
        feats=[dict(t.fields["feats"] or {}) for t in tokens],
        meta={"doc_id": block.doc_id, "text": meta.get("text")},
    )


def read_conllu(path: str | Path, *, skip_bad: bool = False, require_heads: bool = True) -> Corpus:
    """Read every sentence of a CoNLL-U file as an `Example` with gold arcs.

    A malformed sentence raises `CorpusError` ("file:line: what is wrong"), or with
    `skip_bad=True` is skipped with a warning and listed in `corpus.skipped`.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"no CoNLL-U file at {path}")
    corpus = Corpus()
    for block in iter_blocks(path):
        try:
            tokens = block_tokens(block)
            heads = check_heads(block, tokens) if require_heads else None
        except CorpusError as exc:
            corpus.reject(exc, skip_bad)
            continue
        corpus.append(block_to_example(block, tokens, heads))
    return corpus
