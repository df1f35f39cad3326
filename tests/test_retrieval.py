"""Retrieval heads and their causal check (`headprobe.studies.retrieval`, METHODS §16).

The copy rule on hand-built rows (every number worked out by hand), and planted models end to
end. A forward hook makes the model answer "dark blue" and stop at every needle probe (at a
decoding step, one token in, it picks the next token of a script), so a probe whose answer is
"dark blue" is recalled and one whose answer is "bright red" is not. The layer-0 weights of a
tiny Llama with grouped-query attention (4 query heads over 2 KV heads) are set by hand so that
query head 0 copies the answer: its key features mark "dark" and "blue", its query from ":"
(the prompt's last token, fed at step 0) looks for "dark" and its query from "dark" (fed at
step 1) looks for "blue" (RoPE's rotation made negligible on those dimensions); query head 1,
sharing its KV head, has a zero query (uniform attention: its argmax is position 0). So head 0
copies at both steps of a two-token answer (score 2 / 2 = 1) and head 1 never (0). The same
plant in a tiny GPT-2. Word-level tokenizer: every word and punctuation mark one token.
"""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

import headprobe
from headprobe.cli import main
from headprobe.inputs.corpora.conllu import stream_conllu
from headprobe.report.explorer.data import explorer_data
from headprobe.studies.retrieval.analysis import (
    Prompts,
    RetrievalScorer,
    passes,
    step_copies,
)
from headprobe.studies.retrieval.needles import INSTRUCTION, needle_stream

HAY = ["The dog ran home .", "A cat sat down .", "We ate two pears .", "It rained all day ."]
NEEDLES = [
    dict(needle="The key is dark blue .", question="What colour is the key ?", answer="dark blue"),
    dict(
        needle="The box is bright red .", question="What colour is the box ?", answer="bright red"
    ),
]


