"""Circuits on a task as a run (METHODS §20): its refusals (one line, exit 2), the run's tables
against values computed here from the hooked forward of `test_circuit_exact.Reference` (the
in-sample and held-out curves, CPR and CMD as trapezoids, the validation sample's exact values,
the estimates per example), a fold too small and a task the model does not do, and the report
section rendered in Chromium."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_circuit_exact import Reference
from test_patching_report import task_it_does
from test_patching_task import good_rows, run_one_line, task_file, tiny_lm  # noqa: F401
from test_report import PRINT_WIDTH, check_page_in_chromium, chromium_binary

import headprobe
from headprobe.inputs.tasks import task_examples, task_items
from headprobe.model.edge_graph import EdgeGraph
from headprobe.model.task_nodes import TaskNodes
from headprobe.report import build_report
from headprobe.scoring.tally import unit_fold
from headprobe.studies.circuit import edge_scores as es
from headprobe.studies.circuit.curves import areas
from headprobe.studies.patching.node_effects import TaskPairs

BUDGETS = "1,5,20,50,100"


# ------------------------------------------------------------------------------ bad input
def test_circuit_without_a_task_is_refused(tiny_lm, capsys):  # noqa: F811
    path, _, _ = tiny_lm
    line = run_one_line(["--model", path, "--analyses", "circuit"], capsys)
    assert "--task" in line


def test_circuit_without_patching_is_refused(tiny_lm, tmp_path, capsys):  # noqa: F811
    path, _, _ = tiny_lm
    args = ["--model", path, "--task", task_file(tmp_path, good_rows(3)), "--analyses", "circuit"]
    line = run_one_line(args, capsys)
    assert "patching" in line


@pytest.mark.parametrize("budgets", ["5,2", "0,10", "10,150", "1,1", "a,b"])
def test_a_budget_list_not_increasing_in_0_100_is_refused(tiny_lm, tmp_path, capsys, budgets):  # noqa: F811
    path, _, _ = tiny_lm
    args = ["--model", path, "--task", task_file(tmp_path, good_rows(3)),
            "--analyses", "patching,circuit", "--budgets", budgets]  # fmt: skip
    line = run_one_line(args, capsys)
    assert line.startswith("headprobe: error: --budgets")


# ------------------------------------------------------------------------------ the run
@pytest.fixture(scope="module")
def circuit_run(tiny_lm):  # noqa: F811
    _, model, tok = tiny_lm
    rows = task_it_does(model, tok)
    results = headprobe.run(
        loaded=(model, tok, "tiny"), task=rows, analyses=["patching", "circuit"],
        circuit_budgets=BUDGETS, progress=False,
    )  # fmt: skip
    examples = task_examples(task_items(rows), tok)
    return results, model, examples


def reference_metric(model, ref, examples, out) -> np.ndarray:
    """[example] m(C) by the hooked forward, one example at a time."""
    got = []
    for e in examples:
        pairs = TaskPairs.of([e], "cpu")
        with torch.no_grad():
            corrupted = ref.writes(pairs.corrupted, pairs)
            got.append(float(ref.run(pairs.clean, pairs, corrupted, out)[0]))
    return np.array(got)


def test_the_curves_equal_circuits_evaluated_by_the_hooked_forward(circuit_run):
    results, model, examples = circuit_run
    info = results.summary["circuit"]
    assert info["does_task"] and min(info["fold_units"]) >= info["min_fold_units"]
    curve, edges = results.tables["circuit_curve"], results.tables["circuit_edges"]
    assert sorted(set(curve["budget"])) == [0.01, 0.05, 0.2, 0.5, 1.0]
    pairs = TaskPairs.of(examples, "cpu")
    graph = EdgeGraph.of(TaskNodes(model), pairs.clean)
    ref = Reference("gpt2", model, graph)
    reach = graph.reach()
    index = reach.nonzero().numpy()
    assert len(edges) == len(index)
    m_clean = reference_metric(model, ref, examples, torch.zeros(reach.shape))
    m_corr = reference_metric(model, ref, examples, reach.float())
    folds = np.array([unit_fold(e.unit, 0) for e in examples])
    for budget in (0.05, 0.2):
        n = int(budget * len(edges))
        row = curve[(curve["ranking"] == "signed") & (curve["budget"] == budget)].iloc[0]
        assert row["n_edges"] == n
        top = np.argsort(-edges["eap_ig"].to_numpy(), kind="stable")[:n]
        out = reach.float()
        out[index[top, 0], index[top, 1]] = 0.0
        m_c = reference_metric(model, ref, examples, out)
        f = (m_c - m_corr).sum() / (m_clean - m_corr).sum()
        assert row["f_in_sample"] == pytest.approx(f, rel=1e-4, abs=1e-5)
        held = np.zeros(len(examples))
        for fold in (0, 1):
            ranks = edges[f"rank_fold{1 - fold}"].to_numpy()
            out = reach.float()
            keep = np.nonzero(ranks <= n)[0]
            out[index[keep, 0], index[keep, 1]] = 0.0
            mine = [e for e, f_ in zip(examples, folds) if f_ == fold]
            held[folds == fold] = reference_metric(model, ref, mine, out)
        f = (held - m_corr).sum() / (m_clean - m_corr).sum()
        assert row["f_held_out"] == pytest.approx(f, rel=1e-4, abs=1e-5)
        assert row["f_held_out_low"] <= row["f_held_out"] <= row["f_held_out_high"]
    full = curve[curve["budget"] == 1.0]
    assert np.allclose(full[["f_in_sample", "f_held_out"]].to_numpy(), 1.0, atol=1e-5)


def test_cpr_and_cmd_are_trapezoids_over_the_curves(circuit_run):
    results, _, _ = circuit_run
    curve, scores = results.tables["circuit_curve"], results.tables["circuit_scores"]
    scores = scores.set_index("score")
    budgets = [0.01, 0.05, 0.2, 0.5, 1.0]
    for sample in ("in_sample", "held_out"):
        signed = curve[curve["ranking"] == "signed"].sort_values("budget")[f"f_{sample}"].to_numpy()
        absolute = curve[curve["ranking"] == "absolute"].sort_values("budget")[f"f_{sample}"]
        cpr = sum(
            (b - a) * (x + y) / 2 for a, b, x, y in zip(budgets, budgets[1:], signed, signed[1:])
        )
        gap = np.abs(1 - absolute.to_numpy())
        cmd = sum((b - a) * (x + y) / 2 for a, b, x, y in zip(budgets, budgets[1:], gap, gap[1:]))
        assert scores.loc["CPR", sample] == pytest.approx(cpr, abs=1e-9)
        assert scores.loc["CMD", sample] == pytest.approx(cmd, abs=1e-9)
        assert scores.loc["CPR", f"{sample}_low"] <= scores.loc["CPR", f"{sample}_high"]
    assert areas(np.ones(3), (0.1, 0.5, 1.0)) == pytest.approx(0.9)


def test_the_estimates_and_the_validation_sample(circuit_run):
    results, model, examples = circuit_run
    edges, check = results.tables["circuit_edges"], results.tables["circuit_check"]
    pairs = TaskPairs.of(examples, "cpu")
    graph = EdgeGraph.of(TaskNodes(model), pairs.clean)
    got = es.edge_scores(model, graph, pairs, steps=5)
    index = graph.reach().nonzero().numpy()
    np.testing.assert_allclose(
        edges["eap_ig"], got.eap_ig.double().mean(0)[index[:, 0], index[:, 1]], rtol=1e-4, atol=1e-6
    )
    np.testing.assert_allclose(
        edges["eap"], got.eap.double().mean(0)[index[:, 0], index[:, 1]], rtol=1e-4, atol=1e-6
    )
    sample = edges[edges["exact"].notna()]
    assert len(sample) == 30
    top = edges["eap_ig"].abs().sort_values(ascending=False, kind="stable").index[:20]
    assert edges.loc[top, "exact"].notna().all()
    ref = Reference("gpt2", model, graph)
    reach = graph.reach()
    m_clean = reference_metric(model, ref, examples, torch.zeros(reach.shape))
    for i in sample.index[:3]:
        out = torch.zeros(reach.shape)
        out[index[i, 0], index[i, 1]] = 1.0
        want = (m_clean - reference_metric(model, ref, examples, out)).mean()
        assert edges.loc[i, "exact"] == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert list(check["estimate"]) == ["eap", "eap_ig"] and (check["edges"] == 30).all()
    assert ((check["ci_low"] <= check["spearman"]) & (check["spearman"] <= check["ci_high"])).all()


def test_the_smallest_faithful_circuit_names_its_nodes(circuit_run):
    results, _, _ = circuit_run
    edges, nodes = results.tables["circuit_edges"], results.tables["circuit_nodes"]
    smallest = results.summary["circuit"]["smallest_faithful"]
    curve = results.tables["circuit_curve"]
    signed = curve[(curve["ranking"] == "signed") & (curve["budget"] < 1)]
    faithful = signed[signed["f_held_out_low"] >= 0.8]
    if not len(faithful):
        assert smallest is None and not edges["in_circuit"].any() and not len(nodes)
        return
    assert smallest[1] == int(faithful.sort_values("budget").iloc[0]["n_edges"])
    assert int(edges["in_circuit"].sum()) == smallest[1]
    kept = edges[edges["in_circuit"]]
    named = set(nodes["node"])
    assert named <= set(kept["sender"]) | set(kept["receiver"])
    assert {"role", "noise_share"} <= set(nodes.columns)


def test_a_fold_too_small_gives_no_held_out_curve(tiny_lm):  # noqa: F811
    _, model, tok = tiny_lm
    rows = task_it_does(model, tok)[:6]
    results = headprobe.run(
        loaded=(model, tok, "tiny"), task=rows, analyses=["patching", "circuit"],
        circuit_budgets="10,100", progress=False,
    )  # fmt: skip
    from headprobe.studies.circuit.report import console_text

    curve = results.tables["circuit_curve"]
    info = results.summary["circuit"]
    assert info["does_task"]  # every example's clean difference exceeds its corrupted one
    assert min(info["fold_units"]) < info["min_fold_units"]
    assert "f_held_out" not in curve and curve["f_in_sample"].notna().all()
    assert "held_out" not in results.tables["circuit_scores"]
    assert "no held-out curve" in console_text(results)


def test_a_task_the_model_does_not_do_evaluates_no_circuit(tiny_lm):  # noqa: F811
    _, model, tok = tiny_lm
    rows = [dict(r, corrupted=r["clean"]) for r in good_rows(3)] * 4
    rows = [dict(r, id=f"x{k}") for k, r in enumerate(rows)]
    results = headprobe.run(
        loaded=(model, tok, "tiny"), task=rows, analyses=["patching", "circuit"], progress=False
    )
    assert results.summary["circuit"]["does_task"] is False
    assert not len(results.tables["circuit_curve"]) and not len(results.tables["circuit_nodes"])


@pytest.mark.skipif(
    chromium_binary() is None, reason="chromium not installed (apt-get install chromium)"
)
def test_the_circuit_report_renders_in_chromium(tiny_lm, tmp_path):  # noqa: F811
    _, model, tok = tiny_lm
    out = tmp_path / "run"
    headprobe.run(
        loaded=(model, tok, "tiny"), task=task_it_does(model, tok),
        analyses=["patching", "circuit"], circuit_budgets=BUDGETS, out=str(out), progress=False,
    )  # fmt: skip
    report = build_report(out)
    html = report["html"].read_text(encoding="utf-8")
    for part in ("Circuits on a task", "circuit_curve", "circuit_scores", "circuit_check"):
        assert part in html
    info = check_page_in_chromium(report["html"], tmp_path / "shot.png", print_width=PRINT_WIDTH)
    assert not info["layout"], info["layout"]
    assert not info["errors"], info["errors"]
    broken = [i for i in info["images"] if not (i["complete"] and i["w"] > 0 and i["h"] > 0)]
    assert info["images"] and not broken


@pytest.mark.slow
def test_hanna2024_script_finds_the_induction_circuit(tmp_path):
    """Acceptance 3: on the Olsson script's trained 2-layer model, the edge from the previous-token
    head into the induction head's key is in the smallest faithful circuit; its report renders."""
    import sys
    from pathlib import Path

    analyses = Path(__file__).resolve().parents[1] / "analyses"
    sys.path.insert(0, str(analyses))
    try:
        import hanna2024_circuits as script
    finally:
        sys.path.remove(str(analyses))
    assert script.main(["--skip-smollm2", "--out", str(tmp_path)]) == 0
    results = headprobe.load_results(tmp_path / "induction_circuit")
    edges = results.tables["circuit_edges"]
    assert edges["in_circuit"].any() and len(results.tables["circuit_nodes"])
    report = build_report(tmp_path / "induction_circuit")
    assert "circuit_curve" in report["html"].read_text(encoding="utf-8")
    if chromium_binary() is not None:
        info = check_page_in_chromium(
            report["html"], tmp_path / "shot.png", print_width=PRINT_WIDTH
        )
        assert not info["layout"] and not info["errors"], (info["layout"], info["errors"])
