"""Words <-> pieces (METHODS §1).

Words are tokenized as pre-split words (`is_split_into_words=True`); byte-level
BPE tokenizers get `add_prefix_space=True`. Pieces map to words through
`word_ids()`. Special pieces are kinded: CLS/BOS-like, SEP/EOS-like, other.

Pooling to words, used by every scorer (see `scoring.layer_attention.LayerAttention`):
- attention **to** a word = sum over its pieces;
- attention **from** a word = mean over its pieces (or `first`, `max`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

FROM_MODES = ("mean", "first", "max")

# piece kinds
WORD, CLS_LIKE, SEP_LIKE, OTHER_MARKER, PAD = 0, 1, 2, 3, 4


def is_byte_level(tokenizer) -> bool:
    """True for byte-level BPE (GPT-2, RoBERTa, Llama-3 style) tokenizers."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    pre = json.loads(backend.to_str()).get("pre_tokenizer")
    return "ByteLevel" in json.dumps(pre)


def load_tokenizer(name_or_path: str, **kwargs):
    """The model's fast tokenizer, with `add_prefix_space=True` for byte-level BPE."""
    from transformers import AutoTokenizer

    return prepare_tokenizer(AutoTokenizer.from_pretrained(name_or_path, **kwargs))


SPACE_SYMBOL = "\u0120"  # "Ġ", the byte-level symbol for " "


def _adds_prefix_space(backend) -> bool:
    """True if a pre-split word comes out of normalizer + pre-tokenizer with "Ġ" in front."""
    text = backend.normalizer.normalize_str("a") if backend.normalizer is not None else "a"
    splits = (
        backend.pre_tokenizer.pre_tokenize_str(text) if backend.pre_tokenizer is not None else []
    )
    return bool(splits) and splits[0][0].startswith(SPACE_SYMBOL)


def prepare_tokenizer(tokenizer):
    """Check the tokenizer is fast; give byte-level BPE a prefix space on every word (METHODS §1).

    Done in the backend tokenizer itself (the `add_prefix_space` argument is ignored by
    generic `PreTrainedTokenizerFast` files), so it holds for every byte-level family:
    - GPT-2 / RoBERTa style (a ByteLevel pre-tokenizer that splits words itself):
      its `add_prefix_space` is set;
    - Llama-3 style (Split(regex) then ByteLevel): a " " is prepended to each word by
      the normalizer, *before* the split, so "don't" -> "Ġdon", "'t" as in running text
      (setting the ByteLevel flag there would give every split its own space: "Ġdon", "Ġ't").
    Calling it twice changes nothing more.
    """
    from tokenizers import Tokenizer

    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"{tokenizer.name_or_path}: headprobe needs a fast tokenizer (for word_ids())"
        )
    if is_byte_level(tokenizer) and not _adds_prefix_space(tokenizer.backend_tokenizer):
        state = json.loads(tokenizer.backend_tokenizer.to_str())
        if state["pre_tokenizer"].get("type") == "ByteLevel":
            state["pre_tokenizer"]["add_prefix_space"] = True
        else:
            prepend = {"type": "Prepend", "prepend": " "}
            normalizer = state.get("normalizer")
            state["normalizer"] = (
                prepend
                if normalizer is None
                else {"type": "Sequence", "normalizers": [normalizer, prepend]}
            )
        tokenizer._tokenizer = Tokenizer.from_str(json.dumps(state))
    if is_byte_level(tokenizer):
        tokenizer.add_prefix_space = True
    return tokenizer


@dataclass
class Alignment:
    """One example's pieces and where each belongs."""

    input_ids: list[int]
    piece_word: list[int]  # word index of each piece, -1 for special pieces
    piece_kind: list[int]  # WORD, CLS_LIKE, SEP_LIKE, OTHER_MARKER
    n_words: int

    def __len__(self) -> int:
        return len(self.input_ids)

    def empty_words(self) -> list[int]:
        """Words that the tokenizer turned into no piece at all."""
        seen = set(self.piece_word)
        return [w for w in range(self.n_words) if w not in seen]


BOS_MODES = ("auto", "add", "none")


def adds_bos(tokenizer) -> bool:
    """Does the tokenizer itself put its BOS token first?"""
    bos = getattr(tokenizer, "bos_token_id", None)
    ids = tokenizer(["a"], is_split_into_words=True, add_special_tokens=True)["input_ids"]
    return isinstance(bos, int) and bool(ids) and ids[0] == bos


