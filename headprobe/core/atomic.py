"""Directories that are whole or absent: staging, atomic swap, lock; file hashes and JSON.

The low-level primitives of `headprobe.results.store` (which owns what goes in a results
directory) and `headprobe.scoring.checkpoint`. A directory `OUT` is never written in place.
Everything goes into a staging directory in OUT's *lock area*, a hidden sibling
`.<name>.headprobe/` on the same file system, and is moved into place with one rename (an
atomic exchange with the old directory on Linux), so a reader sees the complete old
directory or the complete new one, never a mix:

    with OutLock(out):                     # one live process per OUT
        recover(out)                       # leftovers of a process that was killed
        with staging(out) as stage:        # removed on the way out, whatever happens
            ...write into stage...
            fsync_tree(stage)
            replace_dir(stage, out)

    .<name>.headprobe/
        lock              held by the live run (flock); JSON: pid, host, start time, argv
        checkpoint/       resumable counts of an interrupted run (`headprobe.scoring.checkpoint`)
        stage-<id>/       the next OUT being written
        old-<id>/         the previous OUT on its way out

This module imports no other headprobe module (a process can hold a lock without torch).

Tests kill a run at a known point with `HEADPROBE_TEST_PAUSE_AT=scoring|saving[:N]`
(the N-th time the point is reached, default 1): the process says so on stderr,
touches `HEADPROBE_TEST_PAUSE_READY` if set, and sleeps until killed, or until the
file `HEADPROBE_TEST_PAUSE_RELEASE` exists.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as _dt
import errno
import hashlib
import json
import os
import shutil
import socket
import sys
import time
import uuid
from pathlib import Path

import numpy as np

LOCK = "lock"  # the lock area's names (see above)
CHECKPOINT = "checkpoint"


class OutInUse(RuntimeError):
    """Another live run holds the output directory."""


# ----------------------------------------------------------------------------------------
# paths
# ----------------------------------------------------------------------------------------
def area(out: str | Path) -> Path:
    """The lock area of `out`: a hidden sibling on the same file system."""
    out = Path(out).absolute()
    return out.parent / f".{out.name}.headprobe"


def now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


# ----------------------------------------------------------------------------------------
# hashes and JSON
# ----------------------------------------------------------------------------------------
def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def sha256_tree(path: str | Path) -> str:
    """One hash over a directory's files (relative names and contents, sorted)."""
    root = Path(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(file.relative_to(root).as_posix().encode() + b"\0")
        digest.update(sha256_file(file).encode())
    return digest.hexdigest()


def json_default(value):
    """`json.dumps(..., default=json_default)`: numpy scalars and paths as plain JSON values."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def write_json(path: Path, value, indent: int | None = 2) -> None:
    """`value` as UTF-8 JSON (numpy scalars and paths allowed) in `path`."""
    path.write_text(json.dumps(value, indent=indent, default=json_default), encoding="utf-8")


def fsync_tree(directory: Path) -> None:
    """Flush a staged directory's files and folders to disk before it is renamed into place."""
    for path in sorted(directory.rglob("*"), reverse=True) + [directory]:
        flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
        try:
            fd = os.open(path, flags)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


# ----------------------------------------------------------------------------------------
# atomic replacement
# ----------------------------------------------------------------------------------------
RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_renameat2 = None


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    global _renameat2
    if not sys.platform.startswith("linux"):
        return False
    if _renameat2 is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            _renameat2 = libc.renameat2
            _renameat2.argtypes = [
                ctypes.c_int,
                ctypes.c_char_p,
                ctypes.c_int,
                ctypes.c_char_p,
                ctypes.c_uint,
            ]
        except (OSError, AttributeError):
            _renameat2 = False
    if not _renameat2:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def replace_dir(staged: Path, target: Path) -> None:
    """Move `staged` to `target`, replacing a directory already there in one step.

    Where the atomic exchange is not available, the old directory is first moved aside to
    `aside(staged)`, which `recover` puts back if the process dies before the new one is in
    place."""
    staged, target = Path(staged), Path(target)
    if not target.exists():
        os.rename(staged, target)
    elif _exchange(staged, target):
        shutil.rmtree(staged, ignore_errors=True)  # now holds the old directory
    else:
        old = aside(staged)
        os.rename(target, old)
        os.rename(staged, target)
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(target.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def new_stage(out: str | Path, of: str | None = None) -> Path:
    """A fresh, empty staging directory in `out`'s lock area: the next `out` (`stage-<id>`),
    or, with `of`, the next copy of the lock area's directory `of` (`<of>.new-<id>`)."""
    place = area(out)
    place.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    stage = place / (f"stage-{tag}" if of is None else f"{of}.new-{tag}")
    stage.mkdir()
    return stage


def aside(stage: Path) -> Path:
    """Where the directory that `stage` replaces waits while it is swapped (no atomic exchange)."""
    name = stage.name
    return stage.with_name(
        "old-" + name[len("stage-") :]
        if name.startswith("stage-")
        else name.replace(".new-", ".old-", 1)
    )


@contextlib.contextmanager
def staging(out: str | Path, of: str | None = None):
    """`new_stage(out, of)`, removed on the way out (after `replace_dir` moved it: nothing left)."""
    stage = new_stage(out, of)
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def recover(out: str | Path) -> list[str]:
    """Tidy the lock area of `out` (call with the lock held): staging directories of dead
    processes are removed, and an old directory whose replacement never arrived (a kill
    between the two renames, where no atomic exchange exists) is put back. Returns notes."""
    out = Path(out).absolute()
    place = area(out)
    notes = []
    if not place.is_dir():
        return notes
    for pattern, target in (("old-*", out), (f"{CHECKPOINT}.old-*", place / CHECKPOINT)):
        for path in sorted(place.glob(pattern)):
            if not target.exists():
                os.rename(path, target)
                if target == out:
                    notes.append(f"put back the previous results of {out} (a save was interrupted)")
            else:
                shutil.rmtree(path, ignore_errors=True)
    for path in sorted(place.glob("stage-*")) + sorted(place.glob(f"{CHECKPOINT}.new-*")):
        pid = _pid_of(path.name)
        if pid is None or pid == os.getpid() or not pid_alive(pid):
            shutil.rmtree(path, ignore_errors=True)
    return notes


def _pid_of(name: str) -> int | None:
    parts = name.split(".")[-1].split("-")
    try:
        return int(parts[1])
    except (IndexError, ValueError):
        return None


def remove_area_if_empty(out: str | Path) -> None:
    try:
        area(out).rmdir()
    except OSError:
        pass


# ----------------------------------------------------------------------------------------
# the lock
# ----------------------------------------------------------------------------------------
def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def describe_holder(info: dict) -> str:
    if not info:
        return "another run (it is starting up)"
    argv = " ".join(info.get("argv") or [])
    return f"pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}" + (
        f": {argv}" if argv else ""
    )


_HELD: dict[str, OutLock] = {}


class OutLock:
    """Exclusive hold on an output directory for one process (re-entrant within it).

    The lock file `<area>/lock` carries an advisory `flock`, which the kernel drops when the
    holder dies, and names the holder (pid, host, start time, command). A lock file left by
    a dead process is taken over; one held by a live process raises `OutInUse`."""

    def __init__(self, out: str | Path):
        self.out = Path(out).absolute()
        self.path = area(self.out) / LOCK
        self.fd: int | None = None
        self.depth = 0
        self.notes: list[str] = []

    def __enter__(self) -> OutLock:
        held = _HELD.get(str(self.path))
        if held is not None:
            held.depth += 1
            self._outer = held
            return held
        self._outer = None
        self.acquire()
        _HELD[str(self.path)] = self
        self.depth = 1
        return self

    def __exit__(self, *exc) -> None:
        target = self._outer or self
        target.depth -= 1
        if target.depth == 0:
            _HELD.pop(str(target.path), None)
            target.release()

    def acquire(self) -> None:
        import fcntl

        for _ in range(100):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:  # the area was just removed by a finishing run
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                info = _read_info(fd)
                os.close(fd)
                if (
                    info.get("host") == socket.gethostname()
                    and isinstance(info.get("pid"), int)
                    and not pid_alive(info["pid"])
                ):
                    # the holder died, but a process it forked still has the file open
                    self.notes.append(
                        f"took over the lock of {describe_holder(info)} (no longer running)"
                    )
                    try:
                        os.unlink(self.path)
                    except FileNotFoundError:
                        pass
                    continue
                raise OutInUse(
                    f"{self.out} is in use by {describe_holder(info)}; wait for it to finish, "
                    f"or choose another --out (lock: {self.path})"
                ) from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # released and unlinked under us: try again
                os.close(fd)
                continue
            previous = _read_info(fd)
            if previous:
                self.notes.append(
                    f"took over the stale lock of {describe_holder(previous)} (no longer running)"
                )
            info = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": now(),
                "argv": list(sys.argv),
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
            os.fsync(fd)
            self.fd = fd
            self.info = info
            return
        raise OutInUse(f"{self.out}: could not take the lock {self.path}")

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)  # unlinked while still held: no one can take a dead file
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = None
        remove_area_if_empty(self.out)


def _read_info(fd: int) -> dict:
    try:
        data = os.pread(fd, 65536, 0)
        info = json.loads(data.decode()) if data.strip() else {}
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


def holder(out: str | Path) -> dict | None:
    """Who holds `out` now (the lock file's JSON), or None when no live run does."""
    import fcntl

    path = area(out) / LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_info(fd)
    finally:
        os.close(fd)
    return None


# ----------------------------------------------------------------------------------------
# test hook: stop at a known point so that a test can kill the process there
# ----------------------------------------------------------------------------------------
_REACHED: dict[str, int] = {}


def test_pause(point: str) -> None:
    wanted = os.environ.get("HEADPROBE_TEST_PAUSE_AT")
    if not wanted:
        return
    name, _, count = wanted.partition(":")
    if name != point:
        return
    _REACHED[point] = _REACHED.get(point, 0) + 1
    if _REACHED[point] != (int(count) if count else 1):
        return
    print(f"headprobe: test pause at {point} (pid {os.getpid()})", file=sys.stderr, flush=True)
    ready = os.environ.get("HEADPROBE_TEST_PAUSE_READY")
    if ready:
        Path(ready).write_text(str(os.getpid()))
    release = os.environ.get("HEADPROBE_TEST_PAUSE_RELEASE")
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        if release and Path(release).exists():
            return
        time.sleep(0.05)
