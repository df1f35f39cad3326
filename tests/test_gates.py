"""Head gates, objectives and importance (METHODS §8, issue 18).

Every ablated output is checked against an independent computation: a deep copy of
the model whose output projection has head h's input columns zeroed (rows for GPT-2's
Conv1D, whose weight is [in, out]), or, for mean ablation, zeroed and the mean's
contribution moved into the bias. Per-row gradients are checked against one example
at a time; the objectives against transformers' own `labels=` losses.
"""

from __future__ import annotations

import copy
import random
from hashlib import blake2b

import pytest
import torch
from conftest import WHOLE_WORDS, WORDS, get_family
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

from headprobe.inputs.align import WORD
from headprobe.inputs.batching import Batch, iter_batches, prepare
from headprobe.inputs.corpora.base import Example
from headprobe.model.gates import HeadGates, head_means, output_projections
from headprobe.model.head_effects import ablation_rows, gate_gradients
from headprobe.model.objectives import IGNORE, Objective, lm_kind, mlm_positions

FAMILIES = ["bert", "gpt2", "llama"]  # llama: 4 query heads over 2 key/value heads


def sentences(n: int, words: int, seed: int = 0, vocab=WHOLE_WORDS) -> list[Example]:
    """`n` sentences of `words` words each (whole words: one piece each, so they share a bucket)."""
    rng = random.Random(seed)
    return [
        Example(
            words=[rng.choice(vocab) for _ in range(words)], unit=f"u{seed}-{i}", source=f"t:{i}"
        )
        for i in range(n)
    ]


def one_batch(family, examples) -> Batch:
    prepared = prepare(examples, family.tokenizer, 512)
    batches = list(iter_batches(prepared, len(examples), family.pad_id))
    assert len(batches) == 1 and len(batches[0]) == len(examples)
    return batches[0]


def with_lm_head(name: str):
    """The family's random base model under a language-model head (head weights seeded)."""
    family = get_family(name)
    torch.manual_seed(10)
    auto = AutoModelForCausalLM if family.causal else AutoModelForMaskedLM
    model = auto.from_config(copy.deepcopy(family.sdpa.config)).eval()
    missing, _ = model.base_model.load_state_dict(
        family.sdpa.state_dict(), strict=False
    )  # BERT's pooler is extra
    assert not missing
    return family, model


def zero_columns(model, heads, d_head: int, means=None):
    """A deep copy with head (layer, h)'s input slice of the output projection removed from the
    weight; with `means` [layer, head, d_head], the mean's contribution added to the bias."""
    twin = copy.deepcopy(model)
    for layer, h in heads:
        proj = output_projections(twin)[layer]  # found by path; the weights are edited by hand
        cut = slice(h * d_head, (h + 1) * d_head)
        conv1d = type(proj).__name__ == "Conv1D"
        with torch.no_grad():
            w = (
                proj.weight[cut, :] if conv1d else proj.weight[:, cut]
            )  # [d_head, out] / [out, d_head]
            if means is not None:
                shift = means[layer, h] @ w if conv1d else w @ means[layer, h]  # [out]
                if proj.bias is None:
                    proj.bias = torch.nn.Parameter(torch.zeros_like(shift))
                proj.bias += shift
            w.zero_()
    return twin


def hidden(model, batch) -> torch.Tensor:
    return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state


# ----------------------------------------------------------------------------- gates
@pytest.mark.parametrize("name", FAMILIES + ["roberta"])
def test_all_ones_is_no_gate(name):
    family = get_family(name)
    batch = one_batch(family, sentences(3, 6))
    model = family.sdpa
    with torch.no_grad():
        plain = hidden(model, batch)
        n_layers, n_heads = family.n_layers, 4
        with HeadGates(model, torch.ones(n_layers, n_heads)):
            gated = hidden(model, batch)
        with HeadGates(model, torch.ones(len(batch), n_layers, n_heads)):
            per_row = hidden(model, batch)
    torch.testing.assert_close(gated, plain, atol=1e-6, rtol=0)
    torch.testing.assert_close(per_row, plain, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "name,heads",
    [
        ("bert", [(1, 2)]),
        ("gpt2", [(0, 3)]),
        ("gpt2", [(2, 0), (2, 1)]),
        ("llama", [(0, 1)]),
        ("llama", [(1, 2), (0, 0)]),
    ],
)
def test_zero_gate_equals_zeroed_weights(name, heads):
    family = get_family(name)
    batch = one_batch(family, sentences(3, 7, seed=1))
    model = family.eager
    d_head = 8
    gates = torch.ones(family.n_layers, 4)
    for layer, h in heads:
        gates[layer, h] = 0.0
    with torch.no_grad():
        with HeadGates(model, gates):
            gated = hidden(model, batch)
        expected = hidden(zero_columns(model, heads, d_head), batch)
        intact = hidden(model, batch)
    torch.testing.assert_close(gated, expected, atol=1e-5, rtol=0)
    assert (gated - intact).abs().max() > 1e-2  # the head did matter


