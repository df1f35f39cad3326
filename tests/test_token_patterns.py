"""Token-level analyses: previous-token, duplicate-token, induction (TransformerLens
patterns and "mul" score) and first-position sinks (Gu et al. sink rate).

- the three patterns, by hand (first occurrences, BOS, adjacent repeats);
- hand-built attention through each scorer: shares, argmax hits, empty rows, BOS, baselines;
- TransformerLens's detection patterns and "mul" score, written here from their formulas,
  against headprobe's numbers on a tiny random GPT-2 (within 1e-6);
- held-out role rules, KV-group tables, and that nothing but counts is kept.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headprobe.config import RunConfig
from headprobe.inputs.align import CLS_LIKE, WORD, Alignment, align_words
from headprobe.inputs.batching import Batch
from headprobe.inputs.corpora.base import Example
from headprobe.results.query import Results
from headprobe.scoring.engine import Engine
from headprobe.studies.duplicate_token.analysis import (
    DuplicateTokenScorer,
    duplicate_token_pattern,
)
from headprobe.studies.induction.analysis import InductionScorer, induction_pattern
from headprobe.studies.previous_token.analysis import PreviousTokenScorer, previous_token_pattern
from headprobe.studies.sink.analysis import EPSILON, SinkScorer

PATTERN_SCORERS = (PreviousTokenScorer, DuplicateTokenScorer, InductionScorer)
TOKEN_SCORERS = PATTERN_SCORERS + (SinkScorer,)


# ------------------------------------------------------------------------------ helpers


class Att:
    """What the engine hands a scorer for one layer: only `pieces` is read by token scorers."""

    def __init__(self, pieces):
        self.pieces = pieces  # [layer, measure, batch, head, query, key]
        self.layers = (0,)


def alignment(ids, kinds=None) -> Alignment:
    kinds = [WORD] * len(ids) if kinds is None else list(kinds)
    words, n = [], 0
    for kind in kinds:
        words.append(n if kind == WORD else -1)
        n += kind == WORD
    return Alignment(list(ids), words, kinds, n)


def example(unit: str, a: Alignment) -> Example:
    return Example(words=[f"t{i}" for i in range(a.n_words)], unit=unit, source=f"{unit}:1")


def run_by_hand(scorer, items, n_heads, causal=True, n_boot=50, keep_units=False):
    """Score `items` = [(unit, alignment, probs [head, T, T])] one example per batch."""
    scorer.bind(1, n_heads, [0], n_boot=n_boot, keep_units=keep_units, causal=causal)
    with torch.inference_mode():
        for unit, a, probs in items:
            batch = Batch([example(unit, a)], [a], pad_id=0)
            state = scorer.prepare(batch)
            scorer.update(Att(torch.as_tensor(probs, dtype=torch.float32)[None, None, None]), state)
            scorer.end_batch(state)
    scorer.finish()
    return scorer.tally_


def totals(tally, label):
    """(score per head [head], n, value sum per head) on the whole data, resample 0."""
    a = tally.arrays(label)
    mass = a["hits"][:, 0].sum(0)[0, :, 0]  # [head]
    n = float(a["n"][:, 0].sum(0)[0])
    return mass / n, n, mass


def causal_rows(t, rng, n_heads=1):
    """Random causal attention rows [head, T, T] (each row sums to 1 over keys 0..i)."""
    raw = rng.random((n_heads, t, t)) + 0.05
    raw = np.tril(raw)
    return raw / raw.sum(-1, keepdims=True)


# ------------------------------------------------------------------------------ patterns


def test_patterns_by_hand():
    #           0   1  2  3  4  5  6
    ids = np.array([9, 5, 7, 5, 7, 7, 8])
    token = np.array([False, True, True, True, True, True, True])  # position 0 is a BOS
    prev = previous_token_pattern(ids, token)
    assert {tuple(x) for x in np.argwhere(prev)} == {
        (2, 1),
        (3, 2),
        (4, 3),
        (5, 4),
        (6, 5),
    }  # not (1, 0): BOS
    dup = duplicate_token_pattern(ids, token)
    assert {tuple(x) for x in np.argwhere(dup)} == {(3, 1), (4, 2), (5, 2), (5, 4)}
    assert (
        not dup[1].any() and not dup[2].any() and not dup[6].any()
    )  # first occurrences: empty rows
    ind = induction_pattern(ids, token)
    # query 3 (token 5, earlier at 1) -> key 2; query 4 (token 7, earlier at 2) -> key 3;
    # query 5 (token 7, earlier at 2 and 4) -> keys 3 and 5 (itself: the previous token is also 7)
    assert {tuple(x) for x in np.argwhere(ind)} == {(3, 2), (4, 3), (5, 3), (5, 5)}


def test_a_special_is_in_no_pattern_even_with_a_repeated_id():
    ids = np.array([1, 4, 4, 1, 4])
    token = np.array([False, True, True, False, True])  # 1 is a special id (BOS/SEP)
    for pattern in (previous_token_pattern, duplicate_token_pattern, induction_pattern):
        d = pattern(ids, token)
        assert not d[:, ~token].any() and not d[~token, :].any()
    ind = induction_pattern(ids, token)
    assert list(np.flatnonzero(ind[4])) == [2]  # not 3: a special is no key
    assert list(np.flatnonzero(ind[2])) == [2]  # "4 4": the query itself
    assert previous_token_pattern(ids, token)[4, 3] == 0  # previous position is the special


# ------------------------------------------------------------------------------ hand-built attention


def test_previous_token_share_argmax_and_bos():
    # BOS t1 t2 t3: rows with a previous token: 2, 3 (row 1's previous position is the BOS)
    a = alignment([50, 10, 11, 12], [CLS_LIKE, WORD, WORD, WORD])
    probs = np.zeros((2, 4, 4))
    probs[:, 0, 0] = 1
    # head 0: row 1 all on BOS; row 2 0.7 on 1 (previous), 0.3 on BOS; row 3 0.2 on 2, 0.8 on BOS
    probs[0, 1, 0] = 1
    probs[0, 2] = [0.3, 0.7, 0, 0]
    probs[0, 3] = [0.8, 0, 0.2, 0]
    # head 1: uniform over the visible keys
    for i in range(4):
        probs[1, i, : i + 1] = 1 / (i + 1)
    tally = run_by_hand(PreviousTokenScorer(), [("u", a, probs)], 2)
    score, n, _ = totals(tally, "mul")
    assert n == 2
    assert score == pytest.approx([(0.7 + 0.2) / 2, (1 / 3 + 1 / 4) / 2], abs=1e-6)
    hits, n, _ = totals(tally, "argmax")
    assert n == 2 and hits[0] == pytest.approx(0.5)  # row 2 yes, row 3 (BOS) no
    # head 1's argmax is the lowest index of its ties: the BOS -> never a hit
    assert hits[1] == 0
    # the first position is the BOS: the `first` baseline never hits; queries = every position
    a_mul = tally.arrays("mul")
    first = list(tally.variants).index("first")
    assert a_mul["base"][:, 0, first].sum() == 0
    assert a_mul["extra:queries"].sum() == 4
    assert "offset=-1" not in tally.variants  # the pattern itself is no baseline


def test_duplicate_token_first_occurrence_is_not_scored():
    # tokens a b a a: row 0, 1 first occurrences (empty); row 2 -> {0}; row 3 -> {0, 2}
    a = alignment([7, 8, 7, 7])
    probs = np.zeros((1, 4, 4))
    probs[0, 0, 0] = 1
    probs[0, 1] = [0.5, 0.5, 0, 0]
    probs[0, 2] = [0.6, 0.1, 0.3, 0]
    probs[0, 3] = [0.25, 0.25, 0.25, 0.25]
    tally = run_by_hand(DuplicateTokenScorer(), [("u", a, probs)], 1)
    score, n, _ = totals(tally, "mul")
    assert n == 2
    assert score[0] == pytest.approx((0.6 + 0.5) / 2, abs=1e-6)
    hits, _, _ = totals(tally, "argmax")
    assert hits[0] == pytest.approx((1 + 1) / 2)  # row 3: tie -> index 0, a duplicate
    # offset -1 predicts key i-1: row 2 -> 1 (b, miss), row 3 -> 2 (a, hit)
    base = tally.arrays("argmax")["base"][:, 0].sum(0)
    assert base[list(tally.variants).index("offset=-1")] == 1
    assert base[list(tally.variants).index("first")] == 2  # key 0 is an `a`


def test_induction_share_with_adjacent_repeat_and_empty_rows():
    # BOS a b a b: query 3 (a) -> key 2 (b after the earlier a); query 4 (b) -> key 3
    a = alignment([99, 1, 2, 1, 2], [CLS_LIKE, WORD, WORD, WORD, WORD])
    probs = np.zeros((1, 5, 5))
    for i in range(5):
        probs[0, i, 0] = 1  # everything on the BOS...
    probs[0, 3] = [0.1, 0, 0.9, 0, 0]
    probs[0, 4] = [0.5, 0, 0, 0.5, 0]  # tie BOS/key 3 -> BOS: argmax miss
    tally = run_by_hand(InductionScorer(), [("u", a, probs)], 1)
    score, n, _ = totals(tally, "mul")
    assert n == 2 and score[0] == pytest.approx((0.9 + 0.5) / 2, abs=1e-6)
    hits, _, _ = totals(tally, "argmax")
    assert hits[0] == pytest.approx(0.5)
    # a sequence without repeats: no row is scored, but its positions count for TransformerLens's normalisation
    b = alignment([5, 6, 7])
    tally = run_by_hand(InductionScorer(), [("v", b, causal_rows(3, np.random.default_rng(0)))], 1)
    assert tally.arrays("mul")["n"][:, 0].sum() == 0
    assert tally.arrays("mul")["extra:queries"].sum() == 3


def test_random_baseline_draws_visible_keys_and_is_reproducible():
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 20, 40).tolist()
    a = alignment(ids + ids)
    probs = causal_rows(80, rng)

    def base():
        tally = run_by_hand(InductionScorer(), [("u", a, probs)], 1, n_boot=0)
        return tally.arrays("argmax")["base"][:, 0].sum(0), tally.arrays("argmax")["n"][:, 0].sum()

    first, n = base()
    again, _ = base()
    np.testing.assert_array_equal(first, again)
    d = induction_pattern(np.array(ids + ids), np.ones(80, dtype=bool))
    rows = np.flatnonzero(d.any(1))
    expected = np.sum(d[rows].sum(1) / (rows + 1))  # E[hits] of a random visible key
    assert n == len(rows)
    assert abs(first[0] - expected) < 4 * np.sqrt(expected)  # one draw per row


def test_random_key_is_visible_only_in_a_causal_model():
    """A pattern whose only key is the last position: a causal model's rows before it cannot
    see it (the random key never hits), an encoder's can."""
    t = 30
    d = np.zeros((t, t), dtype=bool)
    q_rows = np.arange(0, t - 1)
    d[q_rows, t - 1] = True
    scorer = DuplicateTokenScorer()
    hits = {
        causal: sum(
            scorer._baselines(d, q_rows, causal, 0, Example(["x"], f"u{k}", "s"))[:, 0].sum()
            for k in range(20)
        )
        for causal in (True, False)
    }
    assert hits[True] == 0
    assert 0 < hits[False] < 20 * len(q_rows)


