"""Issue 18: ablation effects over shards, the pruning curve, --heads, the random-init control.

Expected values are computed apart from the code under test: the pruning curve by gating
the heads by hand (`HeadGates`, one sentence at a time) and reading transformers' own
`labels=` loss; shards against one pass over the whole corpus; the control's effect on the
role rule with hand-built tallies (as in tests/test_stats.py).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from conftest import WHOLE_WORDS, get_family
from test_gates import one_batch, with_lm_head
from test_stats import VARIANTS, add_arcs

import headprobe
from headprobe.config import RunConfig
from headprobe.core.errors import UsageError
from headprobe.inputs.corpora.conllu import read_conllu
from headprobe.model.control import CONTROL
from headprobe.model.gates import HeadGates
from headprobe.model.loading import random_init
from headprobe.model.objectives import IGNORE
from headprobe.report import build_report
from headprobe.results.query import Results
from headprobe.scoring import registry
from headprobe.scoring.engine import Engine
from headprobe.scoring.tally import Tally
from headprobe.studies.ablation.flags import parse_heads
from headprobe.studies.ablation.report import role_with_importance

PLAIN = dict(n_boot=20, pictures=False, progress=False)


def write_treebank(path, n: int = 24, seed: int = 0):
    """`n` sentences of 3-7 whole words (one piece each): word 1 is the root, the others depend on
    it (`nsubj` or `det`), in documents of three sentences."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        if i % 3 == 0:
            lines.append(f"# newdoc id = d{i // 3}")
        words = [rng.choice(WHOLE_WORDS[:14]) for _ in range(rng.randint(3, 7))]
        lines += [f"# sent_id = s{i}", "# text = " + " ".join(words)]
        for k, word in enumerate(words, start=1):
            head, rel = (0, "root") if k == 1 else (1, "nsubj" if k % 2 else "det")
            lines.append("\t".join([str(k), word, word, "X", "_", "_", str(head), rel, "_", "_"]))
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- shards
def score(model, tokenizer, examples, analyses, n_boot=50):
    scorers = [registry.get(name).make_scorer() for name in analyses]
    Engine(model, tokenizer, scorers, RunConfig(progress=False, n_boot=n_boot, batch_size=5)).run(
        examples
    )
    return {s.analysis: s.tally_ for s in scorers}


def test_ablation_and_importance_merged_over_three_shards_equal_one_run(tmp_path):
    family, model = with_lm_head("llama")
    examples = list(read_conllu(write_treebank(tmp_path / "t.conllu", n=18)))
    whole = score(model, family.tokenizer, examples, ["ablation", "importance"])
    shards = [
        score(model, family.tokenizer, examples[k::3], ["ablation", "importance"]) for k in range(3)
    ]
    for name, tally in whole.items():
        merged = shards[0][name].copy().merge(shards[1][name]).merge(shards[2][name])
        assert merged.sorted_labels() == tally.sorted_labels() == ["causal_lm"]
        a, b = tally.arrays("causal_lm"), merged.arrays("causal_lm")
        assert np.array_equal(a["n"], b["n"])  # trials: exact
        assert a["hits"].shape == (2, 51, 2, 4, 1)
        np.testing.assert_allclose(
            b["hits"], a["hits"], rtol=1e-5, atol=1e-6
        )  # float sums: to rounding
        assert np.abs(a["hits"][:, 0]).sum() > 1.0  # the heads did matter


# ----------------------------------------------------------------------------- the pruning curve
def hand_loss_and_count(
    model, family, examples, heads_off, ignore_first: int = 0
) -> tuple[float, int]:
    """Mean next-piece NLL over every example, one at a time, with `heads_off` zero-gated, and
    the number of targets; pieces `0 .. ignore_first - 1` are not targets."""
    gates = torch.ones(family.n_layers, 4)
    for layer, head in heads_off:
        gates[layer, head] = 0.0
    total = count = 0.0
    with torch.no_grad(), HeadGates(model, gates):
        for example in examples:
            ids = one_batch(family, [example]).input_ids  # [1, piece]
            labels = ids.clone()
            labels[:, :ignore_first] = IGNORE
            loss = model(input_ids=ids, labels=labels).loss  # transformers' own mean
            targets = ids.shape[1] - 1 - max(ignore_first - 1, 0)  # labels shift by one
            total += float(loss) * targets
            count += targets
    return total / count, count


