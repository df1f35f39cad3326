"""Worker processes that tokenize the corpus ahead of the model (`inputs.read_ahead.Workers`,
`--workers N`): results in order, bounded, errors where they belong, and a run's tables
byte-identical for every number of workers."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

import headprobe
from headprobe.inputs.read_ahead import Workers, default_workers, state
from headprobe.scoring.engine import Engine, forward_cores
from headprobe.scoring.pass_settings import PassSettings
from headprobe.studies.positional.analysis import PositionalScorer

EWT_DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "en_ewt-ud-dev.conllu"


def slow_square(x: int) -> int:
    time.sleep(0.05 * (x % 3))  # later parts often finish first
    return x * x


def failing(x: int) -> int:
    if x == 3:
        raise ValueError(f"part {x} is bad")
    return x


def pid_and_state(_) -> tuple:
    return os.getpid(), state().get("word")


def test_results_come_back_in_order_whichever_worker_is_quicker():
    with Workers(3) as workers:
        got = list(workers.ahead(slow_square, range(12), depth=4))
    assert got == [(x, x * x) for x in range(12)]


def test_each_part_is_sent_as_send_makes_it():
    with Workers(2) as workers:
        got = list(workers.ahead(slow_square, ["a", "bb", "ccc"], depth=2, send=len))
    assert got == [("a", 1), ("bb", 4), ("ccc", 9)]


def test_parts_are_taken_only_as_results_are():
    taken = []

    def parts():
        for x in range(10):
            taken.append(x)
            yield x

    with Workers(2) as workers:
        results = workers.ahead(slow_square, parts(), depth=3)
        assert next(results) == (0, 0)
        time.sleep(0.5)  # the reading thread fills its queue, then waits
        # part 0 taken, 3 submitted and waiting in the queue, 1 submitted and waiting to be put:
        # the corpus is not read ahead unbounded
        assert len(taken) == 5
        assert [r for _, r in results] == [x * x for x in range(1, 10)]


def test_an_error_is_raised_where_its_result_would_come():
    with Workers(2) as workers:
        results = workers.ahead(failing, range(6), depth=2)
        assert [next(results)[1] for _ in range(3)] == [0, 1, 2]
        with pytest.raises(ValueError, match="part 3 is bad"):
            next(results)


def test_workers_are_other_processes_started_with_the_state():
    with Workers(2, word="tokenizer") as workers:
        seen = [r for _, r in workers.ahead(pid_and_state, range(4), depth=2)]
    assert all(pid != os.getpid() and word == "tokenizer" for pid, word in seen)


def test_by_default_workers_take_only_the_cores_the_forward_leaves(bert_family, monkeypatch):
    """An accelerator's forward keeps one core busy (the process feeding it); a forward on the CPU
    keeps torch's intra-op threads busy, so a CPU run starts workers only on cores beyond them."""
    cores = 6
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(cores)))
    assert default_workers() == default_workers(1) == 5
    assert default_workers(4) == 2 and default_workers(6) == default_workers(9) == 0
    assert forward_cores("cuda") == forward_cores("cuda:1") == 1
    settings = PassSettings(progress=False, workers=None)
    saved = torch.get_num_threads()
    try:
        for threads, workers in ((6, 0), (4, 2), (1, 5)):
            torch.set_num_threads(threads)
            assert forward_cores("cpu") == threads
            engine = Engine(bert_family.sdpa, bert_family.tokenizer, [PositionalScorer()], settings)
            assert engine.workers == workers, f"{threads} threads"
        asked = Engine(
            bert_family.sdpa,
            bert_family.tokenizer,
            [PositionalScorer()],
            PassSettings(progress=False, workers=3),
        )
        assert asked.workers == 3  # a number given is taken as it is
    finally:
        torch.set_num_threads(saved)


def orphaned_workers(ready: str) -> None:
    """A process that starts two workers, says so, then waits to be killed."""
    with Workers(2) as workers:
        assert list(workers.ahead(slow_square, range(2), depth=2)) == [(0, 0), (1, 1)]
        Path(ready).write_text(" ".join(str(p) for p in workers.pool._processes))
        time.sleep(60)


def test_workers_end_when_the_run_is_killed(tmp_path):
    """SIGKILL of the process that started them (nothing can tell them): the workers end within
    a second, and do not hold its output pipes open."""
    import multiprocessing
    import signal

    ready = tmp_path / "ready"
    parent = multiprocessing.get_context("fork").Process(
        target=orphaned_workers, args=(str(ready),)
    )
    parent.start()
    deadline = time.monotonic() + 30
    while not ready.exists() or not ready.read_text():
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.05)
    pids = [int(p) for p in ready.read_text().split()]
    os.kill(parent.pid, signal.SIGKILL)
    parent.join()
    deadline = time.monotonic() + 5
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in pids if Path(f"/proc/{p}").exists() and not zombie(p)]
    assert not alive, f"workers {alive} outlived the killed run"


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return False


def first_sentences(n: int, out: Path) -> Path:
    blocks = EWT_DEV.read_text(encoding="utf-8").strip().split("\n\n")[:n]
    out.write_text("\n\n".join(blocks) + "\n\n", encoding="utf-8")
    return out


@pytest.mark.skipif(not EWT_DEV.is_file(), reason="needs ../shared/data (UD English EWT dev)")
def test_tables_are_byte_identical_for_any_number_of_workers(bert_family, tmp_path):
    """700 sentences of EWT dev (three chunks of 256 in flight at once) scored by the tiny BERT
    with the input tokenized in this process's thread (0) and in 1, 2 and 4 worker processes:
    every table file the same, byte for byte; the words scored all of the corpus's."""
    treebank = first_sentences(700, tmp_path / "ewt-700.conllu")
    loaded = (bert_family.sdpa, bert_family.tokenizer, "tiny bert")
    tables = {}
    for workers in (0, 1, 2, 4):
        out = tmp_path / f"w{workers}"
        results = headprobe.run(
            treebank=treebank, out=out, progress=False, loaded=loaded, workers=workers
        )
        run = results.summary["runs"]["sentences"]
        skipped = results.summary["skipped"]
        tables[workers] = {p.name: p.read_bytes() for p in sorted(out.glob("*.csv"))}
        tables[workers]["runs and skips"] = (run["examples"], run["words"], skipped)
    examples, _, skipped = tables[0]["runs and skips"]
    # the tiny BERT's 64 positions leave out the longest sentences: every one accounted for
    assert examples > 600 and examples + skipped["sentences_too_long"] == 700
    assert len(tables[0]) >= 6 and "counts.csv" in tables[0]
    for workers in (1, 2, 4):
        assert tables[workers] == tables[0], f"--workers {workers}"
