"""Heads on a task (METHODS §19): the task's input, its refusals (one line, exit 2), the run's
tables against the exact effects computed directly, the statistics against hand-computed sums,
and the task roles on hand-built rows."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import make_gpt2, make_wordpiece
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

import headprobe
from headprobe.cli import main
from headprobe.core.errors import UsageError
from headprobe.inputs.tasks import read_task, task_examples
from headprobe.studies.patching import task_roles
from headprobe.studies.patching.task_sums import TaskSums
from headprobe.studies.patching.task_tables import does_task, metric_frame, nodes_frame

LINES = [
    ("the big cat sat on the mat and the dog ran", "the big dog sat on the mat and the dog ran"),
    ("a red cat sat down and it saw the dog on", "a red dog sat down and it saw the dog on"),
    ("the cat ran and the dog sat on a red mat", "the dog ran and the dog sat on a red mat"),
]


def task_file(tmp_path, rows, name="task.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def good_rows(n: int = 3):
    return [
        {"clean": c, "corrupted": x, "answer": " cat", "distractor": " dog", "id": f"e{k}"}
        for k, (c, x) in enumerate(LINES[:n])
    ]


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    """A 2-layer GPT-2 under its LM head with a byte-level tokenizer, saved for `--model`."""
    tok = make_gpt2(add_prefix_space=True)
    config = GPT2Config(
        vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=40,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, initializer_range=0.3,
    )  # fmt: skip
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval()
    path = tmp_path_factory.mktemp("tiny-gpt2-lm")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path), model, tok


def run_one_line(args, capsys) -> str:
    capsys.readouterr()  # what building the fixtures printed
    code = main(["run", "--quiet", "--no-report", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1, err
    return err[0]


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "text,expected",
    [
        ('{"clean": "a b", "corrupted": "a c", "answer": " x", "distractor": " y"}\n{bad json\n',
         ":2: invalid JSON"),
        ('{"clean": "a b", "corrupted": "a c", "answer": " x"}\n', ":1: missing key 'distractor'"),
        ('{"clean": "  ", "corrupted": "a c", "answer": " x", "distractor": " y"}\n',
         ":1: 'clean' is empty"),
        ("\n\n", "no example"),
    ],
)  # fmt: skip
def test_a_bad_task_file_is_one_line_before_the_model_loads(tmp_path, capsys, text, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    # a model path that does not exist: the task is checked first, so its line is the one shown
    line = run_one_line(["--model", str(tmp_path / "no-model"), "--task", str(path)], capsys)
    assert str(path) in line and expected in line


def test_prompts_of_different_lengths_name_the_line_and_both_lengths(tiny_lm, tmp_path, capsys):
    rows = good_rows(2)
    rows[1]["corrupted"] = rows[1]["corrupted"] + " and"
    line = run_one_line(["--model", tiny_lm[0], "--task", task_file(tmp_path, rows)], capsys)
    assert "task.jsonl:2:" in line and "clean is 11 pieces and corrupted 12" in line


def test_answer_and_distractor_of_one_token_are_refused(tiny_lm, tmp_path, capsys):
    rows = good_rows(1)
    rows[0]["distractor"] = " cat"
    line = run_one_line(["--model", tiny_lm[0], "--task", task_file(tmp_path, rows)], capsys)
    assert "task.jsonl:1:" in line and "same token" in line


def test_patching_without_a_task_is_refused(tiny_lm, capsys):
    line = run_one_line(["--model", tiny_lm[0], "--analyses", "patching"], capsys)
    assert "patching reads a task" in line and "--task" in line


def test_a_model_without_a_language_model_head_is_refused(tmp_path, capsys):
    tok = make_wordpiece()
    config = BertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=40, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    BertModel(config).save_pretrained(tmp_path / "bert")
    tok.save_pretrained(tmp_path / "bert")
    rows = [{"clean": "the cat [MASK]", "corrupted": "the dog [MASK]", "answer": "sat",
             "distractor": "ran"}]  # fmt: skip
    args = ["--model", str(tmp_path / "bert"), "--task", task_file(tmp_path, rows)]
    line = run_one_line(args, capsys)
    assert "no language-model head" in line


def test_a_longer_answer_warns_naming_the_piece_scored(tiny_lm, capsys):
    _, _, tok = tiny_lm
    rows = good_rows(1)
    rows[0]["answer"] = " unbelievable"
    items = read_task_rows(rows)
    examples = task_examples(items, tok)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "more than one piece" in err[0] and "the one scored" in err[0]
    first = tok(" unbelievable", add_special_tokens=False)["input_ids"][0]
    assert examples[0].meta["answer_id"] == first


def read_task_rows(rows):
    from headprobe.inputs.tasks import task_items

    return task_items(rows)


def test_a_list_of_dicts_keeps_other_keys_and_names_units(tmp_path):
    rows = good_rows(2)
    rows[0]["template"], rows[1]["unit"] = 7, "doc-a"
    items = read_task(task_file(tmp_path, rows))
    assert items[0].extra == {"template": 7} and items[0].id == "e0"
    assert items[1].unit == "doc-a"
    with pytest.raises(UsageError, match=r"task\[0\]: missing key 'answer'"):
        read_task_rows([{"clean": "a", "corrupted": "b", "distractor": "c"}])


# ------------------------------------------------------------------------------ the run
def test_the_run_tables_equal_the_exact_effects_computed_directly(tiny_lm, tmp_path):
    from headprobe.model.task_nodes import TaskNodes
    from headprobe.studies.patching.node_effects import TaskPairs, exact_effects

    path, model, tok = tiny_lm
    rows = good_rows(3)
    results = headprobe.run(
        loaded=(model, tok, "tiny"), task=rows, estimate="atp,ig", progress=False
    )
    nodes = results.tables["patching_nodes"]
    assert len(nodes) == 1 + 2 * (4 + 1)  # the embeddings, 2 layers of 4 heads and an MLP
    examples = task_examples(read_task_rows(rows), tok)
    pairs = TaskPairs.of(examples, "cpu")
    exact = exact_effects(model, TaskNodes(model), pairs)
    want = exact.noise.double().mean(0).numpy()  # one unit per example: the mean per example
    np.testing.assert_allclose(nodes["noise"].to_numpy(), want, rtol=1e-5, atol=1e-6)
    diff = (exact.m_clean - exact.m_corrupted).double()
    share = exact.denoise.double().sum(0) / diff.sum()
    np.testing.assert_allclose(
        nodes["denoise_share"].to_numpy(), share.numpy(), rtol=1e-4, atol=1e-5
    )
    metric = results.tables["patching_metric"].set_index("metric")
    assert metric.loc["clean", "value"] == pytest.approx(float(exact.m_clean.mean()), rel=1e-5)
    check = results.tables["patching_check"]
    assert set(zip(check["estimate"], check["effect"])) == {
        (k, e) for k in ("atp", "ig") for e in ("noise", "denoise")
    }
    assert (check["nodes"] == len(nodes)).all()
    summary = results.task_summary()
    assert summary["examples"] == 3 and summary["clean"][0] == pytest.approx(
        metric.loc["clean", "value"]
    )


def test_a_task_the_model_does_not_do_names_no_head(tiny_lm):
    _, model, tok = tiny_lm
    rows = [dict(r, corrupted=r["clean"]) for r in good_rows(3)]  # no cue changed: difference 0
    results = headprobe.run(loaded=(model, tok, "tiny"), task=rows, progress=False)
    assert results.task_summary()["does_task"] is False
    assert len(results.tables["patching_heads"]) == 0
    nodes = results.tables["patching_nodes"]
    # its own value changes nothing (but float rounding: a pass of several copies adds in another order)
    assert nodes["noise"].abs().max() < 1e-5 and nodes["denoise"].abs().max() < 1e-5
    assert (nodes["role"] == "").all()


def test_denoising_every_node_at_once_gives_the_clean_metric(tiny_lm):
    from headprobe.model.task_nodes import TaskNodes
    from headprobe.studies.patching.node_effects import TaskPairs, _Runner, metric

    _, model, tok = tiny_lm
    pairs = TaskPairs.of(task_examples(read_task_rows(good_rows(3)), tok), "cpu")
    nodes = TaskNodes(model)
    with torch.no_grad():
        run = _Runner(model, nodes, pairs)
        with nodes.recording() as clean:
            m_clean = metric(run.logits(pairs.clean))
        with nodes.replacing(clean):
            got = metric(run.logits(pairs.corrupted))
        assert not torch.equal(metric(run.logits(pairs.corrupted)), m_clean)
    torch.testing.assert_close(got, m_clean, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------ statistics
def test_shares_and_means_are_ratios_of_unit_sums():
    sums = TaskSums(["embed", "0-0"], layers=1, heads=1)
    rng = np.random.default_rng(0)
    units = [f"u{k % 40}" for k in range(80)]  # 40 units of two examples each
    noise = rng.normal(1.0, 0.1, (80, 2))
    rows = {
        "m_clean": rng.normal(3.0, 0.2, 80), "m_corrupted": rng.normal(1.0, 0.2, 80),
        "noise": noise, "denoise": noise * 0.5,
    }  # fmt: skip
    sums.add(units, rows)
    weights = np.ones((3, 40))  # resample 0 the data; two resamples equal to it
    weights[2, :20] = 0.0
    frame = nodes_frame(sums, [("embed", -1, -1), ("0-0", 0, 0)], weights)
    diff = rows["m_clean"] - rows["m_corrupted"]
    np.testing.assert_allclose(frame["noise"], noise.mean(0))
    np.testing.assert_allclose(frame["denoise_share"], (noise * 0.5).sum(0) / diff.sum())
    metric = metric_frame(sums, weights)
    assert metric.set_index("metric").loc["difference", "value"] == pytest.approx(diff.mean())
    assert does_task(metric)
    assert frame["direct"].isna().all()  # no direct effect given: NaN, never zeros


def row_of(**values):
    base = dict(
        direct=1.0, direct_low=0.5, direct_high=1.5, p_holm=0.001, direct_answer=0.0,
        direct_answer_low=0.0, direct_answer_high=0.0, direct_distractor=0.0,
        direct_distractor_low=0.0, direct_distractor_high=0.0, attention_answer=0.0,
        attention_answer_first=0.0, attention_answer_last=0.0, attention_distractor=0.0,
        attention_distractor_first=0.0, attention_distractor_last=0.0,
        attention_first_position=0.0, ov_copy_rate=0.0,
    )  # fmt: skip
    return pd.Series(dict(base, **values))


@pytest.mark.parametrize(
    "values,role",
    [
        (dict(direct_answer=0.8, direct_distractor=0.2, attention_answer=0.5), "mover"),
        (dict(direct_answer=0.1, direct_distractor=0.9, attention_distractor=0.6), "suppressor"),
        (dict(direct_answer=-0.7, attention_answer=0.4), "negative mover"),
        # raises the answer without attending to it: no rule fits
        (dict(direct_answer=0.9, attention_answer=0.05, attention_distractor=0.5), "other"),
        # both rules met: the larger logit part decides
        (dict(direct_answer=0.3, direct_distractor=0.9, attention_answer=0.3,
              attention_distractor=0.3), "suppressor"),
    ],
)  # fmt: skip
def test_task_roles_on_hand_built_rows(values, role):
    got, met, evidence = task_roles.classify(row_of(**values))
    assert got == role
    assert role in met and "attention to the answer" in evidence


@pytest.mark.slow
def test_wang2022_script_finds_the_induction_head_by_noising(tmp_path):
    """Acceptance 3: on the Olsson script's trained 2-layer model the induction head (the best of
    the induction analysis) is the top head by noising on the induction task."""
    import sys
    from pathlib import Path

    analyses = Path(__file__).resolve().parents[1] / "analyses"
    sys.path.insert(0, str(analyses))
    try:
        import wang2022_ioi as script
    finally:
        sys.path.remove(str(analyses))
    assert script.main(["--skip-smollm2", "--out", str(tmp_path)]) == 0
    # its results' report: the induction head is a mover, and the page renders at 1280 px
    from test_report import PRINT_WIDTH, check_page_in_chromium, chromium_binary

    from headprobe.report import build_report

    results = headprobe.load_results(tmp_path / "induction_task")
    assert "mover" in results.task_summary()["roles"]
    report = build_report(tmp_path / "induction_task")
    html = report["html"].read_text(encoding="utf-8")
    assert "patching_roles" in html and "mover" in html
    if chromium_binary() is not None:
        info = check_page_in_chromium(
            report["html"], tmp_path / "shot.png", print_width=PRINT_WIDTH
        )
        assert not info["layout"] and not info["errors"], (info["layout"], info["errors"])


def word_tokenizer():
    """A word-level tokenizer of every word the IOI templates, names, places and objects use."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from headprobe.inputs import tasks

    words = {"<unk>"}
    for text in tasks.TEMPLATES:
        words |= set(text.replace(",", " ,").replace(".", " .").split())
    words |= set(tasks.NAMES) | set(tasks.PLACES) | set(tasks.OBJECTS) | {",", "."}
    vocab = {w: i for i, w in enumerate(sorted(words))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def test_the_ioi_generator_is_seeded_and_corrupts_only_the_subjects_second_mention():
    from headprobe.inputs.tasks import ioi_items

    tok = word_tokenizer()
    items = ioi_items(tok, n=40, seed=3)
    assert [i.clean for i in ioi_items(tok, n=10, seed=3)] == [i.clean for i in items[:10]]
    assert [i.clean for i in ioi_items(tok, n=10, seed=4)] != [i.clean for i in items[:10]]
    examples = task_examples(items, tok)
    for item, example in zip(items, examples):
        clean, corrupted = example.meta["input_ids"], example.meta["corrupted_ids"]
        differ = [k for k, (a, b) in enumerate(zip(clean, corrupted)) if a != b]
        assert len(differ) == 1 and 3 <= len(clean) - differ[0] <= 4  # S2, near the end
        io, s = example.meta["answer_id"], example.meta["distractor_id"]
        assert clean.count(io) == 1 and clean.count(s) == 2 and corrupted.count(s) == 1
        assert clean[differ[0]] == s  # the subject's second mention is what changed
        first = min(clean.index(io), clean.index(s))
        assert (clean[first] == io) == (item.extra["order"] == "ABBA")
    assert {i.extra["order"] for i in items} == {"ABBA", "BABA"}


def test_ioi_needs_names_of_one_piece(tiny_lm):
    from headprobe.inputs.tasks import ioi_items

    with pytest.raises(UsageError, match="--task ioi: the tokenizer writes only 0"):
        ioi_items(tiny_lm[2], n=4)
