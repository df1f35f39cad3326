"""Every self-attention family transformers can load, never a silent zero (issue 16).

Tiny random models (2 layers, hidden 32, 4 heads) of 26 families, each with a small
tokenizer from conftest. The query/key projections are redrawn large (`GAIN`) so attention
is peaky (near-uniform rows would hide a wrong mask, bias or scale); `test_attention_is_peaky`
checks it. For each family and each of its attention stacks (encoder; decoder; cross for
T5 and BART):

- `test_capture_equals_eager`: what `AttentionCapture` hands on equals the eager twin's
  `output_attentions` (the model's own numbers, an independent computation) to 1e-5, every
  layer, on a padded batch of three sentences and on one sentence without padding, with the
  inputs the engine feeds (`Sites.model_inputs`). The extra terms are covered this way: T5's
  relative position bias, DeBERTa-v2's disentangled attention (legacy path), ModernBERT's
  local/global layers, Mistral's and Gemma's sliding windows (3 < the sentence's pieces),
  Gemma-2's soft-capping, GPT-OSS's attention sinks (a keyword `eager_probs` does not know:
  computed by the family's own eager function), BLOOM's ALiBi (legacy path), SqueezeBERT's
  pointwise convolutions, grouped, channels first (legacy path; its `output_attentions` are the
  scores, mask added, not probabilities: its reference is what its own nn.Softmax modules return).
- `test_run_by_path`: the model and its tokenizer saved with `save_pretrained`, `headprobe run
  --model DIR` exits 0 with counts that are not zero, per stack.

And a model that hides its attention fails with one line and exit 2; a layer that stops
being captured after discovery is an error, not a zero.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from functools import cache

import pandas as pd
import pytest
import torch
import transformers as tf
from conftest import make_gpt2, make_llama3, make_roberta, make_sentencepiece, make_wordpiece
from test_capture import SENTENCES
from test_cli import conllu_text
from tokenizers import normalizers, processors
from transformers import AutoModel

from headprobe.cli import main
from headprobe.config import RunConfig
from headprobe.inputs.align import align_words
from headprobe.inputs.batching import Batch
from headprobe.inputs.corpora.base import Example
from headprobe.model.attention import CaptureError
from headprobe.model.capture import AttentionCapture
from headprobe.model.discovery import attention_sites
from headprobe.model.projections import projection_in_features

TOL = 1e-5
# Falcon computes its ALiBi attention itself (the legacy path) before transformers 5.25, through
# the attention functions (the interface path) from 5.25 on
FALCON_LEGACY = (
    {"falcon-alibi"} if tuple(int(x) for x in tf.__version__.split(".")[:2]) < (5, 25) else set()
)
GAIN = 2.5  # q/k weights ~ N(0, GAIN^2 / hidden): attention scores with a spread of ~GAIN^2
# T5 does not scale Q K^T by 1/sqrt(head_dim): a smaller gain gives it scores of the same spread (with
# scores ~3x larger, float rounding between SDPA and eager in one layer grows past 1e-5 in the next)
GAINS = {"t5": 1.5, "t5-encoder": 1.5}
QK_NAMES = {
    "query",
    "key",
    "q_proj",
    "k_proj",
    "q",
    "k",
    "q_lin",
    "k_lin",
    "Wqkv",
    "c_attn",
    "query_key_value",
    "qkv_proj",
    "query_proj",
    "key_proj",
    "pos_query_proj",
    "pos_key_proj",
}
QK_NORMS = {"q_norm", "k_norm"}  # per-head norms after the projection (Qwen3, Gemma3)
FIELDS = {
    "encoder": "encoder_attentions",
    "decoder": "decoder_attentions",
    "cross": "cross_attentions",
}
H = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def make_t5_tokenizer():
    """SentencePiece style with `</s>` appended (T5), pad = id 3."""
    tok = make_sentencepiece()
    backend = tok.backend_tokenizer
    eos = tok.convert_tokens_to_ids("</s>")
    backend.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", eos)]
    )
    return tf.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def make_llama3_spaced():
    tok = make_llama3()
    tok.backend_tokenizer.normalizer = normalizers.Prepend(
        " "
    )  # as headprobe.inputs.align does for it
    return tok


TOKENIZERS = {
    "wordpiece": make_wordpiece,
    "roberta": lambda: make_roberta(add_prefix_space=True),
    "gpt2": lambda: make_gpt2(add_prefix_space=True),
    "llama3": make_llama3_spaced,
    "sentencepiece": make_sentencepiece,
    "t5": make_t5_tokenizer,
}


def ids(tok) -> dict:
    return dict(
        vocab_size=len(tok),
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else 0,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )


def decoder_only(config_class, tok, **extra):
    return config_class(**H, **ids(tok), max_position_embeddings=64, num_key_value_heads=2, **extra)


# name -> (tokenizer, config from tokenizer, model class, stacks)
FAMILIES = {
    "bert": (
        "wordpiece",
        lambda t: tf.BertConfig(**H, **ids(t), max_position_embeddings=64),
        AutoModel,
        ["encoder"],
    ),
    "roberta": (
        "roberta",
        lambda t: tf.RobertaConfig(**H, **ids(t), max_position_embeddings=66),
        AutoModel,
        ["encoder"],
    ),
    "distilbert": (
        "wordpiece",
        lambda t: tf.DistilBertConfig(
            vocab_size=len(t),
            dim=32,
            n_layers=2,
            n_heads=4,
            hidden_dim=64,
            max_position_embeddings=64,
            pad_token_id=t.pad_token_id,
        ),
        AutoModel,
        ["encoder"],
    ),
    # embeddings (16) projected to the hidden size (32) with no norm after: a larger init keeps
    # the hidden states, hence the scores, from being tiny
    "albert": (
        "sentencepiece",
        lambda t: tf.AlbertConfig(
            **H, **ids(t), embedding_size=16, initializer_range=0.3, max_position_embeddings=64
        ),
        AutoModel,
        ["encoder"],
    ),
    "electra": (
        "wordpiece",
        lambda t: tf.ElectraConfig(
            **H, **ids(t), embedding_size=16, initializer_range=0.3, max_position_embeddings=64
        ),
        AutoModel,
        ["encoder"],
    ),
    "deberta-v2": (
        "sentencepiece",
        lambda t: tf.DebertaV2Config(
            **H,
            **ids(t),
            max_position_embeddings=64,
            relative_attention=True,
            position_buckets=8,
            max_relative_positions=16,
            pos_att_type=["p2c", "c2p"],
            position_biased_input=False,
        ),
        AutoModel,
        ["encoder"],
    ),
    "modernbert": (
        "roberta",
        lambda t: tf.ModernBertConfig(
            **H,
            **ids(t),
            cls_token_id=t.cls_token_id,
            sep_token_id=t.sep_token_id,
            max_position_embeddings=64,
            local_attention=4,
            global_attn_every_n_layers=2,
        ),
        AutoModel,
        ["encoder"],
    ),
    "mpnet": (
        "wordpiece",
        lambda t: tf.MPNetConfig(**H, **ids(t), max_position_embeddings=64),
        AutoModel,
        ["encoder"],
    ),
    "xlm-roberta": (
        "sentencepiece",
        lambda t: tf.XLMRobertaConfig(**H, **ids(t), max_position_embeddings=66),
        AutoModel,
        ["encoder"],
    ),
    "gpt2": (
        "gpt2",
        lambda t: tf.GPT2Config(
            vocab_size=len(t),
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            bos_token_id=t.bos_token_id,
            eos_token_id=t.eos_token_id,
        ),
        AutoModel,
        ["decoder"],
    ),
    "gpt-neox": (
        "gpt2",
        lambda t: tf.GPTNeoXConfig(**H, **ids(t), max_position_embeddings=64),
        AutoModel,
        ["decoder"],
    ),
    "opt": (
        "gpt2",
        lambda t: tf.OPTConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            ffn_dim=64,
            word_embed_proj_dim=32,
            max_position_embeddings=64,
            **ids(t),
        ),
        AutoModel,
        ["decoder"],
    ),
    "llama-gqa": ("llama3", lambda t: decoder_only(tf.LlamaConfig, t), AutoModel, ["decoder"]),
    "mistral-window": (
        "sentencepiece",
        lambda t: decoder_only(tf.MistralConfig, t, sliding_window=3),
        AutoModel,
        ["decoder"],
    ),
    "qwen2": ("llama3", lambda t: decoder_only(tf.Qwen2Config, t), AutoModel, ["decoder"]),
    "qwen3": (
        "llama3",
        lambda t: decoder_only(tf.Qwen3Config, t, head_dim=8),
        AutoModel,
        ["decoder"],
    ),
    "gemma2-softcap": (
        "sentencepiece",
        lambda t: decoder_only(
            tf.Gemma2Config,
            t,
            head_dim=8,
            sliding_window=3,
            attn_logit_softcapping=5.0,
            query_pre_attn_scalar=8,
        ),
        AutoModel,
        ["decoder"],
    ),
    "gemma3": (
        "sentencepiece",
        lambda t: decoder_only(
            tf.Gemma3TextConfig,
            t,
            head_dim=8,
            sliding_window=3,
            query_pre_attn_scalar=8,
            layer_types=["sliding_attention", "full_attention"],
        ),
        AutoModel,
        ["decoder"],
    ),
    "phi3": ("llama3", lambda t: decoder_only(tf.Phi3Config, t), AutoModel, ["decoder"]),
    "gpt-oss-sinks": (
        "llama3",
        lambda t: decoder_only(
            tf.GptOssConfig,
            t,
            head_dim=8,
            num_local_experts=2,
            num_experts_per_tok=1,
            sliding_window=3,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        AutoModel,
        ["decoder"],
    ),
    "bloom-alibi": (
        "gpt2",
        lambda t: tf.BloomConfig(
            vocab_size=len(t),
            hidden_size=32,
            n_layer=2,
            n_head=4,
            bos_token_id=t.bos_token_id,
            eos_token_id=t.eos_token_id,
            pad_token_id=t.eos_token_id,
        ),
        AutoModel,
        ["decoder"],
    ),
    # legacy code with an SDPA path: under SDPA its output_attentions are empty; capture runs it eager
    "falcon-alibi": (
        "gpt2",
        lambda t: tf.FalconConfig(
            vocab_size=len(t),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            alibi=True,
            bos_token_id=t.bos_token_id,
            eos_token_id=t.eos_token_id,
        ),
        AutoModel,
        ["decoder"],
    ),
    # every projection a pointwise nn.Conv1d over [batch, channel, piece], grouped (the value and
    # output projections in 2 groups of 2 heads); output_attentions returns its scores
    "squeezebert": (
        "wordpiece",
        lambda t: tf.SqueezeBertConfig(
            **H,
            **ids(t),
            embedding_size=32,
            max_position_embeddings=64,
            q_groups=2,
            k_groups=2,
            v_groups=2,
            post_attention_groups=2,
            intermediate_groups=4,
            output_groups=4,
        ),
        AutoModel,
        ["encoder"],
    ),
    "t5": (
        "t5",
        lambda t: tf.T5Config(
            **ids(t),
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=16,
            decoder_start_token_id=t.pad_token_id,
        ),
        AutoModel,
        ["encoder", "decoder", "cross"],
    ),
    "t5-encoder": (
        "t5",
        lambda t: tf.T5Config(
            **ids(t),
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=16,
            decoder_start_token_id=t.pad_token_id,
        ),
        tf.T5EncoderModel,
        ["encoder"],
    ),
    "bart": (
        "roberta",
        lambda t: tf.BartConfig(
            **ids(t),
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=64,
            decoder_start_token_id=t.eos_token_id,
            forced_eos_token_id=None,
        ),
        AutoModel,
        ["encoder", "decoder", "cross"],
    ),
}
CASES = [(name, stack) for name, (_, _, _, stacks) in FAMILIES.items() for stack in stacks]
SCORES_RETURNED = {"squeezebert"}  # output_attentions holds the scores: the softmax modules' output


@dataclass
class Built:
    name: str
    tokenizer: object
    model: torch.nn.Module  # the implementation a user would get (SDPA where the family has it)
    eager: torch.nn.Module  # the same weights under eager attention: the reference


def peaky(model, gain: float) -> None:
    """Redraw the query/key projections large (and per-head q/k norms scaled by `gain`)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            parts = name.split(".")
            if len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in QK_NAMES:
                param.normal_(0.0, gain / math.sqrt(32))
            elif len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in QK_NORMS:
                param.add_(gain - 1.0)  # RMSNorm weight w (scale w) or Gemma's (scale 1 + w)