def test_sink_first_mass_and_rate():
    # two inputs: head 0 puts 0.5 on position 0 from every later query (sink), head 1 0.1 (not)
    items = []
    for k, t in enumerate((4, 6)):
        probs = np.zeros((2, t, t))
        probs[:, 0, 0] = 1
        for i in range(1, t):
            probs[0, i, 0], probs[0, i, i] = 0.5, 0.5
            probs[1, i, 0], probs[1, i, i] = 0.1, 0.9
        items.append((f"u{k}", alignment(list(range(10, 10 + t))), probs))
    items.append(("single", alignment([3]), np.ones((2, 1, 1))))  # no query after the first
    tally = run_by_hand(SinkScorer(), items, 2)
    first, n, _ = totals(tally, "first")
    assert n == 3 + 5 and first == pytest.approx([0.5, 0.1], abs=1e-6)
    rate, n, _ = totals(tally, "sink_rate")
    assert n == 2 and rate == pytest.approx([1.0, 0.0])
    # uniform attention's mean mass on position 0: 4 tokens (1/2 + 1/3 + 1/4) / 3 >= 0.3, 6 tokens 0.29 < 0.3
    assert tally.variants == ("uniform",)
    assert tally.arrays("sink_rate")["base"][:, 0].sum() == 1
    both = tally.arrays("sink_rate")["both"][0, :, 0, 0]  # head and baseline both sinks
    assert list(both) == [1, 0]
    assert EPSILON == 0.3


