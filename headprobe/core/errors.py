"""The error of a bad option, path or request, found before the work it would spoil.

    from headprobe.core.errors import UsageError
    raise UsageError("--layers 7: the model has 6 layers (0-5)")

The CLI prints its message as one line and exits with status 2 (`headprobe.cli.USER_ERRORS`
lists it beside the errors the other layers own: `CorpusError`, `CaptureError`, `ResultsError`).
It sits at the bottom so that every layer can raise it without importing the option checks.
"""

from __future__ import annotations


class UsageError(ValueError):
    """A bad option or path, found before the run does any work (CLI exit status 2)."""
