"""The repeated-random probe (Olsson et al. 2022) and the "probe" input: token ids given
as they are (1:1 words), specials around them, and `headprobe.run(probe=...)`."""

from __future__ import annotations

import numpy as np
import pytest

import headprobe
from headprobe.cli import main
from headprobe.inputs.align import CLS_LIKE, SEP_LIKE, WORD, align_examples, align_tokens
from headprobe.inputs.batching import prepare
from headprobe.inputs.corpora.base import Example
from headprobe.inputs.probes import make_probe, repeated_random, special_ids, wrap
from headprobe.inputs.samples import SAMPLE
from headprobe.results.query import Results


def test_sequences_repeat_and_are_reproducible(gpt2_tokenizer):
    probe = repeated_random(gpt2_tokenizer, length=7, n=5, seed=3, specials="none")
    assert len(probe) == 5
    for k, ex in enumerate(probe):
        ids = ex.meta["input_ids"]
        assert len(ids) == 14 and ids[:7] == ids[7:]
        assert ex.unit == f"repeated-random:{k}" and len(ex.words) == 14
        assert not set(ids) & special_ids(gpt2_tokenizer)
    again = repeated_random(gpt2_tokenizer, length=7, n=8, seed=3, specials="none")
    assert [e.meta["input_ids"] for e in again[:5]] == [
        e.meta["input_ids"] for e in probe
    ]  # keyed by (seed, k)
    other = repeated_random(gpt2_tokenizer, length=7, n=5, seed=4, specials="none")
    assert [e.meta["input_ids"] for e in other] != [e.meta["input_ids"] for e in probe]


def test_specials_around_the_tokens(wordpiece_tokenizer, llama3_tokenizer, gpt2_tokenizer):
    wp = wordpiece_tokenizer
    assert wrap(wp, "auto") == ([wp.cls_token_id], [wp.sep_token_id])
    assert wrap(llama3_tokenizer, "auto") == ([llama3_tokenizer.bos_token_id], [])
    assert wrap(gpt2_tokenizer, "auto") == ([], [])  # GPT-2 adds nothing to text
    assert wrap(gpt2_tokenizer, "bos") == ([gpt2_tokenizer.bos_token_id], [])
    assert wrap(wp, "none") == ([], [])
    with pytest.raises(ValueError):
        wrap(wp, "sometimes")
    ex = repeated_random(wp, length=4, n=1)[0]
    a = align_tokens(wp, ex.meta["input_ids"])
    assert a.piece_kind == [CLS_LIKE] + [WORD] * 8 + [SEP_LIKE]
    assert a.piece_word == [-1] + list(range(8)) + [-1] and a.n_words == len(ex.words) == 8


def test_probe_and_word_examples_share_a_corpus(llama3_tokenizer):
    probe = repeated_random(llama3_tokenizer, length=5, n=2)
    words = Example(words=["the", "cat"], unit="s", source="s")
    mixed = [probe[0], words, probe[1]]
    aligned = align_examples(llama3_tokenizer, mixed)
    assert aligned[0].input_ids == probe[0].meta["input_ids"]
    assert aligned[1].n_words == 2 and aligned[1].piece_kind[0] == CLS_LIKE
    assert aligned[2].input_ids == probe[1].meta["input_ids"]
    assert len(aligned[1]) < 11
    prepared = prepare(
        mixed, llama3_tokenizer, max_length=len(aligned[1])
    )  # probe: 1 + 2 * 5 = 11 pieces
    assert prepared.skipped["too_long"] == 2 and len(prepared.examples) == 1


def test_unknown_probe(gpt2_tokenizer):
    with pytest.raises(ValueError, match="unknown probe"):
        make_probe("shuffled", gpt2_tokenizer)
    with pytest.raises(ValueError):
        repeated_random(gpt2_tokenizer, length=0)


def test_run_with_a_probe(gpt2_family, tmp_path):
    loaded = (gpt2_family.sdpa, gpt2_family.tokenizer, "tiny-gpt2")
    results = headprobe.run(
        loaded=loaded,
        probe="repeated-random",
        probe_length=8,
        probe_n=40,
        n_boot=50,
        progress=False,
        out=tmp_path / "out",
    )
    assert sorted(results.summary["analyses"]) == [
        "duplicate_token",
        "induction",
        "previous_token",
        "sink",
    ]
    assert "probe" in results.summary["corpora"] and "sentences" not in results.summary["corpora"]
    assert results.summary["n_kv_heads"] == 4
    assert not any("dep->head" in note for note in results.summary["notes"])  # no arcs scored
    for name in ("previous_token", "duplicate_token", "induction", "sink"):
        assert len(results.table(f"{name}_heads")) and len(results.table(f"{name}_kv_groups"))
    induction = results.table("induction_heads")
    assert (induction["label"] == "mul").sum() == 3 * 4
    assert induction["n"].min() >= 40 * 8  # every second-half row, at least
    loaded_back = Results.load(tmp_path / "out")
    assert list(loaded_back.table("induction_heads")["score"]) == pytest.approx(
        list(induction["score"])
    )


def test_token_analyses_read_the_sentence_corpus_without_a_probe(gpt2_family):
    loaded = (gpt2_family.sdpa, gpt2_family.tokenizer, "tiny-gpt2")
    results = headprobe.run(
        loaded=loaded,
        analyses=["positional", "duplicate_token"],
        n_boot=20,
        progress=False,
        pictures=False,
        treebank=SAMPLE,  # the tiny sample (the default is EWT dev)
    )
    assert set(results.summary["analyses"]) == {"positional", "duplicate_token"}
    assert "probe" not in results.summary["corpora"]
    assert sum("is a causal (decoder) model" in note for note in results.summary["notes"]) == 1
    assert results.table("duplicate_token_heads")["n"].max() > 0


def test_cli_probe(gpt2_family, tmp_path, capsys):
    model = tmp_path / "model"
    gpt2_family.sdpa.save_pretrained(model)
    gpt2_family.tokenizer.save_pretrained(model)
    out = tmp_path / "out"
    code = main(
        [
            "run",
            "--model",
            str(model),
            "--probe",
            "repeated-random",
            "--length",
            "6",
            "--n",
            "30",
            "--seed",
            "1",
            "--bootstrap",
            "20",
            "--out",
            str(out),
            "--no-report",
            "--quiet",
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "induction (mul; top 5 of 12 heads" in text
    results = Results.load(out)
    assert "length 6, n 30, seed 1" in results.summary["corpora"]["probe"]
    assert results.summary["runs"]["probe"]["examples"] == 30
    assert np.isfinite(results.table("sink_heads")["score"]).all()