def from_config(model_class, config, **kwargs):
    make = model_class.from_config if model_class is AutoModel else model_class._from_config
    return make(copy.deepcopy(config), **kwargs).eval()


@cache
def build(name: str) -> Built:
    tok_name, config_of, model_class, _ = FAMILIES[name]
    tok = TOKENIZERS[tok_name]()
    config = config_of(tok)
    torch.manual_seed(sorted(FAMILIES).index(name))
    model = from_config(model_class, config)
    peaky(model, GAINS.get(name, GAIN))
    eager = from_config(model_class, config, attn_implementation="eager")
    eager.load_state_dict(model.state_dict())
    return Built(name, tok, model, eager)


def stack_batch(built: Built, sentences, stack: str) -> tuple[Batch, dict]:
    """The batch a stack is scored on and the model inputs for it, as the engine builds them."""
    sites = attention_sites(built.model)
    examples = [
        Example(words=list(s), unit=f"s{i}", source=f"test:{i}") for i, s in enumerate(sentences)
    ]
    alignments = [
        sites.scoring_alignment(a, stack)
        for a in align_words(built.tokenizer, [e.words for e in examples])
    ]
    pad = built.tokenizer.pad_token_id if built.tokenizer.pad_token_id is not None else 0
    batch = Batch(examples, alignments, pad)
    return batch, sites.model_inputs(batch, stack)


