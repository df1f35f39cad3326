"""Words <-> pieces (SPEC section 1).

Words are tokenized as pre-split words (`is_split_into_words=True`); byte-level
BPE tokenizers get `add_prefix_space=True`. Pieces map to words through
`word_ids()`. Special pieces are kinded: CLS/BOS-like, SEP/EOS-like, other.

Pooling to words, used by every scorer (see `engine.LayerAttention`):
- attention **to** a word = sum over its pieces;
- attention **from** a word = mean over its pieces (or `first`, `max`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tokenizers import Tokenizer
from transformers import AutoTokenizer

FROM_MODES = ("mean", "first", "max")

# piece kinds
WORD, CLS_LIKE, SEP_LIKE, OTHER_SPECIAL, PAD = 0, 1, 2, 3, 4


def is_byte_level(tokenizer) -> bool:
    """True for byte-level BPE (GPT-2, RoBERTa, Llama-3 style) tokenizers."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    pre = json.loads(backend.to_str()).get("pre_tokenizer")
    return "ByteLevel" in json.dumps(pre)


def load_tokenizer(name_or_path: str, **kwargs):
    """The model's fast tokenizer, with `add_prefix_space=True` for byte-level BPE."""
    return prepare_tokenizer(AutoTokenizer.from_pretrained(name_or_path, **kwargs))


def _prefix_space_on(node):
    """Set add_prefix_space on every ByteLevel pre-tokenizer in a tokenizer.json tree."""
    if isinstance(node, dict):
        if node.get("type") == "ByteLevel":
            node["add_prefix_space"] = True
        for value in node.values():
            _prefix_space_on(value)
    elif isinstance(node, list):
        for value in node:
            _prefix_space_on(value)


def prepare_tokenizer(tokenizer):
    """Check the tokenizer is fast; give byte-level BPE `add_prefix_space=True` (SPEC 1).

    The flag is set in the backend tokenizer itself, so it holds for every
    byte-level family (GPT-2, RoBERTa, Llama-3 style with a Split pre-tokenizer).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{tokenizer.name_or_path}: headprobe needs a fast tokenizer (for word_ids())")
    if is_byte_level(tokenizer):
        state = json.loads(tokenizer.backend_tokenizer.to_str())
        _prefix_space_on(state["pre_tokenizer"])
        tokenizer._tokenizer = Tokenizer.from_str(json.dumps(state))
        tokenizer.add_prefix_space = True
    return tokenizer


@dataclass
class Alignment:
    """One example's pieces and where each belongs."""

    input_ids: list[int]
    piece_word: list[int]      # word index of each piece, -1 for special pieces
    piece_kind: list[int]      # WORD, CLS_LIKE, SEP_LIKE, OTHER_SPECIAL
    n_words: int

    def __len__(self) -> int:
        return len(self.input_ids)

    def empty_words(self) -> list[int]:
        """Words that the tokenizer turned into no piece at all."""
        seen = set(self.piece_word)
        return [w for w in range(self.n_words) if w not in seen]


def special_kinds(tokenizer) -> dict[int, int]:
    kinds = {}
    for attr, kind in (("sep_token_id", SEP_LIKE), ("eos_token_id", SEP_LIKE),
                       ("cls_token_id", CLS_LIKE), ("bos_token_id", CLS_LIKE)):
        token_id = getattr(tokenizer, attr, None)
        if isinstance(token_id, int):
            kinds[token_id] = kind
    return kinds


def align_words(tokenizer, sentences: list[list[str]]) -> list[Alignment]:
    """Tokenize pre-split sentences in one batched call and map pieces to words."""
    if not sentences:
        return []
    encoded = tokenizer(
        sentences, is_split_into_words=True, add_special_tokens=True, truncation=False,
        return_attention_mask=False, return_token_type_ids=False, verbose=False,
    )
    kinds = special_kinds(tokenizer)
    alignments = []
    for index, words in enumerate(sentences):
        ids = encoded["input_ids"][index]
        word_ids = encoded.word_ids(index)
        piece_word = [-1 if w is None else w for w in word_ids]
        piece_kind = [WORD if w is not None else kinds.get(t, OTHER_SPECIAL) for t, w in zip(ids, word_ids)]
        alignments.append(Alignment(list(ids), piece_word, piece_kind, len(words)))
    return alignments
