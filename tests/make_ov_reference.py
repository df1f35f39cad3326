"""Reference OV-copying tables for tests/test_ov_copying.py: every head's copying score and
copy-rate hits on two tiny random models, saved as tests/data/ov_reference.npz.

    PYTHONPATH=$PWD python tests/make_ov_reference.py            # writes the fixture

The fixture was made with the code before the copy rate was counted in cache-sized blocks
(commit 269fd72, then headprobe/scorers/ov_copying.py: the top-k of each 512-row chunk of
full-vocabulary logits); the test reruns
`ov_heads` on the same models and tokens with the code as it is and compares.

- `llama`: Llama with GQA (6 query heads over 2 KV heads, d_head 8), 2 layers, vocabulary
  1,000, its own LM head (the embeddings plus noise, so copying shows), random gains in every
  norm; layer 1 head 0 planted to copy (W_O^h = W_V^T), head 4 to suppress (-W_V^T).
- `gpt2`: GPT-2 (LayerNorm, tied head), 2 layers x 4 heads, vocabulary 800, random gains;
  layer 0 head 1 planted to copy, layer 1 head 3 writes nothing (every logit ties: no hit).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

FIXTURE = Path(__file__).resolve().parent / "data" / "ov_reference.npz"
COLUMNS = ("layer", "head", "kv_group", "copying", "hits", "n")


def tiny_llama() -> LlamaForCausalLM:
    """The module docstring's Llama (seeded)."""
    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=48,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        max_position_embeddings=32,
    )
    torch.manual_seed(11)
    model = LlamaForCausalLM(config).eval()
    d = config.head_dim
    with torch.no_grad():
        embed = model.model.embed_tokens.weight
        model.lm_head.weight.copy_(embed + 0.5 * embed.std() * torch.randn_like(embed))
        for layer in model.model.layers:
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
        model.model.norm.weight.uniform_(0.5, 1.5)
        attention = model.model.layers[1].self_attn
        w_v = attention.v_proj.weight[:d]  # [d, hidden]: KV group 0's W_V^T
        attention.o_proj.weight[:, :d] = 3.0 * w_v.T  # head 0 (group 0) copies
        attention.o_proj.weight[:, 4 * d : 5 * d] = -3.0 * attention.v_proj.weight[d:].T
    return model


def tiny_gpt2() -> GPT2LMHeadModel:
    """The module docstring's GPT-2 (seeded)."""
    config = GPT2Config(
        vocab_size=800,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(12)
    model = GPT2LMHeadModel(config).eval()
    hidden, d = config.n_embd, config.n_embd // config.n_head
    with torch.no_grad():
        for block in model.transformer.h:
            block.ln_1.weight.uniform_(0.5, 1.5)
        model.transformer.ln_f.weight.uniform_(0.5, 1.5)
        first, second = (block.attn for block in model.transformer.h)
        w_v = first.c_attn.weight[:, 2 * hidden + d : 2 * hidden + 2 * d]  # [hidden, d]: head 1
        first.c_proj.weight[d : 2 * d] = 4.0 * w_v.T  # W_O^1 [d, hidden] = W_V^T: copies
        second.c_proj.weight[3 * d : 4 * d] = 0.0  # head 3 writes nothing
    return model


def sample(vocab: int, size: int, seed: int) -> np.ndarray:
    """Sorted ids of a seeded sample of `size` tokens among 2..vocab-1."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(np.arange(2, vocab), size=size, replace=False))


def cases() -> dict:
    """{name: (model, sampled token ids)}."""
    return {
        "llama": (tiny_llama(), sample(1000, 400, 1)),
        "gpt2": (tiny_gpt2(), sample(800, 600, 2)),
    }


def tables() -> dict:
    """{f"{case}/{column}": array} of `ov_heads` on every case, with the code as it is."""
    from headprobe.studies.ov_copying.ov_circuits import ov_heads

    out = {}
    for name, (model, tokens) in cases().items():
        heads = ov_heads(model, tokens)
        for column in COLUMNS:
            out[f"{name}/{column}"] = heads[column].to_numpy()
    return out


if __name__ == "__main__":
    made = tables()
    FIXTURE.parent.mkdir(exist_ok=True)
    np.savez(FIXTURE, **made)
    for key in sorted(made):
        if key.endswith(("/hits", "/copying")):
            print(key, np.round(made[key], 3).tolist())