def reference(built: Built, inputs: dict, stack: str) -> tuple:
    if built.name in SCORES_RETURNED:
        return softmax_outputs(built.eager, inputs)
    with torch.no_grad():
        out = built.eager(**inputs, output_attentions=True)
    field = FIELDS[stack] if attention_sites(built.model).encoder_decoder else "attentions"
    return getattr(out, field)


def softmax_outputs(model, inputs: dict) -> tuple:
    """What the model's own nn.Softmax modules returned in one forward pass, in call order."""
    got = []
    handles = [
        m.register_forward_hook(lambda m, args, out: got.append(out.detach().clone()))
        for m in model.modules()
        if isinstance(m, torch.nn.Softmax)
    ]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return tuple(got)


def capture_all(built: Built, inputs: dict, stack: str) -> dict[int, torch.Tensor]:
    got = {}
    with (
        torch.no_grad(),
        AttentionCapture(
            built.model, None, lambda layer, p: got.__setitem__(layer, p.clone()), stack=stack
        ),
    ):
        built.model(**inputs)
    return got


def real_lengths(inputs: dict, stack: str) -> tuple[list[int], list[int]]:
    """Real query and key positions per example."""
    mask = inputs.get("attention_mask")  # none: an unpadded batch, every position real
    ids = inputs["input_ids"]
    encoder = mask.sum(1).tolist() if mask is not None else [ids.shape[1]] * len(ids)
    decoder = inputs.get("decoder_attention_mask")
    decoder = (
        decoder.sum(1).tolist()
        if decoder is not None
        else [inputs.get("decoder_input_ids", inputs["input_ids"]).shape[1]] * len(encoder)
    )
    if "decoder_input_ids" not in inputs or stack == "encoder":
        return encoder, encoder
    return decoder, (decoder if stack == "decoder" else encoder)


