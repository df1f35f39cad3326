"""The named capture `head_output` (METHODS §9): c_h = z_h W_O^h per head.

Summed over heads, plus the output projection's bias, it must equal the output projection's
own output (a forward hook on that module), on BERT (`attention.output.dense`, beside the
self-attention), GPT-2 (Conv1D `c_proj`), Llama with grouped-query attention (`o_proj`),
T5 (`o`, encoder and cross attention) and SqueezeBERT (legacy path: a grouped pointwise
nn.Conv1d, `post_attention.conv1d`, whose output is channels first, [batch, hidden, query]).
"""

from __future__ import annotations

import pytest
import torch
from conftest import get_family
from test_capture import SENTENCES
from test_norms import TOL, inputs_of, module_outputs

import headprobe
from headprobe.model.discovery import attention_sites


def bias_of(projection) -> torch.Tensor:
    bias = getattr(projection, "bias", None)
    return bias.detach().float() if bias is not None else torch.zeros(())


def check_sum(model, inputs, stack=None) -> int:
    """Assert sum_h c_h + bias == the output projection's output for every layer of the stack;
    the number of layers checked."""
    sites = attention_sites(model).of(stack)
    projections = [site.output for site in sites]
    expected = module_outputs(model, inputs, projections)  # {layer: [batch, query, hidden]}
    for layer, projection in enumerate(projections):
        if isinstance(projection, torch.nn.Conv1d):  # [batch, hidden, query]
            expected[layer] = expected[layer].transpose(1, 2)
    with torch.no_grad(), headprobe.capture_heads(model, needs={"head_output"}, stack=stack) as got:
        model(**inputs)
    assert sorted(got.head_output) == list(range(len(sites)))
    for layer, site in enumerate(sites):
        c = got.head_output[layer]  # [batch, head, query, hidden]
        assert c.shape[1] == site.heads
        assert c.shape[2:] == expected[layer].shape[1:]
        total = c.sum(1) + bias_of(site.output)  # [batch, query, hidden]
        torch.testing.assert_close(total, expected[layer].float(), rtol=TOL, atol=TOL)
        # heads differ: no head alone is the whole output
        assert (c[:, 0] - c[:, 1]).abs().max() > 1e-3
    return len(sites)


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_head_output_sums_to_the_output_projection(name):
    family = get_family(name)
    assert check_sum(family.sdpa, inputs_of(family)) == family.n_layers


@pytest.mark.parametrize("stack", ["encoder", "cross"])
def test_head_output_of_t5(stack):
    from test_architectures import build, stack_batch

    built = build("t5")
    _, inputs = stack_batch(built, SENTENCES, stack)
    assert check_sum(built.model, inputs, stack) == built.model.config.num_layers


def test_head_output_of_squeezebert():
    """A grouped pointwise convolution, channels first, on the legacy path (padded batch)."""
    from test_architectures import build, stack_batch

    built = build("squeezebert")
    _, inputs = stack_batch(built, SENTENCES, "encoder")
    assert inputs["attention_mask"].min() == 0  # padded
    assert check_sum(built.model, inputs) == 2


def test_head_output_with_probs_leaves_the_model_unchanged():
    """Asking for head_output beside probs: both arrive, and the model's output is unchanged."""
    family = get_family("llama")
    inputs = inputs_of(family)
    with torch.no_grad():
        plain = family.sdpa(**inputs).last_hidden_state
        with headprobe.capture_heads(family.sdpa, needs={"probs", "head_output"}) as got:
            captured = family.sdpa(**inputs).last_hidden_state
    torch.testing.assert_close(captured, plain, rtol=TOL, atol=TOL)
    assert got.probs[1].shape[:2] == got.head_output[1].shape[:2]
