"""The reader-and-tokenizer worker (`inputs.read_ahead.prefetched`): order, errors, early exit."""

from __future__ import annotations

import threading
import time

import pytest

from headprobe.inputs.read_ahead import prefetched


def test_chunks_come_in_order_with_their_work():
    got = list(prefetched(iter([[1, 2], [3], [4, 5, 6]]), sum))
    assert got == [([1, 2], 3), ([3], 3), ([4, 5, 6], 15)]


def test_work_runs_ahead_of_the_consumer_but_at_most_depth_chunks():
    started = []

    def work(chunk):
        started.append(chunk)
        return chunk

    stream = prefetched(iter(range(10)), work, depth=2)
    assert next(stream) == (0, 0)
    time.sleep(0.3)  # the worker fills the queue, then waits
    # chunk 0 handed over, 2 waiting in the queue, 1 done and waiting to be put
    assert len(started) == 4
    assert [x for x, _ in stream] == list(range(1, 10))


def test_an_error_of_the_reader_is_raised_where_its_chunk_would_come():
    def chunks():
        yield [1]
        yield [2]
        raise ValueError("corpus.conllu line 7: bad row")

    stream = prefetched(chunks(), len)
    assert next(stream) == ([1], 1)
    assert next(stream) == ([2], 1)
    with pytest.raises(ValueError, match="line 7"):
        next(stream)


def test_leaving_early_stops_the_worker():
    before = threading.active_count()
    stream = prefetched(iter(range(1000)), lambda c: c, depth=1)
    next(stream)
    stream.close()  # the consumer leaves the loop (an exception, a break)
    time.sleep(0.3)
    assert threading.active_count() == before
