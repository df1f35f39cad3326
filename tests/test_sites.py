"""What `AttentionSite` carries: the module, its output and value projections, the norm
before it, and each head's W_V and W_O blocks (`value_weight`, `output_weight`).

The weights are checked against the model's own forward pass: the values the attention
function receives must equal x @ W_V[g] + b_V[g] computed from the value projection's input x,
and the output projection's output must equal sum_h z_h @ W_O[h] + b_O from the heads'
outputs z the attention function returned; fused projections (GPT-2's c_attn, GPT-NeoX's
interleaved query_key_value, Phi-3's qkv_proj, ModernBERT's Wqkv) and grouped-query heads
(Llama, 2 kv heads for 4 query heads) included.
"""

from __future__ import annotations

import pytest
import torch
from test_architectures import build, stack_batch
from test_capture import SENTENCES

from headprobe.model.attention import fallback, routed
from headprobe.model.sites import attention_sites, output_weight, value_bias, value_weight

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


def test_legacy_sites_carry_module_and_output_projection():
    """DeBERTa-v2, MPNet, BLOOM, Falcon: no attention function, yet each site has its module (the
    innermost module that returned the probabilities) and the output projection gates use."""
    expected = {
        "deberta-v2": ("DisentangledSelfAttention", "attention.output.dense"),
        "mpnet": ("MPNetSelfAttention", "attention.attn.o"),
        "bloom-alibi": ("BloomAttention", "self_attention.dense"),
        "falcon-alibi": ("FalconAttention", "self_attention.dense"),
    }
    for name, (module_class, output) in expected.items():
        model = build(name).model
        names = {m: n for n, m in model.named_modules()}
        sites = attention_sites(model)
        assert sites.path == "legacy"
        assert [type(site.module).__name__ for site in sites.sites] == [module_class] * 2
        for layer, site in enumerate(sites.sites):
            assert names[site.output].endswith(f".{layer}.{output}"), (name, names[site.output])
        assert all(site.d_head == 8 for site in sites.sites)
