"""Worker processes: the one place that says how headprobe starts them and how many cores it
may give them (`usable_cores`).

    with worker_pool(2, initializer=start, initargs=(state,)) as pool:   # started, ready
        pool.submit(function, part)

Forked where the platform has it (Linux: the workers start with everything imported, the
parent's objects inherited, nothing pickled but what is submitted) and spawned elsewhere (the
submitted functions and the initializer's arguments must be importable and picklable). Every
worker is started here, in the calling thread: a forked pool would otherwise fork at its first
`submit`, from whatever thread submits, outside the guard on Python 3.12's warning about forking
a process that ran threads (torch's).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor


def worker_pool(n: int, **kwargs) -> ProcessPoolExecutor:
    """A `ProcessPoolExecutor` of `n` workers (`kwargs`: its initializer, initargs), all started."""
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context(
        "fork" if sys.platform == "linux" and "fork" in methods else "spawn"
    )
    with warnings.catch_warnings():  # 3.12+: fork of a process that ran threads (torch)
        warnings.simplefilter("ignore", DeprecationWarning)
        pool = ProcessPoolExecutor(n, mp_context=context, **kwargs)
        for done in [pool.submit(int) for _ in range(n)]:  # every worker started here
            done.result()
    return pool


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform tells it, else
    every core of the machine)."""
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return len(cores) if cores else (os.cpu_count() or 1)