@pytest.mark.parametrize("name,stack", CASES)
def test_capture_equals_eager(name, stack):
    built = build(name)
    sites = attention_sites(built.model)
    assert sites.stacks == FAMILIES[name][3]
    for sentences in (SENTENCES, SENTENCES[:1]):  # padded batch; one sentence, no padding
        batch, inputs = stack_batch(built, sentences, stack)
        expected = reference(built, inputs, stack)
        got = capture_all(built, inputs, stack)
        assert sorted(got) == list(range(len(expected))) == list(range(2)), (
            sites.path,
            sorted(got),
        )
        queries, keys = real_lengths(inputs, stack)
        for layer, probs in got.items():
            assert probs.dtype == torch.float32 and probs.shape == expected[layer].shape
            for row, (n_q, n_k) in enumerate(zip(queries, keys)):
                diff = (
                    (probs[row, :, :n_q, :n_k] - expected[layer][row, :, :n_q, :n_k].float())
                    .abs()
                    .max()
                    .item()
                )
                assert diff <= TOL, (
                    f"{name} {stack} layer {layer} example {row}: max abs diff {diff}"
                )


@pytest.mark.parametrize("name,stack", CASES)
def test_attention_is_peaky(name, stack):
    """The redrawn weights make attention far from uniform: over rows with 3 or more visible
    keys, the row maximum's share of the row exceeds the uniform share 1/n by 0.3 on average
    (uniform attention: 0; rows need not sum to 1: GPT-OSS's sinks take a part)."""
    built = build(name)
    _, inputs = stack_batch(built, SENTENCES[:1], stack)
    for probs in reference(built, inputs, stack):
        probs = probs[0].float()  # [head, query, key]
        n_visible = (probs > 0).sum(-1).float()  # [head, query]
        excess = probs.amax(-1) / probs.sum(-1) - 1.0 / n_visible  # [head, query]
        assert excess[n_visible >= 3].mean().item() >= 0.3