def hand_losses(model, family, examples, heads_off) -> float:
    """Mean next-piece NLL over every example, one at a time, with `heads_off` zero-gated."""
    return hand_loss_and_count(model, family, examples, heads_off)[0]


def test_prune_curve_equals_heads_gated_by_hand(tmp_path):
    family, model = with_lm_head("llama")
    path = write_treebank(tmp_path / "t.conllu")
    results = headprobe.run(
        loaded=(model, family.tokenizer, "tiny"),
        treebank=str(path),
        analyses=["prune_curve"],
        **PLAIN,
    )
    assert set(results.analyses) == {
        "importance",
        "prune_curve",
    }  # importance added to order the heads
    curve = results.prune_curve
    info = results.summary["prune_curve"]
    assert info["order_by"] == "importance" and set(curve["order_by"]) == {"importance"}
    # the order: least important first (importance per piece, ascending)
    importance = results.importance_heads.set_index(["layer", "head"])["score"]
    order = [tuple(int(x) for x in name.split("-")) for name in info["order"]]
    assert sorted(order) == [(l, h) for l in range(2) for h in range(4)]
    assert list(importance.loc[order]) == sorted(importance)
    # 8 heads: 10% of 8 = 0.8 -> 1, 30% = 2.4 -> 2, 50% = 4, 80% = 6.4 -> 6 (nearest, halves up)
    assert curve["heads_removed"].tolist() == [0, 1, 2, 2, 3, 4, 5, 6, 6, 7, 8]
    assert curve["percent"].tolist() == [f"{p}%" for p in range(0, 101, 10)]
    examples = list(read_conllu(path))
    for row in curve.itertuples(index=False):
        expected = hand_losses(model, family, examples, order[: int(row.heads_removed)])
        assert row.value == pytest.approx(expected, rel=1e-5), row.percent
        assert row.ci_low <= row.value <= row.ci_high
    assert curve["change"].iloc[0] == 0.0
    assert curve["value"].iloc[-1] != pytest.approx(
        curve["value"].iloc[0], rel=1e-3
    )  # all heads gone matters
    assert " ".join(r for r in curve["removed"] if r) == " ".join(
        info["order"]
    )  # each head once, in order
    # the role map carries each head's rank; the report renders the curve and the ranks
    roles = results.roles.set_index("name")
    top = importance.idxmax()
    assert roles.loc[f"{top[0]}-{top[1]}", "importance_rank"] == 1 and set(
        roles["importance_of"]
    ) == {8}
    text = build_report(results, tmp_path / "report")["markdown"].read_text()
    assert "## Pruning curve" in text and "none, importance rank 1 of 8" in text


def test_prune_curve_without_lm_head_orders_by_ablation(tmp_path):
    family = get_family("bert")  # base model: representation change
    path = write_treebank(tmp_path / "t.conllu", n=12)
    results = headprobe.run(
        loaded=(family.sdpa, family.tokenizer, "tiny"),
        treebank=str(path),
        prune_curve=True,
        analyses=["positional"],
        **PLAIN,
    )
    info = results.summary["prune_curve"]
    assert info["order_by"] == "ablation" and "importance" not in results.analyses
    effect = results.ablation_heads.set_index(["layer", "head"])["score"]
    order = [tuple(int(x) for x in name.split("-")) for name in info["order"]]
    assert len(order) == 12 and list(effect.loc[order]) == sorted(effect)
    curve = results.prune_curve
    assert curve["value"].iloc[0] == pytest.approx(0.0, abs=1e-6)  # nothing removed: no change
    # everything removed: 1 - cos(h_L with every head zeroed, h_L intact), averaged over pieces by hand
    total = count = 0.0
    with torch.no_grad():
        for example in read_conllu(path):
            batch = one_batch(family, [example])
            intact = family.sdpa(input_ids=batch.input_ids).last_hidden_state[0]
            with HeadGates(family.sdpa, torch.zeros(3, 4)):
                gone = family.sdpa(input_ids=batch.input_ids).last_hidden_state[0]
            total += float((1 - torch.nn.functional.cosine_similarity(gone, intact, dim=-1)).sum())
            count += intact.shape[0]
    assert curve["value"].iloc[-1] == pytest.approx(total / count, rel=1e-5)
    with pytest.raises(UsageError, match="needs every head ablated"):
        headprobe.run(
            loaded=(family.sdpa, family.tokenizer, "tiny"),
            treebank=str(path),
            prune_curve=True,
            analyses=["ablation"],
            heads="0-1",
            **PLAIN,
        )


