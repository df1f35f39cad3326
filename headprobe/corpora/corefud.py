"""CorefUD coreference (`Entity=` in the CoNLL-U MISC column) -> documents -> windows.

Reading (`read_corefud`, `parse_corefud`)
-----------------------------------------
A CorefUD file is read into `CorefDocument`s (one per `# newdoc id`), each with its
sentences (syntactic words only: multiword range lines `3-4` and empty nodes `5.1`
are not words) and its mentions in **document** word coordinates.

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

Every malformed input raises `CorpusError` ("path:line: what is wrong"): bad column
count, bad word id or head, an `Entity=` value that is not a sequence of brackets,
an empty id, a closing bracket with no open mention of its entity, or a mention still
open at the end of its document (named by the line of its opening bracket).

Mention coordinates: `start` is the first word, `end` is **exclusive** (one past the
last word), as in a Python slice; `head` is the mention head, by SPEC section 3 the
first word of the mention whose syntactic head lies outside the mention.

Windows (`pack_windows`, `coref_examples`, `read_coref_examples`)
---------------------------------------------------------------
SPEC section 3: consecutive whole sentences of one document, packed greedily while
the window's pieces (specials included) fit `window` (default 128). A sentence that
alone does not fit (or has a word that gives no piece) is skipped, counted, and closes
the current window. Packing takes a piece-counting callable
`count_pieces(words) -> int | None` (specials included; `None` = the words cannot be
tokenized, a word gives no piece), so it does not depend on the engine;
`tokenizer_piece_counter(tokenizer)` builds one from a Hugging Face fast tokenizer.
Each window becomes an `Example` with `unit` = document id and `mentions` in window
coordinates (only mentions entirely inside the window; the others are counted).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from headprobe.corpora.base import CorpusError, Example, base_relation

N_COLUMNS = 10
DEFAULT_ENTITY_FIELDS = ("eid", "etype", "head", "other")
ID_FIELDS = ("eid", "GRP")

# A chunk is an opening bracket "(...", possibly closed at once "(...)", or a closing "...)".
_CHUNK = re.compile(r"\([^()]*\)?|[^()]+\)")
_DISCONTINUOUS = re.compile(r"^(.+)\[(\d+)/(\d+)\]$")

PieceCounter = Callable[[Sequence[str]], "int | None"]


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Mention:
    """One mention. `start` inclusive, `end` exclusive, `head` in the same coordinates."""

    start: int
    end: int
    entity: str                                        # cluster id as written (GRP / eid)
    head: int
    source: str = field(default="", compare=False)     # "path:line" of the opening bracket
    fields: tuple = field(default=(), compare=False)   # ((name, value), ...) other bracket fields

    def __len__(self) -> int:
        return self.end - self.start

    def shifted(self, offset: int) -> "Mention":
        """The same mention with every coordinate moved by `-offset`."""
        return Mention(self.start - offset, self.end - offset, self.entity, self.head - offset,
                       self.source, self.fields)

    @property
    def attrs(self) -> dict[str, str]:
        return dict(self.fields)


def mention_order(mention: Mention) -> tuple[int, int]:
    """SPEC order: by start, longer first on ties (use as a sort key; sorts are stable)."""
    return (mention.start, -(mention.end - mention.start))


@dataclass
class CorefSentence:
    sent_id: str
    source: str              # "path:line" of the sentence's first line
    start: int               # document index of its first word
    words: list[str]
    heads: list[int]         # sentence-relative 0-based head, -1 for root
    deprels: list[str]       # subtype cut
    upos: list[str]
    feats: list[dict]
    lines: list[int]         # file line of each word

    def __len__(self) -> int:
        return len(self.words)


@dataclass
class CorefDocument:
    doc_id: str
    source: str                                    # "path:line" of the `# newdoc` line (or first line)
    sentences: list[CorefSentence] = field(default_factory=list)
    mentions: list[Mention] = field(default_factory=list)   # document coordinates, SPEC order
    skipped: Counter = field(default_factory=Counter)       # discontinuous / empty_node
    cross_sentence: int = 0                        # mentions spanning more than one sentence

    @property
    def words(self) -> list[str]:
        return [w for s in self.sentences for w in s.words]

    @property
    def n_words(self) -> int:
        return sum(len(s) for s in self.sentences)

    @property
    def clusters(self) -> dict[str, list[Mention]]:
        """Entity id -> its mentions (SPEC order), entities in order of first mention."""
        out: dict[str, list[Mention]] = {}
        for m in self.mentions:
            out.setdefault(m.entity, []).append(m)
        return out


# ------------------------------------------------------------------------ parsing


def _parse_feats(text: str, where: str) -> dict:
    if text in ("_", ""):
        return {}
    feats = {}
    for item in text.split("|"):
        if "=" not in item:
            raise CorpusError(f"{where}: malformed FEATS item {item!r}")
        key, value = item.split("=", 1)
        feats[key] = value
    return feats


def _misc_entity(misc: str) -> str | None:
    if misc in ("_", ""):
        return None
    for item in misc.split("|"):
        if item.startswith("Entity="):
            return item[len("Entity="):]
    return None


def split_entity_chunks(value: str, where: str = "<string>") -> list[str]:
    """`'(7-a(3-b)'` -> `['(7-a', '(3-b)']`; anything else than brackets raises `CorpusError`."""
    chunks = _CHUNK.findall(value)
    if not value or "".join(chunks) != value:
        raise CorpusError(f"{where}: malformed Entity value {value!r} (expected brackets "
                          f"like '(ID-...', 'ID)' or '(ID-...)')")
    return chunks


class _DocumentBuilder:
    """Collects the sentences and brackets of one document."""

    def __init__(self, doc_id: str, source: str, path: str, fields: Sequence[str]):
        self.doc = CorefDocument(doc_id, source)
        self.path = path
        self.set_fields(fields)
        self.open: dict[str, list[tuple[int, int, tuple, bool]]] = {}   # key -> [(start, line, fields, disc)]
        self.raw: list[tuple[int, int, str, int, tuple]] = []            # (start, end, entity, line, fields)
        self.n_words = 0

    def set_fields(self, fields: Sequence[str]) -> None:
        self.fields = tuple(fields)
        self.id_index = next((self.fields.index(f) for f in ID_FIELDS if f in self.fields), 0)

    def brackets(self, value: str, line: int, empty_node: bool) -> None:
        where = f"{self.path}:{line}"
        for chunk in split_entity_chunks(value, where):
            opening, closing = chunk.startswith("("), chunk.endswith(")")
            values = chunk.strip("()").split("-")
            if opening:
                if self.id_index >= len(values) or values[self.id_index] == "":
                    raise CorpusError(f"{where}: bracket {chunk!r} has no entity id "
                                      f"(global.Entity = {'-'.join(self.fields)})")
                key = values[self.id_index]
                named = tuple((self.fields[i] if i < len(self.fields) else f"field{i + 1}", v)
                              for i, v in enumerate(values) if i != self.id_index)
            else:
                # A closing bracket names the id only (old files may repeat the other fields).
                key = values[self.id_index] if len(values) > 1 and self.id_index < len(values) else values[0]
                named = ()
                if key == "":
                    raise CorpusError(f"{where}: closing bracket {chunk!r} has no entity id")
            disc = _DISCONTINUOUS.match(key)
            if opening:
                if disc and disc.group(2) == "1":
                    self.doc.skipped["discontinuous"] += 1
                start = self.n_words          # an empty node's opening goes to the next word
                if closing:
                    if disc:
                        continue
                    if empty_node:
                        self.doc.skipped["empty_node"] += 1
                        continue
                    self.raw.append((start, start + 1, key, line, named))
                else:
                    self.open.setdefault(key, []).append((start, line, named, bool(disc)))
            else:
                stack = self.open.get(key)
                if not stack:
                    raise CorpusError(f"{where}: closing bracket {chunk!r} but no mention of entity "
                                      f"{key!r} is open")
                start, open_line, named, is_disc = stack.pop()
                if is_disc:
                    continue
                # A closing on an empty node ends at the previous syntactic word.
                end = self.n_words if empty_node else self.n_words + 1
                if end <= start:
                    self.doc.skipped["empty_node"] += 1
                    continue
                self.raw.append((start, end, key, open_line, named))

    def finish(self) -> CorefDocument:
        for key, stack in self.open.items():
            if stack:
                line = stack[-1][1]
                raise CorpusError(f"{self.path}:{line}: mention of entity {key!r} opened here is not "
                                  f"closed before the end of document {self.doc.doc_id!r}")
        heads: list[int] = []
        sentence_of: list[int] = []
        lines: list[int] = []
        for k, s in enumerate(self.doc.sentences):
            heads.extend(-1 if h < 0 else s.start + h for h in s.heads)
            sentence_of.extend([k] * len(s))
            lines.extend(s.lines)
        mentions = []
        for start, end, key, line, named in self.raw:
            if end > self.n_words:   # an empty node's opening at the very end of the document
                self.doc.skipped["empty_node"] += 1
                continue
            head = next((i for i in range(start, end) if not start <= heads[i] < end), None)
            if head is None:
                raise CorpusError(f"{self.path}:{line}: mention of entity {key!r} (words {start}..{end - 1} "
                                  f"of document {self.doc.doc_id!r}) has no word whose head lies outside it "
                                  f"(cyclic heads?)")
            if sentence_of[start] != sentence_of[end - 1]:
                self.doc.cross_sentence += 1
            mentions.append(Mention(start, end, key, head, f"{self.path}:{line}", named))
        self.doc.mentions = sorted(mentions, key=mention_order)
        return self.doc


def _iter_lines(path: str) -> Iterator[tuple[int, str]]:
    with open(path, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, start=1):
            yield number, raw.rstrip("\n").rstrip("\r")


def parse_corefud(lines: Iterable[str] | str, source: str = "<string>") -> list[CorefDocument]:
    """Parse CorefUD CoNLL-U text (a string or an iterable of lines); errors name `source:line`."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    return _parse(enumerate(lines, start=1), source)


