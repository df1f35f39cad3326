"""The copy rate counted in cache-sized blocks gives the same table as the code it replaced.

tests/data/ov_reference.npz holds `ov_heads` on a tiny GQA Llama and a tiny GPT-2 (random
weights and norm gains, one head planted to copy, one to suppress or write nothing), made by
tests/make_ov_reference.py with the code that took a top-k over whole [sample, vocab] rows.
Hits must be equal (they are counts), copying scores equal to 1e-6; the blocks are also made
tiny, so tokens are settled across many blocks and the first block's products split heads' rows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from make_ov_reference import COLUMNS, FIXTURE, cases

from headprobe.studies.ov_copying import ov_circuits as ov_copying


@pytest.fixture(scope="module")
def models() -> dict:
    return cases()


@pytest.mark.parametrize("name", ["llama", "gpt2"])
@pytest.mark.parametrize("blocks", [None, (3, 40), (7, 128)], ids=["default", "3x40", "7x128"])
def test_table_equals_the_reference(models, name, blocks, monkeypatch):
    if blocks is not None:
        monkeypatch.setattr(ov_copying, "ROW_BLOCK", blocks[0])
        monkeypatch.setattr(ov_copying, "VOCAB_BLOCK", blocks[1])
    reference = np.load(FIXTURE)
    model, tokens = models[name]
    got = ov_copying.ov_heads(model, tokens)
    assert list(got.columns) == list(COLUMNS)
    for column in ("layer", "head", "kv_group", "hits", "n"):
        np.testing.assert_array_equal(got[column].to_numpy(), reference[f"{name}/{column}"])
    np.testing.assert_allclose(
        got["copying"].to_numpy(), reference[f"{name}/copying"], rtol=0, atol=1e-6, equal_nan=True
    )


def test_the_reference_has_copies_misses_and_a_silent_head():
    """The fixture tests something: planted heads copy many tokens, others few or none."""
    reference = np.load(FIXTURE)
    assert reference["llama/hits"].max() > 100 and reference["llama/hits"].min() == 0
    assert reference["gpt2/hits"].max() > 200 and np.isnan(reference["gpt2/copying"]).sum() == 1
    assert len(set(reference["llama/kv_group"])) == 2  # GQA: 6 heads over 2 KV groups


def refuse_three(item: int) -> int:
    if item == 3:
        raise ValueError("item 3")
    return item


def test_across_cores_keeps_the_order_and_gives_the_threads_back():
    """Each item runs in a thread of one intra-op thread, grad off and inference mode as the
    caller's; results in the items' order; torch's thread count restored, after an error too."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.inference_mode():
            seen = ov_copying.across_cores(
                lambda i: (
                    i,
                    torch.get_num_threads(),
                    torch.is_grad_enabled(),
                    torch.is_inference_mode_enabled(),
                ),
                range(7),
            )
        assert seen == [(i, 1, False, True) for i in range(7)]
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError, match="item 3"):
            ov_copying.across_cores(refuse_three, range(5))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