# ----------------------------------------------------------------------------- --heads
def test_heads_option_ablates_only_those_heads(tmp_path):
    family, model = with_lm_head("llama")
    path = write_treebank(tmp_path / "t.conllu", n=9)
    every = headprobe.run(
        loaded=(model, family.tokenizer, "tiny"),
        treebank=str(path),
        analyses=["ablation"],
        heads="all",
        **PLAIN,
    ).ablation_heads
    some = headprobe.run(
        loaded=(model, family.tokenizer, "tiny"),
        treebank=str(path),
        analyses=["ablation"],
        heads="1-2,0-1",
        **PLAIN,
    ).ablation_heads
    assert list(zip(some["layer"], some["head"])) == [(0, 1), (1, 2)] and len(every) == 8
    mine = every.set_index(["layer", "head"]).loc[[(0, 1), (1, 2)]]
    np.testing.assert_allclose(some["score"], mine["score"], rtol=1e-5)
    assert parse_heads("17-3, 18-6,17-3") == [(17, 3), (18, 6)] and parse_heads("all") is None


@pytest.mark.parametrize(
    "heads,analyses,message",
    [
        ("17_3", ["ablation"], r"--heads '17_3': '17_3' is not a head"),
        ("1-2", ["dependency"], "add --analyses ablation"),
        (",", ["ablation"], "is not a head"),
    ],
)
def test_bad_heads_refused_before_the_model_loads(heads, analyses, message):
    with pytest.raises(UsageError, match=message):
        headprobe.run("no/such-model", analyses=analyses, heads=heads, **PLAIN)


def test_heads_that_do_not_exist_are_refused():
    family, model = with_lm_head("llama")
    with pytest.raises(UsageError, match="head 2-0 does not exist"):
        headprobe.run(
            loaded=(model, family.tokenizer, "tiny"), analyses=["ablation"], heads="2-0", **PLAIN
        )
    with pytest.raises(UsageError, match="--control 'shuffled'"):
        headprobe.run("no/such-model", control="shuffled", **PLAIN)


# ----------------------------------------------------------------------------- random-init control
def test_random_init_is_reproducible_and_new():
    family = get_family("gpt2")
    state = torch.get_rng_state()
    one, two, other = (
        random_init(family.sdpa, 0),
        random_init(family.sdpa, 0),
        random_init(family.sdpa, 1),
    )
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random state untouched
    a, b, c, trained = (m.state_dict() for m in (one, two, other, family.sdpa))
    assert a.keys() == trained.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)  # same seed, same weights
    changed = [k for k in a if a[k].dtype.is_floating_point and not torch.equal(a[k], trained[k])]
    weights = [k for k in a if k.endswith("weight") and a[k].dim() == 2]
    assert set(weights) <= set(changed)  # every matrix re-drawn
    assert any(not torch.equal(a[k], c[k]) for k in weights)  # another seed, other weights
    assert type(one) is type(family.sdpa) and one.config._attn_implementation == "sdpa"


def test_control_run_same_tokenizer_other_weights(tmp_path):
    family = get_family("llama")
    path = write_treebank(tmp_path / "t.conllu", n=15)
    run = lambda: headprobe.run(
        loaded=(family.sdpa, family.tokenizer, "tiny"),
        treebank=str(path),
        analyses=["dependency", "surface"],
        control="random-init",
        **PLAIN,
    )
    first, again = run(), run()
    assert set(first.tallies) == {"dependency", "surface", "dependency~control", "surface~control"}
    assert first.tallies["dependency~control"].model == CONTROL
    for key in ("dependency~control", "surface~control"):  # reproducible with the seed
        for label in first.tallies[key].sorted_labels():
            for name, value in first.tallies[key].arrays(label).items():
                assert np.array_equal(value, again.tallies[key].arrays(label)[name]), (
                    key,
                    label,
                    name,
                )
    # the same tokenizer: the same arcs (n) per label and head; other weights: other hits
    mine, theirs = first.counts, first.control.counts
    assert mine[["label", "layer", "head", "direction", "fold", "n"]].equals(
        theirs[["label", "layer", "head", "direction", "fold", "n"]]
    )
    assert not np.array_equal(mine["hits"].fillna(-1), theirs["hits"].fillna(-1))
    # best heads carry the control's best of the same label and selection
    best, control_best = first.best_heads, first.control.best_heads
    for row in best[best["fold"] == ""].itertuples(index=False):
        theirs_row = control_best[
            (control_best["label"] == row.label)
            & (control_best["selection"] == row.selection)
            & (control_best["fold"] == "")
            & (control_best["analysis"] == row.analysis)
        ]
        assert row.control_accuracy == pytest.approx(theirs_row["accuracy"].iloc[0], nan_ok=True)
        assert row.control_heads == theirs_row["heads"].iloc[0]
    # saved and loaded: the control's tables come back, the analyses are the trained model's
    first.save(tmp_path / "out")
    loaded = Results.load(tmp_path / "out")
    assert sorted(loaded.analyses) == ["dependency", "surface"]
    assert loaded.control.best_heads.equals(first.control.best_heads)
    assert first.summary["control"]["analyses"] == ["dependency", "surface"]
    assert (
        "## Random-init control"
        in build_report(loaded, tmp_path / "report")["markdown"].read_text()
    )


