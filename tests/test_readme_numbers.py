"""The numbers README.md states are the numbers a run gives (slow: MiniLM on EWT and GUM dev).

Each test reads its table out of README.md itself, so the README cannot drift from the code:
the console lines it opens with (those of `headprobe run` with no options, `conftest.default_run`)
and the sentence that reads one of them, the EWT dependency table (intervals and held-out column
included), the GUM coreference table, MiniLM's role counts, and the weights-vs-norms shares per
layer (METHODS §7).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import headprobe
from headprobe.model import loading as models

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
EWT_DEV = DATA / "en_ewt-ud-dev.conllu"
GUM_DEV = DATA / "en_gum-ud-dev.conllu"


def need(path: Path) -> Path:
    if not path.is_file():
        pytest.skip(f"shared data not found: {path}")
    return path


def readme_table(first_header: str) -> list[list[str]]:
    """The body rows (cells stripped) of the README table whose header starts with `first_header`."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def number(text: str) -> float:
    return float(text.replace(",", ""))


def estimate(text: str) -> tuple[float, tuple[float, float] | None, str | None]:
    """'0.6515 (0.621-0.684)' -> (0.6515, (0.621, 0.684), None); '0.4470 (2-1 / 2-8)' ->
    (0.447, None, '2-1 / 2-8'); '0.3451 (+1)' -> (0.3451, None, '+1')."""
    m = re.fullmatch(r"([0-9.]+)(?: \(([^)]*)\))?", text)
    value, extra = float(m.group(1)), m.group(2)
    interval = re.fullmatch(r"([0-9.]+)-([0-9.]+)", extra or "")
    if interval:
        return value, (float(interval.group(1)), float(interval.group(2))), None
    return value, None, extra


def same(value: float, stated: float, places: int) -> bool:
    return round(float(value), places) == stated


@pytest.fixture(scope="module")
def minilm():
    return models.load(None, device="cpu")


@pytest.fixture(scope="module")
def ewt(minilm):
    return headprobe.run(treebank=need(EWT_DEV), pictures=False, progress=False, loaded=minilm)


def best_row(results, analysis, label, selection):
    best = results.best_heads
    rows = best[
        (best["analysis"] == analysis)
        & (best["label"] == label)
        & (best["selection"] == selection)
        & (best["fold"] == "")
    ]
    assert len(rows) == 1, (analysis, label, selection)
    return rows.iloc[0]


def check(found: list, what, value, stated, places: int | None = None) -> None:
    """Note a difference between a computed `value` and the README's `stated` one."""
    ok = same(value, stated, places) if places is not None else value == stated
    if not ok:
        found.append(f"{what}: computed {value!r}, README {stated!r}")


def picked(text: str | None, heads: str) -> str:
    """The README's held-out heads ('2-1 / 2-8': chosen on fold 0 / fold 1) as the table writes
    them ('2-1 | 2-8'); none named: the in-sample head."""
    return text.replace(" / ", " | ") if text else heads


