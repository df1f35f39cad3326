"""headprobe: what do the attention heads of a Transformer do?

Scores every attention head against syntactic dependency arcs, coreference
links and positional proximity (definitions: docs/METHODS.md).

    import headprobe
    results = headprobe.run(treebank="en_ewt-ud-dev.conllu")   # imports torch, transformers
    results = headprobe.load_results("results/minilm")         # reads tables: no torch

The exports are imported on first use (PEP 562 `__getattr__`), so `import headprobe` is cheap
and reading results or building a report never imports torch or transformers.
"""

import importlib
from typing import TYPE_CHECKING

from headprobe.version import __version__ as __version__

if TYPE_CHECKING:  # for type checkers and the import graph (tests/test_imports.py): as _EXPORTS
    from headprobe.api import attention_for_sentence, run  # noqa: F401
    from headprobe.extend import PatternRule, pattern_analysis  # noqa: F401
    from headprobe.model.capture import AttentionCapture, capture_heads  # noqa: F401
    from headprobe.model.discovery import attention_sites  # noqa: F401
    from headprobe.model.loading import load as load_model  # noqa: F401
    from headprobe.model.sites import AttentionSite  # noqa: F401
    from headprobe.results.query import Results, load_results  # noqa: F401
    from headprobe.training.runner import Timeline, timeline  # noqa: F401

# public name -> (module, name there), imported by `__getattr__` on first use
_EXPORTS = {
    "run": ("headprobe.api", "run"),
    "attention_for_sentence": ("headprobe.api", "attention_for_sentence"),
    "AttentionCapture": ("headprobe.model.capture", "AttentionCapture"),
    "capture_heads": ("headprobe.model.capture", "capture_heads"),
    "load_model": ("headprobe.model.loading", "load"),
    "AttentionSite": ("headprobe.model.sites", "AttentionSite"),
    "attention_sites": ("headprobe.model.discovery", "attention_sites"),
    "Results": ("headprobe.results.query", "Results"),
    "load_results": ("headprobe.results.query", "load_results"),
    "PatternRule": ("headprobe.extend", "PatternRule"),
    "pattern_analysis": ("headprobe.extend", "pattern_analysis"),
    "timeline": ("headprobe.training.runner", "timeline"),
    "Timeline": ("headprobe.training.runner", "Timeline"),
}


def __getattr__(name: str):
    """`headprobe.run` and the other exports: imported on first use, then kept here."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'headprobe' has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


def explore(results):
    """The head explorer of `results` (a `Results` or a results directory) as a notebook widget:
    display it, select a head, read `widget.head` ("L-H"). Without widget support it renders as
    the report's self-contained HTML. See `headprobe.report.explorer`."""
    from headprobe.report.explorer.widget import explore as _explore  # noqa: F401

    return _explore(results)


__all__ = ["explore", *_EXPORTS]
