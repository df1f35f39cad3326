"""Comparing runs (headprobe.results.comparison, `headprobe compare`): heads matched across models.

A MiniLM-shaped run (6 x 12 heads, planted tallies from tests/fixtures_results.py, no model)
compared with itself must match every head to itself with similarity 1 and keep every
role; the same counts under a second measure with the heads permuted must give back the
permutation; hand-built profiles check the centring, the block weights and an unmatched
head of a larger model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from headprobe.cli import main as cli_main
from headprobe.results.comparison import (
    Run,
    comparable,
    compare_runs,
    head_profiles,
    match_heads,
    match_profiles,
    role_agreement,
)
from headprobe.results.query import Results
from headprobe.stats.roles import NONE

try:
    from tests.fixtures_results import make_results, make_results_dir
    from tests.test_report import check_page_in_chromium, chromium_binary
except ImportError:  # tests/ itself on sys.path
    from fixtures_results import make_results, make_results_dir
    from test_report import check_page_in_chromium, chromium_binary

SHAPE = dict(n_layers=6, n_heads=12)  # all-MiniLM-L6-v2


@pytest.fixture(scope="module")
def minilm_dir(tmp_path_factory):
    return make_results_dir(tmp_path_factory.mktemp("minilm") / "results", seed=4, **SHAPE)


@pytest.fixture(scope="module")
def compared(minilm_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    assert cli_main(["compare", str(minilm_dir), str(minilm_dir), "--out", str(out)]) == 0
    return out


def test_a_run_against_itself_matches_every_head_to_itself(compared):
    matches = pd.read_csv(compared / "tables" / "matches.csv")
    assert len(matches) == 72
    assert (matches["name_a"] == matches["name_b"]).all()
    assert np.allclose(matches["similarity"], 1.0, atol=1e-9)
    assert matches["same_role"].all()
    pairs = pd.read_csv(compared / "tables" / "pairs.csv")
    assert pairs["roles_kept"].tolist() == [1.0] and pairs["pairs"].tolist() == [72]
    assert pairs["mean_all_pairs"].iloc[0] < 0.5  # other heads are not alike
    counts = pd.read_csv(compared / "tables" / "role_counts.csv")
    a, b = (
        counts[counts["run"] == r].set_index("role")["heads"] for r in dict.fromkeys(counts["run"])
    )
    assert a.equals(b) and a.sum() == 72
    page = (compared / "compare.html").read_text(encoding="utf-8")
    # scripts: only the head explorers' one inline module (nothing loaded from anywhere)
    assert "<script src" not in page and page.count('<script type="module">') == 1
    assert 'data-table="role-counts"' in page
    assert all(
        (compared / "figures" / f"role_maps.{ext}").is_file() for ext in ("png", "svg", "pdf")
    )
    assert (compared / "compare.md").read_text(encoding="utf-8").index("## Summary") > 0


@pytest.mark.skipif(
    chromium_binary() is None, reason="chromium not installed (apt-get install chromium)"
)
def test_compare_page_fits_in_chromium(compared, minilm_dir):
    info = check_page_in_chromium(
        compared / "compare.html",
        compared / "compare_screenshot.png",
        hidden_markers=["5e" * 32],
        print_width=718,
    )
    assert not info["layout"], info["layout"]
    assert not info["print_layout"], info["print_layout"]
    assert not info["visible_markers"], info["visible_markers"]
    assert not info["external"] and not info["errors"], (info["external"], info["errors"])


def test_cli_compare_refuses_bad_input(tmp_path, capsys, minilm_dir):
    assert cli_main(["compare", str(minilm_dir), "--out", str(tmp_path / "o")]) == 2
    assert (
        cli_main(
            ["compare", str(minilm_dir), str(tmp_path / "missing"), "--out", str(tmp_path / "o")]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "Traceback" not in "".join(err) and str(tmp_path / "missing") in err[1]


def permuted(counts: pd.DataFrame, perm: dict) -> pd.DataFrame:
    out = counts.copy()
    heads = out["layer"] >= 0
    moved = [perm[(l, h)] for l, h in zip(out.loc[heads, "layer"], out.loc[heads, "head"])]
    out.loc[heads, "layer"] = [l for l, _ in moved]
    out.loc[heads, "head"] = [h for _, h in moved]
    return out


def test_two_measures_of_one_run_match_the_permutation():
    base = make_results(seed=2, examples=False, **SHAPE)
    rng = np.random.default_rng(0)
    heads = [(l, h) for l in range(6) for h in range(12)]
    perm = dict(zip(heads, [heads[k] for k in rng.permutation(len(heads))]))
    counts = pd.concat(
        [
            base.counts.assign(measure="weights"),
            permuted(base.counts, perm).assign(measure="norms"),
        ],
        ignore_index=True,
    )
    both = Results({}, dict(base.summary), tables={**base.tables, "counts": counts})
    matches = match_heads(Run("weights", both, "weights"), Run("norms", both, "norms"))
    got = {
        (a, b): (c, d)
        for a, b, c, d in zip(
            matches["layer_a"], matches["head_a"], matches["layer_b"], matches["head_b"]
        )
    }
    assert got == perm
    assert np.allclose(matches["similarity"], 1.0, atol=1e-9)
    assert (
        head_profiles(both, "weights").shape == head_profiles(base).shape
    )  # one measure at a time
    # a run scored on two measures, named without one, is read under its first (weights)
    default = Run("both", both)
    assert default.measure == "weights"
    itself = match_heads(default, Run("base", base))
    assert (itself["layer_a"] == itself["layer_b"]).all() and (
        itself["head_a"] == itself["head_b"]
    ).all()
    assert np.allclose(itself["similarity"], 1.0, atol=1e-9)


def test_hand_built_profiles_centring_weights_and_an_unmatched_head():
    # three heads, a block of two dependency features and a block of one surface feature
    a = pd.DataFrame(
        {
            "dependency|x|": [0.9, 0.1, 0.2],
            "dependency|y|": [0.1, 0.8, 0.3],
            "surface|cls|": [0.2, 0.2, 0.8],
        },
        index=pd.MultiIndex.from_tuples([(0, 0), (0, 1), (0, 2)], names=["layer", "head"]),
    )
    xa, _, shared = comparable(a, a)
    centred = a.to_numpy() - a.to_numpy().mean(axis=0)
    assert shared == list(a.columns)
    np.testing.assert_allclose(xa, centred / np.array([np.sqrt(2), np.sqrt(2), 1.0]))
    # a larger model: a's heads in another order, plus a head whose profile is the mean (nothing
    # sets it apart: similarity 0 with every head), and a feature a does not have
    rows = [a.iloc[2], a.iloc[0], a.iloc[1], a.mean()]
    b = pd.DataFrame(rows).reset_index(drop=True)
    b.index = pd.MultiIndex.from_tuples([(0, 0), (0, 1), (1, 0), (1, 1)], names=["layer", "head"])
    b["coreference|ALL|"] = [0.5, 0.1, 0.7, 0.4]
    pairs = match_profiles(a, b)
    assert pairs.attrs["features"] == 3
    assert list(zip(pairs["a"], pairs["b"])) == [
        (0, 1),
        (1, 2),
        (2, 0),
    ]  # row 3 of b left unmatched
    np.testing.assert_allclose(pairs["similarity"], 1.0)
    assert not comparable(a, b[["coreference|ALL|"]])[2]
    with pytest.raises(ValueError, match="share no scored label"):
        match_profiles(a, b[["coreference|ALL|"]])


def test_role_agreement_counts_kept_roles():
    m = pd.DataFrame(
        {"role_a": ["sink", "sink", "syntactic", NONE], "role_b": ["sink", NONE, "syntactic", NONE]}
    )
    m["same_role"] = m["role_a"] == m["role_b"]
    agree = role_agreement(m).set_index("role")
    assert agree.loc["sink", ["heads", "kept"]].tolist() == [2, 1]
    assert agree.loc["all heads", ["heads", "kept"]].tolist() == [4, 3]
    assert agree.loc["heads with a role", "share_kept"] == pytest.approx(2 / 3)


def test_differently_shaped_models_compare(tmp_path):
    small, large = (
        make_results(seed=1, examples=False),
        make_results(seed=3, examples=False, **SHAPE),
    )
    tables = compare_runs([Run("small", small), Run("large", large)])
    assert len(tables["matches"]) == 6  # min(2 x 3, 6 x 12) pairs, each head of small once
    assert tables["matches"][["layer_a", "head_a"]].drop_duplicates().shape[0] == 6
    assert tables["matches"][["layer_b", "head_b"]].drop_duplicates().shape[0] == 6
    assert set(tables["best_heads"]["run"]) == {"small", "large"}
