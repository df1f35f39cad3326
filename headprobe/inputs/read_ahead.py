"""Reading and tokenizing ahead of the model: a thread (`prefetched`) that reads the corpus
(and tokenizes it, with `--workers 0`), and worker processes (`Workers`, `--workers N`) that
tokenize and align each chunk while the model scores the batches before it.

    for chunk, done in prefetched(chunks, work):          # work(chunk) in a thread, in order
        ...
    with Workers(2, tokenizer=tokenizer) as workers:      # two processes that hold the tokenizer
        for chunk, alignments in workers.ahead(align_in_worker, chunks, 4, example_inputs):
            ...                                           # each chunk's words sent, in order

Order is kept: results come back in the order of their parts, whatever worker was quicker, so
a run's tables do not depend on the number of workers. Memory is bounded: at most `depth` parts
are in the workers or waiting to be taken. An exception raised by `function` is raised where
its result would have come.

The workers are started by `core.processes.worker_pool` (forked on Linux: they start with the
parent's modules and tokenizer; spawned elsewhere: the tokenizer is pickled); a part and its result always travel pickled, so a worker
is sent a chunk's words and sends back its alignments, never the examples. Reading itself stays
in this process: reading in workers was measured, and unpickling the examples they sent back
cost this process as much as reading them (benchmarks/README.md, "The host's ceiling").
`default_workers(busy)`: the cores this process may use, less the `busy` ones the model's forward
keeps working (the engine's count: one that feeds an accelerator, or every intra-op thread of a
forward on the CPU, where a worker would take a core from the forward).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor

from headprobe.core.processes import usable_cores, worker_pool


def default_workers(busy: int = 1) -> int:
    """The cores this process may use, less the `busy` ones the model's forward keeps working;
    0 when none is left."""
    return max(0, usable_cores() - max(1, int(busy)))


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
            for chunk, alignments in workers.ahead(align_in_worker, chunks, 4, example_inputs):
                ...

    A hand-written pool around `concurrent.futures.ProcessPoolExecutor` rather than
    `multiprocessing.Pool.imap`: `imap` takes parts from its iterator as fast as it can (the
    whole corpus read ahead, unbounded memory); `ahead` takes them through `prefetched`, at
    most `depth` waiting."""

    def __init__(self, n: int, **state):
        self.n, self.state = int(n), state
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Workers:
        self.pool = worker_pool(self.n, initializer=_start, initargs=(self.state, os.getpid()))
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

    def ahead(
        self, function: Callable, parts: Iterable, depth: int, send: Callable | None = None
    ) -> Iterator[tuple]:
        """(part, function(send(part))) for each part, in the parts' order: the parts taken by a
        thread (`prefetched`: at most `depth` submitted and waiting to be taken), each computed
        by a worker, sent `send(part)` (default: the part itself)."""

        def submit(part) -> Future:
            return self.pool.submit(function, part if send is None else send(part))

        for part, future in prefetched(parts, submit, depth=depth):
            yield part, future.result()
