"""`--analyses composition` through the run (METHODS §18): the CLI and `headprobe.run`, its tables
saved and returned, the `reads` query, the circuits of the role map, the graph, bad input.

The effects in the run's `composition_edges` are checked against an independent hooked forward
(`test_composition.reference`: the sender's slice replaced in the real output projection, the
receiver's channel projection fed the changed residual stream) on the run's own probe sequences,
summed over the scored rows (the repeated half's pieces) by hand.
"""

from __future__ import annotations

import copy
import io
import random
from contextlib import redirect_stderr, redirect_stdout
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from test_composition import reference
from test_gates import with_lm_head
from test_report import check_page_in_chromium, chromium_binary

import headprobe
from headprobe.cli import main
from headprobe.core.errors import UsageError
from headprobe.extend import CIRCUIT_COLUMN

N, LENGTH = 6, 5
KEYS = ["layer", "head", "channel", "sender_layer", "sender_head"]


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    family, model = with_lm_head("gpt2")
    out = tmp_path_factory.mktemp("composition") / "results"
    results = headprobe.run(
        loaded=(model, family.tokenizer, "tiny"),
        probe="repeated-random",
        probe_n=N,
        probe_length=LENGTH,
        analyses=["composition", "induction", "previous_token"],
        n_boot=50,
        pictures=False,
        progress=False,
        out=out,
    )
    return family, model, results, out


def probe_inputs(family):
    """The run's probe sequences ([row, piece] ids) and their scored rows (the repeated half's
    pieces: word index >= LENGTH), from the examples themselves."""
    from headprobe.inputs.batching import prepare
    from headprobe.inputs.probes import make_probe

    examples = list(
        make_probe("repeated-random", family.tokenizer, length=LENGTH, n=N, seed=0, vocab_size=None)
    )
    prepared = prepare(examples, family.tokenizer, 512)
    ids = torch.tensor([a.input_ids for a in prepared.alignments])
    rows = torch.tensor([[w >= LENGTH for w in a.piece_word] for a in prepared.alignments])
    return ids, rows


def test_edges_equal_an_independent_hooked_forward(composed):
    family, model, results, _ = composed
    edges = results.composition_edges
    eager = copy.deepcopy(model)
    eager.config._attn_implementation = "eager"
    built = SimpleNamespace(eager=eager, name="gpt2")
    ids, rows = probe_inputs(family)
    rng = random.Random("composition-run")
    n_layers, n_heads = results.n_layers, results.n_heads
    for _ in range(4):
        layer = rng.randrange(1, n_layers)
        sender = (rng.randrange(layer), rng.randrange(n_heads))
        head, channel = rng.randrange(n_heads), rng.choice("qk")
        tv, rel, _ = reference(
            built, {"input_ids": ids}, "decoder", sender, (layer, head), channel, 0.0
        )
        keep = rows.float()
        want_tv = float((tv * keep).sum() / keep.sum())
        want_rel = float((rel * keep).sum() / keep.sum())
        got = edges[
            (edges["layer"] == layer)
            & (edges["head"] == head)
            & (edges["channel"] == channel)
            & (edges["sender_layer"] == sender[0])
            & (edges["sender_head"] == sender[1])
        ]
        assert len(got) == 1
        assert got["ablation"].iloc[0] == "zero"
        assert got["pattern_effect"].iloc[0] == pytest.approx(want_tv, abs=1e-5)
        assert got["output_effect"].iloc[0] == pytest.approx(want_rel, abs=1e-5)
        low, high = got["output_effect_low"].iloc[0], got["output_effect_high"].iloc[0]
        assert low <= got["output_effect"].iloc[0] <= high


