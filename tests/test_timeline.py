"""`headprobe timeline` (METHODS §17) on tiny local checkpoints of a causal LM: scores and the
objective against short independent computations, onsets, resume, the refusals before loading,
the report.

The checkpoints are a 2 x 4 GPT-2 (hidden 32) with the byte-level test tokenizer, its weights a
path from one random init towards another (`step_0` ... `step_300`), saved with the tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import make_gpt2
from test_report import check_page_in_chromium, chromium_binary
from transformers import GPT2Config, GPT2LMHeadModel

import headprobe
from headprobe.cli import main
from headprobe.core.errors import UsageError
from headprobe.inputs.probes import make_probe
from headprobe.training import series as series_mod
from headprobe.training.runner import Timeline, timeline
from headprobe.training.timeline_tables import CHECKPOINTS

STEPS = [0, 100, 200, 300]
LENGTH, N = 12, 40
PROBE_ARGS = ["--probe", "repeated-random", "--length", str(LENGTH), "--n", str(N)]
OPTIONS = dict(
    probe="repeated-random",
    probe_length=LENGTH,
    probe_n=N,
    analyses=["induction"],
    progress=False,
    report=False,
)


def gpt2_config(tok, n_layer=2):
    return GPT2Config(
        vocab_size=len(tok),
        n_embd=32,
        n_layer=n_layer,
        n_head=4,
        n_positions=64,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        initializer_range=0.3,
    )


def save_series(root, steps=STEPS, n_layer=2, tok=None):
    """Checkpoints `root/step_<s>`: weights (1 - t) W_a + t W_b, t = s / max(steps)."""
    tok = tok or make_gpt2(add_prefix_space=True)
    torch.manual_seed(0)
    a = GPT2LMHeadModel(gpt2_config(tok, n_layer)).state_dict()
    torch.manual_seed(1)
    b = GPT2LMHeadModel(gpt2_config(tok, n_layer)).state_dict()
    paths = []
    for step in steps:
        t = step / max(steps)
        model = GPT2LMHeadModel(gpt2_config(tok, n_layer))
        mixed = {k: ((1 - t) * a[k] + t * b[k]) if a[k].is_floating_point() else a[k] for k in a}
        model.load_state_dict(mixed)
        path = root / f"step_{step}"
        model.save_pretrained(path)
        tok.save_pretrained(path)
        paths.append(str(path))
    return paths


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    return save_series(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def whole(series, tmp_path_factory):
    """The timeline run straight through, checkpoints given out of order."""
    out = tmp_path_factory.mktemp("timeline") / "T"
    return timeline(list(reversed(series)), out=str(out), **OPTIONS)


# -------------------------------------------------------------------- independent computations
def probe_ids():
    """The probe's sequences [n, 2 * LENGTH] (the tiny GPT-2 tokenizer adds no special token)."""
    tok = make_gpt2(add_prefix_space=True)
    stream = make_probe("repeated-random", tok, length=LENGTH, n=N, seed=0, specials="auto")
    return torch.tensor([ex.meta["input_ids"] for ex in stream])


def induction_mul(path, ids) -> np.ndarray:
    """[layer, head] share of attention on the token after an earlier occurrence of the
    query's token, averaged over the rows that have one (Olsson et al.), from the eager model."""
    model = GPT2LMHeadModel.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        att = torch.stack(
            model(ids, output_attentions=True).attentions, 1
        )  # [b, layer, head, q, k]
    t = ids.shape[1]
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    prev = ids[:, torch.clamp(j[0] - 1, min=0)]  # [b, k]: token before key j
    pattern = (j >= 1) & (j - 1 < i) & (prev[:, None, :] == ids[:, :, None])  # [b, q, k]
    rows = pattern.any(-1)  # [b, q]
    mass = (att * pattern[:, None, None]).sum(-1)  # [b, layer, head, q]
    return ((mass * rows[:, None, None]).sum((0, 3)) / rows.sum()).numpy()


def repeated_half_loss(path, ids) -> float:
    """Mean next-token NLL over the targets in the repeated half after its first token."""
    model = GPT2LMHeadModel.from_pretrained(path).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.double(), -1)  # [b, t, vocab]
    targets = torch.arange(LENGTH + 1, 2 * LENGTH)
    nll = -logp[:, targets - 1].gather(-1, ids[:, targets, None])[..., 0]
    return float(nll.mean())


