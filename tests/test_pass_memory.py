"""The scoring pass keeps nothing per sentence: what it retains does not grow with the corpus.

A deterministic check (no timing, no resident-memory reading): the same tiny model scores N and
then 4N sentences, each its own unit; after each pass (the scorers' tallies flushed, before any
statistics) the Python and NumPy allocations still held (`tracemalloc`, less those of transformers' own
lines: `NOT_OURS`) and the live torch
tensors are counted. Anything kept per sentence, per unit or per batch for the whole pass (seen
ids, examples, pool bookkeeping, buffered rows, cached draws, per-length caches) makes the 4N
pass hold more than the N pass.
"""

from __future__ import annotations

import gc
import random
import tracemalloc

import torch
from conftest import WORDS

from headprobe.config import RunConfig
from headprobe.inputs.corpora.base import Example
from headprobe.scoring import engine as engine_module
from headprobe.scoring.engine import Engine
from headprobe.scoring.tally import UnitDraws
from headprobe.studies.dependency.analysis import DependencyScorer
from headprobe.studies.positional.analysis import PositionalScorer
from headprobe.studies.surface.analysis import SurfaceScorer

N = 40
# bytes the 4N pass may hold beyond the N pass: a few small objects whose size depends on a
# count (a larger int), nothing per sentence (3N sentences x 100 B would be 12 kB)
SLACK = 4096


def sentences(n: int, copies: int = 1) -> list[Example]:
    """`n` random parsed sentences of 3 to 10 words, `copies` times over, each its own unit (the
    copies have the same labels, so the two passes see the same label set)."""
    rng = random.Random(7)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 10))]
        root = rng.randrange(len(words))
        heads = [-1 if i == root else (i + 1) % len(words) for i in range(len(words))]
        out.append((words, heads))
    return [
        Example(
            words=words,
            unit=f"s{copy}-{index:04d}",
            source=f"random:{copy}:{index}",
            heads=heads,
            deprels=["root" if h < 0 else "dep" for h in heads],
            upos=["X"] * len(words),
        )
        for copy in range(copies)
        for index, (words, heads) in enumerate(out)
    ]


def live_tensors() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


# transformers' own code keeps a little per forward call (the `output_*` keys of its
# `capture_outputs` wrapper: 3.9 kB over the ~140 more batches of an 8N pass at 6a78415 and now),
# which headprobe neither holds nor can free: what transformers' own lines allocated is not counted
NOT_OURS = [tracemalloc.Filter(False, "*/transformers/*")]


def held_bytes(snapshot) -> int:
    """Bytes of the traced allocations still held, less those made by transformers' own lines."""
    return sum(stat.size for stat in snapshot.filter_traces(NOT_OURS).statistics("filename"))


def retained_by_pass(family, examples) -> tuple[int, int]:
    """(bytes of Python/NumPy allocations held after the pass, live tensors after it), with the
    engine and its scorers (their fixed-size tallies) still alive."""
    gc.collect()
    tracemalloc.start()
    try:
        before = held_bytes(tracemalloc.take_snapshot())
        engine = Engine(
            family.sdpa,
            family.tokenizer,
            [DependencyScorer(), PositionalScorer(), SurfaceScorer()],
            # tokenized in the pass's reading thread: what worker processes send back is a
            # chunk's alignments, handed over as the thread's are (tests/test_read_ahead.py)
            RunConfig(batch_size=8, progress=False, n_boot=100, workers=0),
        )
        engine.run(examples)
        gc.collect()
        held = held_bytes(tracemalloc.take_snapshot()) - before
        tensors = live_tensors()
    finally:
        tracemalloc.stop()
    del engine
    return held, tensors


def test_the_pass_retains_nothing_per_sentence(bert_family, monkeypatch):
    # the one cache kept across a pass: each unit's resample weights, for the most recent
    # `UnitDraws.SIZE` units; made smaller than N here, so it is full after either pass
    monkeypatch.setattr(UnitDraws, "SIZE", 8)
    monkeypatch.setattr(UnitDraws, "_shared", {})
    # the corpus is read a chunk at a time, and a chunk is held until its batches are scored:
    # chunks much smaller than N, so both passes read several
    monkeypatch.setattr(engine_module, "CHUNK", 8)
    # imports, lazy caches and the batch shapes of both passes (a cache keyed by shape holds
    # as much after either; a cache that grows per sentence still grows 4x as much in the second)
    retained_by_pass(bert_family, sentences(N, copies=4))
    small = retained_by_pass(bert_family, sentences(N))
    large = retained_by_pass(bert_family, sentences(N, copies=4))
    grown = large[0] - small[0]
    assert grown <= SLACK, (
        f"the pass held {small[0]:,} B after {N} sentences and {large[0]:,} B after {4 * N}: "
        f"{grown / (3 * N):.0f} B more per sentence"
    )
    assert large[1] <= small[1], f"live tensors: {small[1]} after {N}, {large[1]} after {4 * N}"


def test_batch_size_from_device_memory():
    """The GPU's batch size: the largest power of two from 64 to 1,024 whose typical examples fit
    in half the free memory (per example: worked out here from the formula's terms)."""
    from headprobe.scoring.batch_size import CPU_BATCH, MOST, auto_batch_size, batch_size_for

    layers, heads, hidden, inter, t = 12, 12, 768, 3072, 64
    per_example = layers * (4 * t * (12 * hidden + 2 * inter) + 16 * heads * t * t)
    assert per_example == 12 * (4 * 64 * 15360 + 16 * 12 * 4096)
    assert batch_size_for(2 * 300 * per_example, layers, heads, hidden, inter) == 256
    assert batch_size_for(2 * 255 * per_example, layers, heads, hidden, inter) == 128
    assert batch_size_for(10 * per_example, layers, heads, hidden, inter) == CPU_BATCH
    assert batch_size_for(2 * 1024 * per_example, layers, heads, hidden, inter) == MOST
    assert auto_batch_size(torch.nn.Linear(2, 2), "cpu") == CPU_BATCH
