"""CorefUD documents (`headprobe.inputs.corpora.corefud`) -> coreference windows.

    windows = read_coref_examples(path, tokenizer_piece_counter(tokenizer), window=128,
                                  skip_bad=True, single_document=False)  # Corpus of window Examples
    windows = stream_coref_examples(path, ...)                       # the same, read lazily (a Stream)

Windows (`pack_windows`, `coref_examples`, `read_coref_examples`)
---------------------------------------------------------------
METHODS §3: consecutive whole sentences of one document, packed greedily while
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

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from headprobe.inputs.corpora.base import (
    Accounting,
    Corpus,
    Example,
    Stream,
)
from headprobe.inputs.corpora.corefud import (
    DOCUMENT_SKIPS,
    CorefDocument,
    mention_order,
    read_corefud,
    stream_corefud,
)

PieceCounter = Callable[[Sequence[str]], "int | None"]


def pack_windows(
    sentences: Sequence[Sequence[str]], count_pieces: PieceCounter, window: int = 128
) -> tuple[list[list[int]], list[tuple[int, str]]]:
    """Greedy METHODS §3 packing of one document's sentences (lists of words).

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
        words=words,
        unit=document.doc_id,
        source=first.source,
        heads=heads,
        deprels=deprels,
        upos=upos,
        feats=feats,
        mentions=sorted(inside, key=mention_order),
        meta={
            "doc_id": document.doc_id,
            "sent_ids": [s.sent_id for s in sents],
            "sentence_starts": [s.start - lo for s in sents],
            "doc_start": lo,
        },
        sent_id=first.sent_id,
    )
    return example, across


def coref_examples(
    documents: Iterable[CorefDocument], count_pieces: PieceCounter, window: int = 128
) -> Corpus:
    """Pack every document into METHODS §3 windows and return them as a `Corpus` of `Example`s.

    `counts`: documents, sentences, windows, mentions, window_mentions and the skip counters
    (`sentence_too_long`, `sentence_no_piece`, `mention_in_skipped_sentence`,
    `mention_across_windows`, `discontinuous`, `empty_node`, `mention_across_skipped_sentence`);
    `skipped`: one "path:line: why" per skipped sentence or mention. When `documents` is the
    `Corpus` from `read_corefud`, its skips (malformed sentences and mentions) come first.
    """
    if isinstance(documents, Corpus):
        corpus = Corpus(skipped=documents.skipped, counts=documents.counts)
    else:
        corpus = Corpus()
    corpus.extend(_windows(documents, count_pieces, window, corpus))
    return corpus


def _windows(
    documents: Iterable[CorefDocument], count_pieces: PieceCounter, window: int, sink: Accounting
) -> Iterator[Example]:
    """The window `Example`s of each document in turn; counts and skips go to `sink` (`coref_examples`)."""
    counts = sink.counts
    for doc in documents:
        counts["documents"] += 1
        counts["sentences"] += len(doc.sentences)
        counts["mentions"] += len(doc.mentions)
        for key in DOCUMENT_SKIPS:
            counts[key] += doc.skipped[key]
        groups, skipped = pack_windows([s.words for s in doc.sentences], count_pieces, window)
        for i, reason in skipped:
            s = doc.sentences[i]
            what = (
                f"more than {window} pieces"
                if reason == "too_long"
                else "a word the tokenizer turns into no piece"
            )
            sink.note(f"{s.source}: sentence {s.sent_id} skipped: {what}", f"sentence_{reason}")
        examples = [window_example(doc, group)[0] for group in groups]
        ranges = [(ex.meta["doc_start"], ex.meta["doc_start"] + len(ex.words)) for ex in examples]
        counts["window_mentions"] += sum(len(ex.mentions) for ex in examples)
        skipped_ranges = [
            (doc.sentences[i].start, doc.sentences[i].start + len(doc.sentences[i]))
            for i, _ in skipped
        ]
        for m in doc.mentions:
            if any(lo <= m.start and m.end <= hi for lo, hi in ranges):
                continue
            if any(lo <= m.start and m.end <= hi for lo, hi in skipped_ranges):
                counts["mention_in_skipped_sentence"] += 1
            else:
                counts["mention_across_windows"] += 1
        counts["windows"] += len(groups)
        yield from examples


def tokenizer_piece_counter(tokenizer) -> PieceCounter:
    """`count_pieces` from a fast tokenizer, through the engine's own word alignment
    (`headprobe.inputs.align.align_words`): pieces of the pre-split words, specials included;
    None when a word gives no piece. Pass a tokenizer from `headprobe.inputs.align.load_tokenizer`
    (byte-level BPE needs `add_prefix_space=True`)."""
    from headprobe.inputs.align import align_words

    def count(words: Sequence[str]) -> int | None:
        if not words:
            return None
        alignment = align_words(tokenizer, [list(words)])[0]
        return None if alignment.empty_words() else len(alignment)

    return count


def read_coref_examples(
    path: str | Path,
    count_pieces: PieceCounter,
    window: int = 128,
    *,
    skip_bad: bool = False,
    single_document: bool = False,
) -> Corpus:
    """`read_corefud` + `coref_examples` in one call: a `Corpus` of window `Example`s.

    windows = read_coref_examples(path, tokenizer_piece_counter(tokenizer), 128, skip_bad=True)
    windows.counts["malformed_sentence"], windows.skipped
    """
    return coref_examples(
        read_corefud(path, skip_bad=skip_bad, single_document=single_document), count_pieces, window
    )


def stream_coref_examples(
    path: str | Path,
    count_pieces: PieceCounter,
    window: int = 128,
    *,
    skip_bad: bool = False,
    single_document: bool = False,
) -> Stream:
    """`read_coref_examples` as a lazy `Stream`: each pass reads the file again, one document at a
    time; the reader's and the packing's skips and counts fill in together (in file order).

        windows = stream_coref_examples(path, tokenizer_piece_counter(tokenizer), 128)
        for example in windows: ...
        windows.counts["windows"]                      # complete after the pass
    """
    documents = stream_corefud(path, skip_bad=skip_bad, single_document=single_document)
    return Stream(
        lambda sink: _windows(documents, count_pieces, window, sink),
        name=str(path),
        accounting=documents,
    )