# ------------------------------------------------------------------------------- the tables
def test_induction_scores_and_objective_agree_with_independent_code(whole, series):
    ids = probe_ids()
    heads = whole.heads
    assert list(heads.columns[:2]) == ["step", "checkpoint"]
    assert list(whole.objective["step"]) == STEPS  # ordered by step, whatever the order given
    for step, path in zip(STEPS, series):
        mine = heads[(heads["step"] == step) & (heads["label"] == "mul")]
        got = mine.pivot(index="layer", columns="head", values="score").to_numpy()
        np.testing.assert_allclose(got, induction_mul(path, ids), atol=1e-5)
        assert (mine["ci_low"] <= mine["score"]).all() and (mine["score"] <= mine["ci_high"]).all()
        row = whole.objective[whole.objective["step"] == step].iloc[0]
        assert row["value"] == pytest.approx(repeated_half_loss(path, ids), abs=1e-4)
        assert row["ci_low"] < row["value"] < row["ci_high"]
    assert set(heads["label"]) == {"mul", "argmax"}


def test_the_onset_is_the_largest_rise_of_the_best_score(whole, series):
    ids = probe_ids()
    best = [induction_mul(path, ids).max() for path in series]
    k = int(np.argmax(np.diff(best)))
    onset = whole.onsets[(whole.onsets["label"] == "mul")].iloc[0]
    assert (onset["from_step"], onset["to_step"]) == (STEPS[k], STEPS[k + 1])
    assert onset["rise"] == pytest.approx(best[k + 1] - best[k], abs=1e-5)
    assert onset["rise_low"] <= onset["rise"] <= onset["rise_high"]
    losses = [repeated_half_loss(path, ids) for path in series]
    f = int(np.argmax(-np.diff(losses)))
    assert (onset["objective_from_step"], onset["objective_to_step"]) == (STEPS[f], STEPS[f + 1])
    assert onset["objective_fall"] == pytest.approx(losses[f] - losses[f + 1], abs=1e-4)
    assert bool(onset["same_interval"]) == (k == f)


def test_every_checkpoint_is_a_whole_results_directory(whole):
    for record in whole.checkpoints:
        results = headprobe.load_results(whole.directory / CHECKPOINTS / record["checkpoint"])
        assert "induction" in results.analyses
        table = results.tables["induction_heads"]
        mine = whole.heads[
            (whole.heads["checkpoint"] == record["checkpoint"]) & (whole.heads["label"] == "mul")
        ]
        theirs = table[table["label"] == "mul"]
        np.testing.assert_allclose(mine["score"].to_numpy(), theirs["score"].to_numpy())
    again = Timeline.load(whole.directory)
    pd.testing.assert_frame_equal(again.onsets, whole.onsets)


# ------------------------------------------------------------------------------------- resume
def test_a_killed_timeline_resumes_and_gives_the_same_bytes(whole, series, tmp_path, monkeypatch):
    import headprobe.api as api

    real, scored = api.run, []

    def stopping(config, *args, **kwargs):
        if len(scored) == 3:
            raise KeyboardInterrupt  # killed after its third checkpoint
        scored.append(str(config.model))
        return real(config, *args, **kwargs)

    monkeypatch.setattr(api, "run", stopping)
    out = tmp_path / "T"
    with pytest.raises(KeyboardInterrupt):
        timeline(series, out=str(out), **OPTIONS)
    assert scored == series[:3]
    scored.clear()
    monkeypatch.setattr(
        api, "run", lambda config, *a, **k: scored.append(config.model) or real(config, *a, **k)
    )
    timeline(series, out=str(out), **OPTIONS)
    assert scored == series[3:]  # only the rest
    for name in whole.tables:
        for suffix in (".parquet", ".csv"):
            assert (out / f"{name}{suffix}").read_bytes() == (
                whole.directory / f"{name}{suffix}"
            ).read_bytes(), name


def test_a_timeline_run_again_with_other_options_is_refused(whole, series):
    with pytest.raises(UsageError, match="other options"):
        timeline(series, out=str(whole.directory), **dict(OPTIONS, probe_n=N + 1))


# ----------------------------------------------------------------------- refused before loading
@pytest.fixture
def no_loading(monkeypatch):
    from headprobe.model import loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loading, "_load", refuse)


def cli(args, capsys) -> tuple[int, str]:
    capsys.readouterr()  # what saving the checkpoints printed
    status = main(["timeline", *args, "--quiet", "--no-report"])
    return status, capsys.readouterr().err.strip()


def test_a_missing_checkpoint_is_refused_in_one_line(series, tmp_path, capsys, no_loading):
    missing = str(tmp_path / "step_400")
    status, err = cli([*series, missing, "--out", str(tmp_path / "T")], capsys)
    assert status == 2 and len(err.splitlines()) == 1
    assert f"checkpoint {missing}" in err and "no such model directory" in err


