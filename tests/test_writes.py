"""What a head writes (METHODS §9) on hand-built one-layer Llamas whose answers are known.

The model: vocabulary V = 16 = d_model, orthonormal embeddings e_i (W_E, and the LM head is
the same matrix, so W_U = W_E^T), every norm's gain 1, the MLP zeroed (attention only).

- OV copying: one head with W_V W_O = I has M = W_E W_E^T = I: copying score 1, and each
  token is its own row's top logit (copy rate 1); with -I: score -1 and rate 0; with 0: no
  score (no eigenvalue) and rate 0 (ties count against the token).
- DLA: head 0 planted to write k e_y at every position (its values read x . s with
  s = sum_i e_i, and W_O maps that to (k / sqrt(d)) e_y; the norm makes x_j = sqrt(d) e_j, so
  x_j . s = sqrt(d)), head 1 zero. The residual stream at t is e_{x_t} + k e_y, so
  s(t) = sqrt((1 + k^2 + 2k [x_t = y]) / d + eps) and, W_U centred,
  DLA_0(t) = (k / s(t)) ([y_t = y] - 1 / V); DLA_1(t) = 0.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import make_llama3
from transformers import LlamaConfig, LlamaForCausalLM

from headprobe.config import RunConfig
from headprobe.core.errors import UsageError
from headprobe.inputs.probes import make_probe
from headprobe.scoring import registry
from headprobe.scoring.engine import Engine

V = D = 16
EPS = 1e-6
K = 3.0
Y = 7  # the planted head's token
LENGTH = 6


def one_layer(heads: int, head_dim: int, seed: int = 0) -> LlamaForCausalLM:
    """The module docstring's model, attention weights left for the test to set."""
    config = LlamaConfig(
        vocab_size=V,
        hidden_size=D,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=head_dim,
        rms_norm_eps=EPS,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    q, _ = torch.linalg.qr(torch.randn(D, D, dtype=torch.float64))
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(q[:V].float())  # orthonormal rows
        model.lm_head.weight.copy_(q[:V].float())  # W_U = W_E^T
        layer = model.model.layers[0]
        for module in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.mlp.down_proj):
            module.weight.zero_()
        for norm in (layer.input_layernorm, layer.post_attention_layernorm, model.model.norm):
            norm.weight.fill_(1.0)
    return model


@pytest.mark.parametrize("sign", [1.0, -1.0, 0.0])
def test_identity_ov_circuit_copies_and_its_negative_suppresses(sign):
    from headprobe.studies.ov_copying.ov_circuits import ov_heads

    model = one_layer(heads=1, head_dim=D)
    attention = model.model.layers[0].self_attn
    with torch.no_grad():
        attention.v_proj.weight.copy_(torch.eye(D))
        attention.o_proj.weight.copy_(sign * torch.eye(D))
    heads = ov_heads(model, np.arange(2, V))
    assert len(heads) == 1
    if sign:
        assert heads["copying"].iloc[0] == pytest.approx(sign, abs=1e-5)
    else:  # a head that writes nothing: no eigenvalue, and every logit ties (never a copy)
        assert np.isnan(heads["copying"].iloc[0])
    assert heads["n"].iloc[0] == V - 2
    assert heads["hits"].iloc[0] == (V - 2 if sign > 0 else 0)


def planted(k: float = K, y: int = Y) -> LlamaForCausalLM:
    """Head 0 writes k e_y at every position; head 1 writes nothing (module docstring)."""
    model = one_layer(heads=2, head_dim=8)
    e = model.model.embed_tokens.weight.detach().double()  # [V, D]
    attention = model.model.layers[0].self_attn
    with torch.no_grad():
        attention.v_proj.weight.zero_()
        attention.v_proj.weight[0] = e.sum(0).float()  # head 0, feature 0: x . s
        attention.o_proj.weight.zero_()
        attention.o_proj.weight[:, 0] = (k / math.sqrt(D) * e[y]).float()
    return model