def test_gate_per_row_ablates_only_its_row():
    family = get_family("llama")
    batch = one_batch(family, sentences(3, 5, seed=2))
    model = family.sdpa
    gates = torch.ones(3, family.n_layers, 4)  # [batch, layer, head]
    gates[1, 0, 3] = 0.0  # row 1 only: layer 0, head 3
    with torch.no_grad():
        with HeadGates(model, gates):
            gated = hidden(model, batch)
        ablated = hidden(zero_columns(model, [(0, 3)], 8), batch)
        intact = hidden(model, batch)
    torch.testing.assert_close(gated[1], ablated[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(gated[[0, 2]], intact[[0, 2]], atol=1e-6, rtol=0)


def test_gates_undo_on_exception():
    family = get_family("gpt2")
    model = family.sdpa
    batch = one_batch(family, sentences(2, 4))
    with pytest.raises(RuntimeError, match="boom"):
        with HeadGates(model, torch.zeros(family.n_layers, 4)):
            assert all(len(p._forward_pre_hooks) == 1 for p in output_projections(model))
            raise RuntimeError("boom")
    assert all(len(p._forward_pre_hooks) == 0 for p in output_projections(model))
    with torch.no_grad():
        torch.testing.assert_close(
            hidden(model, batch), hidden(family.eager, batch), atol=1e-5, rtol=0
        )


def test_bad_gate_shape_is_one_clear_error():
    family = get_family("bert")
    with pytest.raises(ValueError, match=r"gates must be \[layer, head\] = \[3, 4\]"):
        HeadGates(family.sdpa, torch.ones(4, 3))


# ----------------------------------------------------------------------------- mean ablation
@pytest.mark.parametrize("name", FAMILIES)
def test_mean_ablation_equals_hand_computed_mean(name):
    family = get_family(name)
    model = family.eager
    pad = family.pad_id
    # two padded batches of different lengths: padding pieces must not enter the mean
    corpus = []
    for seed, lengths in ((3, (5, 3)), (4, (4, 6, 2))):
        rng = random.Random(seed)
        rows = [[rng.randrange(5, len(family.tokenizer)) for _ in range(n)] for n in lengths]
        width = max(lengths)
        corpus.append(
            {
                "input_ids": torch.tensor([r + [pad] * (width - len(r)) for r in rows]),
                "attention_mask": torch.tensor(
                    [[1] * len(r) + [0] * (width - len(r)) for r in rows]
                ),
            }
        )
    # by hand: the raw inputs of every output projection, kept, then averaged over real pieces
    seen = {layer: [] for layer in range(family.n_layers)}
    handles = [
        p.register_forward_pre_hook(
            lambda m, args, layer=layer: seen[layer].append(args[0].detach())
        )
        for layer, p in enumerate(output_projections(model))
    ]
    with torch.no_grad():
        for inputs in corpus:
            model(**inputs)
    for handle in handles:
        handle.remove()
    hand = (
        torch.stack(
            [
                torch.cat(
                    [x[inputs["attention_mask"].bool()] for x, inputs in zip(seen[layer], corpus)]
                )
                .double()
                .mean(0)
                for layer in range(family.n_layers)
            ]
        )
        .float()
        .view(family.n_layers, 4, 8)
    )
    means = head_means(model, corpus)  # [layer, head, d_head]
    torch.testing.assert_close(means, hand, atol=1e-6, rtol=1e-6)

    gates = torch.ones(family.n_layers, 4)
    gates[1, 2] = 0.0
    with torch.no_grad():
        with HeadGates(model, gates, means=means):
            gated = model(**corpus[1]).last_hidden_state
        expected = zero_columns(model, [(1, 2)], 8, means=hand)(**corpus[1]).last_hidden_state
        zeroed = zero_columns(model, [(1, 2)], 8)(**corpus[1]).last_hidden_state
    torch.testing.assert_close(gated, expected, atol=1e-5, rtol=0)
    assert (gated - zeroed).abs().max() > 1e-3  # mean ablation is not zero ablation


def test_convolution_gates_equal_zeroed_channels():
    """SqueezeBERT's output projection is a grouped pointwise nn.Conv1d reading [batch, channel,
    piece]: a zero gate on head 2 of layer 1 equals zeroing channels 16..23 of that convolution's
    input by hand (a pre-hook), on a padded batch; a gate per row ablates its row only; a mean
    gate equals setting those channels to the head's mean over the real pieces, computed by hand
    from the convolution's inputs."""
    from test_ablation_families import loud
    from test_architectures import build, stack_batch
    from test_capture import SENTENCES

    from headprobe.model.discovery import attention_sites

    model = loud("squeezebert")
    _, inputs = stack_batch(build("squeezebert"), SENTENCES, "encoder")
    mask = inputs["attention_mask"].bool()  # [batch, piece]
    layer, head = 1, 2
    cut = slice(8 * head, 8 * (head + 1))
    conv = attention_sites(model).sites[layer].output
    kept = []

    def by_hand(mean=None):
        def hook(module, args):
            kept.append(args[0].detach().clone())  # [batch, channel, piece]
            x = args[0].clone()
            x[:, cut, :] = 0.0 if mean is None else mean[:, None]
            return (x,)

        handle = conv.register_forward_pre_hook(hook)
        try:
            return model(**inputs).last_hidden_state
        finally:
            handle.remove()

    gates = torch.ones(2, 4)
    gates[layer, head] = 0.0
    rows = torch.ones(len(mask), 2, 4)
    rows[0, layer, head] = 0.0
    with torch.no_grad():
        intact = model(**inputs).last_hidden_state
        expected = by_hand()
        with HeadGates(model, gates):
            gated = model(**inputs).last_hidden_state
        with HeadGates(model, rows):
            per_row = model(**inputs).last_hidden_state
    torch.testing.assert_close(gated, expected, atol=1e-6, rtol=0)
    assert (gated - intact).abs().max() > 1e-2  # the head did matter
    torch.testing.assert_close(per_row[0], expected[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(per_row[1:], intact[1:], atol=1e-6, rtol=0)

    hand = kept[0][:, cut, :].transpose(1, 2)[mask].double().mean(0).float()  # [d_head]
    means = head_means(model, [inputs])  # [layer, head, d_head]
    torch.testing.assert_close(means[layer, head], hand, atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        expected = by_hand(hand)
        with HeadGates(model, gates, means=means):
            gated = model(**inputs).last_hidden_state
    torch.testing.assert_close(gated, expected, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------- objectives
def test_mlm_positions_deterministic_fifteen_percent_never_special():
    family = get_family("bert")
    examples = sentences(60, 10, seed=5, vocab=WORDS)  # split words too: several pieces
    prepared = prepare(examples, family.tokenizer, 512)
    batches = list(iter_batches(prepared, 64, family.pad_id))
    chosen_total = words_total = 0
    for batch in batches:
        keys = [ex.sent_id for ex in batch.examples]
        chosen = mlm_positions(keys, batch.piece_kind, seed=0)
        assert torch.equal(chosen, mlm_positions(keys, batch.piece_kind, seed=0))
        assert not chosen[batch.piece_kind != WORD].any()  # never CLS, SEP or padding
        # the formula by hand, independent of headprobe.scoring.tally
        for row, key in enumerate(keys[:3]):
            for p in range(batch.n_pieces):
                h = int.from_bytes(
                    blake2b(f"0:mask:{key}:{p}".encode(), digest_size=8).digest(), "little"
                )
                assert bool(chosen[row, p]) == (
                    h / 2**64 < 0.15 and int(batch.piece_kind[row, p]) == WORD
                )
        chosen_total += int(chosen.sum())
        words_total += int((batch.piece_kind == WORD).sum())
    assert words_total > 600
    assert 0.12 < chosen_total / words_total < 0.18
    other = mlm_positions(keys, batch.piece_kind, seed=1)
    assert not torch.equal(other, chosen)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_causal_objective_is_the_models_own_loss(name):
    family, model = with_lm_head(name)
    objective = Objective.for_model(model, family.tokenizer)
    assert objective.kind == "causal_lm" == lm_kind(model)
    batch = one_batch(family, sentences(2, 6, seed=6))
    with torch.no_grad():
        values, tokens = objective.per_row(model, objective.targets(model, batch))
        for row in range(2):
            ids = batch.input_ids[row : row + 1]
            loss = model(input_ids=ids, labels=ids).loss  # mean NLL of pieces 1..
            assert tokens[row] == ids.shape[1] - 1
            torch.testing.assert_close(values[row] / tokens[row], loss, atol=1e-5, rtol=1e-5)


def test_masked_objective_is_the_models_own_loss():
    family, model = with_lm_head("bert")
    objective = Objective.for_model(model, family.tokenizer)
    assert objective.kind == "masked_lm"
    batch = one_batch(family, sentences(3, 14, seed=7))
    targets = objective.targets(model, batch)
    chosen = targets.labels != IGNORE  # [batch, piece]
    assert torch.equal(chosen, mlm_positions([e.sent_id for e in batch.examples], batch.piece_kind))
    assert torch.equal(
        targets.inputs["input_ids"][chosen], torch.full((int(chosen.sum()),), 4)
    )  # [MASK]
    with torch.no_grad():
        values, tokens = objective.per_row(model, targets)
        for row in range(3):
            labels = batch.input_ids[row : row + 1].masked_fill(~chosen[row : row + 1], IGNORE)
            loss = model(input_ids=targets.inputs["input_ids"][row : row + 1], labels=labels).loss
            assert tokens[row] == chosen[row].sum() > 0
            torch.testing.assert_close(values[row] / tokens[row], loss, atol=1e-5, rtol=1e-5)


def test_representation_objective():
    family = get_family("bert")
    model = family.sdpa
    objective = Objective.for_model(model)
    assert objective.kind == "representation"
    batch = one_batch(family, sentences(2, 5, seed=8))
    targets = objective.targets(model, batch)
    with torch.no_grad():
        intact, tokens = objective.per_row(model, targets)
        with HeadGates(model, torch.zeros(family.n_layers, 4)):
            ablated, _ = objective.per_row(model, targets)
        ref = targets.reference  # [batch, piece, hidden]
        with HeadGates(model, torch.zeros(family.n_layers, 4)):
            h = hidden(model, batch)
        by_hand = (1 - (h * ref).sum(-1) / (h.norm(dim=-1) * ref.norm(dim=-1))).sum(-1)
    assert tokens.tolist() == [7.0, 7.0]  # CLS + 5 words + SEP
    torch.testing.assert_close(intact, torch.zeros(2), atol=1e-5, rtol=0)
    torch.testing.assert_close(ablated, by_hand, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- importance
@pytest.mark.parametrize("name", FAMILIES)
def test_gradient_per_row_equals_one_example_at_a_time(name):
    family, model = with_lm_head(name)
    objective = Objective.for_model(model, family.tokenizer)
    examples = sentences(3, 30, seed=9)
    batch = one_batch(family, examples)
    grad, tokens = gate_gradients(model, batch, objective)  # [batch, layer, head]
    score = grad.abs()  # importance: |dL_row/dg| at g = 1
    assert score.shape == (3, family.n_layers, 4)
    for row, example in enumerate(examples):
        alone = one_batch(family, [example])
        targets = objective.targets(model, alone)
        gate = torch.ones(
            family.n_layers, 4, requires_grad=True
        )  # one gate per head: this example only
        with HeadGates(model, gate):
            value, n = objective.per_row(model, targets)
        (grad,) = torch.autograd.grad(value.sum(), gate)
        assert n[0] == tokens[row] > 0
        torch.testing.assert_close(score[row], grad.abs(), atol=1e-5, rtol=1e-4)
    assert (score > 0).float().mean() > 0.9
    assert all(p.grad is None for p in model.parameters())  # nothing accumulated in the model


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_ablation_rows_equal_zeroed_weights(name):
    family, model = with_lm_head(name)
    objective = Objective.for_model(model, family.tokenizer)
    batch = one_batch(family, sentences(2, 30, seed=11))
    heads = [(0, 1), (1, 3), (0, 2)]
    delta, tokens = ablation_rows(model, batch, objective, heads)
    together, _ = ablation_rows(
        model, batch, objective, heads, copies=2
    )  # 2 heads per pass, then 1
    targets = objective.targets(model, batch)
    with torch.no_grad():
        intact, _ = objective.per_row(model, targets)
        for column, head in enumerate(heads):
            twin = zero_columns(model, [head], 8)
            ablated, _ = objective.per_row(twin, targets)
            torch.testing.assert_close(delta[:, column], ablated - intact, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(together, delta, atol=1e-5, rtol=1e-5)
    assert delta.abs().min() > 0 and tokens.min() > 0


# ----------------------------------------------------------------------------- loading
def test_load_lm_picks_the_head_and_its_objective(tmp_path):
    import json

    from headprobe.model.loading import load_lm

    saved = {}
    for name in ("bert", "gpt2"):
        family, model = with_lm_head(name)
        saved[name] = tmp_path / name
        model.save_pretrained(saved[name])
        family.tokenizer.save_pretrained(saved[name])
    base = tmp_path / "base"  # a base checkpoint that claims an MLM head it lacks
    get_family("bert").sdpa.save_pretrained(base)
    get_family("bert").tokenizer.save_pretrained(base)
    config = json.loads((base / "config.json").read_text())
    config["architectures"] = ["BertForMaskedLM"]
    (base / "config.json").write_text(json.dumps(config))

    model, _, _, kind = load_lm(str(saved["bert"]))
    assert (type(model).__name__, kind) == ("BertForMaskedLM", "masked_lm")
    model, _, _, kind = load_lm(str(saved["gpt2"]))
    assert (type(model).__name__, kind) == ("GPT2LMHeadModel", "causal_lm")
    model, _, _, kind = load_lm(str(base))
    assert (type(model).__name__, kind) == ("BertModel", "representation")


# ----------------------------------------------------------------------------- as analyses
def write_treebank(path, n: int, words: int, seed: int):
    """`n` sentences (a chain: word i heads word i + 1), two documents."""
    lines = []
    for i, example in enumerate(sentences(n, words, seed)):
        if i % (n // 2) == 0:
            lines.append(f"# newdoc id = d{i}")
        lines.append(f"# sent_id = s{i}")
        for j, word in enumerate(example.words):
            lines.append(
                f"{j + 1}\t{word}\t{word}\tX\t_\t_\t{j}\t{'root' if j == 0 else 'dep'}\t_\t_"
            )
        lines.append("")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_ablation_and_importance_analyses_stream_into_tables(tmp_path, name):
    import headprobe
    from headprobe.inputs.corpora.conllu import read_conllu
    from headprobe.scoring.engine import max_length

    family, model = with_lm_head(name)
    treebank = write_treebank(tmp_path / "t.conllu", 8, 20, seed=12)
    results = headprobe.run(
        loaded=(model, family.tokenizer, "tiny"),
        treebank=treebank,
        analyses=["ablation", "importance", "dependency"],
        n_boot=50,
        pictures=False,
        progress=False,
    )
    assert (
        results.head_scores("dependency", "ALL")["n"].max() > 0
    )  # attention analyses run beside them
    objective = Objective.for_model(model, family.tokenizer)
    assert results.summary["objectives"] == {
        "ablation": objective.description,
        "importance": objective.description,
        "importance_check": objective.description,  # importance brings its exact check
    }
    # the same sums, computed directly batch by batch
    prepared = prepare(read_conllu(treebank), family.tokenizer, max_length(model, family.tokenizer))
    assert len(prepared.examples) == 8
    delta = importance = 0
    tokens = 0.0
    for batch in iter_batches(prepared, 64, family.pad_id):
        d, n = ablation_rows(model, batch, objective)  # [row, layer * head]
        i = gate_gradients(model, batch, objective)[0].abs()  # [row, layer, head]
        delta, importance, tokens = (
            delta + d.sum(0),
            importance + i.sum(0).flatten(),
            tokens + float(n.sum()),
        )
    for table, expected in (
        (results.ablation_heads, delta / tokens),
        (results.importance_heads, importance / tokens),
    ):
        assert set(table["objective"]) == {objective.description} and set(table["label"]) == {
            objective.kind
        }
        assert (table["layer"].tolist(), table["head"].tolist()) == (
            [l for l in range(family.n_layers) for _ in range(4)],
            list(range(4)) * family.n_layers,
        )
        torch.testing.assert_close(
            torch.tensor(table["score"].to_numpy(), dtype=torch.float32),
            expected,
            atol=1e-5,
            rtol=1e-4,
        )
        assert (table["n"] == tokens).all()
        assert (
            (table["ci_low"] <= table["score"] + 1e-9) & (table["score"] <= table["ci_high"] + 1e-9)
        ).all()


def test_importance_analysis_refuses_a_model_without_lm_head():
    import headprobe

    family = get_family("bert")
    with pytest.raises(ValueError, match="importance analysis needs a language-model loss"):
        headprobe.run(
            loaded=(family.sdpa, family.tokenizer, "tiny"),
            analyses=["importance"],
            n_boot=10,
            pictures=False,
            progress=False,
        )