def test_another_architecture_is_refused(series, tmp_path, capsys, no_loading):
    other = save_series(tmp_path, steps=[400], n_layer=3)
    status, err = cli([*series, *other, "--out", str(tmp_path / "T")], capsys)
    assert status == 2 and len(err.splitlines()) == 1
    assert "step_400" in err and "architecture differs" in err and "layers 2 vs 3" in err


def test_another_tokenizer_is_refused(series, tmp_path, capsys, no_loading):
    # the same vocabulary size (so the same architecture), another pre-tokenizer: other ids
    other = save_series(tmp_path, steps=[400], tok=make_gpt2(add_prefix_space=False))
    status, err = cli([*series, *other, "--out", str(tmp_path / "T")], capsys)
    assert status == 2 and len(err.splitlines()) == 1
    assert "step_400" in err and "tokenizer differs" in err


def test_a_step_that_cannot_be_parsed_is_refused(series, tmp_path, capsys, no_loading):
    import shutil

    odd = tmp_path / "final"
    shutil.copytree(series[0], odd)
    status, err = cli([series[1], str(odd), "--out", str(tmp_path / "T")], capsys)
    assert status == 2 and "no step in its name" in err and "--steps" in err
    assert len(err.splitlines()) == 1


def test_steps_from_names_revisions_and_steps_given():
    parse = series_mod.parse_step
    assert parse("ckpt/step_01000") == 1000 and parse("step1000") == 1000
    assert parse("google/multiberts-seed_0-step_20k") == 20000
    assert parse("EleutherAI/pythia-70m@step143000") == 143000 and parse("final") is None
    found = series_mod.checkpoints(["EleutherAI/pythia-70m"], revisions="step1000,step0")
    assert [c.model for c in found] == [
        "EleutherAI/pythia-70m@step0",
        "EleutherAI/pythia-70m@step1000",
    ]
    assert [c.label for c in found] == ["pythia-70m@step0", "pythia-70m@step1000"]
    given = series_mod.checkpoints(["b", "a"], steps="2k,10")
    assert [(c.model, c.step) for c in given] == [("a", 10), ("b", 2000)]
    with pytest.raises(UsageError, match="one checkpoint per step"):
        series_mod.checkpoints(["x/step_1", "y/step1"])
    with pytest.raises(UsageError, match="--revisions applies to one name"):
        series_mod.checkpoints(["a", "b"], revisions="step0")


# -------------------------------------------------------------------------------- the report
def test_the_report_renders_a_timeline_directory(whole, capsys):
    assert main(["report", str(whole.directory)]) == 0
    html = (whole.directory / "report" / "timeline.html").read_text()
    for figure in ("timeline_best.png", "timeline_objective.png", "timeline_role_maps_1.png"):
        assert (whole.directory / "report" / "figures" / figure).is_file()
        assert figure in html  # listed in the report
    assert "Onsets" in html and "METHODS §17" in html


# --------------------------------------------------------------------- analyses/chen2024 script
def test_the_syntax_onset_script_on_tiny_masked_lm_checkpoints(tmp_path, capsys):
    import importlib.util
    import sys

    from conftest import make_wordpiece
    from transformers import BertConfig, BertForMaskedLM

    from headprobe.inputs.samples import SAMPLE

    tok = make_wordpiece()
    paths = []
    for k, step in enumerate([0, 20000, 40000]):
        torch.manual_seed(k)
        config = BertConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=128,
            pad_token_id=tok.pad_token_id,
            initializer_range=0.3,
        )
        path = tmp_path / f"multiberts-seed_0-step_{step // 1000}k"
        BertForMaskedLM(config).save_pretrained(path)
        tok.save_pretrained(path)
        paths.append(str(path))
    analyses = Path(__file__).resolve().parents[1] / "analyses"
    sys.path.insert(0, str(analyses))
    try:
        spec = importlib.util.spec_from_file_location("chen", analyses / "chen2024_syntax_onset.py")
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        out = tmp_path / "out"
        assert (
            script.main(
                [*reversed(paths), "--treebank", str(SAMPLE), "--out", str(out), "--no-report"]
            )
            == 0
        )
    finally:
        sys.path.remove(str(analyses))
    table = pd.read_csv(out / "syntax_onset.csv")
    assert list(table["step"]) == [0, 20000, 40000]
    tl = Timeline.load(out / "timeline")
    for row in table.itertuples(index=False):
        results = tl.results(row.checkpoint)
        best = results.best_head("dependency", "ALL", selection="held-out")
        assert row.dependency_heldout == pytest.approx(best["accuracy"])
        uas = results.tables["parse_scores"]
        uas = uas.loc[(uas["metric"] == "UAS") & (uas["predictor"] == "probe"), "accuracy"]
        assert any(abs(row.uas - v) < 1e-12 for v in uas)
        assert row.mlm_low < row.mlm_loss < row.mlm_high
    assert set(tl.objective["objective"].str.startswith("masked LM")) == {True}
    printed = capsys.readouterr().out
    assert "dependency ALL best score rises most between steps" in printed
    assert "MLM loss falls most" in printed


