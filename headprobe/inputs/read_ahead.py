"""Reading and tokenizing ahead of the model: a thread (`prefetched`) that reads the corpus
(and tokenizes it, with `--workers 0`), and worker processes (`Workers`, `--workers N`) that
tokenize and align each chunk while the model scores the batches before it.

    for chunk, done in prefetched(chunks, work):          # work(chunk) in a thread, in order
        ...
    with Workers(2, tokenizer=tokenizer) as workers:      # two processes that hold the tokenizer
        future = workers.submit(align_in_worker, example_inputs(chunk))   # one chunk's words
        for result in workers.in_order(function, parts, depth=4):   # function(part), in order
            ...

Order is kept: results come back in the order of their parts, whatever worker was quicker, so
a run's tables do not depend on the number of workers. Memory is bounded: at most `depth` parts
are in the workers or waiting to be taken. An exception raised by `function` is raised where
its result would have come.

The workers are forked (Linux: they start with the parent's modules and tokenizer) and spawned
elsewhere (the tokenizer is pickled); a part and its result always travel pickled, so a worker
is sent a chunk's words and sends back its alignments, never the examples. Reading itself stays
in this process: reading in workers was measured, and unpickling the examples they sent back
cost this process as much as reading them (benchmarks/README.md, "The host's ceiling").
`default_workers()`: the cores this process may use, less one for the model's own work.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor


def default_workers() -> int:
    """The cores this process may use, less one (the model's); 0 on a single core."""
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return max(0, (len(cores) if cores else (os.cpu_count() or 1)) - 1)


def prefetched(chunks, work, depth: int = 2):
    """`(chunk, work(chunk))` for each chunk of `chunks`, in order, computed ahead by a worker
    thread and handed over through a queue of at most `depth` done chunks: reading the corpus and
    tokenizing (the fast tokenizers let go of the GIL) run while the model scores the batches
    before them, and memory stays bounded. An exception of the reader or of `work` is raised here,
    where its chunk would have come; leaving the loop early stops the worker.

        for chunk, prepared in prefetched(chunked(examples, 1024), tokenize):
            ...

    A hand-written thread and `queue.Queue` rather than `torch.utils.data.DataLoader`: the chunks
    come from a lazy iterator that must be read once and in order (a checkpoint names examples by
    their ordinal), and a DataLoader worker would pickle the tokenizer and the corpus into another
    process."""
    import queue

    done = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def produce() -> None:
        try:
            for chunk in chunks:
                item = (chunk, work(chunk))
                while not stop.is_set():
                    try:
                        done.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            done.put(end)
        except BaseException as exc:  # handed to the consumer, raised there
            done.put(exc)

    worker = threading.Thread(target=produce, name="headprobe-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item = done.get()
            if item is end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # let a worker blocked on a full queue see the stop
            try:
                done.get(timeout=0.1)
            except queue.Empty:
                pass


# what a worker process holds for the functions it runs (set once, as it starts)
_STATE: dict = {}


def _start(state: dict, parent: int) -> None:
    _STATE.update(state)
    threading.Thread(target=_end_with, args=(parent,), daemon=True).start()


def _end_with(parent: int) -> None:
    """In a worker: end when the process that started it is gone. A run killed outright (SIGKILL,
    the out-of-memory killer) tells its workers nothing; they would wait on their queue forever,
    holding the run's output pipes open."""
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(1)


def state() -> dict:
    """What the workers were started with (`Workers(..., **state)`): in a worker process, for
    the functions it runs."""
    return _STATE


class Workers:
    """`n` worker processes for one pass over a corpus (a context manager: they end with it).
    `state` (e.g. `tokenizer=...`) is what each worker holds (`state()` in the function run).

        with Workers(2, tokenizer=tokenizer) as workers:
            for alignments in workers.in_order(align_part, parts, depth=4):
                ...

    A hand-written pool around `concurrent.futures.ProcessPoolExecutor` rather than
    `multiprocessing.Pool.imap`: `imap` takes parts from its iterator as fast as it can (the
    whole corpus read ahead, unbounded memory); `in_order` submits a part only when fewer than
    `depth` are out."""

    def __init__(self, n: int, **state):
        self.n, self.state = int(n), state
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Workers:
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context(
            "fork" if sys.platform == "linux" and "fork" in methods else "spawn"
        )
        with warnings.catch_warnings():  # 3.12+: fork of a process that ran threads (torch)
            warnings.simplefilter("ignore", DeprecationWarning)
            self.pool = ProcessPoolExecutor(
                self.n, mp_context=context, initializer=_start, initargs=(self.state, os.getpid())
            )
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

    def submit(self, function: Callable, part) -> Future:
        """`function(part)` in a worker: its future."""
        return self.pool.submit(function, part)

    def in_order(self, function: Callable, parts: Iterable, depth: int) -> Iterator:
        """`function(part)` for each part, computed by the workers, given back in the parts'
        order; at most `depth` parts submitted and not yet taken."""
        pending: deque[Future] = deque()
        parts = iter(parts)
        try:
            for part in parts:
                pending.append(self.pool.submit(function, part))
                while len(pending) >= max(1, depth):
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
