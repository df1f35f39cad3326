"""Words <-> pieces (METHODS §1) and word pooling (issue 2, point 4).

All expected piece lists come from the hand-built vocabularies in conftest.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import make_gpt2, make_llama3, make_roberta, make_sentencepiece, make_wordpiece

from headprobe.inputs.align import (
    CLS_LIKE,
    PAD,
    SEP_LIKE,
    WORD,
    align_words,
    load_tokenizer,
    prepare_tokenizer,
)
from headprobe.inputs.batching import Batch
from headprobe.inputs.corpora.base import Example
from headprobe.scoring.layer_attention import LayerAttention

# "unbelievable" is 3 pieces in every family; "$" and "," are single-character words
SENTENCE = ["the", "cat", "unbelievable", "$", ",", "don't"]


def pieces(tokenizer, alignment) -> list[str]:
    return tokenizer.convert_ids_to_tokens(alignment.input_ids)


# -- WordPiece -------------------------------------------------------------------------
def test_wordpiece_alignment(wordpiece_tokenizer):
    tok = wordpiece_tokenizer
    (a,) = align_words(tok, [["The"] + SENTENCE[1:]])  # "The" is lower-cased by BertNormalizer
    assert pieces(tok, a) == [
        "[CLS]",
        "the",
        "cat",
        "un",
        "##believ",
        "##able",
        "$",
        ",",
        "don",
        "'",
        "t",
        "[SEP]",
    ]
    assert a.piece_word == [-1, 0, 1, 2, 2, 2, 3, 4, 5, 5, 5, -1]
    assert a.piece_kind == [
        CLS_LIKE,
        WORD,
        WORD,
        WORD,
        WORD,
        WORD,
        WORD,
        WORD,
        WORD,
        WORD,
        WORD,
        SEP_LIKE,
    ]
    assert a.n_words == 6 and len(a) == 12
    assert a.empty_words() == []


def test_wordpiece_word_without_piece(wordpiece_tokenizer):
    # BertNormalizer(clean_text) deletes control characters: "\x00" becomes no piece at all
    (a,) = align_words(wordpiece_tokenizer, [["the", "\x00", "cat"]])
    assert pieces(wordpiece_tokenizer, a) == ["[CLS]", "the", "cat", "[SEP]"]
    assert a.piece_word == [-1, 0, 2, -1]
    assert a.empty_words() == [1]


def test_batched_call_keeps_sentences_apart(wordpiece_tokenizer):
    a, b, c = align_words(wordpiece_tokenizer, [["a", "dog"], ["unbelievable"], ["it", "ran", "!"]])
    assert a.piece_word == [-1, 0, 1, -1]
    assert b.piece_word == [-1, 0, 0, 0, -1]
    assert c.piece_word == [-1, 0, 1, 2, -1]
    assert align_words(wordpiece_tokenizer, []) == []


# -- byte-level BPE -----------------------------------------------------------------------
BYTE_PIECES = ["Ġthe", "Ġcat", "Ġun", "believ", "able", "Ġ$", "Ġ,", "Ġdon", "'t"]
BYTE_WORDS = [0, 1, 2, 2, 2, 3, 4, 5, 5]


def test_fixture_without_prefix_space_splits_bare_bytes(gpt2_tokenizer):
    """The fixtures are stored like the real GPT-2 / RoBERTa files: no prefix space."""
    (a,) = align_words(gpt2_tokenizer, [["cat"]])
    assert pieces(gpt2_tokenizer, a) == ["c", "a", "t"]


@pytest.mark.parametrize(
    "make, before, after",
    [
        (make_gpt2, [], []),
        (make_roberta, ["<s>"], ["</s>"]),
        (make_llama3, ["<|begin_of_text|>"], []),
    ],
)
def test_byte_level_prepare_tokenizer(make, before, after):
    tok = prepare_tokenizer(make())
    (a,) = align_words(tok, [SENTENCE])
    assert pieces(tok, a) == before + BYTE_PIECES + after
    assert a.piece_word == [-1] * len(before) + BYTE_WORDS + [-1] * len(after)
    assert a.piece_kind == [CLS_LIKE] * len(before) + [WORD] * 9 + [SEP_LIKE] * len(after)


@pytest.mark.parametrize(
    "make, before, after",
    [
        (make_gpt2, [], []),
        (make_roberta, ["<s>"], ["</s>"]),
        (make_llama3, ["<|begin_of_text|>"], []),
    ],
)
def test_byte_level_load_tokenizer_from_disk(tmp_path, make, before, after):
    make().save_pretrained(tmp_path)
    tok = load_tokenizer(str(tmp_path))
    assert tok.is_fast
    (a,) = align_words(tok, [SENTENCE])
    assert pieces(tok, a) == before + BYTE_PIECES + after
    assert a.piece_word == [-1] * len(before) + BYTE_WORDS + [-1] * len(after)


@pytest.mark.parametrize("make", [make_gpt2, make_roberta, make_llama3])
def test_byte_level_pieces_match_running_text(make):
    """Pre-split words get the pieces the unprepared tokenizer gives the text " w1 w2 ...":
    a word-internal split (Llama-3 regex: "don't" -> "don", "'t") gets no extra space."""
    raw, tok = make(), prepare_tokenizer(make())
    words = ["it", "was", "unbelievable", ",", "don't", "!"]
    (a,) = align_words(tok, [words])
    running = raw(" " + " ".join(words), add_special_tokens=False)["input_ids"]
    assert [i for i, w in zip(a.input_ids, a.piece_word) if w >= 0] == running


@pytest.mark.parametrize("make", [make_gpt2, make_roberta, make_llama3])
def test_prepare_tokenizer_twice_changes_nothing(make):
    once = prepare_tokenizer(make())
    twice = prepare_tokenizer(prepare_tokenizer(make()))
    assert twice.add_prefix_space is True
    assert align_words(twice, [SENTENCE])[0].input_ids == align_words(once, [SENTENCE])[0].input_ids


def test_gpt2_tokenizer_class_load_from_disk(tmp_path):
    """A file saved by transformers' own GPT2Tokenizer class (tokenizer_class = GPT2Tokenizer)."""
    from conftest import byte_level_vocab
    from transformers import GPT2Tokenizer

    vocab, merges = byte_level_vocab(["<|endoftext|>"])
    GPT2Tokenizer(vocab=vocab, merges=merges).save_pretrained(tmp_path)
    tok = load_tokenizer(str(tmp_path))
    (a,) = align_words(tok, [SENTENCE])
    assert pieces(tok, a) == BYTE_PIECES
    assert a.piece_word == BYTE_WORDS