def test_tables_are_returned_saved_and_loaded(composed):
    _, _, results, out = composed
    edges = results.composition_edges
    n_layers, n_heads = results.n_layers, results.n_heads
    want = sum(n_heads * layer * n_heads * 3 for layer in range(1, n_layers))
    assert len(edges) == want  # every (sender of an earlier layer, receiver, channel)
    assert list(edges.columns[1:17]) == [
        *KEYS,
        "ablation",
        "pattern_effect",
        "pattern_effect_low",
        "pattern_effect_high",
        "output_effect",
        "output_effect_low",
        "output_effect_high",
        "role_effect",
        "role_effect_low",
        "role_effect_high",
        "p_holm",
    ]
    assert (edges["sender_layer"] < edges["layer"]).all()
    assert edges["output_effect"].gt(0).any()  # never a table of zeros
    assert (edges.loc[edges["channel"] == "v", "pattern_effect"] == 0).all()
    assert edges["p_holm"].between(0, 1).all()
    check = results.composition_check
    assert len(check) == 30 and set(check["sample"]) == {"top", "random"}
    assert len(results.composition_check_correlation) == 1
    assert len(results.composition_weights) == len(edges)
    loaded = headprobe.Results.load(out)
    for name in ("composition_edges", "composition_check", "composition_weights"):
        assert (out / f"{name}.parquet").is_file() and (out / f"{name}.csv").is_file()
        pd.testing.assert_frame_equal(loaded.tables[name], results.tables[name])
    assert loaded.summary["composition"]["ablation"] == "zero"


def test_role_effects_follow_the_run_role_map(composed):
    _, _, results, _ = composed
    edges, roles = results.composition_edges, results.roles
    pattern = {"induction": "induction", "previous-token": "previous_token"}
    role_of = {(r.layer, r.head): pattern.get(r.role, "") for r in roles.itertuples(index=False)}
    want = [role_of[(l, h)] for l, h in zip(edges["layer"], edges["head"])]
    assert list(edges["role"]) == want
    has = edges["role"] != ""
    assert edges.loc[~has, "role_effect"].isna().all()
    assert edges.loc[has, "role_effect"].notna().all()
    assert CIRCUIT_COLUMN in roles.columns


def test_reads_gives_a_heads_senders_per_channel_and_its_readers(composed):
    _, _, results, _ = composed
    edges = results.composition_edges
    got = results.reads("2-1")
    assert set(got["reads"]) == {"q", "k", "v"}
    for channel, table in got["reads"].items():
        assert (table["layer"] == 2).all() and (table["head"] == 1).all()
        assert (table["channel"] == channel).all() and (table["p_holm"] < 0.05).all()
        assert table["output_effect"].is_monotonic_decreasing
        mine = edges[(edges["layer"] == 2) & (edges["head"] == 1) & (edges["channel"] == channel)]
        best = mine[mine["p_holm"] < 0.05]["output_effect"].max()
        if len(table):
            assert table["output_effect"].iloc[0] == best
    readers = results.reads((1, 0))["read_by"]
    assert len(readers) and (readers["sender_layer"] == 1).all()
    assert (readers["sender_head"] == 0).all()


def test_circuit_names_an_induction_head_reading_a_previous_token_head():
    """Hand-built edges and role map: 2-1 (induction) reads 1-0 (previous token) through its key
    with an interval above 0; 2-3's key reads 1-2 only with an interval that reaches 0."""
    from headprobe.studies.composition.analysis import circuits

    def edge(layer, head, sender, effect, low, high, channel="k"):
        return {
            "layer": layer,
            "head": head,
            "channel": channel,
            "sender_layer": sender[0],
            "sender_head": sender[1],
            "ablation": "mean",
            "pattern_effect": effect,
            "pattern_effect_low": low,
            "pattern_effect_high": high,
            "role_effect": effect,
            "role_effect_low": low,
            "role_effect_high": high,
        }

    edges = pd.DataFrame(
        [
            edge(2, 1, (1, 0), 0.30, 0.20, 0.40),
            edge(2, 1, (1, 1), 0.50, 0.40, 0.60),  # larger, but 1-1 is no previous-token head
            edge(2, 1, (1, 0), 0.90, 0.80, 0.95, channel="q"),  # the query, not the key
            edge(2, 3, (1, 2), 0.20, -0.01, 0.40),
        ]
    )
    roles = pd.DataFrame(
        {
            "layer": [1, 1, 1, 2, 2],
            "head": [0, 1, 2, 1, 3],
            "role": ["previous-token", "none", "previous-token", "induction", "induction"],
        }
    )
    found = circuits(SimpleNamespace(tables={"composition_edges": edges}), roles)
    assert sorted(zip(found["layer"], found["head"])) == [(1, 0), (2, 1)]
    text = found.set_index(["layer", "head"])[CIRCUIT_COLUMN]
    assert "key reads previous-token head 1-0" in text[(2, 1)]
    assert "0.300 [0.200, 0.400]" in text[(2, 1)]
    assert "read by 2-1's key" in text[(1, 0)]


