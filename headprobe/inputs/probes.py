"""Synthetic probes: inputs given as token ids, for the token-level analyses.

    examples = repeated_random(tokenizer, length=50, n=500, seed=0)
    headprobe.run("smollm2", probe="repeated-random", probe_length=50, probe_n=500)

`repeated-random` is Olsson et al.'s (2022) probe for induction heads: `length` tokens
drawn uniformly (with replacement) from the tokenizer's vocabulary without its special
tokens, then the same `length` tokens again. Sequence k is drawn from a generator keyed
by (seed, k) alone, so the first m sequences of a larger probe are the same.

Special tokens around the sequence (`specials`):
- "auto" (default): the ones the tokenizer itself puts around plain text (BERT:
  [CLS] ... [SEP]; Llama-3: BOS; GPT-2 and SmolLM2: none);
- "bos": the tokenizer's BOS in front where it has one (TransformerLens's default), nothing else;
- "none": the bare tokens.
Specials are in no token pattern (see `headprobe.extend.patterns`); with a BOS
in front, the first token's previous-token row is empty and position 0 is the BOS.

Each sequence is an `Example` whose words are its non-special tokens (1:1) and whose
`meta["input_ids"]` holds the ids the model gets (`headprobe.inputs.align.align_tokens`); its
unit (folds, bootstrap) is the sequence itself, `repeated-random:<k>`.

A language-model loss on the probe (head ablation, importance; METHODS §8) counts the
repeated half only: `meta["loss_words"]` = (first, stop) names the words whose pieces are
scored, the second half's words after its first (word index > length), exactly the tokens an
induction head can predict by copying; the model still reads the whole sequence.
"""

from __future__ import annotations

import numpy as np

from headprobe.core.seeds import keyed_hash
from headprobe.inputs.corpora.base import Corpus, Example, Stream

REPEATED_RANDOM = "repeated-random"
PROBES = (
    REPEATED_RANDOM,
)  # the inputs' own; an analysis's folder registers others (`registry.Probe`)
PROBE_MARKERS = ("auto", "bos", "none")
LOSS_WORDS = "loss_words"  # Example.meta: (first, stop) words whose loss counts (objectives)


def special_ids(tokenizer) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "special", False):
            ids.add(int(token_id))
    return ids


def vocabulary(tokenizer, vocab_size: int | None = None) -> np.ndarray:
    """Ids a probe may draw: 0..size-1 (size: the smaller of the tokenizer's and the model's
    vocabulary) without the special tokens."""
    size = len(tokenizer) if vocab_size is None else min(len(tokenizer), int(vocab_size))
    special = special_ids(tokenizer)
    return np.array([i for i in range(size) if i not in special], dtype=np.int64)


def wrap(tokenizer, specials: str = "auto") -> tuple[list[int], list[int]]:
    """(ids before, ids after) the probe's tokens."""
    if specials not in PROBE_MARKERS:
        raise ValueError(f"specials must be one of {PROBE_MARKERS}, not {specials!r}")
    if specials == "none":
        return [], []
    if specials == "bos":
        bos = getattr(tokenizer, "bos_token_id", None)
        return ([int(bos)] if isinstance(bos, int) else []), []
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return list(full[:start]), list(full[start + len(plain) :])
    return [], []


def repeated_random(
    tokenizer,
    length: int = 50,
    n: int = 500,
    seed: int = 0,
    specials: str = "auto",
    vocab_size: int | None = None,
) -> Corpus:
    """`n` sequences of `length` random tokens repeated twice (Olsson et al. 2022), in a `Corpus`."""
    return repeated_random_stream(tokenizer, length, n, seed, specials, vocab_size).collect()


def repeated_random_stream(
    tokenizer,
    length: int = 50,
    n: int = 500,
    seed: int = 0,
    specials: str = "auto",
    vocab_size: int | None = None,
) -> Stream:
    """`repeated_random` as a lazy `Stream`: each sequence is drawn when it is taken."""
    if length < 1 or n < 1:
        raise ValueError(f"a probe needs length >= 1 and n >= 1 (got length {length}, n {n})")
    vocab = vocabulary(tokenizer, vocab_size)
    if not len(vocab):
        raise ValueError("the tokenizer has no non-special token to draw")
    before, after = wrap(tokenizer, specials)
    name = f"repeated-random (length {length}, n {n}, seed {seed}, specials {specials})"

    def read(sink):
        for k in range(n):
            rng = np.random.Generator(np.random.PCG64(keyed_hash(seed, "probe", str(k))))
            tokens = vocab[rng.integers(0, len(vocab), length)].tolist()
            ids = before + tokens + tokens + after
            words = tokenizer.convert_ids_to_tokens(tokens + tokens)
            yield Example(
                words=list(words),
                unit=f"repeated-random:{k}",
                source=f"{name}#{k}",
                meta={
                    "input_ids": ids,
                    "probe": "repeated-random",
                    LOSS_WORDS: (length + 1, 2 * length),
                    "loss_note": "the repeated half only (its words after the first)",
                },
            )

    return Stream(read, name=name, total_words=lambda: 2 * length * n)


def make_probe(name: str, tokenizer, **options) -> Stream:
    """The probe `name` (one of `PROBES`) as a lazy `Stream` of `Example`s; `options` are those
    of `repeated_random_stream`."""
    if name not in PROBES:
        raise ValueError(f"unknown probe {name!r}; choose from {', '.join(PROBES)}")
    return repeated_random_stream(tokenizer, **options)