# ------------------------------------------------------------------------------ TransformerLens, from the formulas


def tl_previous(tokens: torch.Tensor) -> torch.Tensor:
    t = tokens.shape[-1]
    d = torch.zeros(t, t)
    d[1:, :-1] = torch.eye(t - 1)
    return torch.tril(d)


def tl_duplicate(tokens: torch.Tensor) -> torch.Tensor:
    t = tokens.shape[-1]
    grid = tokens.repeat(t, 1)
    d = (grid == grid.T).float()
    d.fill_diagonal_(0)
    return torch.tril(d)


def tl_induction(tokens: torch.Tensor) -> torch.Tensor:
    shifted = torch.roll(tl_duplicate(tokens), shifts=1, dims=1)
    shifted[:, 0] = 0
    return torch.tril(shifted)


def mul_all_rows(pattern: torch.Tensor, detection: torch.Tensor) -> float:
    return float((pattern * detection).sum() / pattern.sum())


def per_row_mul(pattern: torch.Tensor, detection: torch.Tensor) -> float:
    rows = detection.sum(-1) > 0
    share = (pattern * detection).sum(-1) / pattern.sum(-1)
    return float(share[rows].mean())


PROMPT = "the cat sat on the mat and the the cat sat on the mat . the big dog ran".split()


