"""The core options' parts (`headprobe.config` declares the fields): `option`, which makes a
field from an `Option`'s spec, and the checks, help texts and record rules those fields name.
Each check is `check(flag, value, values) -> value`, run by `RunConfig.checked` in its stage.
"""

from __future__ import annotations

from dataclasses import field
from pathlib import Path

from headprobe import checks
from headprobe.inputs.align import FROM_MODES
from headprobe.inputs.conventions import PRESETS
from headprobe.inputs.probes import PROBES
from headprobe.model import loading as models
from headprobe.results import store
from headprobe.scoring import registry
from headprobe.scoring.measures import DEFAULT as DEFAULT_MEASURES
from headprobe.scoring.measures import parse_measures
from headprobe.scoring.options import Option
from headprobe.scoring.scorer_base import RunsModel

SENTENCE_SOURCES = ("treebank", "text", "hf_dataset")


def option(default=None, help: str = "", *, repr: bool = True, **spec):
    """A field of the run's core options: `spec` as an `Option`'s (`headprobe.scoring.options`:
    flag, check, stage, choices, type, metavar, action, cli_default, group, record, record_as,
    record_value, record_at, fingerprint). The options an analysis or a probe reads are declared
    in its own folder and join these in `RunConfig` (`_assemble`)."""
    return option_field(Option("", default, help, repr=repr, **spec))


def option_field(declared: Option):
    return field(default=declared.default, repr=declared.repr, metadata=declared.metadata())


# ------------------------------------------------------------------------------ what is recorded
def probe_reads(name: str):
    """The record rule of shared probe option `name` (`--length`, `--n`, `--probe-specials`):
    recorded when the run's probe reads it, the inputs' own random tokens, or a registered probe
    that lists `name` among its options (`registry.Probe.options`: a plugin's probe too)."""

    def reads(config) -> bool:
        if config.probe in PROBES:
            return True
        probe = registry.probe(config.probe) if config.probe is not None else None
        return probe is not None and name in probe.option_names

    return reads


def blocked_or_mapped(config) -> bool:
    return bool(config.query_block) or config.device_map is not None


def measure_asked(config) -> bool:
    return tuple(config.measure) != DEFAULT_MEASURES  # like stack and control: only when asked for


# ------------------------------------------------------------------------------------- checks
def at_least(low: int, what: str = ""):
    return lambda flag, value, values: checks.check_int(flag, value, low, what)


def maybe_at_least(low: int, what: str = ""):
    return lambda flag, value, values: (
        None if value is None else checks.check_int(flag, value, low, what)
    )


def check_layers(flag, value, values):
    return checks.parse_layers(value)


def check_input_file(flag, value, values):
    checks.check_input_file(flag, value)
    return value


def check_figure_formats(flag, value, values) -> tuple[str, ...]:
    """'svg,pdf' -> ('png', 'svg', 'pdf'): the formats of the report's figures, PNG always (the
    pages embed it), parsed by the report's own `drawing.parse_formats`."""
    from headprobe.report.drawing import parse_formats

    names = value.split(",") if isinstance(value, str) else list(value or ())
    try:
        return parse_formats(["png", *names])
    except ValueError as err:
        raise checks.UsageError(str(err).replace("--figures", flag, 1)) from None


def check_hf_dataset(flag, value, values):
    checks.check_hf_dataset(value)
    return value


def check_from_mode(flag, value, values):
    value = PRESETS[values["conventions"]].pooling(value)
    return checks.check_choice(flag, value, FROM_MODES)


def check_model(flag, value, values):
    if values["loaded"] is None:
        checks.check_model(value)
    return value


def check_device(flag, value, values):
    return checks.check_device(value) if values["loaded"] is None else value


def check_out(flag, value, values):
    return None if value is None else store.check_out(value)


def check_max_memory(flag, value, values):
    return models.parse_max_memory(value)


def check_control(flag, value, values):
    if value is not None and values["device_map"] is not None:
        raise checks.UsageError(
            "--control cannot be combined with --device-map (the control is a second copy "
            "of the model, built on one device)"
        )
    return value


def check_measures(flag, value, values) -> tuple[str, ...]:
    """'weights,norms' (or a list) -> the measures in `measures.MEASURES` order."""
    try:
        return parse_measures(value)
    except ValueError as err:
        raise checks.UsageError(f"{flag}: {err}") from None


def check_task(flag, value, values):
    """A built-in task's name, or a task file or list read and checked whole (one line naming
    file:line for the first bad example), before any model loads."""
    from headprobe.inputs.tasks import BUILT_IN, task_items

    if value is None or (isinstance(value, str) and value in BUILT_IN):
        return value
    if isinstance(value, (str, Path)):
        checks.check_input_file(flag, value)
    task_items(value)  # raises UsageError, one line, where an example is malformed
    return value


