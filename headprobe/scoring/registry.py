"""One home per analysis: each analysis declares everything about itself here.

    from headprobe.scoring.registry import Analysis, register

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
list of analyses, and import no analysis: they reach them through it, at run time. Analyses
load on first use through the `headprobe.analyses` entry-point group, the built-ins as well as
other packages' (docs/EXTENDING.md): pyproject.toml declares one entry point per folder of
`headprobe/studies/`, and every folder of this source tree loads even where the installed
metadata lacks it (`_load`). Each registers its analyses; their order is each one's declared
`order`. A plugin that fails to import is one line of `plugin_errors()`, which the CLI prints as a
warning; it is left out, and a run that names it is refused (`get`). `HEADPROBE_DISABLE_PLUGINS`
switches plugins off; `sources()` says where each analysis and probe came from (`headprobe
plugins`).
A module that calls `register` and is imported before `headprobe.run` adds its analyses too.
A name is registered once: a second `register` of it raises unless it says `replace=True`.
See docs/ARCHITECTURE.md, "Adding an analysis".

Reports read the registry too (sections, tables, roles), so loading imports every analysis in
`headprobe report`: an analysis's module imports torch, transformers and the model layer only
inside the functions that compute on tensors (tests/test_light_imports.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field

from headprobe.core.errors import UsageError
from headprobe.model.control import TRAINED
from headprobe.scoring.measures import WEIGHTS

STUDIES = "headprobe.studies"  # the built-in analyses: one folder each, an entry point each
PLUGINS = "headprobe.analyses"  # the entry-point group of other packages' analyses
PLUGIN_ORDER = 1000.0  # where an analysis that declares no order goes: after the built-ins
# which corpus an analysis reads; "probe": token sequences, a probe's (`headprobe.inputs.probes`,
# `run(probe=...)`) where one is given, else the sentence corpus at piece level; "any": whichever
# the run reads (analyses that run the model itself: head ablation): the sentence corpus where
# one is given, else the probe, else the coreference windows, else the bundled sample
# "weights": none, it reads only the model's weights (`scoring.weights_scorer`), computed once
# "task": prompt pairs and a metric (`--task`, `headprobe.inputs.tasks`): the analyses that patch
# the model on them (`patching`), and only they, read a task
SENTENCES, COREFERENCE, PROBE, ANY, WEIGHTS_ONLY, TASK = INPUTS = (
    "sentences",
    "coreference",
    "probe",
    "any",
    "weights",
    "task",
)
# the example pictures of an analysis's best heads (`headprobe.results.examples`): a head's attention on a
# sentence holding its relation, with the gold arcs; on a mention and its nearest antecedent
ARCS, MENTIONS = PICTURES = ("arcs", "mentions")
# the role map's column where an analysis's `circuits` name the circuits a head is in
CIRCUIT_COLUMN = "circuits"


@dataclass(frozen=True)
class RoleRule:
    """A head role: `match(results)` gives one row per head that meets the rule, with columns
    layer, head, detail (what the role names), short (a cell label), evidence (the numbers
    that decided it), score (the number that decided it) and, optionally, brief (the evidence
    in a few words; `brief` below says what they are). Roles are tried in `order`; a head gets
    the first it meets. What a run found (`results.findings.role_findings`: the console after a
    run and the report's summary) gives an `itemised` role's heads a line each (heads that each
    name something different: a relation), and another role's heads one line together."""

    role: str
    order: float
    color: str
    description: str
    match: Callable
    brief: str = ""  # what a match's `brief` column says: "relation: held-out accuracy ..."
    itemised: bool = False  # one line per head in the findings (else one line per role)


@dataclass(frozen=True)
class Analysis:
    name: str
    scorer: type
    input: str = SENTENCES
    selection: bool = True
    # the labels whose best heads are selected (`selection`: best heads, held-out, head tests):
    # selects(label) -> bool; None: every label (a label that only counts, e.g. a probe's
    # outcome per grid cell, is left out)
    selects: Callable | None = None
    # the probe (`--probe`) it is defined on, None: any input; a run without it is refused
    # before the model loads
    probe: str | None = None
    description: str = ""
    family: Callable | None = None
    # the fewest trials a label needs to name a best head or a role; None: the statistics
    # engine's default (`headprobe.stats.head_selection.MIN_N`, passed in where it is needed)
    min_n: int | None = None
    roles: tuple = ()
    # derived tables: {name: fn(results) -> DataFrame}, added to `base_tables`
    tables: dict = field(default_factory=dict)
    # the tables its kind gives it (a pattern analysis's `<name>_heads`, `<name>_kv_groups`):
    # `tables` adds to them (`dataclasses.replace(a, tables={...})` keeps them); a declared table
    # of the same name replaces one, and `base_tables={}` drops them: replacing is explicit
    base_tables: dict = field(default_factory=dict)
    report: str | Callable | None = None
    console: str | Callable | None = None  # text(results, name): what the CLI prints after a run
    # blocks(results, name, first, second): what the report's weights-beside-norms section shows of it
    measures_report: str | Callable | None = None
    default: bool = True  # run when no analyses are named
    cross: bool = False  # defined on cross-attention (decoder queries, encoder keys)
    headline: tuple = ()  # labels the run summary's headline keeps (`summary.json`: "headline")
    pictures: str | None = None  # one of PICTURES: example pictures of its best heads
    # items(window) -> its scored items the pictures may show (MENTIONS: the scored mentions,
    # each with `kind`, `query`, `gold`, `index`), "module:name" or a callable
    picture_items: str | Callable | None = None
    # derived views: views(wide) -> wide with derived columns added, `wide` one row per head (or
    # per layer) and one column per label mean (`Results.mass_per_head`, `mass_per_layer`)
    views: str | Callable | None = None
    # profile(wide) -> the per-head features it gives head profiles (runs side by side,
    # `results.comparison.head_profiles`); None: every label's mean
    profile: str | Callable | None = None
    # the run options it reads: an `Option` it declares (`headprobe.scoring.options`), or the
    # name of one declared elsewhere; given without any of their readers, a check may refuse it
    options: tuple = ()
    # checks of the model, before its weights load: check(config, ModelFacts) raises UsageError
    model_checks: tuple = ()
    added_by: str | None = (
        None  # a RunConfig switch, or an analysis, that adds it to the analyses run
    )
    homes: tuple = ()  # other modules of its own (beside its scorer's and report's)
    # circuits(results, roles) -> DataFrame (layer, head, CIRCUIT_COLUMN): the circuits it names
    # with evidence, given the role map so far; the role map's column of that name (`stats.roles`)
    circuits: str | Callable | None = None
    # card(results) -> (title, {(layer, head): [line]}): what a head's card (the head explorer,
    # in the report and the notebook) says of the head under `title`, e.g. what it reads
    card: str | Callable | None = None
    # queries of its results by name: fn(results, *args), reached as `results.<name>(*args)`
    # (`results.reads("3-1")`), "module:name" or callables
    queries: dict = field(default_factory=dict)
    order: float = PLUGIN_ORDER  # its place among the analyses (reports, tables, the CLI)

    def __post_init__(self):
        merged = {**self.base_tables, **self.tables}
        object.__setattr__(self, "tables", merged)

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(getattr(option, "name", option) for option in self.options)

    @property
    def directions(self) -> tuple[str, ...]:
        return tuple(self.scorer.directions)

    @property
    def baselines(self) -> tuple[str, ...]:
        return tuple(self.scorer.variants)

    def make_scorer(self, model: str = TRAINED, measures=(WEIGHTS,), **options):
        """A new scorer for this analysis counting `model` ("trained", or the random-init
        "control") on every one of `measures` (METHODS §7: "weights", "norms"; one tally each),
        all in one pass; a scorer that reads no attention (it runs the model itself, or reads
        only weights) counts the first."""
        scorer = self.scorer(**options)
        scorer.model = model
        measures = (measures,) if isinstance(measures, str) else tuple(measures)
        scorer.measures = measures if self.reads_attention else measures[:1]
        return scorer

    @property
    def reads_attention(self) -> bool:
        """Whether its scorer reads the captured attention (not a model or weights scorer)."""
        return self.scorer.reads_attention

    def report_section(self):
        """The callable that renders this analysis's report section, `section(results, name) ->
        report.document.Section` (given the analysis's registered name), or None for the default."""
        return _resolve(self.report)

    def measures_blocks(self):
        """The callable `blocks(results, name, first, second) -> [report blocks]` of the report's
        weights-beside-norms section (METHODS §7), or None."""
        return _resolve(self.measures_report)

    def derived_views(self):
        """`views(wide) -> wide` (derived columns of its label means), or None."""
        return _resolve(self.views)

    def profile_features(self):
        """`profile(wide) -> wide` (its features in head profiles), or None."""
        return _resolve(self.profile)

    def circuit_finder(self):
        """`circuits(results, roles) -> DataFrame (layer, head, circuit)`, or None."""
        return _resolve(self.circuits)

    def card_lines(self):
        """`card(results) -> (title, {(layer, head): [line]})`, or None."""
        return _resolve(self.card)

    def console_text(self):
        """The callable `text(results, name) -> str` whose text the CLI prints after a run, or None."""
        return _resolve(self.console)


def _resolve(ref: str | Callable | None):
    """A callable given as itself or as "module:name" (imported only when asked for), or None."""
    if ref is None or callable(ref):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Probe:
    """A synthetic input an analysis may read (`--probe NAME`), declared in its analysis's folder:
    its `options` (`Option`s, as an analysis's), `model_checks` (check(config, ModelFacts), before
    the weights load), `corpus_checks` (check(config, sentences): the run's sentence corpus, or
    None, before the model loads) and `stream(config, tokenizer, net, sentences) -> Stream` (its
    examples, read lazily; `sentences` the run's sentence corpus, or None). "repeated-random" is
    the inputs' own (`headprobe.inputs.probes`)."""

    name: str
    stream: Callable
    description: str = ""
    options: tuple = ()
    model_checks: tuple = ()
    corpus_checks: tuple = ()

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(getattr(option, "name", option) for option in self.options)


_REGISTRY: dict[str, Analysis] = {}
_PROBES: dict[str, Probe] = {}
_loaded = False


def register(analysis: Analysis, *, replace: bool = False) -> Analysis:
    """Add an analysis; returns it, so a module can keep it as a constant. A name already
    registered is refused (`ValueError` naming both) unless `replace=True`."""
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
    old = _REGISTRY.get(analysis.name)
    if old is not None and old is not analysis and not replace:
        raise ValueError(
            f"analysis {analysis.name!r} is registered already (scorer "
            f"{old.scorer.__module__}.{old.scorer.__qualname__}); register(..., replace=True) "
            f"replaces it, registry.unregister({analysis.name!r}) removes it"
        )
    _REGISTRY.pop(analysis.name, None)  # a replacement goes where a new name goes: last
    _REGISTRY[analysis.name] = analysis
    return analysis


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def register_probe(probe: Probe, *, replace: bool = False) -> Probe:
    """Add a probe (`--probe NAME`); returns it. A name already registered is refused unless
    `replace=True`."""
    old = _PROBES.get(probe.name)
    if old is not None and old is not probe and not replace:
        raise ValueError(f"probe {probe.name!r} is registered already")
    _PROBES[probe.name] = probe
    return probe


def probes() -> list[Probe]:
    """The registered probes, in registration order."""
    _load()
    return list(_PROBES.values())


def probe(name: str) -> Probe | None:
    """The registered probe `name`, or None (the inputs' own repeated-random probe)."""
    _load()
    return _PROBES.get(name)


def declared_options() -> list:
    """Every `Option` an analysis or a probe declares, in the analyses' order then the probes';
    an option declared twice is a bug (`ValueError` naming both)."""
    found, owner = {}, {}
    for what in [*analyses(), *probes()]:
        for option in what.options:
            if isinstance(option, str):
                continue
            if option.name in found and found[option.name] is not option:
                raise ValueError(
                    f"option {option.name!r} is declared by {owner[option.name]} and {what.name}"
                )
            found[option.name], owner[option.name] = option, what.name
    return list(found.values())


def model_checks(names, probe_name: str | None) -> list:
    """The model checks of the probe `probe_name`, then of the analyses `names`, in order."""
    found = list(getattr(probe(probe_name), "model_checks", ())) if probe_name else []
    for name in ordered(names):
        found += [check for check in get(name).model_checks if check not in found]
    return found


DISABLE = "HEADPROBE_DISABLE_PLUGINS"  # "name,..." (entry points or packages) or "all"


@dataclass(frozen=True)
class Source:
    """Where registered analyses and probes came from: one entry point of the `PLUGINS` group (a
    built-in study or another package's module), its package and version, whether it `loaded`
    ("loaded", "failed", "disabled"), the error line of a failure, and what it registered."""

    entry: str  # the entry point's name (a plugin names it after its analysis)
    module: str
    package: str
    version: str
    status: str
    error: str = ""
    analyses: tuple[str, ...] = ()
    probes: tuple[str, ...] = ()

    @property
    def builtin(self) -> bool:
        return _is_builtin(self.module)


_sources: list[Source] = []


def _load() -> None:
    """Import the analyses once: the built-ins, then the plugins. Both are entry points of the
    `PLUGINS` group; an entry point whose module is under `STUDIES` is a built-in (this
    package's pyproject.toml declares one per folder). The built-ins are also every folder of
    `STUDIES` in this source tree, so a tree run with no installed metadata, or with metadata
    from before a folder was added, loads them all; a declared built-in that this tree lacks
    (metadata newer than the tree) is skipped. Built-ins are imported in module-name order and
    one that fails to import is a bug and raises; a plugin that fails is kept as one line
    (`plugin_errors`), and the others load; a plugin named in `HEADPROBE_DISABLE_PLUGINS` (its
    entry point's or its package's name, or "all") is not imported. Nothing imports them before
    something asks the registry (a run, its --help, a report, `headprobe plugins`)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import os
    from importlib.metadata import entry_points

    from headprobe.version import __version__

    group = list(entry_points(group=PLUGINS))
    builtin = [entry for entry in group if _is_builtin(entry.module)]
    studies = importlib.import_module(STUDIES)
    here = {found.name for found in pkgutil.iter_modules(studies.__path__, STUDIES + ".")}
    for name in sorted(here | {entry.module for entry in builtin}):
        if name in here or importlib.util.find_spec(name) is not None:
            with _recording(name.rpartition(".")[2], name, "headprobe", __version__):
                importlib.import_module(name)
    off = {word.strip() for word in os.environ.get(DISABLE, "").split(",") if word.strip()}
    for entry in group:
        if entry in builtin:
            continue
        package, version = _package(entry)
        if off & {"all", entry.name, package}:
            _sources.append(Source(entry.name, entry.module, package, version, "disabled"))
            continue
        try:
            with _recording(entry.name, entry.module, package, version):
                entry.load()
        except Exception as exc:  # noqa: BLE001 (any error of a plugin's import is reported)
            what = f"{type(exc).__name__}: {exc}".splitlines()[0]
            line = (
                f"analysis plugin {entry.name!r} ({package} {version}, entry point "
                f"{entry.value!r}) failed to import: {what}; it is left out (switch it off: "
                f"{DISABLE}={entry.name})"
            )
            _sources.append(Source(entry.name, entry.module, package, version, "failed", line))


class _recording:
    """Record, as a `Source`, what importing one entry point registers (a failure re-raises)."""

    def __init__(self, entry: str, module: str, package: str, version: str):
        self.source = (entry, module, package, version)

    def __enter__(self):
        self.before = (set(_REGISTRY), set(_PROBES))

    def __exit__(self, kind, exc, tb):
        if kind is None:
            new = tuple(n for n in _REGISTRY if n not in self.before[0])
            probes = tuple(n for n in _PROBES if n not in self.before[1])
            _sources.append(Source(*self.source, "loaded", analyses=new, probes=probes))
        return False


def _package(entry) -> tuple[str, str]:
    """(package, version) of an entry point's distribution ("?" where unknown)."""
    dist = getattr(entry, "dist", None)
    if dist is None:
        return "?", "?"
    return dist.metadata["Name"] or "?", dist.version or "?"


def _is_builtin(module: str) -> bool:
    """Whether an entry point's module is one of this package's studies (a folder of `STUDIES`)."""
    return module.startswith(STUDIES + ".")


def plugin_errors() -> list[str]:
    """One line per analysis plugin that failed to import (the CLI prints them as warnings)."""
    _load()
    return [source.error for source in _sources if source.status == "failed"]


def loaded_errors() -> list[str]:
    """`plugin_errors` if the registry has loaded, else [] (loads nothing)."""
    return plugin_errors() if _loaded else []


def sources() -> list[Source]:
    """Every entry point of the group, built-ins first: what it registered, or why nothing."""
    _load()
    return list(_sources)


def unavailable(name: str) -> str | None:
    """Why analysis (or probe) `name` is not registered when a plugin of that entry-point name
    failed to import or is switched off: its one line; else None."""
    _load()
    for source in _sources:
        if source.entry == name and source.status == "failed":
            return source.error
        if source.entry == name and source.status == "disabled":
            return f"analysis plugin {name!r} ({source.package}) is switched off by {DISABLE}"
    return None


def _rank(name: str) -> tuple[float, int]:
    """Where analysis `name` goes: its declared `order`, then registration order; a name no
    longer registered (results of a removed plugin) goes last."""
    analysis = _REGISTRY.get(name)
    if analysis is None:
        return (float("inf"), 0)
    return (analysis.order, list(_REGISTRY).index(name))


def ordered(names) -> list[str]:
    """`names` in the analyses' order (each one's declared `order`, ties in registration order;
    the report's sections and `analyses` both read it)."""
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


def headline_labels() -> list[str]:
    """The labels whose best heads a run's summary keeps as its headline (`Analysis.headline`)."""
    return list(dict.fromkeys(label for a in analyses() for label in a.headline))


def pictured(kind: str) -> list[str]:
    """Names of the analyses whose best heads get example pictures of `kind` (one of PICTURES)."""
    return [a.name for a in analyses() if a.pictures == kind]


def picture_items(kind: str):
    """`items(example)` of the first analysis pictured as `kind` that declares its picture items
    (MENTIONS: the coreference analysis's scored mentions), or None."""
    for analysis in analyses():
        if analysis.pictures == kind and analysis.picture_items is not None:
            return _resolve(analysis.picture_items)
    return None


def views_of(name: str):
    """The derived views of analysis `name` (`Analysis.views`), or None (also for a name no
    longer registered)."""
    _load()
    analysis = _REGISTRY.get(name)
    return None if analysis is None else analysis.derived_views()


def profile_of(name: str):
    """The head-profile features of analysis `name` (`Analysis.profile`), or None."""
    _load()
    analysis = _REGISTRY.get(name)
    return None if analysis is None else analysis.profile_features()


def reading(option: str) -> list[str]:
    """Names of the analyses that read run option `option` (a RunConfig field; `Analysis.options`)."""
    return [a.name for a in analyses() if option in a.option_names]


def get(name: str) -> Analysis:
    """The analysis `name`; `UsageError` in one line for a plugin's that failed to import or is
    switched off (`unavailable`), `ValueError` naming the registered ones for another name."""
    _load()
    if name not in _REGISTRY:
        why = unavailable(name)
        if why is not None:
            raise UsageError(f"analysis {name!r} is not available: {why}")
        raise ValueError(f"unknown analysis {name!r}; choose from {', '.join(names())}")
    return _REGISTRY[name]


def min_n(name: str, default: int) -> int:
    """The fewest trials a label of analysis `name` needs to be named a best head or a role
    (METHODS §5): its own, else `default` (the statistics engine's; also for a name no longer
    registered, results of a removed plugin)."""
    _load()
    analysis = _REGISTRY.get(name)
    return default if analysis is None or analysis.min_n is None else analysis.min_n


def role_rules() -> list[tuple[Analysis, RoleRule]]:
    """Every registered role rule with its analysis, in the order roles are tried."""
    rules = [(a, rule) for a in analyses() for rule in a.roles]
    return sorted(rules, key=lambda pair: pair[1].order)


def declaring(rule: RoleRule) -> list[str]:
    """Names of the registered analyses that declare `rule` in their `roles` (usually one): a
    rule written once reads the data of whichever analysis declares it."""
    return [a.name for a, r in role_rules() if r is rule]
