"""CorefUD coreference (`Entity=` in the CoNLL-U MISC column) -> documents (their windows:
`headprobe.inputs.corpora.coref_windows`).

    documents = read_corefud("en_gum-ud-dev.conllu")                 # Corpus of CorefDocuments

Reading (`read_corefud`, `parse_corefud`)
-----------------------------------------
Lines, sentence blocks, rows and trees are read and validated by the treebank reader's
layer (`headprobe.inputs.corpora.conllu`: `iter_blocks`, `read_sentence`), with the same
errors (a gzip-compressed `.conllu.gz` is read the same way); this module adds only coreference: `Entity` brackets, mentions and documents. A CorefUD file is read into `CorefDocument`s (one per `# newdoc id`), each with
its sentences (syntactic words only: multiword range lines `3-4` and empty nodes `5.1`
are not words) and its mentions in **document** word coordinates.

A file without any `# newdoc` line is refused (`CorpusError`), since windows and units
are documents, unless `single_document=True`: then the whole file is one document whose
id is the file name. In a file that marks documents, a sentence before the first
`# newdoc` belongs to none and is an error.

Bracket syntax (CorefUD 1.0, as in UD English GUM), one `Entity=` value per word:

- `(ID-f2-f3...`   opens a mention of entity `ID` (the other fields are named by the
                   `# global.Entity = eid-etype-...` header; `GRP` or `eid` names the
                   id field; without a header the id is the first field);
- `ID)`            closes the most recently opened, still open mention of `ID`;
- `(ID-f2-f3...)`  a one-word mention;
- several chunks follow each other without separator on one word, e.g.
  `(7-abstract-new(3-abstract-giv)` or `7)6)5)4)`; mentions nest, and a closing
  chunk names only the id.

Unknown or extra fields are kept, uninterpreted, in `Mention.fields`.
Discontinuous mentions (`ID[1/2]` ... `ID[2/2]`) are **skipped and counted**
(`skipped["discontinuous"]`, one per mention). A bracket on an empty node is moved to
the nearest syntactic word inside the mention (an opening to the next word, a closing
to the previous one); a mention left without any syntactic word (e.g. a one-word
mention of an empty node) is skipped and counted (`skipped["empty_node"]`).
Mentions may cross sentence boundaries inside one document
(`CorefDocument.cross_sentence` counts them).

Malformed input raises `CorpusError` ("path:line: what is wrong"). With `skip_bad=True`:

- a malformed **sentence** (anything the treebank reader refuses, or an `Entity=` value
  that is not a sequence of brackets, or a bracket without an id) is skipped, warned
  about and counted (`malformed_sentence`); its brackets are not read, and the mentions
  open across it are dropped (their extent is unknown; counted per document as
  `skipped["mention_across_skipped_sentence"]`); the rest of the document is read;
- a malformed **bracket structure**, which no one sentence can be blamed for (a closing
  bracket with no open mention of its entity, a mention still open at the end of its
  document, named by its opening line), skips that mention (`malformed_mention`).

Mention coordinates: `start` is the first word, `end` is **exclusive** (one past the
last word), as in a Python slice; `head` is the mention head, by METHODS §3 the
first word of the mention whose syntactic head lies outside the mention.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from headprobe.inputs.corpora.base import (
    MALFORMED_MENTION,
    Accounting,
    Corpus,
    CorpusError,
    SentIds,
    Stream,
    base_relation,
    text_lines,
)
from headprobe.inputs.corpora.conllu import (
    EMPTY,
    RANGE,
    WORD,
    Block,
    Sentence,
    iter_blocks,
    read_sentence,
)

DEFAULT_ENTITY_FIELDS = ("eid", "etype", "head", "other")
ID_FIELDS = ("eid", "GRP")

# A chunk is an opening bracket "(...", possibly closed at once "(...)", or a closing "...)".
_CHUNK = re.compile(r"\([^()]*\)?|[^()]+\)")
_DISCONTINUOUS = re.compile(r"^(.+)\[(\d+)/(\d+)\]$")

DOCUMENT_SKIPS = ("discontinuous", "empty_node", "mention_across_skipped_sentence")
"""Mentions a document leaves out by design or because a skipped sentence cut them (`CorefDocument.skipped`)."""


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Mention:
    """One mention. `start` inclusive, `end` exclusive, `head` in the same coordinates."""

    start: int
    end: int
    entity: str  # cluster id as written (GRP / eid)
    head: int
    source: str = field(default="", compare=False)  # "path:line" of the opening bracket
    fields: tuple = field(default=(), compare=False)  # ((name, value), ...) other bracket fields

    def __len__(self) -> int:
        return self.end - self.start

    def shifted(self, offset: int) -> Mention:
        """The same mention with every coordinate moved by `-offset`."""
        return Mention(
            self.start - offset,
            self.end - offset,
            self.entity,
            self.head - offset,
            self.source,
            self.fields,
        )

    @property
    def attrs(self) -> dict[str, str]:
        return dict(self.fields)


def mention_order(mention: Mention) -> tuple[int, int]:
    """METHODS §3 order: by start, longer first on ties (use as a sort key; sorts are stable)."""
    return (mention.start, -(mention.end - mention.start))


@dataclass
class CorefSentence:
    sent_id: str  # `# sent_id`, else "<file name>#<ordinal>"
    source: str  # "path:line" of the sentence's first line
    start: int  # document index of its first word
    words: list[str]
    heads: list[int]  # sentence-relative 0-based head, -1 for root
    deprels: list[str]  # subtype cut
    upos: list[str]
    feats: list[dict]
    lines: list[int]  # file line of each word

    def __len__(self) -> int:
        return len(self.words)


@dataclass
class CorefDocument:
    doc_id: str
    source: str  # "path:line" of the `# newdoc` line (or first line)
    sentences: list[CorefSentence] = field(default_factory=list)
    mentions: list[Mention] = field(default_factory=list)  # document coordinates, METHODS §3 order
    skipped: Counter = field(default_factory=Counter)  # discontinuous / empty_node /
    # mention_across_skipped_sentence
    cross_sentence: int = 0  # mentions spanning more than one sentence

    @property
    def words(self) -> list[str]:
        return [w for s in self.sentences for w in s.words]

    @property
    def n_words(self) -> int:
        return sum(len(s) for s in self.sentences)

    @property
    def clusters(self) -> dict[str, list[Mention]]:
        """Entity id -> its mentions (METHODS §3 order), entities in order of first mention."""
        out: dict[str, list[Mention]] = {}
        for m in self.mentions:
            out.setdefault(m.entity, []).append(m)
        return out


# ------------------------------------------------------------------------ parsing


@dataclass
class Bracket:
    """One chunk of an `Entity=` value, on the word (or empty node) of line `line`."""

    chunk: str  # as written, e.g. "(7-abstract-new" or "7)"
    line: int
    position: int  # sentence-relative index of the word it stands on (empty node: the next word)
    empty_node: bool
    opening: bool
    closing: bool
    key: str  # entity id as written (a discontinuous part keeps its "[1/2]")
    named: tuple  # ((name, value), ...) other fields of an opening bracket
    part: int | None  # k of a discontinuous "ID[k/n]", else None


def _misc_entity(misc: str) -> str | None:
    if misc in ("_", ""):
        return None
    for item in misc.split("|"):
        if item.startswith("Entity="):
            return item[len("Entity=") :]
    return None


def split_entity_chunks(value: str, where: str = "<string>") -> list[str]:
    """`'(7-a(3-b)'` -> `['(7-a', '(3-b)']`; anything else than brackets raises `CorpusError`."""
    chunks = _CHUNK.findall(value)
    if not value or "".join(chunks) != value:
        raise CorpusError(
            f"{where}: malformed Entity value {value!r} (expected brackets "
            f"like '(ID-...', 'ID)' or '(ID-...)')"
        )
    return chunks


def entity_fields(block: Block) -> tuple[str, ...]:
    """Bracket field names from the latest `# global.Entity` header (default: eid-etype-head-other)."""
    for line, key, value in block.comments():
        if key == "global.Entity" and not value:
            raise CorpusError(f"{block.path}:{line}: empty '# global.Entity' header")
    header = block.globals.get("Entity")
    return tuple(header.split("-")) if header else DEFAULT_ENTITY_FIELDS


def sentence_brackets(sentence: Sentence) -> list[Bracket]:
    """Every bracket of a validated sentence, in order; a malformed `Entity=` raises `CorpusError`.

    Multiword range lines carry no annotation that is read; an empty node's brackets are
    kept with `empty_node=True` (they move to a word when the document is built)."""
    fields = entity_fields(sentence.block)
    id_index = next((fields.index(f) for f in ID_FIELDS if f in fields), 0)
    out: list[Bracket] = []
    position = 0
    for row in sentence.rows:
        if row.kind == RANGE:
            continue
        value = _misc_entity(row.misc)
        if value is not None:
            where = f"{sentence.block.path}:{row.line}"
            for chunk in split_entity_chunks(value, where):
                opening, closing = chunk.startswith("("), chunk.endswith(")")
                values = chunk.strip("()").split("-")
                if opening:
                    if id_index >= len(values) or values[id_index] == "":
                        raise CorpusError(
                            f"{where}: bracket {chunk!r} has no entity id "
                            f"(global.Entity = {'-'.join(fields)})"
                        )
                    key = values[id_index]
                    named = tuple(
                        (fields[i] if i < len(fields) else f"field{i + 1}", v)
                        for i, v in enumerate(values)
                        if i != id_index
                    )
                else:
                    # A closing bracket names the id only (old files may repeat the other fields).
                    key = (
                        values[id_index]
                        if len(values) > 1 and id_index < len(values)
                        else values[0]
                    )
                    named = ()
                    if key == "":
                        raise CorpusError(f"{where}: closing bracket {chunk!r} has no entity id")
                disc = _DISCONTINUOUS.match(key)
                out.append(
                    Bracket(
                        chunk,
                        row.line,
                        position,
                        row.kind == EMPTY,
                        opening,
                        closing,
                        key,
                        named,
                        int(disc.group(2)) if disc else None,
                    )
                )
        if row.kind == WORD:
            position += 1
    return out


@dataclass
class _Open:
    start: int  # document word index
    line: int
    named: tuple
    discontinuous: bool
    broken: bool = False  # a skipped sentence came after its opening: its extent is unknown


class _DocumentBuilder:
    """Collects the sentences and brackets of one document; a bracket structure that does not
    hold goes to `sink.reject` as a malformed mention (raised, or skipped and counted)."""

    def __init__(self, doc_id: str, source: str, path: str, sink: Accounting, skip_bad: bool):
        self.doc = CorefDocument(doc_id, source)
        self.path, self.sink, self.skip_bad = path, sink, skip_bad
        self.open: dict[str, list[_Open]] = {}
        self.raw: list[tuple[int, int, str, int, tuple]] = []  # (start, end, entity, line, fields)
        self.n_words = 0

    def reject(self, message: str) -> None:
        self.sink.reject(CorpusError(message, MALFORMED_MENTION), self.skip_bad)

    def add(self, sentence: Sentence, brackets: Sequence[Bracket]) -> None:
        words = sentence.words
        self.doc.sentences.append(
            CorefSentence(
                sent_id=sentence.sent_id,
                source=sentence.block.where(),
                start=self.n_words,
                words=[w.form for w in words],
                heads=sentence.heads,
                deprels=[base_relation(w.deprel) for w in words],
                upos=[w.upos for w in words],
                feats=[dict(w.feats) for w in words],
                lines=[w.line for w in words],
            )
        )
        for bracket in brackets:
            self.bracket(bracket, self.n_words + bracket.position)
        self.n_words += len(words)

    def gap(self) -> None:
        """A skipped sentence: the mentions open now may end inside it, so none of them is kept."""
        for stack in self.open.values():
            for entry in stack:
                entry.broken = True

    def bracket(self, b: Bracket, position: int) -> None:
        if b.opening:
            if b.part == 1:
                self.doc.skipped["discontinuous"] += 1
            if b.closing:
                if b.part is not None:
                    return
                if b.empty_node:
                    self.doc.skipped["empty_node"] += 1
                    return
                self.raw.append((position, position + 1, b.key, b.line, b.named))
            else:  # an empty node's opening goes to the next word: `position` already
                self.open.setdefault(b.key, []).append(
                    _Open(position, b.line, b.named, b.part is not None)
                )
            return
        stack = self.open.get(b.key)
        if not stack:
            self.reject(
                f"{self.path}:{b.line}: closing bracket {b.chunk!r} but no mention of entity "
                f"{b.key!r} is open"
            )
            return
        entry = stack.pop()
        if entry.discontinuous:
            return
        if entry.broken:
            self.doc.skipped["mention_across_skipped_sentence"] += 1
            return
        # A closing on an empty node ends at the previous syntactic word.
        end = position if b.empty_node else position + 1
        if end <= entry.start:
            self.doc.skipped["empty_node"] += 1
            return
        self.raw.append((entry.start, end, b.key, entry.line, entry.named))

    def finish(self) -> CorefDocument:
        still_open = sorted(
            ((entry.line, key, entry) for key, stack in self.open.items() for entry in stack),
            key=lambda item: item[0],
        )
        for line, key, entry in still_open:
            if entry.broken:
                self.doc.skipped["mention_across_skipped_sentence"] += 1
            else:
                self.reject(
                    f"{self.path}:{line}: mention of entity {key!r} opened here is not "
                    f"closed before the end of document {self.doc.doc_id!r}"
                )
        heads: list[int] = []
        sentence_of: list[int] = []
        for k, s in enumerate(self.doc.sentences):
            heads.extend(-1 if h < 0 else s.start + h for h in s.heads)
            sentence_of.extend([k] * len(s))
        mentions = []
        for start, end, key, line, named in self.raw:
            if end > self.n_words:  # an empty node's opening at the very end of the document
                self.doc.skipped["empty_node"] += 1
                continue
            head = next((i for i in range(start, end) if not start <= heads[i] < end), None)
            if head is None:  # cannot happen in validated trees; kept as a guard
                self.reject(
                    f"{self.path}:{line}: mention of entity {key!r} (words {start}..{end - 1} of "
                    f"document {self.doc.doc_id!r}) has no word whose head lies outside it"
                )
                continue
            if sentence_of[start] != sentence_of[end - 1]:
                self.doc.cross_sentence += 1
            mentions.append(Mention(start, end, key, head, f"{self.path}:{line}", named))
        self.doc.mentions = sorted(mentions, key=mention_order)
        return self.doc


def read_corefud(
    path: str | Path, *, skip_bad: bool = False, single_document: bool = False
) -> Corpus:
    """Read every document of a CorefUD CoNLL-U file: a `Corpus` of `CorefDocument`s.

        documents = read_corefud("en_gum-ud-dev.conllu")
        documents = read_corefud(path, skip_bad=True)             # bad sentences / mentions skipped
        documents = read_corefud(path, single_document=True)      # a file with no `# newdoc`

    See the module docstring for the rules; `corpus.skipped` / `corpus.counts` say what was
    skipped (`malformed_sentence`, `duplicate_sent_id`, `malformed_mention`). A file that marks
    no documents is refused unless `single_document=True` (one document named after the file);
    where the file has `# newdoc` lines, `single_document` changes nothing. `stream_corefud`
    reads the same documents lazily, one at a time.
    """
    return stream_corefud(path, skip_bad=skip_bad, single_document=single_document).collect()


def stream_corefud(
    path: str | Path, *, skip_bad: bool = False, single_document: bool = False
) -> Stream:
    """`read_corefud` as a lazy `Stream` of `CorefDocument`s: each pass reads the file again and
    holds one document at a time (a file read as one document is held whole)."""
    path = str(path)
    if not Path(path).is_file():
        raise FileNotFoundError(f"no CorefUD file at {path}")
    return Stream(
        lambda sink: _documents(iter_blocks(path), path, skip_bad, single_document, sink), name=path
    )


def parse_corefud(
    lines: Iterable[str] | str,
    source: str = "<string>",
    *,
    skip_bad: bool = False,
    single_document: bool = False,
) -> Corpus:
    """`read_corefud` of CorefUD text in memory (a string or lines); errors name `source:line`."""
    corpus = Corpus()
    corpus.extend(
        _documents(
            iter_blocks(source, text_lines(lines)), source, skip_bad, single_document, corpus
        )
    )
    return corpus


def _read_block(block: Block, ids: SentIds, sink: Accounting, skip_bad: bool):
    """(block, validated sentence or None where it was skipped, its brackets)."""
    try:
        sentence = read_sentence(block, ids)
        return block, sentence, sentence_brackets(sentence)
    except CorpusError as exc:
        sink.reject(exc, skip_bad)
        return block, None, []


class _Documents:
    """Sentences in file order -> documents: `add` returns the document that a new one closes."""

    def __init__(self, path: str, sink: Accounting, skip_bad: bool):
        self.path, self.sink, self.skip_bad = path, sink, skip_bad
        self.builder: _DocumentBuilder | None = None
        self.key = None

    def add(
        self, block: Block, sentence: Sentence | None, brackets: list[Bracket], doc_key, doc_id: str
    ) -> CorefDocument | None:
        done = None
        if self.builder is None or doc_key != self.key:
            done = self.close()
            self.builder = _DocumentBuilder(
                doc_id,
                f"{self.path}:{block.doc_line or block.first_line}",
                self.path,
                self.sink,
                self.skip_bad,
            )
            self.key = doc_key
        if sentence is None:
            self.builder.gap()
        else:
            self.builder.add(sentence, brackets)
        return done

    def close(self) -> CorefDocument | None:
        builder, self.builder = self.builder, None
        return builder.finish() if builder is not None and builder.doc.sentences else None


def _documents(
    blocks: Iterable[Block], path: str, skip_bad: bool, single_document: bool, sink: Accounting
) -> Iterator[CorefDocument]:
    """The documents of `blocks`, each as soon as the next one starts. Blocks before the file's
    first `# newdoc` wait (in a file that marks none: all of them, read as one document or refused)."""
    ids = SentIds()
    docs = _Documents(path, sink, skip_bad)
    pending: list[tuple[Block, Sentence | None, list[Bracket]]] = []
    marks_documents = False
    for block in blocks:
        block, sentence, brackets = _read_block(block, ids, sink, skip_bad)
        if not marks_documents and block.doc_line is not None:
            marks_documents = True
            for early, skipped_or_read, _ in pending:
                if skipped_or_read is not None:
                    sink.reject(
                        CorpusError(
                            f"{early.where()}: sentence before the file's first '# newdoc id' "
                            f"belongs to no document"
                        ),
                        skip_bad,
                    )
            pending = []
        if not marks_documents:
            pending.append((block, sentence, brackets))
            continue
        done = docs.add(block, sentence, brackets, block.doc_line, block.doc_id)
        if done is not None:
            yield done
    if pending and not single_document:
        raise CorpusError(
            f"{path}:{pending[0][0].first_line}: no '# newdoc id' line: the file marks no documents, "
            f"which coreference windows need (read it as one document with single_document=True)"
        )
    for block, sentence, brackets in pending:  # one document: the file
        docs.add(block, sentence, brackets, 0, Path(path).name)
    done = docs.close()
    if done is not None:
        yield done


# ------------------------------------------------------------------------ summary


def corpus_summary(documents: Sequence[CorefDocument]) -> dict[str, int]:
    """Documents, sentences, words, mentions and clusters of parsed documents."""
    return {
        "documents": len(documents),
        "sentences": sum(len(d.sentences) for d in documents),
        "words": sum(d.n_words for d in documents),
        "mentions": sum(len(d.mentions) for d in documents),
        "clusters": sum(len(d.clusters) for d in documents),
        "cross_sentence": sum(d.cross_sentence for d in documents),
        **{key: sum(d.skipped[key] for d in documents) for key in DOCUMENT_SKIPS},
    }
