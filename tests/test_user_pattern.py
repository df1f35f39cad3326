"""A token pattern declared by a user, as a notebook cell would: "attends to the most recent
comma" (`headprobe.pattern_analysis`).

- on hand-built attention, its shares, argmax hits, baselines and TransformerLens score are
  the ones worked out by hand, and specials are left out whatever the function says;
- end to end through `headprobe.run` on a tiny BERT with one head built to look at commas:
  the analysis reaches counts (rows counted from the corpus), its `_heads` table (scores
  equal to the eager attention's), best heads, the role map and the report.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from conftest import make_wordpiece
from transformers import AutoModel, BertConfig

import headprobe
from headprobe.core.seeds import example_key
from headprobe.inputs.align import CLS_LIKE, SEP_LIKE, WORD, Alignment
from headprobe.inputs.batching import Batch
from headprobe.inputs.corpora.base import Example
from headprobe.results.query import Results
from headprobe.scoring import registry

NAME = "last_comma"
COMMA = 20  # the comma's id in the hand-built fixture


def last_comma_pattern(comma: int):
    """D[i, j]: j is the most recent comma before i."""

    def pattern(ids, token):
        d = np.zeros((len(ids), len(ids)), dtype=bool)
        last = -1
        for i, t in enumerate(ids):
            if last >= 0:
                d[i, last] = True
            if t == comma:
                last = i
        return d

    return pattern


def declare(comma: int):
    return headprobe.pattern_analysis(
        NAME,
        last_comma_pattern(comma),
        baselines=("random", "first", "offset=-1"),
        rule=headprobe.PatternRule(
            "comma", threshold=0.5, lower=0.4, what="attends to the most recent comma"
        ),
    )


@pytest.fixture
def unregister():
    yield
    registry.unregister(NAME)


# ------------------------------------------------------------------------------ hand-built attention


class Att:
    def __init__(self, pieces):
        self.pieces = pieces  # [layer, measure, batch, head, query, key]
        self.layers = (0,)


def test_comma_pattern_scores_on_hand_built_attention(unregister):
    analysis = declare(COMMA)
    assert registry.get(NAME) is analysis and analysis.scorer.__name__ == "LastCommaScorer"
    # [CLS] a , b c , d [SEP]: rows with a pattern: 3, 4, 5 -> key 2; 6 -> key 5. The function
    # also gives the [SEP] row (7 -> 5): specials are taken out.
    ids = [2, 10, COMMA, 11, 12, COMMA, 13, 3]
    kinds = [CLS_LIKE] + [WORD] * 6 + [SEP_LIKE]
    a = Alignment(ids, [-1, 0, 1, 2, 3, 4, 5, -1], kinds, 6)
    probs = np.zeros((2, 8, 8))
    probs[0, :, 0] = 1  # rows without a pattern: on [CLS]
    probs[0, 3] = [0.4, 0, 0.6, 0, 0, 0, 0, 0]  # share 0.6, argmax 2: hit
    probs[0, 4] = [0, 0, 0.3, 0.7, 0, 0, 0, 0]  # share 0.3, argmax 3: miss
    probs[0, 5] = [0.5, 0, 0.5, 0, 0, 0, 0, 0]  # share 0.5, tie -> 0: miss
    probs[0, 6] = [0, 0, 0, 0, 0, 1.0, 0, 0]  # share 1, hit
    probs[1] = 1 / 8  # uniform: share 1/8, argmax 0: miss
    scorer = analysis.make_scorer()
    scorer.bind(1, 2, [0], n_boot=50)
    with torch.inference_mode():
        batch = Batch([Example(words=list("abcdef"), unit="u", source="u:1")], [a], pad_id=0)
        state = scorer.prepare(batch)
        scorer.update(Att(torch.as_tensor(probs, dtype=torch.float32)[None, None, None]), state)
        scorer.end_batch(state)
    scorer.finish()
    results = Results({NAME: scorer.tally_}, {"n_layers": 1, "n_heads": 2})
    table = results.table(f"{NAME}_heads").set_index(["label", "head"])
    assert table.loc[("mul", 0), "n"] == 4
    assert table.loc[("mul", 0), "score"] == pytest.approx((0.6 + 0.3 + 0.5 + 1.0) / 4, abs=1e-6)
    assert table.loc[("mul", 1), "score"] == pytest.approx(1 / 8, abs=1e-6)
    assert table.loc[("argmax", 0), "score"] == pytest.approx(2 / 4)
    assert table.loc[("argmax", 1), "score"] == 0
    assert table.loc[("mul", 0), "mul_all_rows"] == pytest.approx(
        2.4 / 8, abs=1e-6
    )  # every position counts
    # one unit: every resample that keeps it gives the same ratio, so the interval is the point
    assert table.loc[("mul", 0), "ci_low"] == pytest.approx(0.6, abs=1e-6)
    assert table.loc[("mul", 0), "ci_high"] == pytest.approx(0.6, abs=1e-6)
    # baselines on the 4 rows: first (the [CLS]) never; offset -1: rows 3 (key 2) and 6 (key 5)
    base = scorer.tally_.arrays("mul")["base"][:, 0].sum(0)
    assert scorer.tally_.variants == ("random", "first", "offset=-1")
    assert list(base[1:]) == [0, 2]
    # random: one key per row drawn from the example's own key (its ids), all 8 keys visible
    draws = np.random.Generator(np.random.PCG64(example_key(0, batch.examples[0])))
    keys = draws.integers(0, np.full(4, 8))  # rows 3, 4, 5, 6
    random_hits = int(np.sum(keys == np.array([2, 2, 2, 5])))
    assert base[0] == random_hits
    best = max(zip((random_hits, 0, 2), ("random", "first", "offset=-1")), key=lambda x: x[0])
    assert table.loc[("mul", 0), "baseline_variant"] == best[1]  # ties: the first declared
    assert table.loc[("mul", 0), "gap"] == pytest.approx(0.6 - best[0] / 4, abs=1e-6)


def test_bad_declarations_say_what_is_wrong(unregister):
    with pytest.raises(ValueError, match="unknown baseline 'last'"):
        headprobe.pattern_analysis(NAME, last_comma_pattern(COMMA), baselines=("random", "last"))
    with pytest.raises(ValueError, match="use letters, digits"):
        headprobe.pattern_analysis("last comma", last_comma_pattern(COMMA))
    analysis = headprobe.pattern_analysis(NAME, lambda ids, token: np.zeros((2, 2), dtype=bool))
    scorer = analysis.make_scorer()
    with pytest.raises(
        ValueError, match=r"last_comma: the pattern function gave shape \(2, 2\) for 3 tokens"
    ):
        scorer.pattern_of(np.arange(3), np.ones(3, dtype=bool))


# ------------------------------------------------------------------------------ end to end

WORDS = [
    "the",
    "a",
    "big",
    "red",
    "cat",
    "dog",
    "mat",
    "sat",
    "ran",
    "on",
    "and",
    "it",
    "was",
    "saw",
    "down",
]
SLOT = 31  # the hidden dimension that marks a comma


def comma_corpus(path, n=60, seed=0):
    """CoNLL-U sentences of the tiny vocabulary, one comma each (a chain of heads); returns
    the number of words after each sentence's comma (the rows with a pattern)."""
    rng = np.random.default_rng(seed)
    lines, after = [], []
    for k in range(n):
        words = list(rng.choice(WORDS, rng.integers(6, 11)))
        at = int(rng.integers(1, len(words) - 2))
        words.insert(at, ",")
        after.append(len(words) - at - 1)
        lines.append(f"# sent_id = s{k}")
        for i, w in enumerate(words, start=1):
            lines.append(f"{i}\t{w}\t{w}\tX\tX\t_\t{i - 1}\t{'root' if i == 1 else 'dep'}\t_\t_")
        lines.append("")
    path.write_text("\n".join(lines) + "\n")
    return after