def read_corefud(path: str | Path) -> list[CorefDocument]:
    """Read every document of a CorefUD CoNLL-U file (see the module docstring)."""
    path = str(path)
    if not Path(path).is_file():
        raise FileNotFoundError(f"no CorefUD file at {path}")
    return _parse(_iter_lines(path), path)


def _parse(numbered: Iterable[tuple[int, str]], path: str) -> list[CorefDocument]:
    documents: list[CorefDocument] = []
    fields: Sequence[str] = DEFAULT_ENTITY_FIELDS
    builder: _DocumentBuilder | None = None
    sent: dict | None = None              # the sentence being read

    def close_sentence() -> None:
        nonlocal sent
        if sent is None:
            return
        if not sent["words"]:
            if sent["start"] is not None:      # token lines, but only ranges / empty nodes
                raise CorpusError(f"{path}:{sent['first']}: sentence has no words")
            sent = None                        # a block of comments only
            return
        n = len(sent["words"])
        heads = []
        for h, line, wid in zip(sent["heads"], sent["lines"], range(1, n + 1)):
            if not 0 <= h <= n:
                raise CorpusError(f"{path}:{line}: head {h} of word {wid} is not a word index in 0..{n}")
            if h == wid:
                raise CorpusError(f"{path}:{line}: word {wid} is its own head")
            heads.append(h - 1)
        builder.doc.sentences.append(CorefSentence(
            sent_id=sent["sent_id"] or f"{path}:{sent['first']}",
            source=f"{path}:{sent['first']}",
            start=sent["start"], words=sent["words"], heads=heads, deprels=sent["deprels"],
            upos=sent["upos"], feats=sent["feats"], lines=sent["lines"]))
        sent = None

    def start_document(doc_id: str, number: int) -> None:
        nonlocal builder
        if builder is not None:
            documents.append(builder.finish())
        builder = _DocumentBuilder(doc_id, f"{path}:{number}", path, fields)

    for number, line in numbered:
        where = f"{path}:{number}"
        if line.strip() == "":
            close_sentence()
            continue
        if line.startswith("#"):
            body = line[1:].strip()
            key, _, value = body.partition("=")
            key, value = key.strip(), value.strip()
            if key == "newdoc id" or body == "newdoc":
                if sent is not None and sent["words"]:
                    raise CorpusError(f"{where}: '# newdoc' inside a sentence")
                start_document(value or f"{path}:{number}", number)
            elif key == "global.Entity":
                if not value:
                    raise CorpusError(f"{where}: empty '# global.Entity' header")
                fields = tuple(value.split("-"))
                if builder is not None:
                    builder.set_fields(fields)
            if sent is None:
                sent = {"first": number, "sent_id": None, "words": [], "heads": [], "deprels": [],
                        "upos": [], "feats": [], "lines": [], "start": None}
            if key == "sent_id":
                sent["sent_id"] = value
            continue
        columns = line.split("\t")
        if len(columns) != N_COLUMNS:
            raise CorpusError(f"{where}: expected {N_COLUMNS} tab-separated columns, found {len(columns)}")
        if builder is None:
            start_document(f"{path}:{number}", number)
        if sent is None:
            sent = {"first": number, "sent_id": None, "words": [], "heads": [], "deprels": [],
                    "upos": [], "feats": [], "lines": [], "start": None}
        if sent["start"] is None:
            sent["start"] = builder.n_words
        token_id = columns[0]
        if "-" in token_id:                      # multiword range: not a word, no annotation read
            continue
        entity = _misc_entity(columns[9])
        if "." in token_id:                      # empty node: not a word; brackets move to a word
            if entity is not None:
                builder.brackets(entity, number, empty_node=True)
            continue
        if not token_id.isdigit() or int(token_id) != len(sent["words"]) + 1:
            raise CorpusError(f"{where}: word id {token_id!r} where {len(sent['words']) + 1} was expected")
        try:
            head = int(columns[6])
        except ValueError:
            raise CorpusError(f"{where}: head {columns[6]!r} is not an integer") from None
        sent["words"].append(columns[1])
        sent["heads"].append(head)
        sent["deprels"].append(base_relation(columns[7]))
        sent["upos"].append(columns[3])
        sent["feats"].append(_parse_feats(columns[5], where))
        sent["lines"].append(number)
        if entity is not None:
            builder.brackets(entity, number, empty_node=False)
        builder.n_words += 1
    close_sentence()
    if builder is not None:
        documents.append(builder.finish())
    return documents


