"""notebooks/explore.ipynb runs top to bottom on the bundled defaults (slow: loads MiniLM and
scores the bundled UD English EWT dev), reading the `Results` query layer."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from headprobe.report.explorer import explorer_html
from headprobe.results import store

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "explore.ipynb"

pytestmark = pytest.mark.slow


def test_explore_notebook_runs(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # like papermill: a cell after the one tagged "parameters" overrides the report folder
    index = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell(f"REPORT_DIR = {str(tmp_path)!r}"))
    client = nbclient.NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 4  # accuracy heatmap, role map, the sentence's attention, composition
    composition = "\n".join(o.get("text", "") for o in outputs)
    assert "induction head " in composition and "reads through k" in composition
    text = "\n".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
    assert "p_holm" in text and "folds_agree" in text  # the best-heads table of Results
    assert (
        "1. positional: a single non-zero offset" in text
    )  # the role rules, from results.role_rules()
    assert (tmp_path / store.REPORT_HTML).is_file() and (tmp_path / store.REPORT_MARKDOWN).is_file()
    assert list((tmp_path / store.REPORT_FIGURES).glob("*.png"))
    check_explorer_widget(nb, outputs)


def check_explorer_widget(nb, outputs):
    """`headprobe.explore(results)` made a widget whose synced state holds every head (6 x 12 for
    MiniLM) and the stored attention: uint8 cells for each head, one [word, word] block per sentence."""
    views = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert views, "no widget displayed"
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    ids = [o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"] for o in views]
    explorers = [
        states[i]["state"] for i in ids if states[i]["state"].get("_model_name") == "AnyModel"
    ]
    assert len(explorers) == 1, "no explorer widget (anywidget) displayed"
    data = explorers[0]["data"]
    assert data["heads"] == [f"{layer}-{head}" for layer in range(6) for head in range(12)]
    attention = data["attention"]
    per_head = sum(len(s["words"]) ** 2 for s in attention["sentences"])
    assert attention["sentences"] and attention["cells_per_head"] == per_head
    assert len(base64.b64decode(attention["cells"])) == 72 * per_head
    assert len(explorer_html(data).encode()) < 1_000_000  # what the explorer adds to the report
    assert any("selected head:" in o.get("text", "") for o in outputs)