def expected_dla(sequences, length: int, k: float = K, y: int = Y):
    """Per sequence: (sum of DLA_0 over the scored positions, positions with DLA_0 > 0, positions),
    the scored positions those predicting the repeated half after its first token."""
    out = []
    for ids in sequences:
        total, positive, n = 0.0, 0, 0
        for p in range(length, 2 * length - 1):  # target ids[p + 1], p + 1 > length
            x, target = ids[p], ids[p + 1]
            s = math.sqrt((1 + k * k + 2 * k * (x == y)) / D + EPS)
            dla = k / s * ((target == y) - 1 / V)
            total, positive, n = total + dla, positive + (dla > 0), n + 1
        out.append((total, positive, n))
    return out


def test_planted_head_has_the_hand_computed_dla():
    model = planted()
    tokenizer = make_llama3()
    probe = make_probe(
        "repeated-random", tokenizer, length=LENGTH, n=12, seed=3, specials="none", vocab_size=V
    ).collect()
    # plant the head's token in some sequences, so DLA > 0 occurs
    for example in probe[::3]:
        ids = example.meta["input_ids"]
        ids[LENGTH + 2] = ids[2] = Y
    scorer = registry.get("logit_attribution").make_scorer()
    Engine(model, tokenizer, [scorer], RunConfig(batch_size=5, progress=False)).run(probe)
    expected = expected_dla([ex.meta["input_ids"] for ex in probe], LENGTH)
    dla = scorer.tally_.arrays("dla")
    share = scorer.tally_.arrays("dla>0")
    n = dla["n"][:, 0, 0].sum()
    assert n == sum(e[2] for e in expected) == 12 * (LENGTH - 1)
    got = dla["hits"][:, 0, 0, :, 0].sum(0)  # [head]
    assert got[0] / n == pytest.approx(sum(e[0] for e in expected) / n, abs=1e-5)
    assert abs(got[1]) < 1e-6  # head 1 writes nothing
    positive = share["hits"][:, 0, 0, :, 0].sum(0)
    assert positive[0] == sum(e[1] for e in expected) > 0
    assert positive[1] == 0


def test_one_position_by_hand():
    """One sequence, its DLA sums per example row (no tally): [x = 7, 3, 7, 3]: the position
    reading 3 predicts 7 = y, the others predict other tokens."""
    from headprobe.studies.logit_attribution.analysis import LogitAttributionScorer

    model = planted()
    scorer = LogitAttributionScorer()
    scorer.scored = None  # every position
    scorer.bind(1, 2)
    scorer.use_model(model, make_llama3())
    scorer.lm.scored = None
    ids = torch.tensor([[Y, 3, Y, 3]])
    batch = type(
        "B", (), {"input_ids": ids, "attention_mask": torch.ones_like(ids), "padded": False}
    )()
    sums, positions = scorer.compute(model, batch)
    s = lambda x: math.sqrt((1 + K * K + 2 * K * (x == Y)) / D + EPS)
    want = sum(K / s(x) * ((t == Y) - 1 / V) for x, t in [(Y, 3), (3, Y), (Y, 3)])
    assert positions.tolist() == [3.0]
    assert sums[0, 0, 0].item() == pytest.approx(want, abs=1e-5)
    assert sums[0, 1, 0].item() == 1.0  # one position raises y's logit


def test_refuses_a_model_without_a_language_model_head(bert_family):
    scorer = registry.get("logit_attribution").make_scorer()
    scorer.bind(3, 4)
    with pytest.raises(
        UsageError, match="^logit_attribution: BertModel has no language-model head"
    ):
        scorer.use_model(bert_family.sdpa, bert_family.tokenizer)


