"""The pool of examples waiting for a batch across chunks (`inputs.batching.Pool`, issue 31):
its batches by hand, a run resumed from any checkpoint (batches across chunk boundaries, an
out-of-memory batch retried in halves) and ranks dealt batches, against one uninterrupted run."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from test_engine import random_sentences

from headprobe.config import RunConfig
from headprobe.inputs.batching import Pool
from headprobe.inputs.corpora.base import Example
from headprobe.scoring import engine as engine_module
from headprobe.scoring.checkpoint import Checkpoint
from headprobe.scoring.distributed import World
from headprobe.scoring.engine import Engine
from headprobe.studies.dependency.analysis import DependencyScorer
from headprobe.studies.positional.analysis import PositionalScorer
from headprobe.studies.surface.analysis import SurfaceScorer


# ------------------------------------------------------------------------------ the pool
def test_pool_batches_by_hand():
    """Batch size 3, budget 12 pieces x examples, bound 20 pieces: a full batch of length 2 or 4
    is 3 examples, of 5 two (12 // 5), of 13 one; past 20 pieces the fullest length goes."""
    pool = Pool(batch_size=3, budget=12, bound=20)
    assert [pool.size(n) for n in (2, 3, 4, 5, 6, 13)] == [3, 3, 3, 2, 2, 1]
    added = []

    def add(item, length):
        added.append((item, length))
        return pool.add(item, length)

    assert add("a", 2) == add("b", 4) == add("c", 2) == add("d", 5) == []
    assert add("e", 2) == [["a", "c", "e"]]  # length 2 reached 3
    assert add("f", 5) == [["d", "f"]]  # length 5 reached 2
    assert add("g", 13) == [["g"]]  # longer than the budget: alone
    assert add("h", 4) == [] and add("i", 4) == [["b", "h", "i"]]  # b waited across batches
    assert pool.pieces == 0 and len(pool) == 0
    for item, length in (("k", 3), ("l", 6), ("m", 3), ("n", 4)):
        assert add(item, length) == []
    assert pool.pieces == 16
    snapshot = pool.waiting()
    # 21 pieces > 20: lengths 3 and 6 hold 6 pieces each, the longer goes
    assert add("o", 5) == [["l"]] and pool.pieces == 15
    assert pool.drain() == [["o"], ["n"], ["k", "m"]]  # longest first
    assert pool.pieces == 0 and pool.drain() == []

    again = Pool(batch_size=3, budget=12, bound=20)  # refilled from the snapshot: same batches
    again.restore(snapshot)
    assert again.pieces == 16 and again.add("o", 5) == [["l"]]
    assert again.drain() == [["o"], ["n"], ["k", "m"]]


# ------------------------------------------------------------------------------ engine runs
def scorers():
    return [DependencyScorer(), PositionalScorer(), SurfaceScorer()]


def corpus() -> list[Example]:
    """30 random sentences and two of 39 words (41 pieces with [CLS] and [SEP]: more than the
    tiny BERT's 40 positions, skipped), one in the first chunk and one in the third."""
    examples = random_sentences(30, seed=11)
    for where in (3, 14):
        examples.insert(
            where,
            Example(words=["the"] * 39, unit=f"long{where}", source=f"x:{where}", heads=None),
        )
    return examples


@pytest.fixture
def small_pool(monkeypatch):
    """Chunks of 6 examples; batch size 4, full at 4 x 5 = 20 pieces; the pool holds 40
    pieces at most: batches mix chunks, and the bound lets lengths go."""
    monkeypatch.setattr(engine_module, "CHUNK", 6)
    monkeypatch.setattr(engine_module, "FULL_AT", {"cpu": 5})
    monkeypatch.setattr(engine_module, "POOL_BATCHES", 2)
    monkeypatch.setattr(engine_module, "POOL_AT", 5)


def tallies_of(engine: Engine) -> dict:
    return {name: tally for s in engine.scorers for name, tally in s.tallies_.items()}


def assert_same_tallies(a: dict, b: dict) -> None:
    """Bit-identical totals (masses included)."""
    assert set(a) == set(b)
    for name, tally in a.items():
        other = b[name]
        assert tally.sorted_labels() == other.sorted_labels(), name
        for label in tally.sorted_labels():
            want, got = tally.arrays(label), other.arrays(label)
            assert want.keys() == got.keys()
            for key in want:
                assert np.array_equal(want[key], got[key]), (name, label, key)


class Killed(Exception):
    """Stands for SIGKILL right after a checkpoint."""


class Hook:
    """`passes._CheckpointHook`'s part, over a real `Checkpoint`; `kill_at`: raise after that save."""

    def __init__(self, checkpoint: Checkpoint, scorers, start, kill_at: int | None = None):
        self.checkpoint, self.scorers, self.start = checkpoint, scorers, start
        self.every, self.kill_at, self.saves = checkpoint.every, kill_at, 0

    def save(self, engine, state: dict) -> None:
        self.checkpoint.save("sentences", self.scorers, dict(state, finished=False))
        self.saves += 1
        if self.saves == self.kill_at:
            raise Killed


def run(model, tokenizer, examples, out=None, kill_at=None, world=None, batches=None):
    """One engine pass, batch size 4; with `out`: checkpointed after every batch (resumed from
    what `out` holds), killed after save `kill_at`. `batches`: a list the scored batches go into."""
    chosen = scorers()
    hook = None
    if out is not None:
        checkpoint = Checkpoint(out, {"test": 1}, every=1, resume=True)
        state = checkpoint.restore("sentences", chosen, "cpu")
        hook = Hook(checkpoint, chosen, state, kill_at)
    engine = Engine(model, tokenizer, chosen, RunConfig(batch_size=4, progress=False))
    if batches is not None:
        score = engine._score

        def watched(batch):
            score(batch)
            batches.append([ex.source for ex in batch.examples])  # scored (not out of memory)

        engine._score = watched
    return engine, engine.run(examples, checkpoint=hook, world=world)


@pytest.fixture
def oom_over_two(bert_family, monkeypatch):
    """The tiny BERT runs out of memory on a batch of more than 2 examples (retried in halves)."""
    model = bert_family.sdpa
    forward = model.forward

    def small_memory(*args, **kwargs):
        if kwargs["input_ids"].shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", small_memory)
    return model


@pytest.mark.parametrize("oom", [False, True], ids=["plain", "oom-halves"])
def test_resumed_runs_equal_one_run(bert_family, small_pool, oom, request, tmp_path):
    """Killed after checkpoint k (every batch checkpointed: mid-chunk, with batches queued and
    examples waiting in the pool, between the halves of a batch that ran out of memory) and
    resumed: the same batches, bit-identical totals, the same stats."""
    tok, examples = bert_family.tokenizer, corpus()
    plain = []
    run(bert_family.sdpa, tok, examples, batches=plain)
    model = request.getfixturevalue("oom_over_two") if oom else bert_family.sdpa
    whole = []
    engine, stats = run(model, tok, examples, batches=whole)
    assert stats["examples"] == 30 and stats["skipped"] == {"too_long": 2}
    ordinal = {ex.source: i for i, ex in enumerate(examples)}
    assert any(len({ordinal[s] // 6 for s in batch}) > 1 for batch in whole), (
        "no batch mixes chunks"
    )
    kills = [2, 5, len(whole) - 3]
    if oom:  # also killed between the halves of a batch of 3 or 4
        assert max(map(len, plain)) > 2 and max(map(len, whole)) == 2 and engine.batch_size_ < 4
        halves = [k for k in range(len(whole) - 1) if whole[k] + whole[k + 1] in plain]
        assert halves
        kills.append(halves[0] + 1)  # save k follows batch k (counted from 1)
    else:
        assert whole == plain
    for kill_at in kills:
        out = tmp_path / f"out{kill_at}"
        first = []
        with pytest.raises(Killed):
            run(model, tok, examples, out=out, kill_at=kill_at, batches=first)
        assert first == whole[:kill_at]
        then = []
        resumed, again = run(model, tok, examples, out=out, batches=then)
        assert first + then == whole, kill_at
        assert_same_tallies(tallies_of(engine), tallies_of(resumed))
        for key in ("examples", "words", "skipped", "skipped_sources"):
            assert again[key] == stats[key], (kill_at, key)


def test_a_checkpoint_names_what_is_held(bert_family, small_pool, tmp_path):
    """The state after the fifth batch: every example read is scored, skipped, queued or
    waiting, each once (ordinals in the corpus); a queued batch and the pool span chunks."""
    out, first = tmp_path / "out", []
    with pytest.raises(Killed):
        run(bert_family.sdpa, bert_family.tokenizer, corpus(), out=out, kill_at=5, batches=first)
    state = Checkpoint(out, {"test": 1}, resume=True).passed("sentences")
    queued = [i for ordinals in state["queued"] for i in ordinals]
    held = queued + state["waiting"]
    assert state["read"] % 6 == 0 and state["stats"]["examples"] == sum(map(len, first))
    assert any(len({i // 6 for i in ordinals}) > 1 for ordinals in state["queued"])
    assert min(state["waiting"]) < state["read"] - 6  # waiting since an earlier chunk
    assert len(set(held)) == len(held) and max(held) < state["read"]
    skipped = state["stats"]["skipped"].get("too_long", 0)
    assert state["read"] == state["stats"]["examples"] + skipped + len(held)


def test_ranks_together_score_the_one_process_batches(bert_family, small_pool):
    """Two ranks (each reads the whole corpus, scores every other batch): their batches are the
    one-process run's, their totals add up to its totals exactly, and so do their stats."""
    tok, examples = bert_family.tokenizer, corpus()
    whole = []
    one, stats = run(bert_family.sdpa, tok, examples, batches=whole)
    ranks = []
    for rank in range(2):
        batches = []
        engine, rank_stats = run(
            bert_family.sdpa, tok, examples, world=World(2, rank), batches=batches
        )
        assert batches == whole[rank::2]
        ranks.append((engine, rank_stats))
    merged = tallies_of(ranks[0][0])
    for name, tally in tallies_of(ranks[1][0]).items():
        merged[name].merge(tally)
    assert_same_tallies(tallies_of(one), merged)
    for key in ("examples", "words"):
        assert ranks[0][1][key] + ranks[1][1][key] == stats[key]
    assert ranks[0][1]["skipped"] == stats["skipped"] and ranks[1][1]["skipped"] == {}


def test_a_longer_corpus_makes_no_larger_batch_on_the_cpu():
    """The engine's pool on the CPU: however many examples share a length, a batch holds at most
    batch size x `full_at("cpu")` pieces, so a corpus eight times longer (whose pool fills the
    batches of long inputs that one copy rarely fills) makes batches no larger (within 5%) than
    one copy does: the size of a batch's blocks does not grow with the corpus."""
    from headprobe.scoring.engine import batch_pool, full_at

    rng = random.Random(0)
    lengths = [min(150, 3 + int(rng.expovariate(1 / 22))) for _ in range(2000)]

    def largest(corpus: list[int]) -> int:
        pool, pieces = batch_pool(64, "cpu"), []
        for n in corpus:
            pieces += [sum(b) for b in pool.add(n, n)]  # an item is its own length
        pieces += [sum(b) for b in pool.drain()]
        assert sum(pieces) == sum(corpus)
        return max(pieces)

    one, eight = largest(lengths), largest(lengths * 8)
    assert eight <= 64 * full_at("cpu") and eight <= 1.05 * one  # 1,024 and 986 (64 x 64: 1,720)
    assert full_at("cuda") >= full_at("cpu")
