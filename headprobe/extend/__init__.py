"""Extending headprobe: the one module a plugin imports (docs/EXTENDING.md, the reference).

    from headprobe.extend import Option, UsageError, pattern_analysis, register

Every name in `__all__` is the supported API: tests/test_extend_api.py fails when one
disappears, and the built-in studies import these names from here, not from the modules that
define them, so the door other packages use is the one the project's own analyses use.

- declaring: `register`, `unregister`, `Analysis`, `RoleRule`, `Probe`, `register_probe`, the
  inputs an analysis reads (`SENTENCES`, `COREFERENCE`, `PROBE`, `ANY`, `WEIGHTS_ONLY`, `TASK`), the
  pictures (`ARCS`, `MENTIONS`) and `PLUGIN_ORDER`;
- options and checks: `Option`, `GIVEN`, `ModelFacts`, `UsageError`;
- token patterns: `pattern_analysis`, `PatternRule`, `PatternScorer`, `PatternExample`;
- scorers: `CountScorer`, `BatchState`, `RowIndex`, `BothIndex`, `masked_word_attention`,
  `first_argmax`, `WeightsScorer`;
- probes' examples: `Example`, `Stream`, `Corpus`, `LOSS_WORDS`, `wrap`, `special_ids`,
  `vocabulary`;
- report sections: `Section`, `Table`, `Paragraph`, `Cell`, `BulletList`, `Details`, `Figure`,
  `head_name`;
- what a section or a table reads: `Results` (`results.table(name)`, `head_scores`,
  `head_values`, `best_head`, `labels`, `summary`, ...), `head_table`, `PAIR_KEYS`;
- a weights-only scorer's model access (imported on first use: they import torch):
  `attention_sites`, `value_weight`, `output_weight`.

Importing this module imports neither torch nor transformers, nor the report's renderers: the
registry imports every analysis when a report is read (tests/test_light_imports.py).
"""

import importlib
from typing import TYPE_CHECKING

from headprobe.core.errors import UsageError
from headprobe.extend.patterns import (
    PatternExample,
    PatternRule,
    PatternScorer,
    pattern_analysis,
)
from headprobe.inputs.corpora.base import Corpus, Example, Stream
from headprobe.inputs.probes import LOSS_WORDS, special_ids, vocabulary, wrap
from headprobe.report.document import (
    BulletList,
    Cell,
    Details,
    Figure,
    Paragraph,
    Section,
    Table,
)
from headprobe.scoring.options import GIVEN, ModelFacts, Option
from headprobe.scoring.registry import (
    ANY,
    ARCS,
    CIRCUIT_COLUMN,
    COREFERENCE,
    MENTIONS,
    PLUGIN_ORDER,
    PROBE,
    SENTENCES,
    TASK,
    WEIGHTS_ONLY,
    Analysis,
    Probe,
    RoleRule,
    register,
    register_probe,
    unregister,
)
from headprobe.scoring.scorer_base import (
    BatchState,
    BothIndex,
    CountScorer,
    RowIndex,
    first_argmax,
    masked_word_attention,
)
from headprobe.scoring.weights_scorer import WeightsScorer
from headprobe.stats.heads import head_table
from headprobe.stats.pair_estimates import PAIR_KEYS

if TYPE_CHECKING:  # for type checkers and the import graph (tests/test_imports.py): as _LAZY
    from headprobe.model.discovery import attention_sites  # noqa: F401
    from headprobe.model.sites import output_weight, value_weight  # noqa: F401
    from headprobe.report.rendered_tables import head_name  # noqa: F401
    from headprobe.results.query import Results  # noqa: F401

# name -> module: imported on first use (torch, or the results layer, behind them)
_LAZY = {
    "attention_sites": "headprobe.model.discovery",
    "value_weight": "headprobe.model.sites",
    "output_weight": "headprobe.model.sites",
    "head_name": "headprobe.report.rendered_tables",
    "Results": "headprobe.results.query",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'headprobe.extend' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    # declaring an analysis or a probe
    "register",
    "unregister",
    "Analysis",
    "RoleRule",
    "Probe",
    "register_probe",
    "SENTENCES",
    "COREFERENCE",
    "PROBE",
    "ANY",
    "WEIGHTS_ONLY",
    "TASK",
    "ARCS",
    "MENTIONS",
    "PLUGIN_ORDER",
    "CIRCUIT_COLUMN",
    # options and checks
    "Option",
    "GIVEN",
    "ModelFacts",
    "UsageError",
    # token patterns
    "pattern_analysis",
    "PatternRule",
    "PatternScorer",
    "PatternExample",
    # scorers
    "CountScorer",
    "BatchState",
    "RowIndex",
    "BothIndex",
    "masked_word_attention",
    "first_argmax",
    "WeightsScorer",
    # a probe's examples
    "Example",
    "Stream",
    "Corpus",
    "LOSS_WORDS",
    "wrap",
    "special_ids",
    "vocabulary",
    # report sections
    "Section",
    "Table",
    "Paragraph",
    "Cell",
    "BulletList",
    "Details",
    "Figure",
    "head_name",
    # what sections and tables read
    "Results",
    "head_table",
    "PAIR_KEYS",
    # a weights-only scorer's model access
    "attention_sites",
    "value_weight",
    "output_weight",
]