def test_cli_refuses_logit_attribution_without_a_language_model_head(tiny_model, tmp_path, capsys):
    """The tiny BERT saved without an LM head: one line, exit 2, nothing written."""
    from headprobe.cli import main

    code = main(
        [
            "run",
            "--model",
            tiny_model,
            "--analyses",
            "logit_attribution",
            "--out",
            str(tmp_path / "o"),
            "--quiet",
            "--no-report",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "logit_attribution" in err[0] and "language-model head" in err[0]


def test_ov_copying_refuses_a_family_without_a_value_projection():
    """BLOOM computes attention itself (legacy path) from a fused query_key_value in an
    interleaved layout: no value projection is seen."""
    from test_architectures import build

    from headprobe.studies.ov_copying.ov_circuits import ov_heads

    with pytest.raises(UsageError, match="^ov_copying: BloomModel .*value projection"):
        ov_heads(build("bloom-alibi").model, np.arange(5, 20))


def test_ov_circuit_of_grouped_heads_against_the_whole_matrix():
    """Llama with GQA (4 query heads over 2 KV heads), random norm gains, no LM head (W_U =
    W_E^T): copying score and copy rate equal those of M_h formed whole ([vocab, vocab]) with
    h's KV group's W_V, and heads sharing a KV group differ."""
    import copy

    from conftest import get_family

    from headprobe.studies.ov_copying.ov_circuits import ov_heads

    model = copy.deepcopy(get_family("llama").sdpa)
    torch.manual_seed(5)
    with torch.no_grad():
        for layer in model.layers:
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
        model.norm.weight.uniform_(0.5, 1.5)
    tokens = np.arange(2, 120)
    got = ov_heads(model, tokens)
    w_e = model.embed_tokens.weight.detach().double()  # [vocab, hidden]
    g_final = model.norm.weight.detach().double()
    config = model.config
    d, group = config.head_dim, config.num_attention_heads // config.num_key_value_heads
    for layer, block in enumerate(model.layers):
        attention = block.self_attn
        g_attn = block.input_layernorm.weight.detach().double()
        for head in range(config.num_attention_heads):
            kv = head // group
            w_v = attention.v_proj.weight.detach().double()[kv * d : (kv + 1) * d].T  # [hidden, d]
            w_o = (
                attention.o_proj.weight.detach().double()[:, head * d : (head + 1) * d].T
            )  # [d, hidden]
            m = (w_e * g_attn) @ w_v @ w_o @ (g_final[:, None] * w_e.T)  # [vocab, vocab]
            eig = torch.linalg.eigvals(m)
            score = float(eig.real.sum() / eig.abs().sum())
            top = m[tokens].topk(5, dim=1).indices  # [sample, 5]
            hits = int((top == torch.as_tensor(tokens)[:, None]).any(1).sum())
            row = got[(got["layer"] == layer) & (got["head"] == head)].iloc[0]
            assert row["kv_group"] == kv
            assert row["copying"] == pytest.approx(score, abs=1e-4)
            assert row["hits"] == hits
    first = got[got["layer"] == 0]
    assert first["copying"].iloc[0] != pytest.approx(first["copying"].iloc[1], abs=1e-3)


def test_dla_of_a_layernorm_model_adds_up_to_the_logit():
    """GPT-2 (LayerNorm, tied head, 2 layers x 4 heads, random weights), one scored position:
    the heads' DLA plus the rest of the residual stream's (embeddings, MLPs, biases) through
    the same frozen norm, plus the norm's bias, equals the model's own centred logit of the
    next token."""
    from transformers import GPT2Config, GPT2LMHeadModel

    import headprobe
    from headprobe.studies.logit_attribution.analysis import LogitAttributionScorer

    torch.manual_seed(6)
    config = GPT2Config(vocab_size=40, n_embd=16, n_layer=2, n_head=4, n_positions=8)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        model.transformer.ln_f.weight.uniform_(0.5, 1.5)
        model.transformer.ln_f.bias.uniform_(-0.5, 0.5)
    ids = torch.tensor([[5, 9]])  # position 0 predicts 9
    scorer = LogitAttributionScorer()
    scorer.bind(2, 4)
    scorer.use_model(model, make_llama3())
    scorer.lm.scored = None
    batch = type(
        "B", (), {"input_ids": ids, "attention_mask": torch.ones_like(ids), "padded": False}
    )()
    sums, _ = scorer.compute(model, batch)  # [layer, 2, head]
    kept = {}
    hook = model.transformer.ln_f.register_forward_pre_hook(lambda m, a: kept.update(r=a[0]))
    with torch.no_grad(), headprobe.capture_heads(model, needs={"head_output"}) as writes:
        logits = model(input_ids=ids).logits[0, 0].double()  # [vocab]
    hook.remove()
    r = kept["r"][0, 0].double()  # [hidden]
    heads = sum(writes.head_output[layer][0, :, 0].double().sum(0) for layer in range(2))
    rest = r - heads  # [hidden]
    ln = model.transformer.ln_f
    u = model.lm_head.weight.detach().double()
    u = u[9] - u.mean(0)  # [hidden]
    s = torch.sqrt(r.var(unbiased=False) + ln.eps)
    g, b = ln.weight.detach().double(), ln.bias.detach().double()
    rest_dla = (g * (rest - rest.mean()) / s) @ u
    total = sums[:, 0].double().sum() + rest_dla + b @ u
    assert total.item() == pytest.approx((logits[9] - logits.mean()).item(), abs=1e-4)
    assert sums[:, 0].abs().min() > 1e-4  # every head contributes something


@pytest.mark.parametrize("measure", ["weights", "weights,norms"])
def test_a_run_writes_the_ov_copying_table_once(tmp_path, measure):
    """ov_copying reads only weights: it has no tally, so its table comes from the run's record of
    it; it is written and read back, one row per head under the first measure whatever the
    measures, with the numbers
    `ov_heads` gives on the same sampled tokens."""
    from test_ablation_control import write_treebank
    from test_gates import with_lm_head

    import headprobe
    from headprobe.results.query import load_results
    from headprobe.studies.ov_copying.analysis import ordinary_tokens
    from headprobe.studies.ov_copying.counts import SAMPLED_TOKENS
    from headprobe.studies.ov_copying.ov_circuits import ov_heads

    family, model = with_lm_head("llama")
    results = headprobe.run(
        loaded=(model, family.tokenizer, "tiny"),
        treebank=str(write_treebank(tmp_path / "t.conllu")),
        analyses=["positional", "ov_copying"],
        measure=measure,
        out=str(tmp_path / "out"),
        n_boot=20,
        pictures=False,
        progress=False,
        report=False,
    )
    table = results.ov_copying_heads
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    assert len(table) == n_layers * n_heads and set(table["measure"]) == {"weights"}
    vocab = model.get_input_embeddings().weight.shape[0]
    tokens = ordinary_tokens(family.tokenizer, vocab, SAMPLED_TOKENS, results.summary["seed"])
    expected = ov_heads(model, tokens)
    np.testing.assert_array_equal(table["hits"].to_numpy(), expected["hits"].to_numpy())
    np.testing.assert_allclose(table["copying"], expected["copying"], atol=1e-6, equal_nan=True)
    assert (tmp_path / "out" / "ov_copying_heads.csv").exists()
    back = load_results(tmp_path / "out").ov_copying_heads
    np.testing.assert_array_equal(back["hits"].to_numpy(), table["hits"].to_numpy())


def test_the_control_has_no_ov_copying_table_of_its_own(tmp_path):
    """With --control random-init, ov_copying is still read off the trained model's weights only:
    no `control_ov_copying_heads` (it would be the trained model's numbers under the control's
    name)."""
    from test_ablation_control import write_treebank
    from test_gates import with_lm_head

    import headprobe

    family, model = with_lm_head("llama")
    results = headprobe.run(
        loaded=(model, family.tokenizer, "tiny"),
        treebank=str(write_treebank(tmp_path / "t.conllu")),
        analyses=["positional", "ov_copying"],
        control="random-init",
        n_boot=20,
        pictures=False,
        progress=False,
    )
    assert "ov_copying_heads" in results.tables and "control_positional_heads" in results.tables
    assert "control_ov_copying_heads" not in results.tables
