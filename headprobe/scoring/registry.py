"""One home per analysis: each analysis declares everything about itself here.

    from headprobe.scorers.registry import Analysis, register

    register(Analysis(
        name="my_pattern", scorer=MyScorer,                # a CountScorer subclass
        selection=True,                                    # best heads, held-out, intervals
        family=lambda label, n: n >= 50,                   # labels in the role family (Holm)
        roles=(RoleRule("my_role", order=3.5, ...),),      # its rule in the head-role map
        tables={"my_table": lambda results: ...},          # derived tables, saved with the results
        report="my_module:my_section",                     # section(results, name) (default: heatmaps)
    ))

What the generic code needs to know about an analysis is declared here, never tested by its name:
which corpus it reads (`input`), which labels' best heads the CLI and the summary show
(`headline`), what the CLI prints of it after a run (`console`), which example pictures its best
heads get (`pictures`), which run options only it reads (`options`), which run switch adds it
(`added_by`) and its report section (`report`, `measures_report`). The order of analyses is
`ordered(names)`, computed here once.

`api`, `stats`, `results`, the CLI and the report read this registry and hold no
list of analyses. The built-in analyses register themselves in their scorer
modules (`headprobe/scorers/*.py`); other packages can add theirs through the
`headprobe.analyses` entry-point group, or by importing a module that calls
`register` before `headprobe.run`. See docs/ARCHITECTURE.md, "Adding an analysis".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from headprobe.model.control import TRAINED
from headprobe.scoring.measures import WEIGHTS
from headprobe.stats.engine import MIN_N

BUILTIN_MODULES = (
    "headprobe.scorers.dependency",
    "headprobe.scorers.coreference",
    "headprobe.scorers.positional",
    "headprobe.scorers.surface",
    "headprobe.scorers.previous_token",
    "headprobe.scorers.duplicate_token",
    "headprobe.scorers.induction",
    "headprobe.scorers.sink",
    "headprobe.scorers.head_similarity",
    "headprobe.scorers.parsing",
    "headprobe.scorers.ablation",
    "headprobe.scorers.logit_attribution",
    "headprobe.scorers.ov_copying",
)
# which corpus an analysis reads; "probe": token sequences, a probe's (`headprobe.inputs.probes`,
# `run(probe=...)`) where one is given, else the sentence corpus at piece level; "any": whichever
# the run reads (analyses that run the model itself: head ablation): the sentence corpus where
# one is given, else the probe, else the coreference windows, else the bundled sample
SENTENCES, COREFERENCE, PROBE, ANY = INPUTS = ("sentences", "coreference", "probe", "any")
# the example pictures of an analysis's best heads (`headprobe.results.examples`): a head's attention on a
# sentence holding its relation, with the gold arcs; on a mention and its nearest antecedent
ARCS, MENTIONS = PICTURES = ("arcs", "mentions")


@dataclass(frozen=True)
class RoleRule:
    """A head role: `match(results)` gives one row per head that meets the rule, with columns
    layer, head, detail (what the role names), short (a cell label), evidence (the numbers
    that decided it). Roles are tried in `order`; a head gets the first it meets."""

    role: str
    order: float
    color: str
    description: str
    match: Callable


@dataclass(frozen=True)
class Analysis:
    name: str
    scorer: type
    input: str = SENTENCES
    selection: bool = True
    description: str = ""
    family: Callable | None = None
    min_n: int = MIN_N  # the fewest trials a label needs to name a best head or a role
    roles: tuple = ()
    tables: dict = field(default_factory=dict)
    report: str | Callable | None = None
    console: str | Callable | None = None  # text(results, name): what the CLI prints after a run
    # blocks(results, name, first, second): what the report's weights-beside-norms section shows of it
    measures_report: str | Callable | None = None
    default: bool = True  # run when no analyses are named
    cross: bool = False  # defined on cross-attention (decoder queries, encoder keys)
    headline: tuple = ()  # labels the run summary's headline keeps; the CLI prints its best heads
    pictures: str | None = None  # one of PICTURES: example pictures of its best heads
    options: tuple = ()  # RunConfig fields only it reads: given without it, a usage error
    added_by: str | None = None  # a RunConfig switch that adds it to the analyses run
    homes: tuple = ()  # other modules of its own (beside its scorer's and report's)

    @property
    def directions(self) -> tuple[str, ...]:
        return tuple(self.scorer.directions)

    @property
    def baselines(self) -> tuple[str, ...]:
        return tuple(self.scorer.variants)

    def make_scorer(self, model: str = TRAINED, measure: str = WEIGHTS, **options):
        """A new scorer for this analysis counting `model` ("trained", or the random-init "control")
        on `measure` (METHODS §7: "weights" or "norms")."""
        scorer = self.scorer(**options)
        scorer.model = model
        scorer.measure = measure
        return scorer

    def report_section(self):
        """The callable that renders this analysis's report section, `section(results, name) ->
        report.document.Section` (given the analysis's registered name), or None for the default."""
        return _resolve(self.report)

    def measures_blocks(self):
        """The callable `blocks(results, name, first, second) -> [report blocks]` of the report's
        weights-beside-norms section (METHODS §7), or None."""
        return _resolve(self.measures_report)

    def console_text(self):
        """The callable `text(results, name) -> str` whose text the CLI prints after a run, or None."""
        return _resolve(self.console)


def _resolve(ref: str | Callable | None):
    """A callable given as itself or as "module:name" (imported only when asked for), or None."""
    if ref is None or callable(ref):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


_REGISTRY: dict[str, Analysis] = {}
_loaded = False


def register(analysis: Analysis) -> Analysis:
    """Add (or replace) an analysis; returns it, so a module can keep it as a constant."""
    if analysis.pictures is not None and analysis.pictures not in PICTURES:
        raise ValueError(
            f"analysis {analysis.name!r}: pictures must be one of {PICTURES}, not {analysis.pictures!r}"
        )
    if analysis.input not in INPUTS:
        raise ValueError(
            f"analysis {analysis.name!r}: input must be one of {INPUTS}, not {analysis.input!r}"
        )
    if analysis.scorer.analysis != analysis.name:
        raise ValueError(
            f"analysis {analysis.name!r}: its scorer says analysis = {analysis.scorer.analysis!r}"
        )
    _REGISTRY[analysis.name] = analysis
    return analysis


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in BUILTIN_MODULES:
        importlib.import_module(module)
    try:
        from importlib.metadata import entry_points

        for entry in entry_points(group="headprobe.analyses"):
            entry.load()
    except Exception:  # a broken plugin must not break the built-ins   # pragma: no cover
        pass


def _rank(name: str) -> int:
    """Where analysis `name` goes: its module's place in `BUILTIN_MODULES`, else after them (an
    analysis of another package, or one no longer registered)."""
    analysis = _REGISTRY.get(name)
    module = analysis.scorer.__module__ if analysis is not None else None
    return BUILTIN_MODULES.index(module) if module in BUILTIN_MODULES else len(BUILTIN_MODULES)


def ordered(names) -> list[str]:
    """`names` in the analyses' order: the built-ins in `BUILTIN_MODULES` order (whatever order
    their modules were imported in), then the others in the order given (the report's sections
    and `analyses` both read it)."""
    _load()
    return sorted(names, key=_rank)


def analyses(input: str | None = None) -> list[Analysis]:
    """Registered analyses in their order (`ordered`): the built-ins, then the others in
    registration order."""
    _load()
    return [
        _REGISTRY[name]
        for name in ordered(list(_REGISTRY))
        if input is None or _REGISTRY[name].input == input
    ]


def names(input: str | None = None) -> list[str]:
    return [a.name for a in analyses(input)]


def headlines() -> list[str]:
    """Names of the analyses whose best heads the CLI prints after a run (`Analysis.headline`)."""
    return [a.name for a in analyses() if a.headline]


def headline_labels() -> list[str]:
    """The labels whose best heads a run's summary keeps as its headline (`Analysis.headline`)."""
    return list(dict.fromkeys(label for a in analyses() for label in a.headline))


def pictured(kind: str) -> list[str]:
    """Names of the analyses whose best heads get example pictures of `kind` (one of PICTURES)."""
    return [a.name for a in analyses() if a.pictures == kind]


def reading(option: str) -> list[str]:
    """Names of the analyses that read run option `option` (a RunConfig field; `Analysis.options`)."""
    return [a.name for a in analyses() if option in a.options]


def get(name: str) -> Analysis:
    _load()
    if name not in _REGISTRY:
        raise ValueError(f"unknown analysis {name!r}; choose from {', '.join(names())}")
    return _REGISTRY[name]


def min_n(name: str) -> int:
    """The fewest trials a label of analysis `name` needs to be named a best head or a role
    (METHODS §5); the default for a name no longer registered (results of a removed plugin)."""
    _load()
    analysis = _REGISTRY.get(name)
    return analysis.min_n if analysis is not None else Analysis.min_n


def role_rules() -> list[tuple[Analysis, RoleRule]]:
    """Every registered role rule with its analysis, in the order roles are tried."""
    rules = [(a, rule) for a in analyses() for rule in a.roles]
    return sorted(rules, key=lambda pair: pair[1].order)


def declaring(rule: RoleRule) -> list[str]:
    """Names of the registered analyses that declare `rule` in their `roles` (usually one): a
    rule written once reads the data of whichever analysis declares it."""
    return [a.name for a, r in role_rules() if r is rule]