def check_analyses(flag, value, values) -> list[str]:
    """The analyses to run: the named ones (a list, or a comma list), else every default one; with a
    probe and none named, every token analysis that reads attention too; on `stack` only those defined there; then those
    a switch that is on adds (`Analysis.added_by`)."""
    if isinstance(value, str):
        value = [name.strip() for name in value.split(",") if name.strip()]
    task = values.get("task") is not None
    if not value and task:  # a task's own analyses
        wanted = [a.name for a in registry.analyses(registry.TASK) if a.default]
    elif not value:
        wanted = [a.name for a in registry.analyses() if a.default and a.input != registry.TASK]
        if values["probe"] is not None:  # the token analyses that read attention, and those
            wanted += [  # defined on this probe alone (the needle probe's retrieval heads)
                a.name
                for a in registry.analyses(registry.PROBE)
                if not issubclass(a.scorer, RunsModel)
                or (a.probe == values["probe"] and not a.added_by)
            ]
    else:
        for name in value:
            registry.get(name)  # raises with the list of known analyses
        wanted = list(dict.fromkeys(value))
    wanted = analyses_on_stack(values["stack"], wanted, bool(value), values["probe"])
    added = [
        a.name
        for a in registry.analyses()
        if a.added_by and (values.get(a.added_by) or a.added_by in wanted) and a.name not in wanted
    ]
    check_inputs_read(wanted + added, values["probe"], task)
    return wanted + added


def check_inputs_read(names: list[str], probe, task: bool) -> None:
    """An analysis defined on one probe only (`Analysis.probe`) needs that probe; one that reads
    a task (`registry.TASK`) needs `--task`."""
    added = {o.name: o.flag for o in registry.declared_options()}
    for name in names:
        analysis = registry.get(name)
        if analysis.probe is not None and probe != analysis.probe:
            by = analysis.added_by
            asked = f"{added.get(by) or by} (analysis {name})" if by else name
            raise checks.UsageError(
                f"{asked} reads the {analysis.probe} probe, not "
                f"{'a sentence corpus' if probe is None else f'--probe {probe}'}: "
                f"add --probe {analysis.probe}"
            )
        if analysis.input == registry.TASK and not task:
            raise checks.UsageError(
                f"{name} reads a task (prompt pairs and a metric), and none was given: add "
                "--task FILE.jsonl or --task ioi"
            )


def task_help() -> str:
    from headprobe.inputs.tasks import BUILT_IN, KEYS

    return (
        f"a task: a JSONL file of {{{', '.join(KEYS)}}} (optional id, unit; METHODS §19), or a "
        f"built-in generator ({', '.join(BUILT_IN)}: indirect-object identification, Wang et al. "
        "2022; --n examples, --seed); its default analysis is patching"
    )


def task_record(value) -> str:
    from headprobe.inputs.tasks import task_name

    return task_name(value)


def probe_help() -> str:
    return (
        f"a synthetic probe for the token analyses ({', '.join(registry.names(registry.PROBE))}): "
        "repeated-random = random tokens repeated twice (Olsson et al. 2022); "
        + "".join(f"{p.name} = {p.description}; " for p in registry.probes())
        + "without --analyses every "
        "token analysis that reads attention runs on it, and those defined on that probe alone. Without a probe, token analyses named in --analyses read the "
        "sentence corpus at piece level"
    )


def probe_names() -> tuple[str, ...]:
    """The inputs' own probes, then those an analysis's folder registers (`registry.Probe`)."""
    return (*PROBES, *(p.name for p in registry.probes()))


def coref_help() -> str:
    return (
        "CorefUD CoNLL-U file (Entity= in MISC) for the "
        + " and ".join(registry.names(registry.COREFERENCE))
        + " analysis"
    )


def added_help(option: str) -> str:
    """The help of switch `option` that adds analyses to a run (`Analysis.added_by`)."""
    return "; ".join(
        f"also run {a.name}: {a.description}" for a in registry.analyses() if a.added_by == option
    )


def pictures_help() -> str:
    return "attention pictures of the best heads of " + ", ".join(
        registry.pictured(registry.ARCS) + registry.pictured(registry.MENTIONS)
    )


def stack_help() -> str:
    return (
        "attention stack of an encoder-decoder (T5, BART): encoder (default), decoder (its self-attention; "
        "the decoder reads its start token, then the sentence), or cross (decoder queries over encoder keys: "
        + ", ".join(a.name for a in registry.analyses() if a.cross)
        + " only)"
    )


def analyses_on_stack(stack, wanted: list[str], named: bool, probe) -> list[str]:
    """The analyses to run on attention stack `stack` (None: the model's default): on
    cross-attention only those defined there (`Analysis.cross`); one named that is not, or a
    probe, is a usage error."""
    if stack != "cross":
        return wanted
    defined = [a.name for a in registry.analyses() if a.cross]
    undefined = [name for name in wanted if not registry.get(name).cross]
    if undefined and (named or probe is not None):
        raise checks.UsageError(
            f"--stack cross: {', '.join(undefined)} {'is' if len(undefined) == 1 else 'are'} not defined on "
            f"cross-attention (decoder queries over encoder keys: rows and columns are two sequences, so there "
            f"are no arcs or token patterns within one); on cross-attention: {', '.join(defined)}"
        )
    return [name for name in wanted if name in defined]


def analyses_help() -> str:
    return "comma list of " + ",".join(registry.names()) + " (default: all that apply)"
