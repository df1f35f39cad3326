"""Handing the heap's free pages back to the OS between batches on the CPU (Linux, glibc).

    trimmer = HeapTrimmer.for_this_process()   # None off glibc, or with HEADPROBE_KEEP_MALLOC=1
    for batch in batches:
        score(batch)
        trimmer.after_batch()                  # trims before it could pass 128 MB of growth

A batch allocates and frees tensors of many sizes (the model's activations, the attention of a
group of layers), each batch's shapes its own. glibc serves a block below its mmap threshold
from the heap, and raises that threshold (up to 32 MiB) each time a larger mapped block is
freed, so after the first batches the megabyte-sized blocks come from the heap too. What a
batch holds at once is small (about 16 MB of tensors for a full batch of MiniLM), but best-fit
placement cuts each batch's blocks from other parts of the heap, and every page a batch touches
stays resident until a trim: between trims the resident set climbs by the pages the batches
since the last one spread over, and a long corpus, with more batches, reaches a higher peak
(benchmarks/README.md, "What grew with the corpus"). So the trimmer reads the resident set
after each batch (one read of /proc/self/statm) and trims as soon as the next batch could take
it `TRIM_GROWTH` past what it was after the last trim: when it is within the most one batch has
added of that margin (and every `every` batches, where asked).

Why the margin is 128 MB, and why the step is counted. A trim hands back every free page, and
the batch after it faults its working set back in: that is growth past the new floor too. A
margin below what a batch faults back trims again at once, after nearly every other batch (114
trims in 202 batches of EWT dev x4 at 48 MB, the run 15% slower than with no trim). With 128 MB
on growth alone the same run trims 5 times, but a long corpus has more batches to overshoot the
margin by one large batch: the peak at x40 was 1.066x x4's (`whole_run.py memory`). Trimming
before the largest step seen so far could pass the margin holds the peak to the margin whatever
the corpus's length: x40 1.017x x4 in the same benchmark, with 34 trims on x4
(benchmarks/README.md, "the heap trimmed on growth alone").

HEADPROBE_MMAP_THRESHOLD=1048576 fixes the threshold (blocks of a mebibyte or more mapped and
unmapped whole): about a quarter slower on the CPU, so it is not the default.
"""

from __future__ import annotations

import ctypes
import os
import sys

TRIM_EVERY = None  # batches between trims at most (None: trims on growth alone)
TRIM_GROWTH = 128 * 2**20  # resident bytes past the last trim's that trigger one
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (HEADPROBE_MMAP_THRESHOLD)


def resident_bytes() -> int:
    """The process's resident set now (Linux)."""
    with open("/proc/self/statm", "rb") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class HeapTrimmer:
    """Trims the heap (`trim`) after a batch when the next one could take the resident set
    (`resident`) past `growth` bytes above what it was after the last trim (or when made): when
    the resident set now plus the most one batch has added (`step`) is past that; and every
    `every` batches in any case (None: on growth alone). The batch after a trim, which faults
    its working set back in, and the pass's first two, which allocate what the pass keeps, do
    not count in `step`. `trims` counts the trims made."""

    def __init__(self, trim, resident=resident_bytes, every=TRIM_EVERY, growth=TRIM_GROWTH):
        self.trim, self.resident = trim, resident
        self.every, self.growth = every, growth
        self.batches = 0
        self.trims = 0
        self.floor = resident()  # resident bytes after the last trim
        self.last = self.floor  # resident bytes after the previous batch
        self.step = 0  # the most one batch has added (see the class docstring)
        self.since = 0  # batches since the last trim

    def after_batch(self) -> None:
        self.batches += 1
        self.since += 1
        now = self.resident()
        if self.since > 1 and self.batches > 2:
            self.step = max(self.step, now - self.last)
        self.last = now
        due = self.every is not None and self.batches % self.every == 0
        if not due and now + self.step <= self.floor + self.growth:
            return
        self.trim()
        self.trims += 1
        self.floor = self.last = self.resident()
        self.since = 0

    @classmethod
    def for_this_process(cls) -> HeapTrimmer | None:
        """A trimmer of this process's glibc heap, or None (not Linux, no glibc, or
        HEADPROBE_KEEP_MALLOC=1, which leaves the allocator alone)."""
        if os.environ.get("HEADPROBE_KEEP_MALLOC") or not sys.platform.startswith("linux"):
            return None
        try:
            libc = ctypes.CDLL("libc.so.6")
            trim, mallopt = libc.malloc_trim, libc.mallopt
            resident_bytes()
        except (OSError, AttributeError):
            return None
        threshold = os.environ.get("HEADPROBE_MMAP_THRESHOLD")
        if threshold and threshold.isdigit():  # bytes
            mallopt(M_MMAP_THRESHOLD, int(threshold))
        return cls(lambda: trim(0))
