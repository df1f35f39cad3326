"""headprobe: what do the attention heads of a pretrained Transformer do?

Scores every attention head against syntactic dependency arcs, coreference
links and positional proximity (definitions: docs/METHODS.md).
"""

from headprobe.api import attention_for_sentence, run
from headprobe.model.capture import AttentionCapture, capture_heads
from headprobe.model.loading import load as load_model
from headprobe.model.sites import AttentionSite, attention_sites
from headprobe.results.query import Results, load_results
from headprobe.studies.token_patterns.patterns import PatternRule, pattern_analysis
from headprobe.version import __version__ as __version__


def explore(results):
    """The head explorer of `results` (a `Results` or a results directory) as a notebook widget:
    display it, select a head, read `widget.head` ("L-H"). Without widget support it renders as
    the report's self-contained HTML. See `headprobe.report.explorer`."""
    from headprobe.report.explorer.widget import explore as _explore

    return _explore(results)


__all__ = [
    "run",
    "explore",
    "load_results",
    "load_model",
    "attention_for_sentence",
    "AttentionCapture",
    "capture_heads",
    "Results",
    "pattern_analysis",
    "PatternRule",
    "attention_sites",
    "AttentionSite",
]