def test_role_beside_its_importance_rank():
    row = {
        "role": "syntactic",
        "detail": "nsubj",
        "importance_rank": 3,
        "importance_of": 72,
        "importance_by": "importance",
    }
    assert role_with_importance(row) == "syntactic (nsubj), importance rank 3 of 72"
    assert role_with_importance({"role": "none", "detail": ""}) == "none"


def role_tally(model: str = "trained", n_heads: int = 2) -> Tally:
    return Tally(
        "dependency",
        directions=("dep->head", "head<-dep"),
        variants=VARIANTS,
        layers=[0],
        n_heads=n_heads,
        resamples=200,
        extras=("unreachable",),
        model=model,
    )


def add_units(tally, rates, base_rate, rng, n_units=60, arcs=4, label="nsubj"):
    """Units whose arcs head h hits (dep->head) with `rates[h]`, the first baseline with `base_rate`."""
    for u in range(n_units):
        hits = np.zeros((arcs, len(rates), 2))
        for h, rate in enumerate(rates):
            hits[:, h, 0] = rng.random(arcs) < rate
        base = np.zeros((arcs, 2))
        base[:, 0] = rng.random(arcs) < base_rate
        add_arcs(tally, f"u{u}", label, hits, base)


@pytest.mark.parametrize("control_rate,syntactic", [(None, True), (0.5, True), (0.95, False)])
def test_syntactic_role_needs_a_head_above_the_controls_heldout_best(control_rate, syntactic):
    trained = role_tally()
    add_units(
        trained, (0.8, 0.0), 0.3, np.random.default_rng(0)
    )  # head 0-0 passes METHODS §6 on its own
    tallies = {"dependency": trained}
    if control_rate is not None:
        control = role_tally(CONTROL)
        add_units(
            control, (0.0, control_rate), 0.3, np.random.default_rng(1)
        )  # the control's best: 0-1
        tallies["dependency~control"] = control
    results = Results(tallies)
    roles = results.roles.set_index("name")
    assert bool(roles.loc["0-0", "role"] == "syntactic") is syntactic
    assert roles.loc["0-1", "role"] == "none"
    if control_rate is not None:
        bar = results.best_head("dependency", "nsubj", "held-out")["control_accuracy"]
        mine = results.head_tests.set_index(["label", "layer", "head"]).loc[
            ("nsubj", 0, 0), "heldout_accuracy"
        ]
        assert bool(mine > bar) is syntactic  # the rule's reason, by the numbers
        assert abs(bar - control_rate) < 0.1
        if syntactic:
            assert f"random-init control's held-out best {bar:.4f}" in roles.loc["0-0", "evidence"]


# ----------------------------------------------------------------------------- head groups, restricted loss
def test_head_groups_on_a_restricted_loss_equal_gates_and_labels_by_hand(tmp_path):
    """GroupScorer (analyses/olsson2022_induction.py): each group gated together, the loss counted on
    the pieces `scored` names (here: every piece from the fourth on), against transformers' own
    loss with those labels alone and the heads gated by hand."""
    from headprobe.studies.ablation.groups import GroupScorer, points_table

    family, model = with_lm_head("llama")
    examples = list(read_conllu(write_treebank(tmp_path / "t.conllu", n=10)))
    groups = [("intact", []), ("pair", [(0, 1), (1, 2)]), ("layer 1", [(1, h) for h in range(4)])]
    scorer = GroupScorer()
    scorer.scored = lambda batch: torch.arange(batch.input_ids.shape[1])[None, :] >= 3  # [1, piece]
    scorer.use_groups(groups)
    Engine(
        model, family.tokenizer, [scorer], RunConfig(progress=False, n_boot=30, batch_size=4)
    ).run(examples)
    table = points_table(scorer.tally_, [label for label, _ in groups], "intact").set_index("label")
    for label, heads in groups:
        mean, count = hand_loss_and_count(
            model, family, examples, heads, ignore_first=3
        )  # pieces 0-2 not targets
        assert table.loc[label, "value"] == pytest.approx(mean, rel=1e-5), label
        assert table.loc[label, "n"] == count
    assert table.loc["intact", "change"] == 0.0 and table.loc["layer 1", "change"] != 0.0


