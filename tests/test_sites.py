"""What `AttentionSite` carries: the module, its output and value projections, the norm
before it, and each head's W_V and W_O blocks (`value_weight`, `output_weight`).

The weights are checked against the model's own forward pass: the values the attention
function receives must equal x @ W_V[g] + b_V[g] computed from the value projection's input x,
and the output projection's output must equal sum_h z_h @ W_O[h] + b_O from the heads'
outputs z the attention function returned; fused projections (GPT-2's c_attn, GPT-NeoX's
interleaved query_key_value, Phi-3's qkv_proj, ModernBERT's Wqkv) and grouped-query heads
(Llama, 2 kv heads for 4 query heads) included. SqueezeBERT (legacy path) has pointwise
nn.Conv1d projections, channels first and grouped: its W_V and W_O are checked entry by entry
against the convolutions' weights (block-diagonal by hand) and against its forward pass.
"""

from __future__ import annotations

import pytest
import torch
from test_architectures import FALCON_LEGACY, build, stack_batch
from test_capture import SENTENCES

from headprobe.model.attention import fallback, routed
from headprobe.model.discovery import attention_sites
from headprobe.model.sites import output_weight, value_bias, value_weight

TOL = 1e-5


def one_pass(model, inputs):
    """Per attention call, in order: (module, value [batch, kv, key, d], z [batch, query, head, d]);
    and per projection module, its inputs and outputs in call order."""
    calls, seen = [], {}

    def record(module, query, key, value, mask, scaling, dropout, kwargs):
        out, weights = fallback(module)(
            module, query, key, value, mask, scaling=scaling, dropout=dropout, **kwargs
        )
        calls.append((module, value.detach().clone(), out.detach().clone()))
        return out, weights

    def keep(module, args, output):
        seen.setdefault(module, []).append((args[0].detach().clone(), output.detach().clone()))

    handles = [
        m.register_forward_hook(keep)
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"
    ]
    try:
        with torch.no_grad(), routed(model, every=record):
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return calls, seen


@pytest.mark.parametrize(
    "name", ["bert", "gpt2", "llama-gqa", "t5", "gpt-neox", "phi3", "modernbert", "bart"]
)
def test_value_and_output_weights_recompute_the_model(name):
    built = build(name)
    sites = attention_sites(built.model)
    _, inputs = stack_batch(built, SENTENCES[:1], sites.stacks[-1])
    calls, seen = one_pass(built.model, inputs)
    assert len(calls) == len(sites.sites)
    for site, (module, value, z) in zip(sites.sites, calls):
        assert site.module is module
        assert value_weight(site).shape == (site.kv_heads, 32, site.d_head)
        assert output_weight(site).shape == (site.heads, site.d_head, 32)
        # values: the value projection's input, through W_V, is what the attention function got
        ((x, _),) = seen[site.value]  # [batch, key, d_model], called once in the pass
        bias = value_bias(site)
        v = torch.einsum("bkm,gmd->bgkd", x, value_weight(site))  # [batch, kv, key, d]
        if bias is not None:
            v = v + bias[None, :, None, :]
        assert (v - value).abs().max().item() <= TOL, (name, site.stack, site.layer)
        # output: sum over heads of z_h W_O[h] (+ bias) is the output projection's output
        out = torch.einsum("bqhd,hdm->bqm", z, output_weight(site))  # [batch, query, d_model]
        if site.output.bias is not None:
            out = out + site.output.bias
        expected = [o for i, o in seen[site.output] if torch.equal(i, z.flatten(2))]
        assert len(expected) >= 1 and (out - expected[0]).abs().max().item() <= TOL


def test_grouped_query_value_heads():
    """Llama with 4 query heads and 2 kv heads: W_V has 2 blocks, W_O has 4."""
    site = attention_sites(build("llama-gqa").model).sites[0]
    assert (site.heads, site.kv_heads, site.d_head) == (4, 2, 8)
    assert value_weight(site).shape == (2, 32, 8) and output_weight(site).shape == (4, 8, 32)


def test_norm_in_is_the_pre_attention_norm():
    """Pre-norm blocks name the norm their values read; post-norm (BERT, BART) have none."""
    for name, norm in [("llama-gqa", "input_layernorm"), ("gpt2", "ln_1"), ("t5", "layer_norm")]:
        model = build(name).model
        names = {m: n for n, m in model.named_modules()}
        for site in attention_sites(model).sites:
            if site.stack == "cross":  # values from the encoder's output, outside the block
                assert site.norm_in is None
            else:
                assert names[site.norm_in].endswith(norm), (name, site.name)
    for name in ("bert", "bart", "albert"):
        assert all(site.norm_in is None for site in attention_sites(build(name).model).sites)