def test_transformer_lens_scores_on_tiny_gpt2(gpt2_family):
    family = gpt2_family
    a = align_words(family.tokenizer, [PROMPT])[0]
    assert all(k == WORD for k in a.piece_kind)  # no specials: TL's patterns apply as they are
    tokens = torch.tensor(a.input_ids)
    reference = {
        "previous_token": tl_previous(tokens),
        "duplicate_token": tl_duplicate(tokens),
        "induction": tl_induction(tokens),
    }
    ours = {
        "previous_token": previous_token_pattern,
        "duplicate_token": duplicate_token_pattern,
        "induction": induction_pattern,
    }
    token = np.ones(len(tokens), dtype=bool)
    for name, d in reference.items():  # the patterns themselves
        np.testing.assert_array_equal(
            ours[name](tokens.numpy(), token), d.numpy().astype(bool), err_msg=name
        )
    assert reference["induction"].diagonal().sum() > 0  # "the the": the self cell is exercised

    scorers = [cls() for cls in PATTERN_SCORERS]
    Engine(family.sdpa, family.tokenizer, scorers, RunConfig(progress=False, n_boot=10)).run(
        [Example(words=PROMPT, unit="p", source="prompt")]
    )
    results = Results(
        {s.analysis: s.tally_ for s in scorers}, {"n_layers": family.n_layers, "n_heads": 4}
    )
    with torch.no_grad():
        out = family.eager(input_ids=tokens[None], output_attentions=True)
    for name, detection in reference.items():
        table = results.table(f"{name}_heads")
        mul = table[table["label"] == "mul"].set_index(["layer", "head"])
        for layer in range(family.n_layers):
            for head in range(4):
                pattern = out.attentions[layer][0, head].float()
                assert mul.loc[(layer, head), "mul_all_rows"] == pytest.approx(
                    mul_all_rows(pattern, detection), abs=1e-6
                )
                assert mul.loc[(layer, head), "score"] == pytest.approx(
                    per_row_mul(pattern, detection), abs=1e-6
                )
        argmax = table[table["label"] == "argmax"].set_index(["layer", "head"])
        rows = detection.sum(-1) > 0
        for layer in range(family.n_layers):
            for head in range(4):
                top = out.attentions[layer][0, head].argmax(-1)
                hit = detection[torch.arange(len(tokens)), top][rows].double().mean()
                assert argmax.loc[(layer, head), "score"] == pytest.approx(float(hit), abs=1e-9)
                assert argmax.loc[(layer, head), "n"] == int(rows.sum())


# ------------------------------------------------------------------------------ roles, tables, memory


def synthetic_items(n_units, length=12, seed=0):
    """Repeated random sequences with BOS and a made-up attention: head 0 induction,
    head 1 previous token, head 2 uniform, head 3 on the BOS."""
    rng = np.random.default_rng(seed)
    items = []
    for k in range(n_units):
        tokens = rng.choice(
            np.arange(10, 1000), length, replace=False
        ).tolist()  # no repeat within a half
        ids = [1] + tokens + tokens
        a = alignment(ids, [CLS_LIKE] + [WORD] * (2 * length))
        t = len(ids)
        ind = induction_pattern(np.array(ids), np.array(a.piece_kind) == WORD)
        probs = np.zeros((4, t, t))
        for i in range(t):
            keys = np.flatnonzero(ind[i])
            probs[0, i, keys[0] if len(keys) else 0] = 1
            probs[1, i, i - 1 if i > 1 else 0] = 1
            probs[2, i, : i + 1] = 1 / (i + 1)
            probs[3, i, 0] = 1
        items.append((f"seq{k}", a, probs))
    return items


@pytest.fixture(scope="module")
def synthetic_results():
    items = synthetic_items(80)
    tallies = {}
    for cls in TOKEN_SCORERS:
        tallies[cls.analysis] = run_by_hand(cls(), items, 4, n_boot=200)
    return Results(tallies, {"n_layers": 1, "n_heads": 4, "n_kv_heads": 2})


