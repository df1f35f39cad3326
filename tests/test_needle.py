"""The needle probe (`headprobe.studies.retrieval.needles`, METHODS §16) and its options.

A word-level tokenizer built with `tokenizers` (every word and every punctuation mark one token,
character offsets exact) makes every count below one by hand: each haystack sentence is five
tokens ("The dog ran home ."), the needle five ("The key is blue ."), the answer one ("blue").
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import BertConfig, LlamaConfig, PreTrainedTokenizerFast

import headprobe
from headprobe.checks import UsageError
from headprobe.cli import main
from headprobe.config import RunConfig
from headprobe.inputs.corpora.base import CorpusError, Example
from headprobe.studies.retrieval.needles import (
    HAYSTACK,
    INSTRUCTION,
    NEEDLES,
    Needle,
    check_needle,
    depth_grid,
    nearest_boundary,
    needle_stream,
    read_needles,
    recalled,
    sentence_text,
    word_recall,
    words_of,
)

HAY = ["The dog ran home .", "A cat sat down .", "We ate two pears .", "It rained all day ."]
NEEDLE = Needle("The key is blue .", "What colour is the key ?", "blue", "test needle")
TEMPLATE = (
    "{% for m in messages %}<|user|> {{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %} <|assistant|>{% endif %}"
)


def word_tokenizer(chat: bool = False):
    """Every whitespace- or punctuation-separated piece of the test texts is one token."""
    texts = HAY + [NEEDLE.needle, NEEDLE.question, "Question : Answer :", INSTRUCTION]
    pieces = sorted({p for t in texts for p, _ in pre_tokenizers.Whitespace().pre_tokenize_str(t)})
    specials = ["<unk>", "<|user|>", "<|assistant|>"]
    vocab = {w: i for i, w in enumerate(specials + pieces)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        additional_special_tokens=["<|user|>", "<|assistant|>"],
    )
    if chat:
        fast.chat_template = TEMPLATE
    return fast


def probes(tokenizer, lengths, depths, haystack=HAY, **options):
    return list(needle_stream(tokenizer, [NEEDLE], lengths, depths, haystack, **options))


def test_context_length_and_depth_snapped_to_sentences():
    tok = word_tokenizer()
    # 25 tokens: the needle (5) beside four whole sentences (20); depths 0, .25, .5, .75, 1 of
    # the haystack's 20 tokens -> boundaries after 0, 1 (5 tokens), 2 (10), 3 (15), 4 sentences
    examples = probes(tok, [25], 5)
    assert [ex.meta["depth"] for ex in examples] == [0.0, 0.25, 0.5, 0.75, 1.0]
    for k, ex in enumerate(examples):
        ids, meta = ex.meta["input_ids"], ex.meta
        assert meta["context_span"] == (0, 25) and meta["context_tokens"] == 25
        assert meta["needle_span"] == (5 * k, 5 * k + 5)
        assert meta["answer_span"] == (5 * k + 3, 5 * k + 4)
        start, stop = meta["answer_span"]
        assert tok.decode(ids[start:stop]) == "blue"
        assert meta["depth_used"] == k / 4
        # plain prompt: the context, then "Question: <question>" and "Answer:"
        assert tok.decode(ids[25:]) == "Question : What colour is the key ? Answer :"
        assert len(ex.words) == len(ids) and not meta["chat"]
        assert not meta["answer_in_haystack"]


def test_cut_to_whole_sentences_and_nearest_boundary():
    tok = word_tokenizer()
    # 17 tokens: the needle and two sentences (15); a third would make 20
    (short,) = probes(tok, [17], 1)
    assert short.meta["context_tokens"] == 15 and short.meta["context_span"] == (0, 15)
    # depth .6 of 20 tokens is 12: boundary 10 (after sentence 2); .65 -> 13: boundary 15;
    # .625 -> 12.5, a tie: the earlier boundary
    (middle,) = probes(tok, [25], 1)  # one depth: the middle, 10 of 20 tokens
    assert middle.meta["needle_span"] == (10, 15)
    assert nearest_boundary([5, 5, 5, 5], 0.6) == 2
    assert nearest_boundary([5, 5, 5, 5], 0.65) == 3
    assert nearest_boundary([5, 5, 5, 5], 0.625) == 2
    assert depth_grid(1) == [0.5] and depth_grid(3) == [0.0, 0.5, 1.0]


def test_haystack_starts_over_where_it_runs_out():
    tok = word_tokenizer()
    (ex,) = probes(tok, [30], 1)  # 25 tokens of haystack: the four sentences and the first again
    ids = ex.meta["input_ids"]
    assert ex.meta["context_tokens"] == 30
    assert tok.decode(ids[:30]).split(" . ")[-1] == "The dog ran home ."


def test_chat_template_turn():
    tok = word_tokenizer(chat=True)
    (ex,) = probes(tok, [25], 1)
    ids, meta = ex.meta["input_ids"], ex.meta
    assert meta["chat"]
    text = tok.decode(ids)
    assert text.startswith("<|user|> The dog ran home .")
    question = pre_tokenizers.Whitespace().pre_tokenize_str(f"{INSTRUCTION} {NEEDLE.question}")
    assert text.endswith(" ".join(piece for piece, _ in question) + " <|assistant|>")
    assert meta["context_span"] == (1, 26) and meta["needle_span"] == (11, 16)
    assert tok.decode(ids[slice(*meta["answer_span"])]) == "blue"
    # the specials are no words (every probe's alignment: one word per non-special token)
    assert len(ex.words) == len(ids) - 2


def test_units_from_content_and_one_probe_per_grid_cell(tmp_path):
    tok = word_tokenizer()
    examples = probes(tok, [20, 25], 3)
    assert len(examples) == 6 and len({ex.unit for ex in examples}) == 6
    assert examples[0].unit == f"needle:{NEEDLE.key}:20:0.000"
    path = tmp_path / "elsewhere.jsonl"
    path.write_text(json.dumps(dict(needle=NEEDLE.needle, question="Q ?", answer="blue")) + "\n")
    (again,) = needle_stream(tok, path, [20], 1, HAY)
    assert again.unit == f"needle:{NEEDLE.key}:20:0.500"  # the same needle, read from a file
    assert again.source == f"{path}:1 (length 20, depth 0.50)"


def test_corpus_examples_as_haystack_and_the_answer_in_it():
    tok = word_tokenizer()
    corpus = [Example(words=s.split(), unit=f"s{i}", source="t") for i, s in enumerate(HAY)]
    (ex,) = probes(tok, [25], 1, haystack=corpus)
    assert tok.decode(ex.meta["input_ids"][:5]) == "The dog ran home ."
    assert sentence_text(["It", "was", "n't", "(", "there", ")", "."]) == "It wasn't (there)."
    (seen,) = probes(tok, [25], 1, haystack=HAY[:3] + ["The key is blue ."])
    assert seen.meta["answer_in_haystack"]


def test_bad_haystack_lengths_and_prompts():
    tok = word_tokenizer()
    with pytest.raises(CorpusError, match="empty haystack"):
        probes(tok, [25], 1, haystack=[])
    with pytest.raises(ValueError, match="alone has more than 4 tokens"):
        probes(tok, [4], 1)
    with pytest.raises(ValueError, match="its prompt has 35 tokens, more than the 30"):
        probes(tok, [25], 1, max_prompt=30)  # 25 + "Question : What colour is the key ? Answer :"


def test_needle_file_errors_name_file_and_line(tmp_path):
    good = json.dumps(dict(needle="The key is blue.", question="Which?", answer="blue"))
    cases = [
        ("{not json", "2: not JSON"),
        ("[1, 2]", "2: expected a JSON object"),
        (json.dumps(dict(needle="N", question="Q")), "2: field 'answer' is missing"),
        (json.dumps(dict(needle="N", question="", answer="N")), "2: field 'question' is ''"),
        (json.dumps(dict(needle="The key.", question="Q", answer="red")), "is not a span"),
    ]
    for line, message in cases:
        path = tmp_path / "needles.jsonl"
        path.write_text(good + "\n" + line + "\n")
        with pytest.raises(CorpusError, match=re.escape(message)) as err:
            read_needles(path)
        assert str(err.value).startswith(f"{path}:2: ")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(CorpusError, match="no needle"):
        read_needles(empty)
    path.write_text("\n" + good + "\n")
    assert read_needles(path) == [Needle("The key is blue.", "Which?", "blue", f"{path}:2")]


def test_word_recall_gate():
    assert word_recall("Saffron.", "saffron") == 1.0
    assert word_recall("The key is kept in a green flowerpot.", "under a green flowerpot") == 0.75
    assert word_recall("a pot", "under a green flowerpot") == 0.25
    assert word_recall("two", "two two kites") == pytest.approx(1 / 3)  # repeats count
    assert recalled("It is kept in a green flowerpot", "under a green flowerpot")
    assert not recalled("a green thing", "under a green flowerpot")  # 2 of 4: not more than half
    assert words_of("Mara's 4729-th") == ["mara", "s", "4729", "th"]


def test_built_in_needles_and_bundled_haystack():
    assert len(NEEDLES) >= 3
    haystack = " " + " ".join(words_of(HAYSTACK.read_text(encoding="utf-8"))) + " "
    for needle in NEEDLES:
        assert check_needle(
            dict(needle=needle.needle, question=needle.question, answer=needle.answer), "x"
        )
        assert f" {' '.join(words_of(needle.answer))} " not in haystack  # nothing to copy by luck
    lines = HAYSTACK.read_text(encoding="utf-8").splitlines()
    assert len(lines) > 300 and all(line.strip() == line and line for line in lines)
    assert len(haystack.split()) > 9000  # room for 8,192-token contexts without starting over


def test_the_registered_needle_probe_builds_the_needle_stream():
    """`--probe needle` is a probe the retrieval folder registers (`registry.Probe`), its options
    assembled into RunConfig; the inputs' own probes do not name it."""
    from types import SimpleNamespace

    from headprobe.config import RunConfig
    from headprobe.inputs.probes import PROBES
    from headprobe.scoring import registry

    assert "needle" not in PROBES
    probe = registry.probe("needle")
    assert probe.option_names == ("needles", "needle_lengths", "needle_depths")
    config = RunConfig(probe="needle", needle_lengths="25", needle_depths=2).checked()
    net = SimpleNamespace(config=SimpleNamespace())
    stream = probe.stream(dataclasses.replace(config, needles=[NEEDLE]), word_tokenizer(), net, HAY)
    assert [ex.meta["needle_span"] for ex in stream] == [(0, 5), (20, 25)]