def word_tokenizer() -> PreTrainedTokenizerFast:
    texts = [*HAY, INSTRUCTION, "Question : Answer :"]
    texts += [n[k] for n in NEEDLES for k in ("needle", "question")]
    pieces = sorted({p for t in texts for p, _ in pre_tokenizers.Whitespace().pre_tokenize_str(t)})
    vocab = {w: i for i, w in enumerate(["<unk>", "</s>", *pieces])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # words joined by spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")


TOK = word_tokenizer()
ID = TOK.get_vocab()


def answering(model, script: dict[int, int]):
    """A forward hook: at a decoding step (one token in) the model chooses script[its input token]
    (else </s>); a longer input (the teacher-forced answer) keeps the model's own logits."""

    def hook(module, args, kwargs, output):
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        if ids.shape[1] != 1:
            return output
        logits = torch.full_like(output.logits, -10.0)
        for b, token in enumerate(ids[:, -1].tolist()):
            logits[b, -1, script.get(token, ID["</s>"])] = 10.0
        output.logits = logits
        return output

    model.register_forward_hook(hook, with_kwargs=True)
    return model


SCRIPT = {ID[":"]: ID["dark"], ID["dark"]: ID["blue"]}  # answer "dark blue", then </s>
# hidden features 0-3 (zeroed for every other token): the keys "dark" (0) and "blue" (1), the
# queries of ":" (2, looking for "dark") and of "dark" (3, looking for "blue")
FEATURES = {"dark": (0, 3), "blue": (1,), ":": (2,)}


def mark(embedding: torch.Tensor) -> None:
    embedding[:, :4] = 0.0
    for word, features in FEATURES.items():
        for feature in features:
            embedding[ID[word], feature] = 4.0


def planted_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    """GPT-2 (no GQA, absolute positions zeroed, LayerNorm before attention), head_dim 4: query
    head 0 reads features 2, 3 onto dims 0, 1, its keys features 0, 1; query head 1 zero."""
    config = GPT2Config(
        vocab_size=len(TOK), n_embd=16, n_layer=2, n_head=4, n_positions=128, eos_token_id=1
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        model.transformer.wpe.weight.zero_()
        mark(model.transformer.wte.weight)
        c_attn = model.transformer.h[0].attn.c_attn  # Conv1D [in, q | k | v]
        c_attn.weight[:, 0:8], c_attn.bias[0:8] = 0.0, 0.0  # queries of heads 0, 1
        c_attn.weight[:, 16:20], c_attn.bias[16:20] = 0.0, 0.0  # keys of head 0
        for query, key, dim in ((2, 0, 0), (3, 1, 1)):
            c_attn.weight[query, dim], c_attn.weight[key, 16 + dim] = 10.0, 10.0
    return answering(model, SCRIPT)


def planted(name: str):
    return planted_llama() if name == "llama" else planted_gpt2()


def planted_llama(seed: int = 0) -> LlamaForCausalLM:
    """Llama, head_dim 8, RoPE's slowest pair (dims 3, 7) turning 1e-6 rad per position: query
    head 0 reads features 2, 3 onto dims 3, 7, KV head 0's keys features 0, 1; query head 1 zero."""
    config = LlamaConfig(
        vocab_size=len(TOK),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # query heads 0, 1 read KV head 0
        head_dim=8,
        max_position_embeddings=128,
        rope_theta=1e8,
        bos_token_id=None,
        eos_token_id=ID["</s>"],
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        mark(model.model.embed_tokens.weight)
        attention = model.model.layers[0].self_attn
        attention.k_proj.weight[:8] = 0.0  # KV head 0
        attention.q_proj.weight[:16] = 0.0  # query heads 0, 1
        for query, key, dim in ((2, 0, 3), (3, 1, 7)):
            attention.q_proj.weight[dim, query], attention.k_proj.weight[dim, key] = 10.0, 10.0
    return answering(model, SCRIPT)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A JSONL of the two needles and a CoNLL-U treebank of the haystack's four sentences."""
    where = tmp_path_factory.mktemp("retrieval")
    (where / "needles.jsonl").write_text("\n".join(json.dumps(n) for n in NEEDLES) + "\n")
    lines = []
    for i, sentence in enumerate(HAY):
        lines.append(f"# sent_id = s{i}")
        for j, word in enumerate(sentence.split()):
            head, rel = (0, "root") if j == 0 else (1, "dep")
            lines.append(f"{j + 1}\t{word}\t{word}\tX\tX\t_\t{head}\t{rel}\t_\t_")
        lines.append("")
    (where / "hay.conllu").write_text("\n".join(lines) + "\n")
    return where


def run(files, depths: int, name: str = "llama", **options):
    return headprobe.run(
        probe="needle",
        needles=str(files / "needles.jsonl"),
        treebank=str(files / "hay.conllu"),
        needle_lengths="25",
        needle_depths=depths,
        loaded=(planted(name), TOK, f"planted {name}"),
        device="cpu",
        progress=False,
        n_boot=50,
        **options,
    )


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def results(files, request):
    """32 depths x 2 needles: the 32 "dark blue" probes are recalled, the 32 others are not."""
    return run(files, 32, request.param, analyses=["retrieval"])


@pytest.fixture(scope="module")
def checked(files, tmp_path_factory):
    """3 depths x 2 needles with the causal check (k = 1), saved with its report."""
    out = tmp_path_factory.mktemp("checked") / "out"
    return run(files, 3, analyses=["retrieval"], retrieval_check=1, out=str(out), report=True)


# ------------------------------------------------------------------------------ the rule
def test_copy_rule_on_hand_built_rows():
    # two probes, 3 heads, 6 keys; probe 0's answer at padded positions 2..4, probe 1's at 1..2
    ids = torch.tensor([[9, 9, 5, 6, 7, 9], [9, 5, 6, 9, 9, 9]])
    start, stop = torch.tensor([2, 1]), torch.tensor([5, 3])
    rows = torch.zeros(2, 3, 7)  # key 6: the token generated at the previous step
    rows[0, 0, 3] = 1.0  # head 0 looks at position 3 (token 6, in the span)
    rows[0, 1, 5] = 1.0  # head 1 at position 5 (token 9, outside the span)
    rows[0, 2, [3, 6]] = 1.0  # head 2: a tie between 3 and 6, the lowest position wins
    rows[1, :, 2] = 1.0  # probe 1: every head at position 2 (token 6, in its span)
    token, active = torch.tensor([6, 6]), torch.tensor([True, True])
    assert step_copies(rows, token, active, ids, start, stop).tolist() == [
        [True, False, True],
        [True, True, True],
    ]
    # the chosen token must be the one there; a row that stopped copies nothing
    assert not step_copies(rows, torch.tensor([7, 6]), active, ids, start, stop)[0].any()
    assert not step_copies(rows, token, torch.tensor([True, False]), ids, start, stop)[1].any()
    # the generated token's own key (position 6) is never in the span, even where it is the same
    rows = torch.zeros(1, 1, 7)
    rows[0, 0, 6] = 1.0
    assert not step_copies(rows, torch.tensor([6]), active[:1], ids[:1], start[:1], stop[:1]).any()


def test_score_divides_by_the_answer_span():
    """Two answer tokens, one copying step: score 1/2 (per-step copies summed in `model_pass`)."""
    scorer = RetrievalScorer()
    scorer.bind(1, 2, seed=0, n_boot=3)
    example = SimpleNamespace(unit="u", meta={"length": 25, "depth": 0.5}, source="s")
    batch = SimpleNamespace(examples=[example], device=torch.device("cpu"))
    copies = torch.tensor([[[1.0, 0.0]]])  # [probe, layer, head]
    state = scorer.probe_rows(batch, copies / torch.tensor([2.0])[:, None, None], [True])
    assert state.keys == [("u", "grid:25:0.500"), ("u", "retrieval")]
    assert state.values[0, 0, 0].tolist() == [[0.0, 0.0], [0.5, 0.0]]  # [row, head]
    assert state.extra["recalled"][:, 0].tolist() == [1, 1]
    failed = scorer.probe_rows(batch, copies, [False])
    assert failed.keys == [("u", "grid:25:0.500")] and failed.extra["recalled"][0, 0] == 0


def test_role_needs_mean_lower_end_and_probes():
    import pandas as pd

    table = pd.DataFrame(
        {
            "n": [40, 40, 40, 20],
            "score": [0.1, 0.09, 0.5, 0.5],
            "ci_low": [0.01, 0.02, 0.0, 0.2],
        }
    )
    assert passes(table, 30).tolist() == [True, False, False, False]


# ------------------------------------------------------------------------------ planted model
def test_planted_head_scores_one_and_its_kv_partner_zero(results):
    heads = results.retrieval_heads.set_index(["layer", "head"])
    # only the 32 recalled ("dark blue") probes count: the 32 failed ones add nothing
    assert (heads["n"] == 32).all()
    assert heads.loc[(0, 0), ["score", "ci_low", "ci_high", "fold0", "fold1"]].tolist() == [1.0] * 5
    assert heads.loc[(0, 1), "score"] == 0.0  # (Llama: the same KV head) its own query
    if results.summary["n_kv_heads"] == 2:
        assert heads.loc[(0, 0), "kv_group"] == heads.loc[(0, 1), "kv_group"] == 0
    roles = results.roles.set_index("name")
    assert (
        roles.loc["0-0", "role"] == "retrieval"
        and "over 32 recalled" in roles.loc["0-0", "evidence"]
    )
    assert roles.loc["0-1", "role"] == "none"
    best = results.best_heads
    assert set(best["label"]) == {"retrieval"}  # the grid cells select no head
    held = best[(best["selection"] == "held-out") & (best["fold"] == "")].iloc[0]
    assert held["heads"] == "0-0" and held["accuracy"] == 1.0


def test_success_map_counts_every_probe(results):
    success = results.retrieval_success
    assert success["length"].tolist() == [25] * 32
    assert success["depth"].tolist() == pytest.approx([k / 31 for k in range(32)], abs=5e-4)
    assert (success["probes"] == 2).all() and (success["recalled"] == 1).all()
    assert (success["share"] == 0.5).all()


def test_console_names_the_heads(results, capsys):
    from headprobe.studies.retrieval.analysis import console_text

    text = console_text(results, "retrieval")
    assert "32 of 64 needle probes recalled" in text
    passed = int(results.retrieval_heads["passes"].sum())  # GPT-2's other heads copy too
    assert f"retrieval heads ({passed} of 8" in text and "  0-0  1.000 [1.000, 1.000]" in text


def test_a_batch_of_unequal_prompts_scores_as_each_alone():
    """Left padding changes nothing: a long and a short probe in one batch, and each alone."""
    model = planted_llama()
    scorer = RetrievalScorer()
    scorer.bind(2, 4, seed=0, n_boot=3)
    scorer.use_model(model, TOK)
    long, short = (
        next(iter(needle_stream(TOK, [n], [length], 1, HAY)))
        for n, length in zip(_needles(), (25, 15))
    )
    assert len(long.meta["input_ids"]) != len(short.meta["input_ids"])

    def rows(examples):
        batch = SimpleNamespace(examples=examples, device=torch.device("cpu"))
        state = scorer.model_pass(model, batch)
        return dict(zip(state.keys, state.values[0, :, 0].permute(1, 0, 2).tolist()))

    together = rows([long, short])
    assert together == {**rows([long]), **rows([short])}
    assert together[(long.unit, "retrieval")][0][0] == 1.0


def _needles():
    from headprobe.studies.retrieval.needles import Needle

    return [
        Needle(n["needle"], n["question"], n["answer"], f"needle {k}")
        for k, n in enumerate(NEEDLES)
    ]


def test_forced_tokens_are_each_answers_own():
    examples = [
        next(iter(needle_stream(TOK, [n], [length], 1, HAY)))
        for n, length in zip(_needles(), (25, 15))
    ]
    prompts = Prompts.of(examples, pad_id=0, device="cpu")
    for row, example in enumerate(examples):  # the prompts, left-padded
        prompt = example.meta["input_ids"]
        assert prompts.ids[row][prompts.mask[row].bool()].tolist() == prompt
        a, b = example.meta["answer_span"]
        assert prompts.ids[row, prompts.start[row] : prompts.stop[row]].tolist() == prompt[a:b]
    tokens, mask = prompts.forced(pad_id=0)
    assert tokens.tolist() == [[ID["dark"], ID["blue"]], [ID["bright"], ID["red"]]]
    assert mask.tolist() == [[1, 1], [1, 1]]


# ------------------------------------------------------------------------------ the causal check
def zeroed(model, heads):
    """A copy of `model` with the output projection's columns of `heads` set to 0: zero ablation
    by the weights, independent of the gates."""
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for layer, head in heads:
            twin.model.layers[layer].self_attn.o_proj.weight[:, head * 8 : (head + 1) * 8] = 0.0
    return twin


def test_check_against_weights_zeroed_by_hand(checked, files):
    table = checked.retrieval_check.set_index("condition")
    conditions = checked.summary["retrieval_check"]["conditions"]
    assert conditions["none"] == [] and conditions["retrieval"] == ["0-0"]
    draws = [heads for name, heads in conditions.items() if name.startswith("random ")]
    assert len(draws) == 5 and all(len(h) == 1 and h != ["0-0"] for h in draws)
    corpus = list(stream_conllu(files / "hay.conllu"))
    probes = list(needle_stream(TOK, files / "needles.jsonl", [25], 3, corpus))
    model = planted_llama()
    for name, heads in conditions.items():
        twin = zeroed(model, [tuple(map(int, h.split("-"))) for h in heads])
        total, tokens = 0.0, 0
        for example in probes:
            prompt = example.meta["input_ids"]
            a, b = example.meta["answer_span"]
            ids = torch.tensor([prompt + prompt[a:b]])
            with torch.no_grad():
                logp = torch.log_softmax(twin(ids).logits[0].double(), -1)
            for k in range(a, b):
                total += float(logp[len(prompt) + k - a - 1, prompt[k]])
                tokens += 1
        assert table.loc[name, "logprob"] == pytest.approx(total / tokens, abs=1e-5)
        assert table.loc[name, "answer_tokens"] == tokens == 12
        assert table.loc[name, "success"] == 0.5  # the hooked answer: "dark blue" on every probe
    assert table.loc["none", "logprob_change"] == 0.0
    mean = np.mean(
        [table.loc[name, "logprob"] for name in conditions if name.startswith("random ")]
    )
    assert table.loc["random (mean)", "logprob"] == pytest.approx(mean, abs=1e-9)
    versus = checked.retrieval_check_versus.set_index("what")
    gap = table.loc["retrieval", "logprob"] - table.loc["random (mean)", "logprob"]
    assert versus.loc["logprob", "change"] == pytest.approx(gap, abs=1e-9)


def test_report_and_explorer_show_retrieval(checked):
    out = __import__("pathlib").Path(checked.summary["out"])
    text = (out / "report" / "report.md").read_text()
    assert (
        "Retrieval heads: the needle probe" in text and "Retrieval heads: the causal check" in text
    )
    assert (out / "report" / "figures" / "retrieval_success.png").is_file()
    assert (out / "report" / "figures" / "retrieval_scores.png").is_file()
    data = explorer_data(checked)
    score = next(
        s for s in data["scores"] if s["table"] == "retrieval_heads" and s["column"] == "score"
    )
    assert score["values"][data["heads"].index("0-0")] == 1.0
    assert (out / "retrieval_check.csv").is_file() and (out / "retrieval_success.csv").is_file()


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "options, message",
    [
        (["--analyses", "retrieval"], "retrieval reads the needle probe, not a sentence corpus"),
        (
            ["--probe", "repeated-random", "--analyses", "retrieval"],
            "not --probe repeated-random: add --probe needle",
        ),
        (
            ["--retrieval-check", "5"],
            "--retrieval-check (analysis retrieval_check) reads the needle",
        ),
        (["--probe", "needle", "--retrieval-check", "0"], "--retrieval-check"),
    ],
)
def test_cli_refuses_in_one_line(options, message, tmp_path, capsys):
    code = main(["run", "--model", "smollm2", "--out", str(tmp_path / "o"), *options])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1


def test_empty_haystack_refused_before_the_model_loads(tmp_path):
    empty = tmp_path / "empty.conllu"
    empty.write_text("\n\n")
    model = SimpleNamespace()  # not a model: a run that got past the checks would fail on it
    with pytest.raises(headprobe.checks.UsageError, match="holds no sentence: an empty haystack"):
        headprobe.run(probe="needle", treebank=str(empty), loaded=(model, TOK, "x"), device="cpu")


def test_nothing_recalled_no_heads_and_no_check(files):
    """A model that never answers right: every probe in the success map, no head scored, the
    check not run and saying why."""
    model = answering(planted_llama(), {ID[":"]: ID["dog"]})  # the last hook decides: "dog"
    results = headprobe.run(
        probe="needle",
        needles=str(files / "needles.jsonl"),
        treebank=str(files / "hay.conllu"),
        needle_lengths="25",
        needle_depths=2,
        retrieval_check=1,
        loaded=(model, TOK, "wrong"),
        device="cpu",
        progress=False,
        n_boot=5,
    )
    assert results.summary["analyses"][-2:] == ["retrieval", "retrieval_check"]  # the default
    assert results.retrieval_success["recalled"].sum() == 0
    assert results.retrieval_success["probes"].sum() == 4
    assert not len(results.retrieval_heads) and not len(results.retrieval_check)
    assert "no probe was recalled" in results.summary["retrieval_check"]["note"]
    from headprobe.studies.retrieval.causal import console_text

    assert "not run (no probe was recalled" in console_text(results, "retrieval_check")
