"""The errors a user sees as one line: a bad option, path or request, found before the work it
would spoil, and attention that cannot be captured exactly.

    from headprobe.core.errors import UsageError
    raise UsageError("--layers 7: the model has 6 layers (0-5)")

The CLI prints their message as one line and exits with status 2 (`headprobe.cli.USER_ERRORS`
lists them beside the errors the other layers own: `CorpusError`, `ResultsError`). They sit at the
bottom so that every layer can raise them without importing the option checks, and the CLI can
name `CaptureError` without importing the model layer (torch, transformers).
"""

from __future__ import annotations


class UsageError(ValueError):
    """A bad option or path, found before the run does any work (CLI exit status 2)."""


class CaptureError(ValueError):
    """Attention that cannot be captured exactly, or a capture that delivered less than asked
    (`headprobe.model`: the attention sites and the capture raise it; CLI exit status 2)."""
