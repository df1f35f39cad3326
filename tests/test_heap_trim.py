"""The heap trimmer: when it trims (deterministic: a scripted resident set, trims counted)."""

from __future__ import annotations

import mmap
import sys

import pytest

from headprobe.scoring.heap_trim import HeapTrimmer, resident_bytes

MB = 2**20


class Heap:
    """A resident set that grows by each batch's `growth` and falls to `base` when trimmed."""

    def __init__(self, base: int, growth: list[int]):
        self.base, self.growth, self.now, self.trimmed_after = base, growth, base, []
        self.batch = 0

    def resident(self) -> int:
        return self.now

    def score(self) -> None:
        self.now += self.growth[self.batch]
        self.batch += 1

    def trim(self) -> None:
        self.now = self.base
        self.trimmed_after.append(self.batch)


def test_a_heap_that_grows_past_the_margin_is_trimmed_then_and_every_eighth_batch():
    # batches 1-3 grow 20 MB each: 60 > 48 after the third; then 5 MB each (40 in 8 batches)
    heap = Heap(700 * MB, [20 * MB] * 3 + [5 * MB] * 13)
    trimmer = HeapTrimmer(heap.trim, heap.resident, every=8, growth=48 * MB)
    for _ in range(16):
        heap.score()
        trimmer.after_batch()
    assert heap.trimmed_after == [3, 8, 16]
    assert trimmer.trims == 3
    # between trims the resident set never went more than one batch past the margin
    assert trimmer.floor == 700 * MB


def test_a_heap_that_does_not_grow_is_trimmed_every_eighth_batch_only():
    heap = Heap(700 * MB, [0] * 24)
    trimmer = HeapTrimmer(heap.trim, heap.resident, every=8, growth=48 * MB)
    for _ in range(24):
        heap.score()
        trimmer.after_batch()
    assert heap.trimmed_after == [8, 16, 24]


def test_the_floor_is_what_a_trim_leaves():
    """A trim that leaves more resident than before (what is in use grew) raises the floor:
    growth is counted from there, not from the start."""
    heap = Heap(700 * MB, [30 * MB, 30 * MB, 30 * MB, 30 * MB])
    trimmer = HeapTrimmer(heap.trim, heap.resident, every=100, growth=48 * MB)
    heap.score(), trimmer.after_batch()  # 730: no trim
    heap.score()  # 760
    heap.base = 740 * MB  # the trim after batch 2 leaves 740 in use
    trimmer.after_batch()
    assert heap.trimmed_after == [2] and trimmer.floor == 740 * MB
    heap.score(), trimmer.after_batch()  # 770: within 48 of 740
    assert heap.trimmed_after == [2]
    heap.score(), trimmer.after_batch()  # 800: 60 past 740
    assert heap.trimmed_after == [2, 4]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/statm")
def test_the_resident_set_is_read_from_the_process():
    """A fresh anonymous mapping (not the heap, whose free pages may already be resident) adds
    its pages once each is written, and takes them away when unmapped."""
    before = resident_bytes()
    block = mmap.mmap(-1, 64 * MB)
    for offset in range(0, 64 * MB, mmap.PAGESIZE):
        block[offset] = 1
    grown = resident_bytes()
    block.close()
    assert grown - before > 48 * MB
    assert grown - resident_bytes() > 48 * MB