# ------------------------------------------------------------------------ windows


def pack_windows(sentences: Sequence[Sequence[str]], count_pieces: PieceCounter,
                 window: int = 128) -> tuple[list[list[int]], list[tuple[int, str]]]:
    """Greedy SPEC packing of one document's sentences (lists of words).

    Returns `(windows, skipped)`: `windows` are lists of consecutive sentence indices;
    `skipped` lists `(sentence index, reason)` with reason `"too_long"` (alone it has
    more than `window` pieces) or `"no_piece"` (`count_pieces` returned None). A skipped
    sentence closes the current window.
    """
    windows: list[list[int]] = []
    skipped: list[tuple[int, str]] = []
    current: list[int] = []
    words: list[str] = []
    for i, sentence in enumerate(sentences):
        alone = count_pieces(list(sentence))
        if alone is None or alone > window:
            skipped.append((i, "no_piece" if alone is None else "too_long"))
            if current:
                windows.append(current)
            current, words = [], []
            continue
        if current:
            together = count_pieces(words + list(sentence))
            if together is not None and together <= window:
                current.append(i)
                words.extend(sentence)
                continue
            windows.append(current)
        current, words = [i], list(sentence)
    if current:
        windows.append(current)
    return windows, skipped


class CorefCorpus(list):
    """A list of window `Example`s that also says what was skipped, and why.

    `skipped`: one message per skipped sentence ("path:line: ..."), as in
    `headprobe.corpora.conllu.Corpus`; `counts`: documents, sentences, windows, mentions,
    and the skip counters (`sentence_too_long`, `sentence_no_piece`, `mention_in_skipped_sentence`,
    `mention_across_windows`, `discontinuous`, `empty_node`).
    """

    def __init__(self, items=(), skipped=None, counts=None):
        super().__init__(items)
        self.skipped: list[str] = list(skipped or [])
        self.counts: Counter = Counter(counts or {})


