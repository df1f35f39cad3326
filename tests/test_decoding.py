"""Greedy decoding with each step's query row (`headprobe.model.decoding`, METHODS §16).

The reference for a step's row: the whole sequence so far (prompt + the tokens generated before
the step) through an eager twin with `output_attentions=True`, its last query row. The tokens:
`model.generate(do_sample=False)`. Tiny random causal LMs from configs: a Llama with grouped
query attention (4 query heads over 2 KV heads), a GPT-2 and a BLOOM (ALiBi; the capture's
legacy `output_attentions` path); seeded, no downloads.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import (
    BloomConfig,
    BloomForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

from headprobe.model.capture import capture_heads
from headprobe.model.decoding import decode, stop_tokens

TOL = 1e-5
VOCAB = 48


def config_of(name: str):
    if name == "bloom":  # ALiBi, attention computed in the module: the legacy path
        return BloomForCausalLM, BloomConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            n_layer=2,
            n_head=4,
            initializer_range=0.3,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=0,
        )
    if name == "llama":
        return LlamaForCausalLM, LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,  # GQA: query heads 0,1 read KV head 0; 2,3 read KV head 1
            head_dim=8,
            max_position_embeddings=64,
            initializer_range=0.3,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=0,
        )
    return GPT2LMHeadModel, GPT2Config(
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=3,
        n_head=4,
        n_positions=64,
        initializer_range=0.3,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )


_TWINS: dict[str, tuple] = {}


def twins(name: str):
    """(the model under SDPA where it has it, an eager twin with the same weights), built once."""
    if name not in _TWINS:
        cls, config = config_of(name)
        torch.manual_seed(7)
        own = "eager" if name == "bloom" else "sdpa"  # BLOOM has no SDPA
        sdpa = cls._from_config(copy.deepcopy(config), attn_implementation=own).eval()
        eager = cls._from_config(copy.deepcopy(config), attn_implementation="eager").eval()
        eager.load_state_dict(sdpa.state_dict())
        _TWINS[name] = sdpa, eager
    return _TWINS[name]


def prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(1, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def run(model, ids, **options):
    steps = []
    out = decode(model, ids, steps.append, **options)
    return out, steps


def eager_last_row(eager, sequence: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        attentions = eager(sequence, output_attentions=True).attentions
    return [a[:, :, -1] for a in attentions]  # per layer [batch, head, key]


@pytest.mark.parametrize("name", ["llama", "gpt2", "bloom"])
def test_each_step_row_is_eager_attention_last_row(name):
    sdpa, eager = twins(name)
    ids = prompt(11, 0)
    out, steps = run(sdpa, ids, max_new_tokens=6)
    assert out.ids.shape == (1, 6) and out.lengths.tolist() == [6] and not out.stopped.any()
    n_layers = len(eager_last_row(eager, ids))
    for step in steps:
        # step t's query is the token fed at t: the prompt's last (t = 0), else token t-1
        sequence = torch.cat([ids, out.ids[:, : step.index]], dim=1)
        reference = eager_last_row(eager, sequence)
        assert sorted(step.rows) == list(range(n_layers))
        for layer, row in step.rows.items():
            assert row.dtype == torch.float32
            assert row.shape == (1, 4, 11 + step.index)  # [batch, head, key]: every query head
            assert (row - reference[layer]).abs().max().item() <= TOL
            assert torch.allclose(row.sum(-1), torch.ones(1, 4), atol=1e-5)
        assert step.token.tolist() == [int(out.ids[0, step.index])]


@pytest.mark.parametrize("name", ["llama", "gpt2", "bloom"])
def test_tokens_are_greedy_generate(name):
    sdpa, _ = twins(name)
    ids = prompt(9, 1)
    out, _ = run(sdpa, ids, max_new_tokens=8)
    with torch.no_grad():
        generated = sdpa.generate(ids, do_sample=False, max_new_tokens=8, min_new_tokens=8)
    assert out.ids.tolist() == generated[:, 9:].tolist()


def test_a_row_stops_after_its_stop_token():
    sdpa, _ = twins("llama")
    ids = prompt(10, 2)
    free, _ = run(sdpa, ids, max_new_tokens=6)
    tokens = free.ids[0].tolist()
    k = next(i for i, t in enumerate(tokens) if t not in tokens[:i] and i >= 1)
    out, steps = run(sdpa, ids, max_new_tokens=6, stop={tokens[k]})
    assert out.row(0) == tokens[: k + 1]  # the stop token is kept
    assert out.stopped.tolist() == [True] and len(steps) == k + 1


def test_left_padded_batch_is_each_prompt_alone():
    sdpa, _ = twins("llama")
    long, short = prompt(10, 3), prompt(7, 4)
    ids = torch.cat([long, torch.cat([torch.zeros(1, 3, dtype=torch.long), short], 1)])
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # three pads in front of the short prompt
    batch, batch_steps = run(sdpa, ids, attention_mask=mask, max_new_tokens=5)
    for b, (alone_ids, pad) in enumerate([(long, 0), (short, 3)]):
        alone, alone_steps = run(sdpa, alone_ids, max_new_tokens=5)
        assert batch.ids[b].tolist() == alone.ids[0].tolist()
        for together, single in zip(batch_steps, alone_steps):
            for layer, row in single.rows.items():
                assert together.rows[layer][b, :, :pad].abs().sum().item() == 0.0  # pads: nothing
                diff = (together.rows[layer][b, :, pad:] - row[0]).abs().max().item()
                assert diff <= TOL


def test_prefill_in_chunks_changes_nothing():
    sdpa, _ = twins("gpt2")
    ids = prompt(13, 5)
    whole, whole_steps = run(sdpa, ids, max_new_tokens=4)
    chunked, chunked_steps = run(sdpa, ids, max_new_tokens=4, prefill_chunk=3, layers=[1])
    assert chunked.ids.tolist() == whole.ids.tolist()
    for a, b in zip(chunked_steps, whole_steps):
        assert sorted(a.rows) == [1]  # only the layers asked for
        assert (a.rows[1] - b.rows[1]).abs().max().item() <= TOL


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_forced_tokens_are_a_whole_forwards_log_p(name):
    """`forced`: each forced token's log p after the prompt and the forced tokens before it, as
    one forward pass over prompt + forced gives it; a left-padded batch with right-padded forced
    tokens; the greedy answer the same as without them."""
    sdpa, _ = twins(name)
    long, short = prompt(10, 8), prompt(7, 9)
    ids = torch.cat([long, torch.cat([torch.zeros(1, 3, dtype=torch.long), short], 1)])
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    forced = torch.tensor([[5, 6, 7], [8, 9, 0]])
    forced_mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # row 1 forces two tokens
    out, _ = run(sdpa, ids, attention_mask=mask, forced=forced, forced_mask=forced_mask)
    plain, _ = run(sdpa, ids, attention_mask=mask)
    assert out.ids.tolist() == plain.ids.tolist()
    for b, (alone, k) in enumerate([(long, 3), (short, 2)]):
        sequence = torch.cat([alone, forced[b : b + 1, :k]], 1)
        with torch.no_grad():
            logp = sdpa(sequence).logits[0].float().log_softmax(-1)  # [piece, vocab]
        n = alone.shape[1]
        reference = [logp[n - 1 + i, forced[b, i]].item() for i in range(k)]
        assert out.forced[b, :k].tolist() == pytest.approx(reference, abs=1e-5)
        assert out.forced[b, k:].abs().sum().item() == 0.0
    assert plain.forced is None


def test_last_row_quantity_of_a_whole_forward():
    sdpa, eager = twins("llama")
    ids = prompt(8, 6)
    with torch.no_grad(), capture_heads(sdpa, needs={"last_row"}) as heads:
        sdpa(ids)
    for layer, reference in enumerate(eager_last_row(eager, ids)):
        assert heads.last_row[layer].shape == (1, 4, 8)
        assert (heads.last_row[layer] - reference).abs().max().item() <= TOL


def test_stop_tokens_are_end_of_turn_and_newlines(gpt2_tokenizer):
    # the byte-level vocabulary has one token holding a newline, the byte symbol "Ċ"
    newline = gpt2_tokenizer.convert_tokens_to_ids("\u010a")
    assert stop_tokens(gpt2_tokenizer) == {gpt2_tokenizer.eos_token_id, newline}
