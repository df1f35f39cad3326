"""Norm-based attention (issue 17, SPEC 7; Kobayashi et al. 2020).

- capture's `value_norms` equal ||v_j^h W_O^h|| computed directly from the value projection's
  output (hooked) and the output projection's weight, for BERT (W_O beside the
  self-attention: `attention.output.dense`), GPT-2 (Conv1D `c_proj`, values from the fused
  `c_attn`), Llama with grouped-query attention (`o_proj`) and a BERT spread over devices by
  accelerate with a layer offloaded to disk;
- adding `norms` to a run leaves every `weights` count bit-identical;
- a hand-built 3-piece input whose [SEP] value has norm 0: its mass vanishes under norms.
"""

from __future__ import annotations

import copy

import pytest
import torch

import headprobe
from conftest import get_family
from headprobe.capture import AttentionCapture, CaptureUnavailable, Heads, QueryBlock
from test_capture import SENTENCES, make_batch

TOL = 1e-5


def direct_value_norms(model, name: str, inputs) -> dict[int, torch.Tensor]:
    """{layer: [batch, head, key]} from the value projection's output (a forward hook) and the
    output projection's weight, head by head: || W_O[:, h*d:(h+1)*d] @ v_j^(group of h) ||."""
    config = model.config
    n_heads = config.num_attention_heads
    hidden = config.hidden_size
    if name == "bert":
        sites = [(layer.attention.self.value, layer.attention.output.dense.weight) for layer in model.encoder.layer]
    elif name == "gpt2":
        sites = [(block.attn.c_attn, block.attn.c_proj.weight.T) for block in model.h]      # Conv1D: [in, out]
    else:
        sites = [(layer.self_attn.v_proj, layer.self_attn.o_proj.weight) for layer in model.layers]
    values: dict[int, torch.Tensor] = {}
    handles = [projection.register_forward_hook(
        lambda module, args, output, layer=layer: values.__setitem__(layer, output.detach().clone()))
        for layer, (projection, _) in enumerate(sites)]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    out = {}
    for layer, (_, weight) in enumerate(sites):
        v = values[layer]                                             # [batch, key, features]
        if name == "gpt2":
            v = v[..., 2 * hidden:]                                   # q, k, v = c_attn(x).split(hidden)
        d = weight.shape[1] // n_heads
        kv = v.shape[-1] // d
        v = v.reshape(v.shape[0], v.shape[1], kv, d)                  # [batch, key, kv_head, d]
        norms = []
        for h in range(n_heads):
            w_h = weight[:, h * d:(h + 1) * d].detach().to(torch.float64)     # [hidden, d]
            v_h = v[:, :, h // (n_heads // kv)].to(torch.float64)              # [batch, key, d]
            norms.append(torch.linalg.vector_norm(v_h @ w_h.T, dim=-1))       # [batch, key]
        out[layer] = torch.stack(norms, dim=1).float()                # [batch, head, key]
    return out


def captured_norms(model, inputs, needs=("value_norms",)) -> dict[int, torch.Tensor]:
    with torch.no_grad(), headprobe.capture_heads(model, needs=needs) as heads:
        model(**inputs)
    return heads.value_norms


def inputs_of(family):
    batch = make_batch(family.tokenizer, SENTENCES, family.pad_id, causal=family.causal)
    return dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
@pytest.mark.parametrize("needs", [("value_norms",), ("probs", "value_norms")])
def test_value_norms_equal_the_direct_computation(name, needs):
    family = get_family(name)
    inputs = inputs_of(family)
    expected = direct_value_norms(family.sdpa, name, inputs)
    got = captured_norms(family.sdpa, inputs, needs)
    assert sorted(got) == list(range(family.n_layers))
    for layer, norms in expected.items():
        assert got[layer].shape == norms.shape
        assert got[layer].dtype == torch.float32
        torch.testing.assert_close(got[layer], norms, rtol=TOL, atol=TOL)
        assert norms.std() > 0.05 * norms.mean()                      # not a constant a wrong head could match


def test_value_norms_of_grouped_heads_differ_per_query_head():
    """GQA (Llama: 4 query heads over 2 KV heads): heads 0 and 1 read the same value vectors
    but have their own W_O blocks, so their norms differ."""
    family = get_family("llama")
    got = captured_norms(family.sdpa, inputs_of(family))[0]           # [batch, head, key]
    assert not torch.allclose(got[:, 0], got[:, 1])


def test_value_norms_on_a_model_spread_over_devices(tmp_path):
    """accelerate dispatch, layer 1 offloaded to disk (weights on the meta device between
    forwards): the captured norms equal the plain model's direct computation."""
    accelerate = pytest.importorskip("accelerate")
    family = get_family("bert")
    device_map = {"embeddings": "cpu", "encoder.layer.0": "cpu", "encoder.layer.1": "disk",
                  "encoder.layer.2": "cpu", "pooler": "cpu"}
    split = accelerate.dispatch_model(copy.deepcopy(family.sdpa), device_map=device_map, offload_dir=tmp_path,
                                      force_hooks=True)
    assert next(split.encoder.layer[1].parameters()).device.type == "meta"
    inputs = inputs_of(family)
    expected = direct_value_norms(family.sdpa, "bert", inputs)
    got = captured_norms(split, inputs, ("probs", "value_norms"))
    for layer, norms in expected.items():
        torch.testing.assert_close(got[layer], norms, rtol=TOL, atol=TOL)


def test_named_capture_hands_on_what_is_asked_and_leaves_the_output():
    family = get_family("llama")
    inputs = inputs_of(family)
    with torch.no_grad():
        reference = family.sdpa(**inputs).last_hidden_state
        seen = []
        with AttentionCapture(family.sdpa, [1], lambda layer, heads, block: seen.append((layer, heads, block)),
                              query_block=4, needs={"probs", "value_norms"}):
            blocked = family.sdpa(**inputs).last_hidden_state
    torch.testing.assert_close(blocked, reference, rtol=TOL, atol=TOL)
    t = inputs["input_ids"].shape[1]
    assert [block for _, _, block in seen] == [QueryBlock(s, min(s + 4, t), t) for s in range(0, t, 4)]
    for layer, heads, block in seen:
        assert isinstance(heads, Heads) and set(heads) == {"probs", "value_norms"}
        assert heads.probs.shape[2] == block.stop - block.start
        assert heads.value_norms.shape[-1] == t                       # every key in every block


def test_bad_needs_and_the_legacy_path(bert_family):
    with pytest.raises(ValueError, match="unknown capture quantity 'values'"):
        AttentionCapture(bert_family.sdpa, None, None, needs={"values"})
    with pytest.raises(NotImplementedError, match="head_output"):
        AttentionCapture(bert_family.sdpa, None, None, needs={"head_output"})
    legacy = copy.deepcopy(bert_family.eager)
    legacy._supports_attention_backend = False                        # as MPNet: output_attentions only
    with pytest.raises(CaptureUnavailable, match="BertModel.*value_norms.*norms measure"):
        AttentionCapture(legacy, None, None, needs={"probs", "value_norms"})
    with torch.no_grad(), headprobe.capture_heads(legacy, needs={"probs"}) as heads:
        legacy(**inputs_of(bert_family))
    assert sorted(heads.probs) == [0, 1, 2]