@pytest.mark.skipif(
    chromium_binary() is None, reason="chromium not installed (apt-get install chromium)"
)
def test_the_timeline_report_fits_in_chromium(whole):
    from headprobe.training.page import build_timeline_report

    paths = build_timeline_report(whole.directory)
    info = check_page_in_chromium(paths["html"], paths["out_dir"] / "timeline_screenshot.png")
    assert not info["layout"], info["layout"]  # nothing scrolls sideways at 1280 px
    assert not info["errors"], info["errors"]
    assert len(info["images"]) == len(paths["figures"]) >= 3
    broken = [i for i in info["images"] if not (i["complete"] and i["w"] > 0 and i["h"] > 0)]
    assert not broken, broken


def test_a_checkpoint_that_fails_to_load_stops_in_one_line_and_keeps_the_rest(
    series, tmp_path, capsys
):
    import shutil

    broken = tmp_path / "step_400"
    shutil.copytree(series[0], broken)
    (broken / "model.safetensors").write_bytes(b"not weights")
    out = tmp_path / "T"
    status, err = cli([*series, str(broken), "--out", str(out), *PROBE_ARGS], capsys)
    assert status == 2 and len(err.splitlines()) == 1 and f"checkpoint {broken}" in err
    assert sorted(p.name for p in (out / CHECKPOINTS).iterdir()) == [Path(p).name for p in series]


def test_reporting_a_timeline_imports_no_run_library(whole):
    import subprocess
    import sys

    code = (
        "import sys, json\nfrom headprobe.cli import main\n"
        f"status = main(['report', {str(whole.directory)!r}])\n"
        "print(json.dumps([status, [m for m in ('torch', 'transformers') if m in sys.modules]]))"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(root)}
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [0, []], done.stderr


@pytest.mark.slow
def test_the_phase_change_script(tmp_path, capsys):
    """Acceptance: a causal LM trained here, never seen before; the script checks the timeline
    against independent code on other sequences and exits 0 when the onsets agree."""
    import importlib.util
    import sys

    analyses = Path(__file__).resolve().parents[1] / "analyses"
    sys.path.insert(0, str(analyses))
    try:
        spec = importlib.util.spec_from_file_location(
            "olsson", analyses / "olsson2022_phase_change.py"
        )
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        assert script.main(["--out", str(tmp_path)]) == 0
    finally:
        sys.path.remove(str(analyses))
    table = pd.read_csv(tmp_path / "phase_change.csv")
    assert (table["max_head_difference"] <= 0.06).all()
    assert "same interval: yes" in capsys.readouterr().out


def test_name_at_revision_is_a_hub_name_at_that_revision():
    from headprobe.checks import check_model
    from headprobe.model.loading import resolve, split_revision

    name = "EleutherAI/pythia-70m@step1000"
    assert check_model(name) == ("EleutherAI/pythia-70m", {"revision": "step1000"}, name)
    assert resolve(name) == ("EleutherAI/pythia-70m", {"revision": "step1000"}, name)
    assert split_revision("EleutherAI/pythia-70m") == ("EleutherAI/pythia-70m", None)
    with pytest.raises(UsageError, match="neither a local model directory nor"):
        check_model("bad name@rev")


def test_a_model_without_a_language_model_head_has_no_objective(tiny_model, tmp_path):
    import shutil

    from headprobe.inputs.samples import SAMPLE

    paths = [shutil.copytree(tiny_model, tmp_path / f"step{k}") for k in (1, 2)]
    tl = timeline(
        [str(p) for p in paths],
        out=str(tmp_path / "T"),
        treebank=str(SAMPLE),
        analyses=["positional"],
        progress=False,
    )
    assert tl.objective.empty and list(tl.heads["step"].unique()) == [1, 2]
    assert tl.onsets["objective_fall"].isna().all()


def test_a_log_axis_where_the_steps_span_decades():
    from headprobe.training.page import log_steps

    assert log_steps([0, 1000, 8000, 143000]) and log_steps([1, 512, 1000])
    assert not log_steps([0, 100, 200, 1200]) and not log_steps([0, 5])