def test_prepare_tokenizer_leaves_other_families_alone():
    for make in (make_wordpiece, make_sentencepiece):
        raw = make()
        tok = prepare_tokenizer(make())
        assert (
            align_words(tok, [SENTENCE])[0].input_ids == align_words(raw, [SENTENCE])[0].input_ids
        )


def test_prepare_tokenizer_needs_fast():
    with pytest.raises(ValueError, match="fast tokenizer"):
        prepare_tokenizer(SimpleNamespace(is_fast=False, name_or_path="slow-model"))


# -- SentencePiece style ------------------------------------------------------------------
def test_sentencepiece_alignment(sentencepiece_tokenizer):
    tok = sentencepiece_tokenizer
    (a,) = align_words(tok, [SENTENCE])
    # "▁unbelievable": ▁un + believ + able = -6 beats anything using single letters (-10 each);
    # "▁don't": ▁don + ' + t (no "'t" piece)
    assert pieces(tok, a) == [
        "<s>",
        "▁the",
        "▁cat",
        "▁un",
        "believ",
        "able",
        "▁$",
        "▁,",
        "▁don",
        "'",
        "t",
    ]
    assert a.piece_word == [-1, 0, 1, 2, 2, 2, 3, 4, 5, 5, 5]
    assert a.piece_kind == [CLS_LIKE] + [WORD] * 10


