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


def test_a_heap_is_trimmed_before_its_next_batch_could_pass_the_margin_and_every_eighth():
    # batches 1-3 grow 20 MB each: 760 > 748 after the third; then 5 MB each, the largest step
    # still 20 MB: trimmed after batch 14 (730 + 20 > 748) and at 8 and 16 (every 8)
    heap = Heap(700 * MB, [20 * MB] * 3 + [5 * MB] * 13)
    trimmer = HeapTrimmer(heap.trim, heap.resident, every=8, growth=48 * MB)
    for _ in range(16):
        heap.score()
        trimmer.after_batch()
    assert heap.trimmed_after == [3, 8, 14, 16]
    assert trimmer.trims == 4 and trimmer.step == 20 * MB
    assert trimmer.floor == 700 * MB


def test_the_resident_set_stays_within_the_margin_whatever_the_length():
    """Steady steps: the trim comes before the step that would pass the margin (growth alone,
    no periodic trims), so the resident set never passes floor + growth however many batches."""
    heap = Heap(700 * MB, [10 * MB] * 400)
    trimmer = HeapTrimmer(heap.trim, heap.resident, every=None, growth=48 * MB)
    highest = 0
    for _ in range(400):
        heap.score()
        highest = max(highest, heap.now)
        trimmer.after_batch()
    assert highest == 740 * MB  # 748 is the margin: 750 never reached
    assert heap.trimmed_after[:3] == [4, 8, 12] and trimmer.trims == 100


def test_the_batch_after_a_trim_and_the_first_two_do_not_count_as_a_step():
    """The pass's first batches (what it keeps) and each batch right after a trim (its working
    set faulted back in) grow the resident set without being a step the next batch could take."""
    growth = [90 * MB, 60 * MB] + [1 * MB] * 10
    heap = Heap(700 * MB, growth)
    trimmer = HeapTrimmer(heap.trim, heap.resident, every=None, growth=128 * MB)
    heap.score(), trimmer.after_batch()  # 790: the first batch
    heap.score(), trimmer.after_batch()  # 850: past 828, trimmed
    assert heap.trimmed_after == [2] and trimmer.step == 0
    heap.base = 700 * MB
    heap.growth[2] = 70 * MB  # the batch after the trim faults 70 MB back in
    for _ in range(10):
        heap.score()
        trimmer.after_batch()
    assert heap.trimmed_after == [2] and trimmer.step == 1 * MB  # 779 + 1 <= 828: no trim


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