def window_example(document: CorefDocument, sentence_indices: Sequence[int]) -> tuple[Example, int]:
    """One window `Example` of whole sentences; returns it and the number of mentions that
    overlap the window without lying entirely inside it (those are left out)."""
    sents = [document.sentences[i] for i in sentence_indices]
    first, last = sents[0], sents[-1]
    lo, hi = first.start, last.start + len(last)
    # The sentences of a window are consecutive, so document coordinates shift by `lo`.
    words, heads, deprels, upos, feats = [], [], [], [], []
    for s in sents:
        offset = s.start - lo
        words.extend(s.words)
        heads.extend(-1 if h < 0 else h + offset for h in s.heads)
        deprels.extend(s.deprels)
        upos.extend(s.upos)
        feats.extend(dict(f) for f in s.feats)
    inside, across = [], 0
    for m in document.mentions:
        if lo <= m.start and m.end <= hi:
            inside.append(m.shifted(lo))
        elif m.start < hi and m.end > lo:
            across += 1
    example = Example(
        words=words, unit=document.doc_id, source=first.source, heads=heads, deprels=deprels,
        upos=upos, feats=feats, mentions=sorted(inside, key=mention_order),
        meta={"doc_id": document.doc_id, "sent_ids": [s.sent_id for s in sents],
              "sentence_starts": [s.start - lo for s in sents], "doc_start": lo},
    )
    return example, across


