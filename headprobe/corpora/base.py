"""One model input: a sentence, or a coreference window of whole sentences."""

from __future__ import annotations

from dataclasses import dataclass, field


class CorpusError(ValueError):
    """Malformed input; the message names the file and line (or the sentence)."""


@dataclass
class Example:
    words: list[str]                      # syntactic words
    unit: str                             # bootstrap / fold unit (sentence id, or document id)
    source: str                           # "path:line" of the example's first line
    heads: list[int] | None = None        # 0-based head word index, -1 for root
    deprels: list[str] | None = None      # relation with its subtype cut
    upos: list[str] | None = None
    feats: list[dict] | None = None
    mentions: list | None = None          # coreference mentions (window-relative word indices)
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.words)


def base_relation(deprel: str) -> str:
    """UD relation with its subtype cut: 'obl:tmod' -> 'obl'."""
    return deprel.split(":", 1)[0]