def test_graph_draws_in_png_svg_and_pdf(composed, tmp_path):
    from headprobe.studies.composition.graph import composition_graph, graph_edges

    _, _, results, _ = composed
    shown = graph_edges(results.composition_edges)
    assert len(shown) and (shown["p_holm"] < 0.05).all()
    drawing = composition_graph(shown, results.n_layers, results.n_heads, {(1, 0): "prev"})
    paths = drawing.save(tmp_path / "graph", ("png", "svg", "pdf"))
    assert sorted(p.suffix for p in paths) == [".pdf", ".png", ".svg"]
    assert paths[0].read_bytes()[:4] == b"\x89PNG"
    assert all(p.stat().st_size > 1000 for p in paths)


def cli(*args) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        try:
            status = main(list(args))
        except SystemExit as stop:
            status = stop.code
    return status, err.getvalue()


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--receivers", "3-x"], "'3-x' is not a head"),
        (["--receivers", "0-1"], "layer 0 has no earlier heads to read"),
        (["--receivers", "9-0"], "receiver 9-0 does not exist"),
        (["--senders", "mlp"], "the senders always include heads"),
        (["--senders", "heads,foo"], "foo is not one of heads, mlp, embed"),
        (["--ablation", "bogus"], "--ablation"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tiny_model, tmp_path, extra, needle):
    status, err = cli(
        "run",
        "--model",
        tiny_model,
        "--analyses",
        "composition",
        "--quiet",
        "--out",
        str(tmp_path / "out"),
        *extra,
    )
    assert status == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out" / "composition_edges.parquet").exists()


def test_receivers_without_composition_are_refused():
    with pytest.raises(UsageError, match="--receivers is read by the composition analysis"):
        headprobe.run(analyses="ablation", receivers="1-0")


def test_unreachable_family_is_refused_in_one_line():
    from test_architectures import build

    built = build("mpnet")  # the legacy path: its attention is its own code
    with pytest.raises(UsageError) as err:
        headprobe.run(
            loaded=(built.model, built.tokenizer, "mpnet"),
            analyses="composition",
            pictures=False,
            progress=False,
        )
    assert "legacy path" in str(err.value) and "\n" not in str(err.value)


def test_cli_run_writes_the_tables(tiny_model, tmp_path):
    out = tmp_path / "out"
    status, err = cli(
        "run",
        "--model",
        tiny_model,
        "--analyses",
        "composition",
        "--receivers",
        "2-1,1-0",
        "--probe",
        "repeated-random",
        "--n",
        "4",
        "--length",
        "5",
        "--quiet",
        "--bootstrap",
        "50",
        "--no-report",
        "--out",
        str(out),
    )
    assert status == 0, err
    edges = pd.read_parquet(out / "composition_edges.parquet")
    assert sorted(set(zip(edges["layer"], edges["head"]))) == [(1, 0), (2, 1)]
    assert len(edges) == 3 * 4 + 3 * 8  # channels x senders of earlier layers, per receiver
    assert np.isfinite(edges["output_effect"]).all() and edges["output_effect"].gt(0).any()


def test_resample_ablation_runs_through_the_cli(tiny_model, tmp_path):
    """--ablation resample: each unit's sender writes replaced by its partner unit's (the ablation
    study's pairing); the edges say so, and some effect is measured."""
    out = tmp_path / "out"
    status, err = cli(
        "run", "--model", tiny_model, "--analyses", "composition", "--receivers", "2-1",
        "--ablation", "resample", "--probe", "repeated-random", "--n", "4", "--length", "5",
        "--quiet", "--bootstrap", "50", "--no-report", "--out", str(out),
    )  # fmt: skip
    assert status == 0, err
    edges = pd.read_parquet(out / "composition_edges.parquet")
    assert set(edges["ablation"]) == {"resample"}
    assert len(edges) == 3 * 8  # channels x senders of the two earlier layers
    assert np.isfinite(edges["output_effect"]).all() and edges["output_effect"].gt(0).any()


