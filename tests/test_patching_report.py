"""The patching section of the report (METHODS §19): its metric, heatmaps, roles table and
estimates are there, the page renders in Chromium at 1280 px with nothing scrolling sideways and
no console error, and each head's card carries its task effects."""

from __future__ import annotations

import pytest
import torch
from test_patching_task import LINES, tiny_lm  # noqa: F401  (the fixture)
from test_report import PRINT_WIDTH, check_page_in_chromium, chromium_binary

import headprobe
from headprobe.report import build_report
from headprobe.studies.patching.node_effects import TaskPairs, _Runner, metric

N = 36  # units: more than the 30 a role needs


def task_it_does(model, tok) -> list[dict]:
    """Rows on which the tiny random model does the task by construction: per example, answer
    and distractor ordered so that the clean prompt's logit difference exceeds the corrupted's."""
    from headprobe.inputs.tasks import task_examples, task_items

    words = [" cat", " dog", " mat", " red", " big", " sat"]
    rows = []
    for k in range(N):
        clean, corrupted = LINES[k % len(LINES)]
        a, d = words[k % len(words)], words[(k + 1 + (k // len(words)) % 5) % len(words)]
        rows.append({"clean": clean, "corrupted": corrupted, "answer": a, "distractor": d,
                     "id": f"u{k}"})  # fmt: skip
    examples = task_examples(task_items(rows), tok)
    with torch.no_grad():
        from headprobe.model.task_nodes import TaskNodes

        nodes = TaskNodes(model)
        for row, example in zip(rows, examples):
            pairs = TaskPairs.of([example], "cpu")
            run = _Runner(model, nodes, pairs)
            if metric(run.logits(pairs.clean)) < metric(run.logits(pairs.corrupted)):
                row["answer"], row["distractor"] = row["distractor"], row["answer"]
    return rows


@pytest.fixture(scope="module")
def task_report(tiny_lm, tmp_path_factory):  # noqa: F811
    _, model, tok = tiny_lm
    out = tmp_path_factory.mktemp("task") / "run"
    results = headprobe.run(
        loaded=(model, tok, "tiny"), task=task_it_does(model, tok), estimate="atp,ig",
        out=str(out), progress=False,
    )  # fmt: skip
    return results, build_report(out)


def test_the_section_has_the_metric_heatmaps_roles_and_estimates(task_report):
    results, report = task_report
    assert results.task_summary()["does_task"]
    html = report["html"].read_text(encoding="utf-8")
    for part in ("Heads on a task", "patching_effects", "patching_estimates", "patching_check"):
        assert part in html
    assert "logit difference (answer - distractor)" in html
    assert "patching_roles" in html  # the roles table, here without rows: no head is significant


def test_the_roles_table_shows_each_head_with_its_rule_and_evidence():
    import numpy as np
    import pandas as pd

    from headprobe.studies.patching.report import roles_table
    from headprobe.studies.patching.task_roles import TARGETS, heads_frame

    nodes = pd.DataFrame(
        {"node": ["embed", "0-0", "0-1", "mlp 0"], "layer": [-1, 0, 0, 0], "head": [-1, 0, 1, -1],
         "direct": [0.0, 1.2, -0.8, 0.3], "direct_low": [0.0, 1.0, -1.0, 0.1],
         "direct_high": [0.0, 1.4, -0.6, 0.5], "p_holm": [1.0, 0.001, 0.002, 0.01],
         "direct_answer": [0.0, 1.0, -0.7, 0.2], "direct_answer_low": [0.0, 0.8, -0.9, 0.0],
         "direct_answer_high": [0.0, 1.2, -0.5, 0.4], "direct_distractor": [0.0, 0.2, -0.1, 0.1],
         "direct_distractor_low": [0.0, 0.1, -0.2, 0.0],
         "direct_distractor_high": [0.0, 0.3, 0.0, 0.2]}
    )  # fmt: skip
    attention = np.zeros((len(TARGETS), 1, 2))
    attention[0, 0, :] = [0.6, 0.3]  # both heads attend to the answer
    heads = heads_frame(nodes, attention, None, True)
    assert list(heads["role"]) == ["mover", "negative mover"]  # largest |direct| first
    table = roles_table(heads)
    assert [row[0].text for row in table.rows] == ["0-0", "0-1"]
    assert [row[1].text for row in table.rows] == ["mover", "negative mover"]
    assert "attention to the answer 0.60" in table.rows[0][-1].text


def test_head_cards_carry_the_task_effects(task_report):
    from headprobe.studies.patching.report import card

    results, _ = task_report
    title, lines = card(results)
    assert "Task" in title and len(lines) == results.n_layers * results.n_heads
    first = lines[(0, 0)]
    assert first[0].startswith("noising") and "attention from the scored piece" in first[1]


@pytest.mark.skipif(
    chromium_binary() is None, reason="chromium not installed (apt-get install chromium)"
)
def test_the_task_report_renders_in_chromium(task_report):
    _, report = task_report
    screenshot = report["html"].parent / "task_screenshot.png"
    info = check_page_in_chromium(report["html"], screenshot, print_width=PRINT_WIDTH)
    assert not info["layout"], info["layout"]  # nothing wider than its box at 1280 px
    assert not info["errors"], info["errors"]
    broken = [i for i in info["images"] if not (i["complete"] and i["w"] > 0 and i["h"] > 0)]
    assert info["images"] and not broken