# -- word pooling --------------------------------------------------------------------------
def pooling_batch(tokenizer, from_mode) -> Batch:
    sentences = [["the", "unbelievable", "$"], ["the", "cat"]]
    examples = [Example(words=s, unit=f"s{i}", source=f"t:{i}") for i, s in enumerate(sentences)]
    alignments = align_words(tokenizer, sentences)
    return Batch(examples, alignments, pad_id=tokenizer.pad_token_id, from_mode=from_mode)


def pooling_attention() -> torch.Tensor:
    """[batch 2, head 2, piece 7, piece 7], hand-made (rows need not sum to 1: pooling is linear).

    Example 0 pieces: 0 [CLS] | 1 the | 2 un, 3 ##believ, 4 ##able | 5 $ | 6 [SEP]
    Example 1 pieces: 0 [CLS] | 1 the | 2 cat | 3 [SEP] | 4-6 padding
    """
    att = torch.zeros(2, 2, 7, 7)
    q = torch.arange(7.0)[:, None]
    k = torch.arange(7.0)[None, :]
    att[0, 0] = 10 * q + k  # A[q, k] = 10 q + k
    att[0, 1, 2] = torch.tensor([0.0, 5, 1, 0, 0, 0, 0])
    att[0, 1, 3] = torch.tensor([2.0, 0, 0, 0, 0, 0, 3])
    att[0, 1, 4] = torch.tensor([0.0, 0, 0, 1, 1, 4, 0])
    att[1, :, :4, :4] = 1.0  # every real (query, key) = 1
    att[1, :, 4:, :] = 100.0  # padding rows and columns: must be ignored
    att[1, :, :, 4:] = 100.0
    return att


# Key columns of `.words`: word 0, word 1, word 2, CLS-like, SEP-like.
# Example 0, head 0, "to" (sum over the key's pieces) for query piece q:
#   the: 10q+1   unbelievable: (10q+2)+(10q+3)+(10q+4) = 30q+9   $: 10q+5   CLS: 10q   SEP: 10q+6
# from-pooling of rows: the <- q=1, $ <- q=5, unbelievable <- q in {2, 3, 4}
#   q=1: [11, 39, 15, 10, 16]   q=5: [51, 159, 55, 50, 56]
#   mean over q=2,3,4 (mean q = 3): [31, 99, 35, 30, 36]
#   first (q=2): [21, 69, 25, 20, 26]
#   max (each column increases with q, so q=4): [41, 129, 45, 40, 46]
# Example 0, head 1: only rows 2, 3, 4 are non-zero; pooled to columns:
#   q=2: [0,5,1,0,0,0,0] -> [5, 1+0+0, 0, 0, 0] = [5, 1, 0, 0, 0]
#   q=3: [2,0,0,0,0,0,3] -> [0, 0, 0, 2, 3]
#   q=4: [0,0,0,1,1,4,0] -> [0, 0+1+1, 4, 0, 0] = [0, 2, 4, 0, 0]
#   mean: [5/3, 3/3, 4/3, 2/3, 3/3]; first: [5, 1, 0, 0, 0]; max (column-wise): [5, 2, 4, 2, 3]
#   rows of "the" and "$" are 0.
# Example 1 (two words, no third word), both heads: every real entry 1, each word has one piece:
#   word rows [1, 1, 0, 1, 1]; the padding word row is 0 in every mode.
EX1 = [[1.0, 1, 0, 1, 1], [1.0, 1, 0, 1, 1], [0.0, 0, 0, 0, 0]]
EXPECTED = {
    "mean": (
        [[11.0, 39, 15, 10, 16], [31.0, 99, 35, 30, 36], [51.0, 159, 55, 50, 56]],
        [[0.0, 0, 0, 0, 0], [5 / 3, 1, 4 / 3, 2 / 3, 1], [0.0, 0, 0, 0, 0]],
    ),
    "first": (
        [[11.0, 39, 15, 10, 16], [21.0, 69, 25, 20, 26], [51.0, 159, 55, 50, 56]],
        [[0.0, 0, 0, 0, 0], [5.0, 1, 0, 0, 0], [0.0, 0, 0, 0, 0]],
    ),
    "max": (
        [[11.0, 39, 15, 10, 16], [41.0, 129, 45, 40, 46], [51.0, 159, 55, 50, 56]],
        [[0.0, 0, 0, 0, 0], [5.0, 2, 4, 2, 3], [0.0, 0, 0, 0, 0]],
    ),
}


