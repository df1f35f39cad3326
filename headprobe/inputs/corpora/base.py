"""What every corpus source shares: `Example`, `Corpus`, `CorpusError`, tree validation.

    from headprobe.inputs.corpora.base import ALL, Corpus, CorpusError, Example

    corpus = Corpus()
    try:
        heads = check_tree(forms, raw_heads, deprels, where="t.conllu:12")
    except CorpusError as error:
        corpus.reject(error, skip_bad)      # raise, or warn, list and count it
    corpus.skipped                          # ["t.conllu:14: head '9' of word 3 ...", ...]
    corpus.counts                           # Counter({"malformed_sentence": 1, ...})

Every reader (CoNLL-U treebanks, CorefUD, spaCy text, Hugging Face datasets) has a lazy
form that returns a `Stream` (examples read one at a time, as a run scores them: memory does
not grow with the corpus) and an eager one that returns a `Corpus` (a list); every malformed
input goes through `Accounting.reject`.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ALL = "ALL"
"""The reserved label of the row that pools every relation (or coreference kind); no
input relation may be called so (it would be counted twice in that row)."""

MALFORMED_SENTENCE = "malformed_sentence"
DUPLICATE_SENT_ID = "duplicate_sent_id"
MALFORMED_MENTION = "malformed_mention"
SENTENCE_REASONS = (MALFORMED_SENTENCE, DUPLICATE_SENT_ID)
"""Skip reasons that remove a whole input sentence (see `Corpus.rejected_sentences`)."""


class CorpusError(ValueError):
    """Malformed input. The message starts with where it is: "path:line: what is wrong"
    (a dataset names "spec row k"). `reason` is the skip counter it goes to under skip_bad."""

    def __init__(self, message: str, reason: str = MALFORMED_SENTENCE):
        super().__init__(message)
        self.reason = reason


@dataclass
class Example:
    """One model input: a sentence, or a coreference window of whole sentences.

    `unit` is the bootstrap / fold unit (METHODS §5): the document id where the corpus
    marks documents (`# newdoc id`; always for coreference windows), else the sentence id.
    `sent_id` names the sentence itself (`# sent_id`, else "<file name>#<ordinal>"; a
    window's first sentence); left out, it is the unit.
    """

    words: list[str]  # syntactic words
    unit: str  # bootstrap / fold unit (document id, or sentence id)
    source: str  # "path:line" of the example's first line
    heads: list[int] | None = None  # 0-based head word index, -1 for root
    deprels: list[str] | None = None  # relation with its subtype cut
    upos: list[str] | None = None
    feats: list[dict] | None = None
    mentions: list | None = None  # coreference mentions (window-relative word indices)
    meta: dict = field(default_factory=dict)
    sent_id: str | None = None  # the sentence's own id (None: the unit)

    def __post_init__(self) -> None:
        if self.sent_id is None:
            self.sent_id = self.unit

    def __len__(self) -> int:
        return len(self.words)


class Accounting:
    """What a corpus remembers it skipped: `skipped` ("path:line: why" per skipped thing) and
    `counts` (skips by reason: `malformed_sentence`, `duplicate_sent_id`, `malformed_mention`, ...,
    and whatever totals a reader adds, e.g. the coreference reader's documents and windows)."""

    skipped: list[str]
    counts: Counter

    def reject(self, error: CorpusError, skip_bad: bool) -> None:
        """Raise `error`, or with `skip_bad` warn, list and count it (by `error.reason`) and go on."""
        if not skip_bad:
            raise error
        reason = getattr(error, "reason", MALFORMED_SENTENCE)
        warnings.warn(f"skipping {reason.replace('_', ' ')}: {error}", stacklevel=3)
        self.note(str(error), reason)

    def note(self, message: str, reason: str) -> None:
        """List and count a skip that is no input error (e.g. a sentence too long for the model)."""
        self.skipped.append(message)
        self.counts[reason] += 1

    @property
    def rejected_sentences(self) -> int:
        """Input sentences skipped as malformed or duplicate (not read into the corpus)."""
        return sum(self.counts[reason] for reason in SENTENCE_REASONS)


class Corpus(Accounting, list):
    """A list of items (`Example`s, or CorefUD documents) that remembers what was skipped.

        corpus.reject(error, skip_bad)    # the one skip path for malformed input
        corpus.skipped                    # "path:line: why" per skipped thing
        corpus.counts["malformed_sentence"]

    `counts` holds the skips by reason (`malformed_sentence`, `duplicate_sent_id`,
    `malformed_mention`, ...) and whatever totals a reader adds (the coreference reader:
    documents, sentences, windows, mentions, ...).
    """

    def __init__(self, items=(), skipped=None, counts=None):
        super().__init__(items)
        self.skipped: list[str] = list(skipped or [])
        self.counts: Counter = Counter(counts or {})


class Stream(Accounting):
    """A corpus read lazily: each pass over it reads its source again and yields the items one
    at a time, so a run holds only what it is scoring; the skip accounting fills in during the pass.

        stream = Stream(lambda sink: my_reader(path, sink), name=str(path))
        for example in stream:            # reads the file; sink.reject / sink.note as it goes
            ...
        stream.skipped, stream.counts     # complete once a pass has ended
        corpus = stream.collect()         # the whole thing as a `Corpus` (small inputs, tests)

    `read(sink)` returns an iterator of items and reports skips to `sink` (this stream, or the
    stream given as `accounting`, whose lists are then shared: a reader built on another, like
    the coreference windows on the documents). `skipped` and `counts` are emptied (in place) at
    the start of each pass. `total_words`, when given, is a cheap count of the words the pass
    will yield (a progress bar's total; None: unknown).
    """

    def __init__(
        self,
        read: Callable[[Accounting], Iterable],
        *,
        name: str | None = None,
        accounting: Accounting | None = None,
        total_words: Callable[[], int | None] | None = None,
    ):
        self.read = read
        self.name = name
        self.skipped: list[str] = accounting.skipped if accounting is not None else []
        self.counts: Counter = accounting.counts if accounting is not None else Counter()
        self.total_words = total_words or (lambda: None)

    def __iter__(self) -> Iterator:
        self.skipped.clear()
        self.counts.clear()
        return iter(self.read(self))

    def collect(self) -> Corpus:
        """Every item of one pass, in a `Corpus` with the pass's skip accounting."""
        items = list(self)
        return Corpus(items, self.skipped, self.counts)


class SentIds:
    """Sentence ids seen so far in one input; a repeated one is a `CorpusError`.

    ids = SentIds()
    ids.add("s1", "t.conllu:2", "line 2")
    ids.add("s1", "t.conllu:9", "line 9")   # CorpusError: t.conllu:9: sent_id 's1' ... line 2
    """

    def __init__(self):
        self.first: dict[str, str] = {}

    def add(self, sent_id: str, where: str, label: str) -> None:
        if sent_id in self.first:
            raise CorpusError(
                f"{where}: duplicate sent_id {sent_id!r} (first used at {self.first[sent_id]})",
                DUPLICATE_SENT_ID,
            )
        self.first[sent_id] = label


# ------------------------------------------------------------------------------- lines


def decode_lines(
    raw_lines: Iterable[bytes], path: str, first: int = 1
) -> Iterator[tuple[int, str, CorpusError | None]]:
    """(line number, text, error) per line: bytes decoded as UTF-8, line ends and a leading BOM dropped.

    An undecodable line comes with U+FFFD in its text and a `CorpusError` naming it. `first`: the
    first line's number (a chunk of a file; the BOM is looked for on line 1 only)."""
    for number, raw in enumerate(raw_lines, start=first):
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
        raw = raw.rstrip(b"\n").rstrip(b"\r")
        try:
            yield number, raw.decode("utf-8"), None
        except UnicodeDecodeError as exc:
            yield (
                number,
                raw.decode("utf-8", errors="replace"),
                CorpusError(
                    f"{path}:{number}: invalid UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line)"
                ),
            )


def decode_chunk(chunk: bytes, path: str, first: int) -> tuple[list[str], dict[int, CorpusError]]:
    """The lines of a chunk of whole lines (`file_chunks`) whose first line is line `first`, as
    `decode_lines` gives them (same texts, same errors), decoded in one call where the chunk is
    valid UTF-8, else line by line: (texts, {line number: its error}).

    Why: one `bytes.decode` and one `str.split` for a megabyte of lines instead of a Python
    step per line (the reader's lines cost half its time decoded one by one)."""
    if first == 1 and chunk.startswith(codecs.BOM_UTF8):
        chunk = chunk[len(codecs.BOM_UTF8) :]
    try:
        text = chunk.decode("utf-8")
    except UnicodeDecodeError:
        raw = chunk.split(b"\n")
        if chunk.endswith(b"\n"):
            raw.pop()  # the split's empty tail, not a line
        texts, errors = [], {}
        for number, line, error in decode_lines(raw, path, first):
            texts.append(line)
            if error is not None:
                errors[number] = error
        return texts, errors
    lines = text.split("\n")
    if chunk.endswith(b"\n"):
        lines.pop()
    if "\r" in text:
        lines = [line.rstrip("\r") for line in lines]
    return lines, {}


GZIP_MAGIC = b"\x1f\x8b"  # the first bytes of a gzip file (no UTF-8 text starts with them)


@contextlib.contextmanager
def _opened(path: str | Path):
    """(a binary handle, whether it is gzip-compressed) of a file, told by its first bytes."""
    with open(path, "rb") as raw:
        compressed = raw.read(2) == GZIP_MAGIC
        raw.seek(0)
        yield (gzip.GzipFile(fileobj=raw) if compressed else raw), compressed


def file_lines(path: str | Path) -> Iterator[bytes]:
    """The raw lines of a file (split at b"\\n" only); a gzip-compressed file (`x.conllu.gz`, told by
    its first bytes, whatever its name) is decompressed as it is read, and its line numbers are
    those of the text inside. A broken compressed stream raises a `CorpusError` naming the line
    where reading stopped."""
    with _opened(path) as (handle, compressed):
        number = 0
        try:
            for line in handle:
                number += 1
                yield line
        except (OSError, EOFError, zlib.error) as exc:
            if not compressed:
                raise
            raise CorpusError(
                f"{path}:{number + 1}: the gzip-compressed file cannot be read past line {number} "
                f"({exc})"
            ) from None


def file_chunks(path: str | Path, size: int = 2**20) -> Iterator[tuple[int, bytes]]:
    """(first line's number, bytes) of chunks of about `size` bytes of whole lines of a file: the
    lines `file_lines` gives, read a chunk at a time (gzip-compressed files too). A broken
    compressed stream is read again line by line from the chunk where it broke, so its
    `CorpusError` names the same line as `file_lines`'s."""
    with _opened(path) as (handle, compressed):
        number = 0
        try:
            while lines := handle.readlines(size):
                yield number + 1, b"".join(lines)
                number += len(lines)
            return
        except (OSError, EOFError, zlib.error):
            if not compressed:
                raise
    for k, line in enumerate(file_lines(path)):  # raises the error at its line
        if k >= number:
            yield k + 1, line


def line_chunks(raw_lines: Iterable[bytes], size: int = 4096) -> Iterator[tuple[int, bytes]]:
    """`file_chunks` of lines given one by one (`size` lines a chunk; a line with or without its
    b"\n")."""
    number, chunk = 0, []
    for line in raw_lines:
        chunk.append(line if line.endswith(b"\n") else line + b"\n")
        if len(chunk) == size:
            yield number + 1, b"".join(chunk)
            number, chunk = number + size, []
    if chunk:
        yield number + 1, b"".join(chunk)


def text_lines(text: str | Iterable[str]) -> Iterator[bytes]:
    """Raw lines of CoNLL-U text already in memory (a string or an iterable of lines)."""
    if isinstance(text, str):
        text = text.split("\n")
    for line in text:
        yield line.encode("utf-8", errors="surrogateescape")


def base_relation(deprel: str) -> str:
    """UD relation with its subtype cut: 'obl:tmod' -> 'obl'."""
    return deprel.split(":", 1)[0]


def check_tree(
    forms: Sequence[str],
    heads: Sequence,
    deprels: Sequence,
    where: str,
    word_where: Sequence[str] | None = None,
) -> list[int]:
    """Validate one sentence's dependency tree; return 0-based heads (-1 for the root).

        check_tree(["It", "rained"], ["2", "0"], ["nsubj", "root"], "t.conllu:1")  # -> [1, -1]

    `heads` are 1-based (0 = root), as integers or their text; `where` names the sentence
    ("path:first line"), `word_where[k]` word k+1 ("path:its line"; default `where`).
    Each word needs a head in 0..n other than itself and a relation (not `_` or empty, and
    not the reserved `ALL`); the sentence needs exactly one root and no cycle. A word's
    problem names the word's line, a root or cycle problem the sentence's first line.
    """
    n = len(forms)
    quick = _plain_tree(heads, deprels, n)
    if quick is not None:
        return quick
    word_where = word_where or [where] * n
    out: list[int] = []
    for k, (form, raw, deprel) in enumerate(zip(forms, heads, deprels), start=1):
        at = word_where[k - 1]
        try:
            head = int(str(raw).strip()) if not isinstance(raw, int) else raw
        except ValueError:
            head = None
        if head is None or isinstance(raw, bool) or not 0 <= head <= n:
            raise CorpusError(
                f"{at}: head {raw!r} of word {k} ({form!r}) is not a word index in 0..{n}"
            )
        if head == k:
            raise CorpusError(f"{at}: word {k} ({form!r}) is its own head")
        relation = "" if deprel is None else str(deprel).strip()
        if relation in ("", "_"):
            raise CorpusError(f"{at}: word {k} ({form!r}) has no relation (DEPREL {deprel!r})")
        if base_relation(relation) == ALL:
            raise CorpusError(
                f"{at}: relation {relation!r} of word {k} ({form!r}): {ALL!r} is reserved "
                f"for the row of all relations"
            )
        out.append(head - 1)
    roots = [k for k, head in enumerate(out) if head < 0]
    if not roots:
        raise CorpusError(f"{where}: no root: no word has head 0")
    if len(roots) > 1:
        named = ", ".join(f"{k + 1} ({forms[k]!r})" for k in roots)
        raise CorpusError(f"{where}: {len(roots)} roots: words {named} all have head 0")
    cycle = find_cycle(out)
    if cycle:
        path = " -> ".join(f"{k + 1} ({forms[k]!r})" for k in cycle + cycle[:1])
        raise CorpusError(f"{where}: cycle in the heads: {path}")
    return out


def _plain_tree(heads: Sequence, deprels: Sequence, n: int) -> list[int] | None:
    """`check_tree`'s answer for a sentence that passes every check, found with few Python steps
    a word (heads given as text, read with `int` as `check_tree` reads them; each distinct
    relation checked once); None for anything else, which `check_tree` then checks word by word
    to name what is wrong. Why: the checks of a well-formed tree were a fifth of the reader's time."""
    if set(map(type, heads)) != {str}:
        return None
    try:
        numbers = list(map(int, heads))
    except ValueError:
        return None
    if not numbers or min(numbers) < 0 or max(numbers) > n or numbers.count(0) != 1:
        return None
    for relation in set(deprels):
        text = relation.strip() if type(relation) is str else ""
        if text in ("", "_") or base_relation(text) == ALL:
            return None
    out = list(map((-1).__add__, numbers))
    return None if find_cycle(out) else out  # a word that is its own head is a cycle too


def find_cycle(heads: Sequence[int]) -> list[int]:
    """The words (0-based, smallest first, in head order) of a cycle in `heads`, else []."""
    state = [0] * len(heads)  # 0 unseen, 1 on the current walk, 2 reaches the root
    for start in range(len(heads)):
        walk, k = [], start
        while 0 <= k and state[k] == 0:
            state[k] = 1
            walk.append(k)
            k = heads[k]
        if 0 <= k and state[k] == 1:  # came back into this walk: a cycle
            cycle = walk[walk.index(k) :]
            first = cycle.index(min(cycle))
            return cycle[first:] + cycle[:first]
        for j in walk:
            state[j] = 2
    return []
