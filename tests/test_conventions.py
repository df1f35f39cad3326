"""Conventions presets (`headprobe.inputs.conventions`): what each switches, and the published numbers they
reproduce on the bundled MiniLM and UD English EWT dev (slow)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from headprobe.config import RunConfig
from headprobe.inputs.align import align_words
from headprobe.inputs.batching import Batch
from headprobe.inputs.conventions import PRESETS, get_conventions
from headprobe.inputs.corpora.base import Example
from headprobe.inputs.corpora.conllu import read_conllu
from headprobe.scoring.engine import Engine
from headprobe.scoring.layer_attention import LayerAttention
from headprobe.studies.dependency.analysis import (
    VARIANTS,
    DependencyScorer,
    baseline_hits,
    scored_arcs,
)

EWT = Path("/work/shared/data/en_ewt-ud-dev.conllu")
S = Example(
    words=["the", "cat", "sat", "."],
    unit="s",
    source="t:1",
    heads=[1, 2, -1, 2],
    deprels=["det", "nsubj", "root", "punct"],
)


def test_presets():
    assert set(PRESETS) == {"headprobe", "clark2019-code", "joanacero"}
    assert (
        get_conventions(None) is PRESETS["headprobe"]
        and get_conventions("headprobe").variants == VARIANTS
    )
    clark = get_conventions("clark2019-code")
    assert (clark.from_mode, clark.cut_subtypes, clark.unscored) == ("first", True, ())
    assert clark.variants == (
        "offset=+0",
        "offset=-1",
        "offset=+1",
        "offset=-2",
        "offset=+2",
        "offset=-3",
    )
    joan = get_conventions("joanacero")
    assert (joan.from_mode, joan.cut_subtypes, joan.relation("obl:tmod")) == (
        "mean",
        False,
        "obl:tmod",
    )
    assert clark.relation("obl:tmod") == "obl"
    with pytest.raises(ValueError, match="unknown conventions"):
        get_conventions("clark")


def test_offset_baselines_clipped_as_clark_et_al():
    """Clark et al.'s offset_predictor: max(0, min(i + k + 1, n)) with 1-based heads, 0 = ROOT: off the
    left end the prediction is ROOT, off the right end the last word (n = 4 words here)."""
    clark = get_conventions("clark2019-code")
    names = list(clark.variants)
    dependent, head = np.array([0, 2, 2, 1]), np.array([-1, -1, 3, 3])  # ROOT = -1
    hits = clark.baseline_hits(dependent, head, np.full(4, 4))
    assert [names[k] for k in np.flatnonzero(hits[0])] == [
        "offset=-1",
        "offset=-2",
        "offset=-3",
    ]  # 0 + k < 0
    assert [names[k] for k in np.flatnonzero(hits[1])] == ["offset=-3"]  # 2 - 3 < 0
    assert [names[k] for k in np.flatnonzero(hits[2])] == ["offset=+1", "offset=+2"]  # 2 + 2 -> 3
    assert [names[k] for k in np.flatnonzero(hits[3])] == ["offset=+2"]
    spec = get_conventions("headprobe")
    got = spec.baseline_hits(dependent, head, np.full(4, 4))  # SPEC: out of range is wrong
    assert got[:2].sum() == 0
    assert [spec.variants[k] for k in np.flatnonzero(got[2])] == ["offset=+1"]
    first = spec.baseline_hits(np.array([3]), np.array([0]), np.array([4]))
    assert [spec.variants[k] for k in np.flatnonzero(first[0])] == ["offset=-3", "first"]
    assert baseline_hits(np.array([3]), np.array([0])).tolist() == first.tolist()


def test_scored_arcs_and_dependency_rows(wordpiece_tokenizer):
    assert scored_arcs(S) == [(0, 1, "det"), (1, 2, "nsubj")]
    assert scored_arcs(S, "clark2019-code") == [
        (0, 1, "det"),
        (1, 2, "nsubj"),
        (2, -1, "root"),
        (3, 2, "punct"),
    ]
    batch = Batch(
        [S], align_words(wordpiece_tokenizer, [S.words]), pad_id=wordpiece_tokenizer.pad_token_id
    )
    pieces = torch.full((1, 1, 6, 6), 1 / 6)
    for conventions, labels, n_all in (
        ("headprobe", {"det", "nsubj", "ALL"}, 2),
        ("clark2019-code", {"det", "nsubj", "root", "punct", "ALL"}, 4),
    ):
        scorer = DependencyScorer(conventions)
        scorer.bind(1, 1, [0], keep_units=True, n_boot=1)
        state = scorer.prepare(batch)
        scorer.update(LayerAttention(0, pieces[None], batch), state)
        scorer.end_batch(state)
        counts = scorer.unit_counts()
        assert set(counts.label.astype(str)) == labels
        assert set(counts.variant.astype(str)) - {""} == set(get_conventions(conventions).variants)
        rows = counts[(counts.label == "ALL") & (counts.variant == "")]
        assert set(rows.n) == {n_all}
        root = counts[(counts.label == "root") & (counts.variant == "")]
        assert root.hits.sum() == 0  # no head predicts ROOT


def test_reader_cuts_or_keeps_subtypes(tmp_path):
    text = (
        "# sent_id = a\n1\tIt\tit\tPRON\t_\t_\t2\tnsubj:pass\t_\t_\n"
        "2\tfell\tfall\tVERB\t_\t_\t0\troot\t_\t_\n3\tyesterday\tyesterday\tNOUN\t_\t_\t2\tobl:tmod\t_\t_\n\n"
    )
    path = tmp_path / "t.conllu"
    path.write_text(text)
    assert read_conllu(path)[0].deprels == ["nsubj", "root", "obl"]
    assert read_conllu(path, conventions="clark2019-code")[0].deprels == ["nsubj", "root", "obl"]
    assert read_conllu(path, conventions="joanacero")[0].deprels == [
        "nsubj:pass",
        "root",
        "obl:tmod",
    ]


def test_engine_takes_from_mode_and_scorer_conventions(bert_family):
    scorer = DependencyScorer()
    engine = Engine(
        bert_family.sdpa,
        bert_family.tokenizer,
        [scorer],
        RunConfig(conventions="clark2019-code", progress=False),
    )
    assert engine.from_mode == "first" and scorer.conventions.name == "clark2019-code"
    assert scorer.tally_.variants == get_conventions("clark2019-code").variants
    explicit = Engine(
        bert_family.sdpa,
        bert_family.tokenizer,
        [DependencyScorer()],
        RunConfig(from_mode="mean", conventions="clark2019-code", progress=False),
    )
    assert explicit.from_mode == "mean"
    own = DependencyScorer("joanacero")
    assert (
        Engine(
            bert_family.sdpa,
            bert_family.tokenizer,
            [own],
            RunConfig(progress=False, conventions=None),
        ).from_mode
        == "mean"
    )
    assert own.conventions.name == "joanacero"  # no conventions given: the scorer keeps its own


def test_api_and_cli_check_the_preset():
    import argparse

    from headprobe import api
    from headprobe.cli import run_parser

    with pytest.raises(ValueError, match="--conventions"):  # before any model is loaded
        api.run(conventions="clark")
    parser = argparse.ArgumentParser(prog="headprobe")
    run_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["run", "--conventions", "clark2019-code"])
    assert args.conventions == "clark2019-code" and args.from_mode is None


# ---------------------------------------------------------------------------------------
# published numbers (issue 13): MiniLM, EWT dev, in-sample best heads
# ---------------------------------------------------------------------------------------
CLARK_CODE = {"obj": 0.7440, "amod": 0.7926, "aux": 0.6970, "advmod": 0.5573}


def best_in_sample(results) -> dict[str, float]:
    best = results.best_heads
    best = best[(best["analysis"] == "dependency") & (best["selection"] == "in-sample")]
    return dict(zip(best["label"], best["accuracy"]))


@pytest.mark.slow
@pytest.mark.skipif(not EWT.is_file(), reason="needs the shared UD English EWT dev file")
def test_clark2019_code_numbers_on_ewt_dev():
    import headprobe

    options = dict(
        treebank=str(EWT), analyses=["dependency"], n_boot=2, progress=False, pictures=False
    )
    clark = headprobe.run(conventions="clark2019-code", **options)
    assert clark.summary["conventions"]["name"] == "clark2019-code"
    assert clark.summary["from_mode"] == "first"
    got = best_in_sample(clark)
    assert {k: round(got[k], 4) for k in CLARK_CODE} == CLARK_CODE
    assert clark.baselines["variant"].str.fullmatch(r"offset=[+-]\d").all()
    all_arcs = clark.best_head("dependency", "ALL")
    assert all_arcs["n"] == 25_147  # every word: root and punct included
    spec_first = headprobe.run(conventions="headprobe", from_mode="first", **options)
    got = best_in_sample(spec_first)
    assert {k: round(got[k], 4) for k in CLARK_CODE} == CLARK_CODE
    assert round(got["ALL"], 4) == 0.4516
    assert spec_first.best_head("dependency", "ALL")["n"] == 20_085
