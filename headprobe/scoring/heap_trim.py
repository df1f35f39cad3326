"""Handing the heap's free pages back to the OS between batches on the CPU (Linux, glibc).

    trimmer = HeapTrimmer.for_this_process()   # None off glibc, or with HEADPROBE_KEEP_MALLOC=1
    for batch in batches:
        score(batch)
        trimmer.after_batch()                  # trims when the resident set grew, or every 8

A batch allocates and frees tensors of many sizes (the model's activations, the attention of a
group of layers), each batch's shapes its own. glibc serves a block below its mmap threshold
from the heap, and raises that threshold (up to 32 MiB) each time a larger mapped block is
freed, so after the first batches the megabyte-sized blocks come from the heap too. What a
batch holds at once is small (about 16 MB of tensors for a full batch of MiniLM), but best-fit
placement cuts each batch's blocks from other parts of the heap, and every page a batch touches
stays resident until a trim: between trims the resident set climbs by the pages the batches
since the last one spread over, and a long corpus, with more batches, reaches a higher peak
(benchmarks/README.md, "What grew with the corpus"). So the trimmer reads the resident set
after each batch (one read of /proc/self/statm) and trims as soon as it has grown
`TRIM_GROWTH` past what it was after the last trim, and every `TRIM_EVERY` batches in any case.
A trimmed page is faulted in again by the next batch that touches it, so trimming after every
batch costs pace; trimming on growth trims after about half of a long corpus's batches.

HEADPROBE_MMAP_THRESHOLD=1048576 fixes the threshold (blocks of a mebibyte or more mapped and
unmapped whole): about a quarter slower on the CPU, so it is not the default.
"""

from __future__ import annotations

import ctypes
import os
import sys

TRIM_EVERY = 8  # batches between trims at most
TRIM_GROWTH = 48 * 2**20  # resident bytes past the last trim's that trigger one
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (HEADPROBE_MMAP_THRESHOLD)


def resident_bytes() -> int:
    """The process's resident set now (Linux)."""
    with open("/proc/self/statm", "rb") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class HeapTrimmer:
    """Trims the heap (`trim`) after a batch when the resident set (`resident`) has grown
    `growth` bytes past what it was after the last trim (or when made), and every `every`
    batches in any case. `trims` counts the trims made."""

    def __init__(self, trim, resident=resident_bytes, every=TRIM_EVERY, growth=TRIM_GROWTH):
        self.trim, self.resident = trim, resident
        self.every, self.growth = every, growth
        self.batches = 0
        self.trims = 0
        self.floor = resident()  # resident bytes after the last trim

    def after_batch(self) -> None:
        self.batches += 1
        if self.batches % self.every and self.resident() <= self.floor + self.growth:
            return
        self.trim()
        self.trims += 1
        self.floor = self.resident()

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
