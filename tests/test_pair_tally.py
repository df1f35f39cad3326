"""Results keyed by a pair of heads (`headprobe.scoring.pair_tally`, `headprobe.stats.pair_estimates`).

A toy pair analysis: for receiver head (l, h) and sender head (l', h'), a query's hit is that both
heads put their largest weight on the same key (argmax agreement), n the queries. Its pair table
is the same, intervals included, whether the units are counted in one tally or in two shards
added together, and after a save and a load.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from headprobe.core.torch_modes import inference_mode
from headprobe.scoring.pair_tally import add_pairs, pair_arrays, pair_tally
from headprobe.scoring.tally import Tally
from headprobe.stats.pair_estimates import PAIR_COLUMNS, pair_table

LAYERS, HEADS, QUERIES, KEYS = [0, 1], 3, 5, 4


def toy_attention(unit: int) -> torch.Tensor:
    """[layer, head, query, key] attention of one unit, drawn from its index."""
    g = torch.Generator().manual_seed(unit)
    return torch.rand(len(LAYERS), HEADS, QUERIES, KEYS, generator=g).softmax(-1)


def agreement(att: torch.Tensor) -> torch.Tensor:
    """[layer, head, sender layer, sender head, channel]: queries whose argmax keys agree."""
    top = att.argmax(-1)  # [layer, head, query]
    same = top[:, :, None, None, :] == top[None, None, :, :, :]  # [l, h, sl, sh, query]
    return same.sum(-1, dtype=torch.int32)[..., None]


@inference_mode
def count(units, resamples: int = 50) -> Tally:
    tally = pair_tally(
        "toy_pairs", channels=("argmax",), layers=LAYERS, n_heads=HEADS, resamples=resamples
    )
    values = torch.stack([agreement(toy_attention(u)) for u in units])  # [row, l, h, sl, sh, c]
    add_pairs(
        tally,
        [f"unit{u}" for u in units],
        ["agree"] * len(units),
        values,
        np.full((len(units), 1), QUERIES),
    )
    return tally


def test_a_pair_table_adds_across_two_shards_exactly(tmp_path):
    units = list(range(40))
    whole = pair_table(count(units))
    first, second = count(units[:17]), count(units[17:])
    merged = first.merge(second)
    pd.testing.assert_frame_equal(pair_table(merged), whole, check_exact=True)
    assert list(whole.columns) == PAIR_COLUMNS
    assert len(whole) == (len(LAYERS) * HEADS) ** 2  # every (receiver, sender) pair, one channel
    assert whole[["ci_low", "ci_high"]].notna().all().all()
    assert ((whole["ci_low"] <= whole["score"]) & (whole["score"] <= whole["ci_high"])).all()
    same = whole[
        (whole["layer"] == whole["sender_layer"]) & (whole["head"] == whole["sender_head"])
    ]
    assert (same["score"] == 1).all()  # a head always agrees with itself
    assert (whole["p_holm"] >= whole["p"]).all()
    merged.save(tmp_path / "pairs.npz")
    pd.testing.assert_frame_equal(
        pair_table(Tally.load(tmp_path / "pairs.npz")), whole, check_exact=True
    )


def test_pair_arrays_keep_receiver_and_sender_apart():
    tally = count(range(6), resamples=0)
    hits = pair_arrays(tally, "agree")["hits"]
    assert hits.shape == (2, 1, len(LAYERS), HEADS, len(LAYERS), HEADS, 1)
    want = sum(agreement(toy_attention(u)).numpy() for u in range(6))
    np.testing.assert_array_equal(hits.sum(0)[0], want)
    table = pair_table(tally)
    assert table["ci_low"].isna().all() and table["p"].isna().all()  # no resamples, no interval


def test_shards_of_other_pairs_do_not_merge():
    other = pair_tally(
        "toy_pairs", channels=("argmax",), layers=LAYERS, n_heads=HEADS, senders=[0], resamples=50
    )
    with pytest.raises(ValueError, match="senders differs"):
        count(range(3)).merge(other)