# ------------------------------------------------------------------------------ options
def write_needles(tmp_path, *lines) -> str:
    path = tmp_path / "n.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_options_checked_and_recorded(tmp_path):
    bad = write_needles(tmp_path, '{"needle": "A b.", "question": "Q?", "answer": "c"}')
    with pytest.raises(
        UsageError, match=re.escape(f"--needles: {bad}:1: answer 'c' is not a span")
    ):
        RunConfig(probe="needle", needles=bad).checked()
    with pytest.raises(UsageError, match="--needles gives the needles of --probe needle"):
        RunConfig(needles=bad).checked()
    with pytest.raises(UsageError, match="--needle-lengths is an option of --probe needle"):
        RunConfig(needle_lengths="100").checked()
    with pytest.raises(UsageError, match="'x' is not a whole number of tokens"):
        RunConfig(probe="needle", needle_lengths="500,x").checked()
    with pytest.raises(UsageError, match="--needle-depths must be at least 1"):
        RunConfig(probe="needle", needle_depths=0).checked()
    checked = RunConfig(probe="needle", needle_lengths="1000, 500", needle_depths=3).checked()
    assert checked.needle_lengths == (1000, 500)
    assert checked.options_record("cpu")["probe"] == {
        "name": "needle",
        "needles": "built-in",
        "lengths": [1000, 500],
        "depths": 3,
    }


