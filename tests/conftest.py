"""Shared fixtures: tiny hand-built tokenizers and tiny random-weight models.

Every vocabulary below is small and explicit, so each test word's pieces can be
worked out by hand:

- WordPiece (BERT style): whole words are single pieces; "unbelievable" ->
  "un", "##believ", "##able" (greedy longest match); "don't" -> "don", "'",
  "t" (BertPreTokenizer splits punctuation); "$", ",", "." are single pieces.
- byte-level BPE (GPT-2 / RoBERTa / Llama-3 style): the 256 byte symbols plus
  merge chains that build "Ġ" + each whole word, "Ġun", "believ", "able",
  "Ġdon" and "'t". With a prefix space "unbelievable" -> "Ġun", "believ",
  "able"; "$" -> "Ġ$"; without one, "cat" -> "c", "a", "t".
- SentencePiece style (Metaspace + Unigram): "▁" + each whole word at score -1,
  "▁un", "believ", "able" at -2, single letters at -10, so the best
  segmentation of "▁unbelievable" is "▁un" + "believ" + "able" (-6).

Models are 2-3 layers, hidden 32, 4 heads, seeded, `.eval()`, loaded with
SDPA attention, each with an eager twin carrying the same weights.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import (
    AutoModel,
    BertConfig,
    GPT2Config,
    LlamaConfig,
    PreTrainedTokenizerFast,
    RobertaConfig,
)

# Whole words every tokenizer turns into exactly one piece (lower case: BERT lower-cases).
WHOLE_WORDS = [
    "the",
    "a",
    "big",
    "red",
    "cat",
    "dog",
    "mat",
    "sat",
    "ran",
    "on",
    "and",
    "it",
    "was",
    "saw",
    "down",
    "$",
    ",",
    ".",
    "!",
]
# Words with several pieces: unbelievable (3 pieces in every family), don't.
SPLIT_WORDS = ["unbelievable", "don't"]
WORDS = WHOLE_WORDS + SPLIT_WORDS

# --------------------------------------------------------------------------------------
# WordPiece (BERT)
# --------------------------------------------------------------------------------------
WP_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WP_VOCAB = WP_SPECIALS + WHOLE_WORDS + ["un", "##believ", "##able", "don", "'", "t"]


def make_wordpiece():
    vocab = {w: i for i, w in enumerate(WP_VOCAB)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
    )


# --------------------------------------------------------------------------------------
# byte-level BPE
# --------------------------------------------------------------------------------------
SPACE = "\u0120"  # "Ġ", the byte-level symbol for " "
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def merge_chain(token: str) -> list[tuple[str, str]]:
    """Merges building `token` left to right: 'Ġcat' -> (Ġ,c), (Ġc,a), (Ġca,t)."""
    out, current = [], token[0]
    for ch in token[1:]:
        out.append((current, ch))
        current += ch
    return out


def byte_level_vocab(specials: list[str]):
    targets = [SPACE + w for w in WHOLE_WORDS] + [
        SPACE + "un",
        SPACE + "don",
        "believ",
        "able",
        "'t",
    ]
    merges: list[tuple[str, str]] = []
    for target in targets:
        for m in merge_chain(target):
            if m not in merges:
                merges.append(m)
    vocab: dict[str, int] = {}
    for s in specials:
        vocab[s] = len(vocab)
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    return vocab, merges


def make_gpt2(add_prefix_space: bool = False):
    """GPT-2 style: ByteLevel pre-tokenizer, no special tokens added, no pad token."""
    vocab, merges = byte_level_vocab(["<|endoftext|>"])
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )


def make_roberta(add_prefix_space: bool = False):
    """RoBERTa style: ByteLevel pre-tokenizer, `<s> ... </s>` added by the post-processor."""
    vocab, merges = byte_level_vocab(["<s>", "<pad>", "</s>", "<unk>"])
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )


def make_llama3():
    """Llama-3 style: Split(regex) + ByteLevel(no prefix, no regex), BOS added, no pad token."""
    vocab, merges = byte_level_vocab(["<|begin_of_text|>", "<|end_of_text|>"])
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", vocab["<|begin_of_text|>"])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>"
    )


# --------------------------------------------------------------------------------------
# SentencePiece style (Metaspace + Unigram), Llama-2 like: `<s>` added in front
# --------------------------------------------------------------------------------------
META = "\u2581"  # "▁"


def make_sentencepiece():
    pieces = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0), ("<pad>", 0.0)]
    pieces += [(META + w, -1.0) for w in WHOLE_WORDS]
    pieces += [
        (META + "un", -2.0),
        ("believ", -2.0),
        ("able", -2.0),
        (META + "don", -2.0),
        ("'", -2.0),
        ("t", -2.0),
        (META, -5.0),
    ]
    have = {p for p, _ in pieces}
    pieces += [(c, -10.0) for c in "abcdefghijklmnopqrstuvwxyz" if c not in have]
    tok = Tokenizer(models.Unigram(pieces, unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=META, prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement=META, prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )


@pytest.fixture(scope="session")
def wordpiece_tokenizer():
    return make_wordpiece()


@pytest.fixture(scope="session")
def gpt2_tokenizer():
    return make_gpt2()


@pytest.fixture(scope="session")
def roberta_tokenizer():
    return make_roberta()


@pytest.fixture(scope="session")
def llama3_tokenizer():
    return make_llama3()


@pytest.fixture(scope="session")
def sentencepiece_tokenizer():
    return make_sentencepiece()


# --------------------------------------------------------------------------------------
# tiny models
# --------------------------------------------------------------------------------------
@dataclass
class Family:
    name: str
    tokenizer: object  # byte-level ones already given a prefix space
    sdpa: torch.nn.Module
    eager: torch.nn.Module
    n_layers: int
    causal: bool

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.tokenizer.eos_token_id


def twins(config, seed: int):
    """An SDPA model and an eager twin with the same weights, both in eval mode."""
    # each model gets its own copy: from_config sets the implementation on the config object it is given
    torch.manual_seed(seed)
    sdpa = AutoModel.from_config(copy.deepcopy(config), attn_implementation="sdpa").eval()
    eager = AutoModel.from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    assert sdpa.config is not eager.config
    eager.load_state_dict(sdpa.state_dict())
    assert sdpa.config._attn_implementation == "sdpa"
    assert eager.config._attn_implementation == "eager"
    return sdpa, eager


# initializer_range 0.3 (not 0.02) so that attention is far from uniform: argmaxes are
# clear and a capture that got the numbers wrong cannot hide behind near-uniform rows.
INIT = 0.3


def build_family(name: str) -> Family:
    if name == "bert":
        tok = make_wordpiece()
        config = BertConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=40,
            pad_token_id=tok.pad_token_id,
            initializer_range=INIT,
        )
        return Family(name, tok, *twins(config, 0), n_layers=3, causal=False)
    if name == "roberta":
        tok = make_roberta(add_prefix_space=True)
        config = RobertaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=42,
            pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            initializer_range=INIT,
        )
        return Family(name, tok, *twins(config, 1), n_layers=2, causal=False)
    if name == "gpt2":
        tok = make_gpt2(add_prefix_space=True)
        config = GPT2Config(
            vocab_size=len(tok),
            n_embd=32,
            n_layer=3,
            n_head=4,
            n_positions=40,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            initializer_range=INIT,
        )
        return Family(name, tok, *twins(config, 2), n_layers=3, causal=True)
    if name == "llama":
        tok = make_llama3()
        # a space before every word, set by hand (what headprobe.inputs.align.prepare_tokenizer does for
        # Split + ByteLevel tokenizers), so the model fixtures do not depend on the code under test
        tok.backend_tokenizer.normalizer = normalizers.Prepend(" ")
        config = LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=64,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            initializer_range=INIT,
        )
        return Family(name, tok, *twins(config, 3), n_layers=2, causal=True)
    raise ValueError(name)


def tiny_mpnet(tokenizer, initializer_range: float = 0.02):
    """A tiny MPNet: it calls no attention function (the capture's legacy output_attentions
    path); its value projection `attn.v` and output projection `attn.o` are found all the same."""
    from transformers import MPNetConfig

    config = MPNetConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=initializer_range,
    )
    torch.manual_seed(4)
    return AutoModel.from_config(config).eval()


FAMILIES = ["bert", "roberta", "gpt2", "llama"]
_FAMILY_CACHE: dict[str, Family] = {}


def get_family(name: str) -> Family:
    if name not in _FAMILY_CACHE:
        _FAMILY_CACHE[name] = build_family(name)
    return _FAMILY_CACHE[name]


@pytest.fixture(scope="session", params=FAMILIES)
def family(request) -> Family:
    return get_family(request.param)


@pytest.fixture(scope="session")
def bert_family() -> Family:
    return get_family("bert")


@pytest.fixture(scope="session")
def gpt2_family() -> Family:
    return get_family("gpt2")


@pytest.fixture(scope="session")
def roberta_family() -> Family:
    return get_family("roberta")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, bert_family) -> str:
    """The 3 x 4 random BERT and its WordPiece tokenizer saved to disk, for `--model PATH`."""
    path = tmp_path_factory.mktemp("tiny-bert")
    bert_family.sdpa.save_pretrained(path)
    bert_family.tokenizer.save_pretrained(path)
    return str(path)


@dataclass
class DefaultRun:
    """`headprobe run --quiet --out OUT` with no other option (what `make run` runs): its
    console and its results directory."""

    console: str
    out: object  # pathlib.Path


@pytest.fixture(scope="session")
def default_run(tmp_path_factory) -> DefaultRun:
    """The default run, once per session (slow: the bundled MiniLM on the bundled EWT dev and GUM
    documents; for tests marked slow only)."""
    import contextlib
    import io

    from headprobe.cli import main

    out = tmp_path_factory.mktemp("default-run") / "results"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main(["run", "--quiet", "--out", str(out)])
    assert status == 0, printed.getvalue()
    return DefaultRun(printed.getvalue(), out)