def test_held_out_roles(synthetic_results):
    roles = synthetic_results.roles.set_index("head")
    assert roles.loc[0, "role"] == "induction"
    assert roles.loc[1, "role"] == "previous-token"
    assert roles.loc[2, "role"] == "none"
    assert roles.loc[3, "role"] == "sink (Gu)"
    assert "fold 0" in roles.loc[0, "evidence"] and "mul over all rows" in roles.loc[0, "evidence"]
    rules = {r.role for r in synthetic_results.role_rules()}
    assert {"induction", "duplicate-token", "previous-token", "sink (Gu)"} <= rules
    # every role name is used once
    from headprobe.scoring.registry import role_rules

    names = [rule.role for _, rule in role_rules()]
    assert len(names) == len(set(names))


def test_head_table_columns_and_intervals(synthetic_results):
    table = synthetic_results.table("induction_heads")
    mul = table[table["label"] == "mul"].set_index("head")
    assert mul.loc[0, "score"] == pytest.approx(1.0)
    assert mul.loc[0, "ci_low"] == pytest.approx(1.0)
    assert mul.loc[0, "mul_all_rows"] == pytest.approx(12 / 25)  # 12 of 25 rows have a pattern
    assert mul.loc[2, "ci_low"] - 1e-12 <= mul.loc[2, "score"] <= mul.loc[2, "ci_high"] + 1e-12
    assert mul.loc[2, "baseline_variant"] in ("random", "first", "offset=-1", "offset=-2")
    assert mul.loc[3, "score"] == 0 and mul.loc[3, "gap_high"] <= 0
    # best heads: the in-sample and held-out rows name head 0 for both labels
    best = synthetic_results.best_heads
    best = best[(best["analysis"] == "induction") & (best["fold"] == "")]
    assert set(best["heads"]) == {"0-0"}


def test_kv_group_table(synthetic_results):
    heads = synthetic_results.table("sink_heads")
    groups = synthetic_results.table("sink_kv_groups")
    first = heads[heads["label"] == "first"].set_index("head")["score"]
    g = groups[groups["label"] == "first"].set_index("kv_group")
    assert list(g["heads"]) == ["0,1", "2,3"]
    assert g.loc[0, "score"] == pytest.approx((first[0] + first[1]) / 2)
    assert g.loc[1, "score_max"] == pytest.approx(first[3]) and g.loc[1, "best_head"] == "0-3"


def test_counts_stream_and_nothing_else_is_kept():
    """Totals have the same size for 5 and 50 inputs; after a batch a scorer holds no tensor
    of that batch; per-unit rows only when asked."""
    sizes = []
    for n in (5, 50):
        scorer = InductionScorer()
        tally = run_by_hand(scorer, synthetic_items(n), 4, n_boot=20)
        sizes.append(
            sum(v.size for label in tally.sorted_labels() for v in tally.arrays(label).values())
        )
        # nothing the size of a sequence (25 positions) or of its attention: per-batch rows at most
        held = [
            k
            for k, v in vars(scorer).items()
            if isinstance(v, (torch.Tensor, np.ndarray))
            and (v.numel() if isinstance(v, torch.Tensor) else v.size) >= 25
        ]
        assert held == [], held
        assert scorer.chunks_ == [] and scorer.unit_counts().empty
    assert sizes[0] == sizes[1]
    kept = InductionScorer()
    run_by_hand(kept, synthetic_items(3), 4, n_boot=5, keep_units=True)
    assert set(kept.unit_counts()["unit"].astype(str)) == {"seq0", "seq1", "seq2"}


@pytest.mark.parametrize("cls", TOKEN_SCORERS)
def test_engine_on_every_family(family, cls):
    """Encoders and decoders, with and without specials: scores are shares in [0, 1]."""
    scorer = cls()
    Engine(family.sdpa, family.tokenizer, [scorer], RunConfig(progress=False, n_boot=5)).run(
        [
            Example(words="the cat sat on the mat and the cat ran".split(), unit="a", source="a"),
            Example(words="a big red dog saw a big red cat".split(), unit="b", source="b"),
        ]
    )
    for label in scorer.tally_.sorted_labels():
        a = scorer.tally_.arrays(label)
        n = a["n"][:, 0].sum()
        assert n > 0
        share = a["hits"][:, 0].sum(0)[..., 0] / n
        assert np.all((share >= -1e-9) & (share <= 1 + 1e-6))