@pytest.fixture
def config_only(tmp_path):
    """Model directories holding a config and no weights: a run that got past the checks would
    fail to load them."""

    def make(config, name):
        path = tmp_path / name
        config.save_pretrained(path)
        return str(path)

    llama = LlamaConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=256,
        architectures=["LlamaForCausalLM"],
    )
    bert = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4)
    bert.architectures = ["BertModel"]
    return make(llama, "llama"), make(bert, "bert")


def test_model_checked_from_its_config_before_loading(config_only):
    llama, bert = config_only
    with pytest.raises(
        UsageError, match=r"reads at most 256 positions \(max_position_embeddings\)"
    ):
        headprobe.run(llama, probe="needle", needle_lengths="200,300")
    with pytest.raises(UsageError, match="is not a causal language model"):
        headprobe.run(bert, probe="needle", needle_lengths="100")


def test_cli_one_line_and_exit_2(config_only, tmp_path, capsys):
    llama, _ = config_only
    bad = write_needles(tmp_path, '{"needle": "A b.", "question": "Q?"}')
    for options, message in [
        (["--needles", bad], f"{bad}:1: field 'answer' is missing"),
        (["--needle-lengths", "250"], "reads at most 256 positions"),
    ]:
        code = main(
            ["run", "--model", llama, "--probe", "needle", "--out", str(tmp_path / "o")] + options
        )
        err = capsys.readouterr().err.strip()
        assert code == 2 and message in err and len(err.splitlines()) == 1


def tiny_causal_lm(tokenizer):
    import torch
    from transformers import LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=384,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def test_a_run_reads_the_needle_probes(llama3_tokenizer):
    """`headprobe.run(probe="needle")`: the bundled haystack through the model's tokenizer, one
    example per (needle, length, depth), each prompt within the model's 384 positions less the
    answer's 32 (the byte-level test vocabulary spells most words byte by byte: 300 tokens of
    context and the question make prompts of 286 to 354 tokens, too long)."""
    model = tiny_causal_lm(llama3_tokenizer)
    results = headprobe.run(
        probe="needle",
        needle_lengths="200",
        needle_depths=2,
        analyses=["previous_token"],
        loaded=(model, llama3_tokenizer, "tiny llama"),
        device="cpu",
        progress=False,
        n_boot=5,
    )
    assert results.summary["options"]["probe"] == {
        "name": "needle",
        "needles": "built-in",
        "lengths": [200],
        "depths": 2,
    }
    assert results.summary["runs"]["probe"]["examples"] == 2 * len(NEEDLES)
    with pytest.raises(ValueError, match="more than the 352 the model can read and still answer"):
        headprobe.run(
            probe="needle",
            needle_lengths="300",
            analyses=["previous_token"],
            loaded=(model, llama3_tokenizer, "tiny llama"),
            device="cpu",
            progress=False,
        )
    base = model.base_model  # the same weights without the language-model head
    with pytest.raises(UsageError, match="tiny base is not a causal language model"):
        headprobe.run(probe="needle", loaded=(base, llama3_tokenizer, "tiny base"), device="cpu")