def readme_console() -> list[str]:
    """The lines of the README's first code block (the default run's console), '...' left out."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("```\n", 2)[1]
    return [line for line in block.splitlines() if line.strip() != "..."]


def test_readme_opens_with_the_default_runs_console(default_run):
    lines = readme_console()
    assert lines[0].startswith("roles of the 72 heads") and len(lines) >= 8
    printed = default_run.console.splitlines()
    missing = [line for line in lines if line not in printed]
    assert not missing, "README lines the default run does not print:\n" + "\n".join(missing)
    # in the order the console prints them
    assert sorted(lines, key=printed.index) == lines


def test_readme_reads_a_head_as_its_console_line_says():
    """'In head 2-0 ... for 0.7399 of the objects, ... gets 0.3576; the gap's 95% bootstrap
    interval is [+0.347, +0.422]': the numbers of that head's console line (itself checked
    against a run above)."""
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    m = re.search(
        r"In head (\d+-\d+) \(.*?\) a direct object attends most to its verb for ([0-9.]+) of "
        r"the objects.*? gets ([0-9.]+); the gap's 95% bootstrap interval is (\[[^]]+\])",
        text,
    )
    assert m, "the README's reading of a head is gone"
    line = next(x for x in readme_console() if x.startswith(f"  {m.group(1)} "))
    assert line.split()[1] == "obj"
    assert f"{m.group(2)} vs {m.group(3)}, gap " in line and m.group(4) in line


def test_readme_ewt_dependency_table(ewt):
    rows = readme_table("relation | arcs | best head")
    assert len(rows) == 6
    found: list[str] = []
    for label, arcs, heads, direction, accuracy, heldout, baseline in rows:
        row = best_row(ewt, "dependency", label, "in-sample")
        check(found, f"{label} arcs", int(row["n"]), int(number(arcs)))
        check(found, f"{label} head", row["heads"], heads)
        check(found, f"{label} direction", row["direction"], direction)
        value, (low, high), _ = estimate(accuracy)
        check(found, f"{label} accuracy", row["accuracy"], value, 4)
        check(found, f"{label} ci_low", row["ci_low"], low, 3)
        check(found, f"{label} ci_high", row["ci_high"], high, 3)
        value, _, variant = estimate(baseline)
        check(found, f"{label} baseline", row["baseline_accuracy"], value, 4)
        check(found, f"{label} baseline variant", row["baseline_variant"], f"offset={variant}")
        held = best_row(ewt, "dependency", label, "held-out")
        value, _, picks = estimate(heldout)
        check(found, f"{label} held-out", held["accuracy"], value, 4)
        check(found, f"{label} held-out heads", held["heads"], picked(picks, heads))
    assert not found, "\n".join(found)


def test_readme_minilm_role_counts(ewt):
    header = readme_table("model | positional | syntactic")
    minilm = next(row for row in header if row[0].startswith("MiniLM"))
    roles = ewt.roles
    assert len(roles) == int(re.search(r"\((\d+) heads\)", minilm[0]).group(1))
    counts = roles["role"].value_counts()
    for role, stated in zip(("positional", "syntactic", "sink", "broad", "none"), minilm[1:]):
        assert int(counts.get(role, 0)) == int(stated), role


def test_readme_gum_coreference_table(minilm):
    results = headprobe.run(
        coref=need(GUM_DEV), analyses=["coreference"], pictures=False, progress=False, loaded=minilm
    )
    rows = readme_table("kind | mentions | best head")
    assert [row[0] for row in rows] == ["ALL", "pronoun", "proper", "nominal"]
    base = results.baselines.set_index(["label", "variant"])["accuracy"]
    found: list[str] = []
    for kind, mentions, heads, accuracy, heldout, nearest, head_match, rules in rows:
        row = best_row(results, "coreference", kind, "in-sample")
        check(found, f"{kind} mentions", int(row["n"]), int(number(mentions)))
        check(found, f"{kind} head", row["heads"], heads)
        value, (low, high), _ = estimate(accuracy)
        check(found, f"{kind} accuracy", row["accuracy"], value, 4)
        check(found, f"{kind} ci_low", row["ci_low"], low, 3)
        check(found, f"{kind} ci_high", row["ci_high"], high, 3)
        held = best_row(results, "coreference", kind, "held-out")
        value, _, picks = estimate(heldout)
        check(found, f"{kind} held-out", held["accuracy"], value, 4)
        check(found, f"{kind} held-out heads", held["heads"], picked(picks, heads))
        for variant, stated in (("nearest", nearest), ("head_match", head_match), ("rules", rules)):
            check(found, f"{kind} {variant}", base[(kind, variant)], float(stated), 4)
    assert not found, "\n".join(found)


def test_readme_weights_vs_norms_shares(minilm):
    from headprobe.studies.surface.surface_measures import special_share

    results = headprobe.run(
        treebank=need(EWT_DEV),
        analyses=["surface"],
        measure="weights,norms",
        keep_unit_counts=True,
        pictures=False,
        progress=False,
        loaded=minilm,
    )
    share = special_share(results).set_index("layer")
    layers, weights, norms = _share_rows()
    for layer, w, n in zip(layers, weights, norms):
        assert same(share.loc[int(layer), "weights"], float(w), 3), layer
        assert same(share.loc[int(layer), "norms"], float(n), 3), layer
    # "Every paired change excludes 0 (the widest interval: layer 5, [-0.302, -0.287])"
    assert (share["change_high"] < 0).all()
    widest = (share["change_high"] - share["change_low"]).idxmax()
    assert widest == 5
    assert same(share.loc[5, "change_low"], -0.302, 3) and same(
        share.loc[5, "change_high"], -0.287, 3
    )


def _share_rows() -> tuple[list[str], list[str], list[str]]:
    """(layers, weights, norms) of the README's weights-vs-norms table (header row = layers)."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| layer | 0 | 1 |"))

    def cells(line):
        return [cell.strip() for cell in line.strip().strip("|").split("|")][1:]

    weights = next(line for line in lines[start:] if line.startswith("| weights |"))
    norms = next(line for line in lines[start:] if line.startswith("| norms |"))
    return cells(lines[start]), cells(weights), cells(norms)