def apply_bos(tokenizer, mode: str, causal: bool):
    """(tokenizer, what was done): a copy of the tokenizer that prepends its BOS token (`add`),
    the tokenizer as it is (`none`), or BOS added for a causal model whose tokenizer has a BOS
    token it does not add (`auto`). What was done: "add" (BOS now first), "tokenizer" (the
    tokenizer adds it already) or "none". The tokenizer passed in is never changed.

    A decoder without a BOS parks attention on the first word (the attention sink), which then
    looks like a head of every relation headed by word 1; with BOS the sink is a special
    position, dropped from dependency scoring (METHODS §1) and measured as first-position mass."""
    if mode not in BOS_MODES:
        raise ValueError(f"bos must be one of {', '.join(BOS_MODES)}, not {mode!r}")
    if adds_bos(tokenizer):
        return tokenizer, "tokenizer"
    bos, bos_id = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "bos_token_id", None)
    if mode == "none" or (mode == "auto" and (not causal or not isinstance(bos_id, int))):
        return tokenizer, "none"
    if not isinstance(bos_id, int):
        raise ValueError("--bos add: the tokenizer has no BOS token")
    import copy

    from tokenizers import processors

    tokenizer = copy.deepcopy(tokenizer)
    backend = tokenizer.backend_tokenizer
    template = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B:1", special_tokens=[(bos, bos_id)]
    )
    current = backend.post_processor
    if current is None or isinstance(current, processors.TemplateProcessing):
        backend.post_processor = template
    else:
        backend.post_processor = processors.Sequence([current, template])
    if not adds_bos(tokenizer):  # pragma: no cover - a tokenizer that ignores its post-processor
        raise ValueError("could not make the tokenizer add its BOS token")
    return tokenizer, "add"


def special_kinds(tokenizer) -> dict[int, int]:
    kinds = {}
    for attr, kind in (
        ("sep_token_id", SEP_LIKE),
        ("eos_token_id", SEP_LIKE),
        ("cls_token_id", CLS_LIKE),
        ("bos_token_id", CLS_LIKE),
    ):
        token_id = getattr(tokenizer, attr, None)
        if isinstance(token_id, int):
            kinds[token_id] = kind
    return kinds


def tokenize_words(tokenizer, sentences: list[list[str]]):
    """Pre-split sentences tokenized in one batched call (ids and word ids, specials added)."""
    return tokenizer(
        sentences,
        is_split_into_words=True,
        add_special_tokens=True,
        truncation=False,
        return_attention_mask=False,
        return_token_type_ids=False,
        verbose=False,
    )


def align_words(tokenizer, sentences: list[list[str]]) -> list[Alignment]:
    """Tokenize pre-split sentences in one batched call and map pieces to words."""
    if not sentences:
        return []
    encoded = tokenize_words(tokenizer, sentences)
    kinds = special_kinds(tokenizer)
    alignments = []
    for index, words in enumerate(sentences):
        ids = encoded["input_ids"][index]
        word_ids = encoded.word_ids(index)
        piece_word = [-1 if w is None else w for w in word_ids]
        piece_kind = [
            WORD if w is not None else kinds.get(t, OTHER_MARKER) for t, w in zip(ids, word_ids)
        ]
        alignments.append(Alignment(list(ids), piece_word, piece_kind, len(words)))
    return alignments


def align_tokens(tokenizer, input_ids) -> Alignment:
    """An input given as token ids (a probe, `headprobe.inputs.probes`): each non-special token is
    its own word (a 1:1 alignment); special ids (BOS, EOS, ...) are kinded as in `align_words`."""
    kinds = special_kinds(tokenizer)
    special = set(kinds) | set(getattr(tokenizer, "all_special_ids", []) or [])
    piece_word, piece_kind, n_words = [], [], 0
    for token_id in input_ids:
        if token_id in special:
            piece_word.append(-1)
            piece_kind.append(kinds.get(token_id, OTHER_MARKER))
        else:
            piece_word.append(n_words)
            piece_kind.append(WORD)
            n_words += 1
    return Alignment([int(t) for t in input_ids], piece_word, piece_kind, n_words)


def example_inputs(examples) -> list[tuple[list[str], list[int] | None]]:
    """What tokenizing an example reads: (its words, a probe's own token ids `meta["input_ids"]`
    or None), for each example (a worker process is sent these, not the examples)."""
    return [(ex.words, (getattr(ex, "meta", None) or {}).get("input_ids")) for ex in examples]


def align_inputs(tokenizer, inputs) -> list[Alignment]:
    """Alignments of `example_inputs`, in order: words tokenized together (`align_words`), except
    an input that carries its own token ids (a probe): `align_tokens`."""
    worded = iter(align_words(tokenizer, [words for words, ids in inputs if ids is None]))
    return [next(worded) if ids is None else align_tokens(tokenizer, ids) for _, ids in inputs]


def align_examples(tokenizer, examples) -> list[Alignment]:
    """Alignments of examples, in order (`align_inputs`)."""
    return align_inputs(tokenizer, example_inputs(examples))


def align_in_worker(inputs) -> list[Alignment]:
    """`align_inputs` in a worker process, with the tokenizer it was started with
    (`read_ahead.Workers(n, tokenizer=...)`)."""
    from headprobe.inputs.read_ahead import state

    return align_inputs(state()["tokenizer"], inputs)
