"""What software made a run (METHODS §15): recorded in `summary["software"]` at run time.

    record()      # {"headprobe": "0.1.0", "commit": "ff018f4...", "transformers": "5.0.0",
                  #  "torch": "2.13.0", "python": "3.11.9"}

`commit` is the git commit of the checkout headprobe was imported from (`-dirty` appended when
tracked files differ from it), absent for an installed wheel. The run's dtype and device are
recorded beside it (`summary["dtype"]`, `summary["device"]`).
"""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the checkout holding headprobe/, if any


def package_version(name: str) -> str:
    """The installed version of distribution `name`, else 'unknown'."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


def headprobe_version() -> str:
    """The installed distribution's version, else the source tree's `__version__`."""
    version = package_version("headprobe")
    if version == "unknown":
        from headprobe.version import __version__ as version
    return version


def git_commit(root: Path = PACKAGE_ROOT) -> str | None:
    """HEAD of the git checkout at `root` (`-dirty` if tracked files changed), or None."""
    if not (root / ".git").exists():
        return None

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
        )
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


def record() -> dict:
    """{headprobe, commit (from a checkout only), transformers, torch, python} versions."""
    out = {"headprobe": headprobe_version()}
    commit = git_commit()
    if commit:
        out["commit"] = commit
    out["transformers"] = package_version("transformers")
    out["torch"] = package_version("torch")
    out["python"] = platform.python_version()
    return out