def test_pooling_batch_maps(wordpiece_tokenizer):
    batch = pooling_batch(wordpiece_tokenizer, "mean")
    assert batch.piece_word.tolist() == [[-1, 0, 1, 1, 1, 2, -1], [-1, 0, 1, -1, -2, -2, -2]]
    assert batch.piece_kind.tolist() == [
        [CLS_LIKE, WORD, WORD, WORD, WORD, WORD, SEP_LIKE],
        [CLS_LIKE, WORD, WORD, SEP_LIKE, PAD, PAD, PAD],
    ]
    assert batch.attention_mask.tolist() == [[1] * 7, [1, 1, 1, 1, 0, 0, 0]]
    assert batch.n_words.tolist() == [3, 2]
    assert batch.word_mask.tolist() == [[True, True, True], [True, True, False]]
    assert batch.input_ids[1, 4:].tolist() == [wordpiece_tokenizer.pad_token_id] * 3
    # from-weights of "unbelievable" (mean): 1/3 on pieces 2, 3, 4
    assert torch.allclose(batch.from_words[0, 1], torch.tensor([0, 0, 1 / 3, 1 / 3, 1 / 3, 0, 0]))
    assert batch.special_present.tolist() == [[True, True], [True, True]]


@pytest.mark.parametrize("mode", ["mean", "first", "max"])
def test_word_pooling(wordpiece_tokenizer, mode):
    batch = pooling_batch(wordpiece_tokenizer, mode)
    att = LayerAttention(5, pooling_attention(), batch)
    words = att.words
    assert words.shape == (1, 2, 2, 3, 5)  # [layer, batch, head, word, word + 2]
    words = words[0]
    head0, head1 = EXPECTED[mode]
    assert torch.allclose(words[0, 0], torch.tensor(head0), atol=1e-4)
    assert torch.allclose(words[0, 1], torch.tensor(head1), atol=1e-6)
    for head in range(2):
        assert torch.allclose(words[1, head], torch.tensor(EX1), atol=1e-6)
    assert att.words is att.words  # computed once, shared
    assert att.pieces.shape == (1, 2, 2, 7, 7) and att.layers == (5,)


def test_word_pooling_without_specials():
    """GPT-2 style (no specials): the CLS-like and SEP-like columns stay 0."""
    tok = make_gpt2(add_prefix_space=True)
    examples = [Example(words=["unbelievable", "cat"], unit="u", source="t:0")]
    alignments = align_words(tok, [ex.words for ex in examples])
    batch = Batch(examples, alignments, pad_id=tok.eos_token_id)
    # pieces: 0 Ġun, 1 believ, 2 able | 3 Ġcat  -- causal, rows sum to 1
    p = torch.tensor([[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0.2, 0.3, 0.5, 0], [0.1, 0.2, 0.3, 0.4]])
    words = LayerAttention(0, p[None, None, None], batch).words[0, 0, 0, 0]
    # unbelievable row = mean of rows 0-2: to itself (1 + 1 + 1) / 3 = 1, to cat 0
    # cat row = row 3: to unbelievable 0.1 + 0.2 + 0.3 = 0.6, to cat 0.4
    assert batch.special_present.tolist() == [[False, False]]
    assert torch.allclose(words, torch.tensor([[1.0, 0, 0, 0], [0.6, 0.4, 0, 0]]), atol=1e-6)