def test_group_ablation_equals_heads_gated_by_hand(tmp_path):
    """--head-groups: each named group gated to 0 together, against the intact model and against
    each other; every value is the loss with exactly those heads zeroed by hand."""
    family, model = with_lm_head("llama")
    path = write_treebank(tmp_path / "t.conllu")
    groups = {"early": [(0, 1), (0, 2)], "late": [(1, 3)]}
    results = headprobe.run(
        loaded=(model, family.tokenizer, "tiny"),
        treebank=str(path),
        analyses=["positional"],
        head_groups="early=0-1,0-2; late=1-3",
        **PLAIN,
    )
    assert "group_ablation" in results.analyses
    assert results.summary["group_ablation"] == {
        "intact": [],
        "early": ["0-1", "0-2"],
        "late": ["1-3"],
    }
    table = results.group_ablation.set_index("group")
    assert list(table.index) == ["intact", "early", "late"]
    examples = list(read_conllu(path))
    intact = hand_losses(model, family, examples, [])
    assert table.loc["intact", "value"] == pytest.approx(intact, rel=1e-5)
    assert table.loc["intact", "change"] == 0.0
    for name, heads in groups.items():
        value = hand_losses(model, family, examples, heads)
        assert table.loc[name, "value"] == pytest.approx(value, rel=1e-5)
        assert table.loc[name, "change"] == pytest.approx(value - intact, rel=1e-4, abs=1e-7)
        assert table.loc[name, "ci_low"] <= table.loc[name, "value"] <= table.loc[name, "ci_high"]
        assert table.loc[name, "heads"] == " ".join(f"{l}-{h}" for l, h in heads)
    versus = results.group_ablation_versus.set_index(["group", "versus"])
    early_vs_late = table.loc["early", "value"] - table.loc["late", "value"]
    assert versus.loc[("early", "late"), "change"] == pytest.approx(early_vs_late, rel=1e-4)
    assert versus.loc[("late", "early"), "change"] == pytest.approx(-early_vs_late, rel=1e-4)
    text = build_report(results, tmp_path / "report")["markdown"].read_text()
    assert "## Heads gated in groups" in text and "early" in text
    console = registry.get("group_ablation").console_text()(results, "group_ablation")
    late = table.loc["late"]
    assert (
        f"late (1-3): {late['value']:.3f} [{late['ci_low']:.3f}, {late['ci_high']:.3f}]" in console
    )
    assert f"change {late['change']:+.3f}" in console
    assert console.count(" - ") == 1  # one line per pair of groups


@pytest.mark.parametrize(
    "groups, message",
    [
        ("early=0-1;early=1-2", "group 'early' is given twice"),
        ("early", "is not NAME=HEADS"),
        ("intact=0-1", "'intact' is the model with no head ablated"),
        ("early=", "names no heads"),
        ("early=9-0", "--head-groups: tiny has 2 layers x 4 heads"),
    ],
)
def test_bad_head_groups_are_one_line(tmp_path, groups, message):
    family, model = with_lm_head("llama")
    with pytest.raises(UsageError, match=message):
        headprobe.run(
            loaded=(model, family.tokenizer, "tiny"),
            treebank=str(write_treebank(tmp_path / "t.conllu")),
            head_groups=groups,
            **PLAIN,
        )


def test_a_second_pass_is_named_by_its_analyses_in_the_progress_bar(tmp_path, capsys):
    """The pruning curve runs after importance, on the same sentences: its bar says what it runs
    (`prune_curve`), not the pass's key (`sentences_second_pass`)."""
    family, model = with_lm_head("llama")
    headprobe.run(
        loaded=(model, family.tokenizer, "tiny"),
        treebank=str(write_treebank(tmp_path / "t.conllu")),
        analyses=["prune_curve"],
        **{**PLAIN, "progress": True},
    )
    bars = capsys.readouterr().err
    assert "prune_curve:" in bars and "sentences:" in bars and "second_pass" not in bars