def test_legacy_sites_carry_module_and_projections():
    """DeBERTa-v2, MPNet, BLOOM, Falcon, SqueezeBERT: no attention function, yet each site has its
    module (the innermost module that returned the field), the output projection gates use and,
    where it is one projection's output whole, the value projection; SqueezeBERT's field holds its
    scores (`softmax`), the others' the probabilities. BLOOM's and Falcon's values come out of a
    fused query_key_value: no value projection."""
    expected = {
        "deberta-v2": (
            "DisentangledSelfAttention",
            "attention.output.dense",
            "attention.self.value_proj",
        ),
        "mpnet": ("MPNetSelfAttention", "attention.attn.o", "attention.attn.v"),
        "bloom-alibi": ("BloomAttention", "self_attention.dense", None),
        **(
            {"falcon-alibi": ("FalconAttention", "self_attention.dense", None)}
            if FALCON_LEGACY
            else {}
        ),
        "squeezebert": ("SqueezeBertSelfAttention", "post_attention.conv1d", "attention.value"),
    }
    for name, (module_class, output, value) in expected.items():
        model = build(name).model
        names = {m: n for n, m in model.named_modules()}
        sites = attention_sites(model)
        assert sites.path == "legacy"
        assert [type(site.module).__name__ for site in sites.sites] == [module_class] * 2
        for layer, site in enumerate(sites.sites):
            assert names[site.output].endswith(f".{layer}.{output}"), (name, names[site.output])
            if value is None:
                assert site.value is None, name
            else:
                assert names[site.value].endswith(f".{layer}.{value}"), (name, names[site.value])
                assert site.value_index.tolist() == list(range(32))
            assert site.softmax == (name == "squeezebert")
        assert all(site.d_head == 8 for site in sites.sites)


def block_diagonal_by_hand(conv) -> torch.Tensor:
    """[out, in] of a kernel-1 nn.Conv1d with `groups` g: out channel o reads input channel c with
    weight[o, c - start, 0] where c is in o's group (start its first channel), else 0."""
    out, per_group, _ = conv.weight.shape
    full = torch.zeros(out, per_group * conv.groups)
    for o in range(out):
        group = o // (out // conv.groups)
        for i in range(per_group):
            full[o, group * per_group + i] = conv.weight[o, i, 0]
    return full


def test_pointwise_convolutions_recompute_squeezebert():
    """SqueezeBERT's value and output projections are nn.Conv1d (kernel 1, 2 groups, channels
    first): W_V and W_O equal the weights written out by hand, head h reads channels h*8..h*8+7
    (so W_O[0] and W_O[1] write only the first group's 16 output channels), and they recompute
    the model's own value and output convolutions."""
    built = build("squeezebert")
    model = built.model
    _, inputs = stack_batch(built, SENTENCES, "encoder")
    seen = {}

    def keep(module, args, output):
        seen[module] = (args[0].detach().clone(), output.detach().clone())

    sites = attention_sites(model).sites
    handles = [p.register_forward_hook(keep) for site in sites for p in (site.value, site.output)]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    for site in sites:
        assert (site.heads, site.kv_heads, site.d_head) == (4, 4, 8)
        w_v = block_diagonal_by_hand(site.value)  # [out, in]
        w_o = block_diagonal_by_hand(site.output)  # [out, in]
        for h in range(4):
            cut = slice(8 * h, 8 * (h + 1))
            assert torch.equal(value_weight(site)[h], w_v[cut].T)  # [d_model, d_head]
            assert torch.equal(output_weight(site)[h], w_o[:, cut].T)  # [d_head, d_model]
        assert (output_weight(site)[:2, :, 16:] == 0).all()  # heads 0, 1: first group only
        assert (output_weight(site)[2:, :, :16] == 0).all()
        # values: x (channels first) through W_V, plus the bias, is the value convolution's output
        x, y = seen[site.value]  # [batch, channel, piece] each
        v = torch.einsum("bmk,hmd->bhkd", x, value_weight(site)) + value_bias(site)[:, None]
        expected = y.unflatten(1, (4, 8)).transpose(2, 3)  # [batch, head, key, d_head]
        assert (v - expected).abs().max().item() <= TOL, site.layer
        # output: sum over heads of z_h W_O[h], plus the bias, is the output convolution's output
        z, out = seen[site.output]  # [batch, channel, piece] each
        total = torch.einsum("bhdq,hdm->bmq", z.unflatten(1, (4, 8)), output_weight(site))
        total = total + site.output.bias[:, None]
        assert (total - out).abs().max().item() <= TOL, site.layer