def test_causality_per_stack():
    """Causal where the site's own mask says so: T5's and BART's decoder, not their encoder or
    cross-attention; sliding-window encoders (ModernBERT) are not causal, decoders are."""
    for name, (_, _, _, stacks) in FAMILIES.items():
        sites = attention_sites(build(name).model)
        for stack in stacks:
            assert sites.causal(stack) == (stack == "decoder"), (name, stack)
            assert all(site.causal == (stack == "decoder") for site in sites.of(stack)), (
                name,
                stack,
            )


def test_shared_layer_is_one_site_per_call():
    """ALBERT's one shared layer runs twice: two sites, one module, layers 0 and 1."""
    sites = attention_sites(build("albert").model)
    assert [site.layer for site in sites.of("encoder")] == [0, 1]
    assert len({id(site.module) for site in sites.of("encoder")}) == 1


def test_output_projection_found():
    """Every site's output projection reads heads x d_head features (SqueezeBERT: input channels
    of its pointwise convolution)."""
    for name in (
        "bert",
        "albert",
        "distilbert",
        "gpt2",
        "llama-gqa",
        "t5",
        "bart",
        "modernbert",
        "gpt-neox",
        "squeezebert",
    ):
        sites = attention_sites(build(name).model)
        assert all(
            site.output is not None
            and projection_in_features(site.output) == site.heads * site.d_head == 32
            for site in sites.sites
        ), name


def run_cli(tmp_path, name, *options) -> tuple[int, dict, pd.DataFrame]:
    built = build(name)
    model_dir = tmp_path / "model"
    if not model_dir.exists():
        built.model.save_pretrained(model_dir)
        built.tokenizer.save_pretrained(model_dir)
    treebank = tmp_path / "tiny.conllu"
    treebank.write_text(conllu_text())
    out = tmp_path / ("out" + "".join(options).replace("-", "_"))
    rc = main(
        [
            "run",
            "--model",
            str(model_dir),
            "--treebank",
            str(treebank),
            "--out",
            str(out),
            "--bootstrap",
            "10",
            "--no-report",
            "--quiet",
            "--checkpoint-every",
            "0",
            "--device",
            "cpu",
            *options,
        ]
    )
    if rc != 0:
        return rc, {}, pd.DataFrame()
    return (
        rc,
        json.loads((out / "summary.json").read_text()),
        pd.read_parquet(out / "counts.parquet"),
    )