def coref_examples(documents: Iterable[CorefDocument], count_pieces: PieceCounter,
                   window: int = 128) -> CorefCorpus:
    """Pack every document into SPEC windows and return them as `Example`s."""
    corpus = CorefCorpus()
    counts = corpus.counts
    for doc in documents:
        counts["documents"] += 1
        counts["sentences"] += len(doc.sentences)
        counts["mentions"] += len(doc.mentions)
        counts["discontinuous"] += doc.skipped["discontinuous"]
        counts["empty_node"] += doc.skipped["empty_node"]
        groups, skipped = pack_windows([s.words for s in doc.sentences], count_pieces, window)
        for i, reason in skipped:
            s = doc.sentences[i]
            counts[f"sentence_{reason}"] += 1
            what = (f"more than {window} pieces" if reason == "too_long"
                    else "a word the tokenizer turns into no piece")
            corpus.skipped.append(f"{s.source}: sentence {s.sent_id} skipped: {what}")
        ranges = []
        for group in groups:
            example, _ = window_example(doc, group)
            ranges.append((example.meta["doc_start"], example.meta["doc_start"] + len(example.words)))
            counts["window_mentions"] += len(example.mentions)
            corpus.append(example)
        skipped_ranges = [(doc.sentences[i].start, doc.sentences[i].start + len(doc.sentences[i]))
                          for i, _ in skipped]
        for m in doc.mentions:
            if any(lo <= m.start and m.end <= hi for lo, hi in ranges):
                continue
            if any(lo <= m.start and m.end <= hi for lo, hi in skipped_ranges):
                counts["mention_in_skipped_sentence"] += 1
            else:
                counts["mention_across_windows"] += 1
        counts["windows"] += len(groups)
    return corpus


def tokenizer_piece_counter(tokenizer) -> PieceCounter:
    """`count_pieces` from a fast tokenizer, through the engine's own word alignment
    (`headprobe.align.align_words`): pieces of the pre-split words, specials included;
    None when a word gives no piece. Pass a tokenizer from `headprobe.align.load_tokenizer`
    (byte-level BPE needs `add_prefix_space=True`)."""
    from headprobe.align import align_words

    def count(words: Sequence[str]) -> int | None:
        if not words:
            return None
        alignment = align_words(tokenizer, [list(words)])[0]
        return None if alignment.empty_words() else len(alignment)

    return count


def read_coref_examples(path: str | Path, count_pieces: PieceCounter, window: int = 128) -> CorefCorpus:
    """`read_corefud` + `coref_examples` in one call."""
    return coref_examples(read_corefud(path), count_pieces, window)


def corpus_summary(documents: Sequence[CorefDocument]) -> dict[str, int]:
    """Documents, sentences, words, mentions and clusters of parsed documents."""
    return {
        "documents": len(documents),
        "sentences": sum(len(d.sentences) for d in documents),
        "words": sum(d.n_words for d in documents),
        "mentions": sum(len(d.mentions) for d in documents),
        "clusters": sum(len(d.clusters) for d in documents),
        "cross_sentence": sum(d.cross_sentence for d in documents),
        "discontinuous": sum(d.skipped["discontinuous"] for d in documents),
        "empty_node": sum(d.skipped["empty_node"] for d in documents),
    }