def comma_bert(tokenizer):
    """A 2-layer random BERT whose layer 0 head 0 puts nearly all its attention on commas: the
    comma's embedding is large in hidden dimension SLOT (zero there for every other token,
    position and segment), the head's keys read SLOT and its queries are a constant."""
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.3,
    )
    torch.manual_seed(5)
    model = AutoModel.from_config(config, attn_implementation="eager").eval()
    comma = tokenizer.convert_tokens_to_ids(",")
    with torch.no_grad():
        emb = model.embeddings
        emb.word_embeddings.weight[:, SLOT] = 0
        emb.word_embeddings.weight[comma, SLOT] = 8
        emb.position_embeddings.weight[:, SLOT] = 0
        emb.token_type_embeddings.weight[:, SLOT] = 0
        att = model.encoder.layer[0].attention.self
        att.query.weight[:8] = 0
        att.query.bias[:8] = 0
        att.query.bias[0] = 6
        att.key.weight[:8] = 0
        att.key.bias[:8] = 0
        att.key.weight[0, SLOT] = 6
    return model


def test_user_pattern_through_run_and_report(unregister, tmp_path):
    tokenizer = make_wordpiece()
    comma = tokenizer.convert_tokens_to_ids(",")
    declare(comma)
    corpus = tmp_path / "commas.conllu"
    after = comma_corpus(corpus)
    model = comma_bert(tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = headprobe.run(
            treebank=corpus,
            analyses=[NAME],
            n_boot=200,
            pictures=False,
            progress=False,
            loaded=(model, tokenizer, "comma-bert"),
            out=tmp_path / "r",
            report=True,
        )
    # counts: the rows with a pattern are the words after each sentence's comma
    counts = results.counts
    rows = counts[(counts["analysis"] == NAME) & (counts["fold"] == "") & (counts["variant"] == "")]
    assert set(rows["label"]) == {"mul", "argmax"} and (rows["n"] == sum(after)).all()
    # the heads table against the eager attention of head 0-0, computed here sentence by sentence
    shares = []
    for block in corpus.read_text().strip().split("\n\n"):
        words = [line.split("\t")[1] for line in block.splitlines() if not line.startswith("#")]
        enc = tokenizer(" ".join(words), return_tensors="pt")
        with torch.no_grad():
            a = model(**enc, output_attentions=True).attentions[0][0, 0]  # [query, key]
        at = 1 + words.index(",")  # after [CLS]
        shares += [float(a[i, at] / a[i].sum()) for i in range(at + 1, len(words) + 1)]
    heads = results.table(f"{NAME}_heads").set_index(["label", "layer", "head"])
    assert heads.loc[("mul", 0, 0), "score"] == pytest.approx(np.mean(shares), abs=1e-5)
    assert np.mean(shares) > 0.9  # the head was built to do this
    assert heads.loc[("mul", 0, 0), "ci_low"] > 0.9 and heads.loc[("mul", 0, 0), "gap_low"] > 0
    # best heads, in-sample and held-out, name it
    best = results.best_heads
    best = best[(best["analysis"] == NAME) & (best["label"] == "mul") & (best["fold"] == "")]
    assert set(best["selection"]) == {"in-sample", "held-out"} and set(best["heads"]) == {"0-0"}
    # its role rule is in use and names the head
    roles = results.roles.set_index(["layer", "head"])
    assert roles.loc[(0, 0), "role"] == "comma"
    assert "fold 0" in roles.loc[(0, 0), "evidence"]
    # the report has its section, its best-heads table and the rule
    text = (tmp_path / "r" / "report" / "report.md").read_text()
    assert f"## {NAME}" in text and "comma: attends to the most recent comma" in text
    html = (tmp_path / "r" / "report" / "report.html").read_text()
    assert '<section id="last-comma">' in html and f'<table id="table-{NAME}-top-heads"' in html
    table = html[html.index(f'<table id="table-{NAME}-top-heads"') :]
    table = table[: table.index("</table>")]
    assert table.count('data-col="head" data-head="0-0"') == 2
    assert table.count('data-col="heldout_head" data-head="0-0"') == 2