@pytest.mark.parametrize("kind", ["mean", "resample"])
def test_mlp_and_embed_senders_run_through_the_cli(tiny_model, tmp_path, kind):
    """--senders heads,mlp,embed on the BERT (post-norm, frozen norms): each receiver also reads
    the embeddings and each earlier layer's MLP (keyed sender_layer, sender_head -1, the
    `sender` column naming the kind); their effects are measured, never a row of zeros, and
    their weights-only scores are NaN (no W_OV)."""
    out = tmp_path / "out"
    status, err = cli(
        "run", "--model", tiny_model, "--analyses", "composition", "--receivers", "2-1",
        "--senders", "heads,mlp,embed", "--ablation", kind, "--probe", "repeated-random",
        "--n", "4", "--length", "5", "--quiet", "--bootstrap", "50", "--no-report",
        "--out", str(out),
    )  # fmt: skip
    assert status == 0, err
    edges = pd.read_parquet(out / "composition_edges.parquet")
    assert len(edges) == 3 * (8 + 1 + 2)  # channels x (heads, embeddings, MLPs of layers 0, 1)
    kinds = edges.groupby("sender").size().to_dict()
    assert kinds == {"head": 3 * 8, "embed": 3, "mlp": 3 * 2} and set(edges["ablation"]) == {kind}
    mlp = edges[edges["sender"] == "mlp"]
    assert sorted(set(mlp["sender_layer"])) == [0, 1] and set(mlp["sender_head"]) == {-1}
    embed = edges[edges["sender"] == "embed"]
    assert set(zip(embed["sender_layer"], embed["sender_head"])) == {(-1, -1)}
    for part in (mlp, embed):
        assert np.isfinite(part["output_effect"]).all() and part["output_effect"].gt(0).all()
        assert part.loc[part["channel"] != "v", "pattern_effect"].gt(0).all()
    weights = pd.read_parquet(out / "composition_weights.parquet")
    others = weights[weights["sender_head"] == -1]
    assert len(others) == 3 * 3 and others["score"].isna().all()
    assert weights.loc[weights["sender_head"] >= 0, "score"].notna().all()


@pytest.fixture(scope="module")
def composed_report(composed, tmp_path_factory):
    from headprobe.report import build_report

    _, _, results, _ = composed
    out = tmp_path_factory.mktemp("composition-report")
    paths = build_report(results, out, formats=("png", "svg", "pdf"))
    return results, out, paths


def test_report_has_the_section_graph_and_head_cards(composed_report):
    from headprobe.report.explorer import explorer_data
    from headprobe.studies.composition.report import head_lines

    results, out, paths = composed_report
    html = paths["html"].read_text(encoding="utf-8")
    assert "Heads that work together: composition" in html
    for suffix in ("png", "svg", "pdf"):
        assert (out / "figures" / f"composition_graph.{suffix}").stat().st_size > 1000
    data = explorer_data(results)
    (cards,) = [c for c in data["cards"] if c["analysis"] == "composition"]
    at = data["heads"].index("2-1")
    assert cards["lines"][at] == head_lines(results.composition_edges, 2, 1)
    reads = results.reads("2-1")["reads"]
    best = reads["k"].iloc[0] if len(reads["k"]) else None
    if best is not None:
        line = next(x for x in cards["lines"][at] if x.startswith("reads through its key"))
        assert line.split(": ", 1)[1].startswith(f"{best.sender_layer}-{best.sender_head} (")


CARD_LINES_JS = """JSON.stringify([...document.querySelectorAll('[data-card-line="composition"]')]
  .map(p => p.textContent))"""


@pytest.mark.skipif(chromium_binary() is None, reason="chromium not installed")
def test_report_graph_and_cards_render_in_chromium(composed_report):
    from test_explorer import click

    results, out, paths = composed_report

    def act(tools, evaluate):
        click(tools, evaluate, "2-1")
        return evaluate(CARD_LINES_JS)

    info = check_page_in_chromium(paths["html"], out / "composition.png", actions=act)
    assert not info["errors"], info["errors"]
    assert not info["layout"], info["layout"]  # nothing scrolls sideways at 1280 px
    broken = [i for i in info["images"] if not (i["complete"] and i["w"] > 0 and i["h"] > 0)]
    assert info["images"] and not broken, broken
    from headprobe.studies.composition.report import head_lines

    assert info["actions"] == head_lines(results.composition_edges, 2, 1)
