"""Resumable runs: the counts of a run, checkpointed every N batches in `--out`'s lock area.

    <out's lock area>/checkpoint/
        state.json                   fingerprint of the run, the batch size it uses, and per
                                     engine pass (`sentences`, `coreference`): finished?, where
                                     the pass is (`Engine.state`), engine stats
        tallies/<pass>/<tally key>.npz  the scorers' totals (constant size), buffered rows included

A checkpoint is written whole into a new directory and swapped in (`atomic.replace_dir`),
so a kill while writing leaves the previous checkpoint. Where a pass is, every example named
by its ordinal in the corpus: the first `read` examples were read (each scored, skipped, or
held), and of those held, the batches dealt and not yet scored (`queued`) and the examples
`waiting` in the engine's pool for a batch (`inputs.batching.Pool`). The fingerprint holds the
input files' SHA-256, the model, the batching and every option that changes a count, so
`--resume` only continues a run with the same inputs and options; the batch size is recorded
beside it, and a resumed run uses it (a different `--batch-size` is refused). Totals add up in
any order, and the engine rebuilds the queued batches and the pool exactly (the pool's batches
depend on what it holds, not on when it was filled), so a resumed run makes the uninterrupted
run's batches and its tables are identical. The checkpoint is removed after a successful save.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from headprobe.core import atomic
from headprobe.core.errors import UsageError
from headprobe.scoring.tally import Tally

DEFAULT_EVERY = 100  # batches between checkpoints
STATE = "state.json"  # the checkpoint's layout (above); its directory: `atomic.CHECKPOINT`
TALLIES = "tallies"


def tally_path(root: Path, key: str, analysis: str) -> Path:
    return root / TALLIES / key / f"{analysis}.npz"


class Checkpoint:
    """The checkpoint of a run to `out` (the caller holds `out`'s lock)."""

    def __init__(
        self,
        out,
        fingerprint: dict,
        every: int = DEFAULT_EVERY,
        resume: bool = False,
        batch_size: int | None = None,
    ):
        """batch_size: the one asked for (None: the run decides; `batch_size` is then the
        interrupted run's when resuming, else None until the run sets it)."""
        self.out = Path(out)
        self.batch_size = batch_size
        self.dir = atomic.area(out) / atomic.CHECKPOINT
        self.every = int(every)
        self.fingerprint = json.loads(json.dumps(fingerprint, default=str))
        self.state = {"fingerprint": self.fingerprint, "passes": {}}
        self.notes: list[str] = []
        self.resumed = False
        state_path = self.dir / STATE
        if self.dir.exists() and not state_path.is_file():
            shutil.rmtree(self.dir, ignore_errors=True)
        if state_path.is_file():
            if resume:
                try:
                    saved = json.loads(state_path.read_text(encoding="utf-8"))
                except ValueError as err:
                    raise UsageError(
                        f"--resume: the checkpoint {self.dir} is unreadable ({err}); "
                        "run again without --resume to start over"
                    ) from None
                differs = first_difference(saved.get("fingerprint", {}), self.fingerprint)
                if differs:
                    raise UsageError(
                        f"--resume: the checkpoint in {self.dir} is of another run ({differs}); "
                        "give the same inputs and options, or run without --resume to start over"
                    )
                used = saved.get("batch_size")
                if batch_size is not None and used is not None and batch_size != used:
                    raise UsageError(
                        f"--resume: the checkpoint in {self.dir} was made with --batch-size "
                        f"{used}; give --batch-size {used} or leave it out"
                    )
                self.batch_size = batch_size or used
                self.state = saved
                self.resumed = True
                done = sum(1 for p in saved["passes"].values() if p.get("finished"))
                self.notes.append(
                    f"resuming from the checkpoint in {self.dir} "
                    f"({done} of the run's scoring passes finished)"
                )
            else:
                shutil.rmtree(self.dir, ignore_errors=True)
                self.notes.append(
                    f"discarded the checkpoint of an interrupted run in {self.dir} "
                    "(give --resume to continue such a run)"
                )
        elif resume:
            self.notes.append(
                f"--resume: no checkpoint for {self.out}; starting from the beginning"
            )

    # -- per engine pass --------------------------------------------------------------
    def passed(self, key: str) -> dict | None:
        """The saved state of pass `key` (None when it has not started)."""
        return self.state["passes"].get(key)

    def restore(self, key: str, scorers, device) -> dict | None:
        """Give `scorers` their checkpointed totals; the pass's saved state, or None."""
        state = self.passed(key)
        if state is None:
            return None
        for scorer in scorers:
            for name in scorer.tally_keys():
                path = tally_path(self.dir, key, name)
                if not path.is_file():
                    raise UsageError(
                        f"--resume: the checkpoint in {self.dir} lacks {path.name}; "
                        "run without --resume to start over"
                    )
                scorer.tallies_[name] = Tally.load_checkpoint(path, device=device)
        return state

    def save(self, key: str, scorers, state: dict) -> None:
        """Write the totals of pass `key` and its `state` (`Engine.state`, finished)."""
        with atomic.staging(self.out, of=atomic.CHECKPOINT) as new:
            (new / TALLIES / key).mkdir(parents=True)
            for scorer in scorers:
                for name, tally in scorer.tallies_.items():
                    tally.save_checkpoint(tally_path(new, key, name))
            for other in self.state["passes"]:
                if other != key and (self.dir / TALLIES / other).is_dir():
                    shutil.copytree(
                        self.dir / TALLIES / other,
                        new / TALLIES / other,
                        copy_function=_link_or_copy,
                    )
            self.state["passes"][key] = state
            self.state["batch_size"] = self.batch_size
            atomic.write_json(new / STATE, self.state)
            atomic.replace_dir(new, self.dir)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def first_difference(saved, current, where: str = "") -> str:
    """'' when equal, else the first key whose value differs, with both values."""
    if isinstance(saved, dict) and isinstance(current, dict):
        for key in sorted(set(saved) | set(current)):
            found = first_difference(
                saved.get(key), current.get(key), f"{where}.{key}" if where else key
            )
            if found:
                return found
        return ""
    if saved != current:
        return f"{where}: {_short(saved)} then, {_short(current)} now"
    return ""


def _short(value) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."