@pytest.mark.parametrize("name", list(FAMILIES))
def test_run_by_path(name, tmp_path):
    for stack in FAMILIES[name][3]:
        options = () if stack == "encoder" else ("--stack", stack)
        rc, summary, counts = run_cli(tmp_path, name, *options)
        assert rc == 0, (name, stack)
        assert summary["stack"] == stack and summary["n_layers"] == 2
        heads = counts[counts["layer"] >= 0]
        analyses = (
            {"surface", "positional"}
            if stack == "cross"
            else {"dependency", "surface", "positional"}
        )
        assert set(heads["analysis"]) == analyses
        assert (
            heads["n"].sum() > 0
            and heads["mass"].fillna(0).sum() + heads["hits"].fillna(0).sum() > 0
        )
        if stack != "cross":
            dependency = heads[(heads["analysis"] == "dependency") & (heads["fold"] == "")]
            assert dependency["hits"].sum() > 0, (name, stack)


def test_cross_stack_refuses_dependency(tmp_path, capsys):
    rc = main(
        [
            "run",
            "--model",
            "unused",
            "--stack",
            "cross",
            "--analyses",
            "dependency",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "dependency is not defined on cross-attention" in err[0]


def test_stack_the_model_lacks(tmp_path, capsys):
    rc, _, _ = run_cli(tmp_path, "bert", "--stack", "decoder")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith(
        "headprobe: error: --stack decoder: BertModel has no decoder attention"
    )


@pytest.mark.skipif(
    not FALCON_LEGACY, reason="transformers >= 5.25 runs Falcon through its attention functions"
)
def test_legacy_path_runs_eager_and_is_undone():
    """Falcon (ALiBi) computes attention itself and has an SDPA path (transformers < 5.25): the
    capture switches it to eager (so output_attentions has the probabilities) and back. No other
    legacy family has an SDPA path."""
    model = build("falcon-alibi").model
    assert attention_sites(model).path == "legacy" and model.config._attn_implementation == "sdpa"
    seen = []
    _, inputs = stack_batch(build("falcon-alibi"), SENTENCES[:1], "decoder")
    with (
        torch.no_grad(),
        AttentionCapture(
            model, [1], lambda layer, p: seen.append(model.config._attn_implementation)
        ),
    ):
        out = model(**inputs)
    assert seen == ["eager"] and model.config._attn_implementation == "sdpa"
    assert out.attentions is None  # not kept on the output


# -- never a silent zero ------------------------------------------------------------------------
class HiddenConfig(tf.PretrainedConfig):
    model_type = "headprobe-hidden-attention"

    def __init__(
        self, vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, **kwargs
    ):
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        super().__init__(**kwargs)


class HiddenAttentionModel(tf.PreTrainedModel):
    """Attention by torch's nn.MultiheadAttention: no transformers attention function, and
    nothing for output_attentions."""

    config_class = HiddenConfig
    base_model_prefix = "hidden"

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = torch.nn.ModuleList(
            torch.nn.MultiheadAttention(
                config.hidden_size, config.num_attention_heads, batch_first=True
            )
            for _ in range(config.num_hidden_layers)
        )
        self.post_init()

    def forward(self, input_ids, attention_mask=None, **kwargs):
        hidden = self.embed(input_ids)
        for layer in self.layers:
            hidden = hidden + layer(hidden, hidden, hidden, need_weights=False)[0]
        return tf.modeling_outputs.BaseModelOutput(last_hidden_state=hidden)


def test_model_that_hides_its_attention_fails_with_one_line(tmp_path, capsys):
    from transformers import AutoConfig

    if HiddenConfig.model_type not in tf.CONFIG_MAPPING:
        AutoConfig.register(HiddenConfig.model_type, HiddenConfig)
        AutoModel.register(HiddenConfig, HiddenAttentionModel)
    tok = make_wordpiece()
    HiddenAttentionModel(HiddenConfig(vocab_size=len(tok))).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    (tmp_path / "tiny.conllu").write_text(conllu_text())
    capsys.readouterr()
    rc = main(
        [
            "run",
            "--model",
            str(tmp_path / "model"),
            "--treebank",
            str(tmp_path / "tiny.conllu"),
            "--out",
            str(tmp_path / "out"),
            "--quiet",
            "--no-report",
            "--device",
            "cpu",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("headprobe: error: HiddenAttentionModel: no attention found")
    assert "interface path" in err[0] and "legacy path" in err[0]
    assert not (tmp_path / "out").exists()


def test_layer_not_captured_is_an_error():
    """A layer that stops calling attention after the sites were found (here: BERT's layer 1
    replaced by the identity) is an error naming the model, the stack, the path and the layer."""
    model = copy.deepcopy(build("bert").model)
    _, inputs = stack_batch(build("bert"), SENTENCES, "encoder")
    assert attention_sites(model).n_layers() == 2  # found with both layers
    model.encoder.layer[1].forward = lambda hidden_states, *args, **kwargs: hidden_states
    with pytest.raises(
        CaptureError,
        match=r"BertModel: 1 of the 2 asked-for layers of its encoder attention "
        r"were captured in a forward pass \(interface path\); missing layers \[1\]",
    ):
        with torch.no_grad(), AttentionCapture(model, None, lambda layer, p: None):
            model(**inputs)
    with (
        torch.no_grad(),
        AttentionCapture(model, [0], lambda layer, p: None),
    ):  # layer 0 alone: fine
        model(**inputs)


# -- the engine on every stack ------------------------------------------------------------------
def engine_counts(built: Built, examples, stack: str, query_block=None):
    from headprobe.scoring.engine import Engine
    from headprobe.studies.dependency.analysis import DependencyScorer
    from headprobe.studies.positional.analysis import PositionalScorer
    from headprobe.studies.surface.analysis import SurfaceScorer

    scorers = [PositionalScorer(), SurfaceScorer()] + (
        [DependencyScorer()] if stack != "cross" else []
    )
    engine = Engine(
        built.model,
        built.tokenizer,
        scorers,
        RunConfig(
            batch_size=4,
            progress=False,
            keep_unit_counts=True,
            n_boot=10,
            query_block=query_block,
            stack=stack,
        ),
    )
    engine.run(examples)
    return engine


@pytest.mark.parametrize(
    "name,stack",
    [
        ("t5", "decoder"),
        ("t5", "cross"),
        ("bart", "cross"),
        ("gpt-oss-sinks", "decoder"),
        ("deberta-v2", "encoder"),
    ],
)
def test_query_blocks_same_counts(name, stack):
    """Query blocks of 2 pieces count exactly what whole matrices count: on an encoder-decoder's
    decoder (start token first) and cross-attention (the start token's row dropped), on a layer
    the family's eager function computes (GPT-OSS) and on the legacy path (DeBERTa-v2)."""
    from test_engine import random_sentences
    from test_query_block import KEY, assert_identical

    examples = random_sentences(12, seed=1)
    engines = [
        engine_counts(build(name), examples, stack, query_block) for query_block in (None, 2)
    ]
    tables = []
    for engine in engines:
        counts = pd.concat([s.unit_counts() for s in engine.scorers], ignore_index=True)
        counts = counts.astype(
            {c: str for c in ("analysis", "label", "unit", "direction", "variant")}
        )
        tables.append(
            counts.astype(
                {"layer": int, "head": int, "n": float, "hits": float, "mass": float}
            ).sort_values(KEY, ignore_index=True)
        )
    assert tables[0]["n"].sum() > 0
    assert_identical(tables[0], tables[1], *engines)


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_word_attention_per_stack(name):
    """Word-level attention of each stack (`pictures.word_attention`) is eager's, pooled to the
    stack's pieces: the decoder's start token is a CLS/BOS-like column; cross-attention's row
    for a word is the decoder position that reads its pieces."""
    from headprobe.scoring.pooling import pool_words
    from headprobe.scoring.sentence_attention import word_attention

    built = build(name)
    words = SENTENCES[0]
    for stack in ("encoder", "decoder", "cross"):
        got = word_attention(
            built.model, built.tokenizer, words, 1, stack=stack
        )  # [head, word, word + 2]
        batch, inputs = stack_batch(built, [words], stack)
        pieces = reference(built, inputs, stack)[1].float()  # [1, head, query, key]
        if stack == "cross":
            pieces = pieces[:, :, 1:]
        expected = pool_words(pieces, batch, "mean", batch.max_words)[0]
        assert got.shape == (4, len(words), len(words) + 2)
        assert (got - expected).abs().max().item() <= TOL, stack
