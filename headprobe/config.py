"""The options of `headprobe run`: one frozen `RunConfig`, assembled from the core options here and
those every analysis and probe declares in its own folder (`headprobe.scoring.options.Option`).

    from headprobe.config import RunConfig
    config = RunConfig(treebank="en_ewt-ud-dev.conllu", layers="0-3", analyses="dependency")
    headprobe.run(config)                         # the same as headprobe.run(treebank=..., layers=...)
    checked = config.checked()                    # every option checked (UsageError naming it), normalised
    checked.layers, checked.analyses              # [0, 1, 2, 3], ["dependency"]

Each core field is declared with `option(default, help, flag=..., check=..., ...)`, each analysis's
with an `Option` in its folder (`Analysis.options`, `Probe.options`; `_assemble` joins them, the
plugins' included): the command line's `headprobe run` options are generated from these fields (`headprobe.cli`), `headprobe.run` takes a
`RunConfig` or the same names as keyword arguments, and `RunConfig.checked` runs the checks in
stages (`STAGES`: plain values, values that depend on others, input files, the model, the device,
`--out`, combinations), all before any model is loaded. `options_record` is
what results record as `summary["options"]` (the resume fingerprint compares it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path

from headprobe import checks
from headprobe.core.seeds import SEED
from headprobe.inputs.align import BOS_MODES, FROM_MODES
from headprobe.inputs.conventions import PRESETS
from headprobe.inputs.probes import PROBE_MARKERS, PROBES
from headprobe.inputs.samples import DEFAULT_COREF, DEFAULT_TREEBANK
from headprobe.model import loading as models
from headprobe.model.control import CONTROLS
from headprobe.model.sites import STACKS
from headprobe.results import store
from headprobe.scoring import registry
from headprobe.scoring.base import RunsModel
from headprobe.scoring.checkpoint import DEFAULT_EVERY
from headprobe.scoring.measures import DEFAULT as DEFAULT_MEASURES
from headprobe.scoring.measures import parse_measures
from headprobe.scoring.options import ADDED, GIVEN, STAGES, Option
from headprobe.scoring.pass_settings import PassSettings
from headprobe.scoring.tally import N_BOOT

SENTENCE_SOURCES = ("treebank", "text", "hf_dataset")


def option(default=None, help: str = "", *, repr: bool = True, **spec):
    """A field of the run's core options: `spec` as an `Option`'s (`headprobe.scoring.options`:
    flag, check, stage, choices, type, metavar, action, cli_default, group, record, record_as,
    record_value, record_at, fingerprint). The options an analysis or a probe reads are declared
    in its own folder and join these in `RunConfig` (`_assemble`)."""
    return _field(Option("", default, help, repr=repr, **spec))


def _field(declared: Option):
    return field(default=declared.default, repr=declared.repr, metadata=declared.metadata())


# ------------------------------------------------------------------------------ what is recorded
def _with_probe(config) -> bool:
    """A probe of random tokens, the inputs' own (its length, number and specials are recorded)."""
    return config.probe in PROBES


def _blocked_or_mapped(config) -> bool:
    return bool(config.query_block) or config.device_map is not None


def _measure_asked(config) -> bool:
    return tuple(config.measure) != DEFAULT_MEASURES  # like stack and control: only when asked for


# ------------------------------------------------------------------------------------- checks
def _at_least(low: int, what: str = ""):
    return lambda flag, value, values: checks.check_int(flag, value, low, what)


def _maybe_at_least(low: int, what: str = ""):
    return lambda flag, value, values: (
        None if value is None else checks.check_int(flag, value, low, what)
    )


def _layers(flag, value, values):
    return checks.parse_layers(value)


def _input_file(flag, value, values):
    checks.check_input_file(flag, value)
    return value


def _figure_formats(flag, value, values) -> tuple[str, ...]:
    """'svg,pdf' -> ('png', 'svg', 'pdf'): the formats of the report's figures, PNG always (the
    pages embed it), parsed by the report's own `figures.parse_formats`."""
    from headprobe.report.figures import parse_formats

    names = value.split(",") if isinstance(value, str) else list(value or ())
    try:
        return parse_formats(["png", *names])
    except ValueError as err:
        raise checks.UsageError(str(err).replace("--figures", flag, 1)) from None


def _hf_dataset(flag, value, values):
    checks.check_hf_dataset(value)
    return value


def _analyses(flag, value, values) -> list[str]:
    """The analyses to run: the named ones (a list, or a comma list), else every default one; with a
    probe and none named, every token analysis that reads attention too; on `stack` only those defined there; then those
    a switch that is on adds (`Analysis.added_by`)."""
    if isinstance(value, str):
        value = [name.strip() for name in value.split(",") if name.strip()]
    if not value:
        wanted = [a.name for a in registry.analyses() if a.default]
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
    wanted = _on_stack(values["stack"], wanted, bool(value), values["probe"])
    added = [
        a.name
        for a in registry.analyses()
        if a.added_by and (values.get(a.added_by) or a.added_by in wanted) and a.name not in wanted
    ]
    _check_probes(wanted + added, values["probe"])
    return wanted + added


def _check_probes(names: list[str], probe) -> None:
    """An analysis defined on one probe only (`Analysis.probe`) needs that probe."""
    for name in names:
        analysis = registry.get(name)
        if analysis.probe is not None and probe != analysis.probe:
            asked = f"{flag(analysis.added_by)} (analysis {name})" if analysis.added_by else name
            raise checks.UsageError(
                f"{asked} reads the {analysis.probe} probe, not "
                f"{'a sentence corpus' if probe is None else f'--probe {probe}'}: "
                f"add --probe {analysis.probe}"
            )


def _on_stack(stack, wanted: list[str], named: bool, probe) -> list[str]:
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


def _from_mode(flag, value, values):
    value = value or PRESETS[values["conventions"]].from_mode
    return checks.check_choice(flag, value, FROM_MODES)


def _model(flag, value, values):
    if values["loaded"] is None:
        checks.check_model(value)
    return value


def _device(flag, value, values):
    return checks.check_device(value) if values["loaded"] is None else value


def _out(flag, value, values):
    return None if value is None else store.check_out(value)


def _max_memory(flag, value, values):
    return models.parse_max_memory(value)


def _control(flag, value, values):
    if value is not None and values["device_map"] is not None:
        raise checks.UsageError(
            "--control cannot be combined with --device-map (the control is a second copy "
            "of the model, built on one device)"
        )
    return value


def _measures(flag, value, values) -> tuple[str, ...]:
    """'weights,norms' (or a list) -> the measures in `measures.MEASURES` order."""
    try:
        return parse_measures(value)
    except ValueError as err:
        raise checks.UsageError(f"{flag}: {err}") from None


def _analyses_help() -> str:
    return "comma list of " + ",".join(registry.names()) + " (default: all that apply)"


def _probe_help() -> str:
    return (
        f"a synthetic probe for the token analyses ({', '.join(registry.names(registry.PROBE))}): "
        "repeated-random = random tokens repeated twice (Olsson et al. 2022); "
        + "".join(f"{p.name} = {p.description}; " for p in registry.probes())
        + "without --analyses every "
        "token analysis that reads attention runs on it, and those defined on that probe alone. Without a probe, token analyses named in --analyses read the "
        "sentence corpus at piece level"
    )


def _probe_names() -> tuple[str, ...]:
    """The inputs' own probes, then those an analysis's folder registers (`registry.Probe`)."""
    return (*PROBES, *(p.name for p in registry.probes()))


def _coref_help() -> str:
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


def _pictures_help() -> str:
    return "attention pictures of the best heads of " + ", ".join(
        registry.pictured(registry.ARCS) + registry.pictured(registry.MENTIONS)
    )


def _stack_help() -> str:
    return (
        "attention stack of an encoder-decoder (T5, BART): encoder (default), decoder (its self-attention; "
        "the decoder reads its start token, then the sentence), or cross (decoder queries over encoder keys: "
        + ", ".join(a.name for a in registry.analyses() if a.cross)
        + " only)"
    )


# ------------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class CoreOptions:
    """The options of every run, whatever it analyses; `RunConfig` adds those the registered
    analyses and probes declare (`_assemble`). See each field's help (`help_text`)."""

    model: str | None = option(
        None,
        "hub name or path; bundled aliases: minilm (default), smollm2",
        flag="--model",
        check=_model,
        stage="model",
    )
    treebank: str | Path | None = option(
        None,
        "CoNLL-U file with gold dependencies, plain or .gz (default: the bundled UD English EWT dev)",
        flag="--treebank",
        check=_input_file,
        stage="input",
        group="source",
    )
    text: str | Path | None = option(
        None,
        "raw text file, parsed with the bundled spaCy en_core_web_sm (silver arcs)",
        flag="--text",
        check=_input_file,
        stage="input",
        group="source",
    )
    hf_dataset: str | None = option(
        None,
        "Hugging Face dataset NAME[:CONFIG[:SPLIT]] or a save_to_disk dir",
        flag="--hf-dataset",
        check=_hf_dataset,
        stage="input",
        group="source",
    )
    coref: str | Path | None = option(
        None,
        _coref_help,
        flag="--coref",
        check=_input_file,
        stage="input",
    )
    probe: str | None = option(
        None,
        _probe_help,
        flag="--probe",
        choices=_probe_names(),
        record=GIVEN,
        record_at=14,
        record_as=("probe", "name"),
    )
    probe_length: int = option(
        50,
        "--probe: random tokens per half (default: 50)",
        flag="--length",
        type=int,
        metavar="LENGTH",
        check=_at_least(1, " (tokens per half of a probe sequence)"),
        record=_with_probe,
        record_at=15,
        record_as=("probe", "length"),
    )
    probe_n: int = option(
        500,
        "--probe: sequences (default: 500)",
        flag="--n",
        type=int,
        metavar="N",
        check=_at_least(1, " (probe sequences)"),
        record=_with_probe,
        record_at=16,
        record_as=("probe", "n"),
    )
    probe_specials: str = option(
        "auto",
        "--probe: special tokens around each sequence: auto (the tokenizer's own, as for text), bos "
        "(BOS in front where the tokenizer has one), none (default: auto)",
        flag="--probe-specials",
        choices=PROBE_MARKERS,
        record=_with_probe,
        record_at=17,
        record_as=("probe", "specials"),
    )
    out: str | Path | None = option(
        None,
        "output directory (default: results; in Python: none, nothing is written). The run holds it "
        "(a second run on it is refused) and writes it whole or not at all",
        flag="--out",
        check=_out,
        stage="out",
        cli_default="results",
    )
    analyses: list[str] | str | None = option(
        None,
        _analyses_help,
        flag="--analyses",
        check=_analyses,
        stage="derived",
        record=True,
        record_at=0,
        record_value=sorted,
    )
    device: str | None = option(
        None,
        "cuda, cpu (default: cuda when available)",
        flag="--device",
        check=_device,
        stage="device",
        record=True,
        record_at=8,
    )
    device_map: str | dict | None = option(
        None,
        "load a big model over several devices with accelerate's dispatch: auto, balanced, "
        "balanced_low_0, sequential, or a JSON map of module -> device; each layer is scored where it "
        "runs (not with torchrun)",
        flag="--device-map",
        metavar="MAP",
        record=_blocked_or_mapped,
        record_at=20,
    )
    max_memory: str | dict | None = option(
        None,
        "with --device-map: memory per device, e.g. 0=10GiB,cpu=30GiB",
        flag="--max-memory",
        metavar="SIZES",
        check=_max_memory,
        record=_blocked_or_mapped,
        record_at=21,
    )
    query_block: int | None = option(
        None,
        "capture attention N query pieces at a time: one layer needs O(N x keys) memory per head "
        "instead of O(keys^2), for long inputs (e.g. --window 2048); same counts (default: whole "
        "matrices)",
        flag="--query-block",
        type=int,
        metavar="N",
        check=_maybe_at_least(1, " query pieces"),
        record=_blocked_or_mapped,
        record_at=19,
    )
    stack: str | None = option(
        None, _stack_help, flag="--stack", choices=STACKS, record=GIVEN, record_at=18
    )
    control: str | None = option(
        None,
        "random-init: also score the attention analyses on the same architecture re-initialised with "
        "--seed (same tokenizer); best heads gain the control's best, and a role rule may ask for a "
        "head above the control's held-out best",
        flag="--control",
        choices=CONTROLS,
        check=_control,
        stage="derived",
        record=GIVEN,
        record_at=23,
    )
    measure: str | tuple = option(
        ",".join(DEFAULT_MEASURES),
        "what each head is scored on (METHODS §7): weights (attention weights, the "
        "default), norms (weight x ||value x W_O||, Kobayashi et al. 2020), or weights,norms (both from one pass; "
        "every table has a measure column)",
        flag="--measure",
        metavar="M[,M]",
        check=_measures,
        record=_measure_asked,
        record_at=24,
        record_value=",".join,
    )
    dtype: str = option(
        "float32",
        "model weights' dtype (default: float32)",
        flag="--dtype",
        choices=tuple(models.DTYPES),
        record=True,
        record_at=7,
    )
    batch_size: int | None = option(
        None,
        "sentences per batch (default: 64 on the CPU; on a GPU as many as half its free memory "
        "holds, 64 to 1,024; --resume uses the interrupted run's; coreference windows: a quarter)",
        flag="--batch-size",
        type=int,
        check=_maybe_at_least(1),
        record=True,
        record_at=2,
    )
    layers: str | list[int] | None = option(
        None,
        "layers to score, e.g. 0-3,8 (0-based; in Python also a list) (default: all)",
        flag="--layers",
        check=_layers,
        record=True,
        record_at=1,
    )
    from_mode: str | None = option(
        None,
        "pooling of attention FROM a word over its pieces: mean, first or max (default: the "
        "conventions'; headprobe: mean)",
        flag="--from-mode",
        choices=FROM_MODES,
        check=_from_mode,
        stage="derived",
        record=True,
        record_at=3,
    )
    conventions: str = option(
        "headprobe",
        "scoring conventions: headprobe (default, METHODS §1-§2), or those of the released code behind a published "
        "number: clark2019-code (from = first piece, root and punct in ALL, offsets -3..2 clipped, "
        "subtypes cut), joanacero (as clark2019-code with from = mean and UD subtypes kept); see "
        "docs/CONVENTIONS.md",
        flag="--conventions",
        choices=tuple(PRESETS),
        record=True,
        record_at=13,
    )
    window: int = option(
        128,
        "coreference window in pieces (default: 128)",
        flag="--window",
        type=int,
        check=_at_least(checks.MIN_WINDOW, " pieces"),
        record=True,
        record_at=4,
    )
    skip_bad: bool = option(
        False,
        "skip malformed sentences, in --treebank/--text/--hf-dataset and --coref (warn and count)",
        flag="--skip-bad",
        action="store_true",
        record=True,
        record_at=9,
    )
    coref_single_document: bool = option(
        False,
        "read a --coref file without '# newdoc' lines as one document (refused otherwise)",
        flag="--coref-single-document",
        action="store_true",
        record=True,
        record_at=12,
    )
    seed: int = option(
        SEED,
        f"seed of folds, bootstrap weights and probes (default: {SEED})",
        flag="--seed",
        type=int,
        check=_at_least(0),
        record=True,
        record_at=5,
    )
    n_boot: int = option(
        N_BOOT,
        f"bootstrap resamples (default: {N_BOOT})",
        flag="--bootstrap",
        type=int,
        metavar="N",
        check=_at_least(1, " (resamples for the intervals and held-out selection)"),
        record=True,
        record_at=6,
        record_as="bootstrap_resamples",
    )
    bos: str = option(
        "none",
        "prepend the tokenizer's BOS token: none (inputs as the tokenizer makes them), add, or auto "
        "(for a causal model whose tokenizer has one but does not add it) (default: none)",
        flag="--bos",
        choices=BOS_MODES,
        record=True,
        record_at=11,
    )
    keep_unit_counts: bool = option(
        False,
        "also keep per-unit rows (unit_counts.parquet): small corpora and debugging",
        flag="--keep-unit-counts",
        action="store_true",
        record=True,
        record_at=10,
    )
    report: bool = option(
        False,
        "do not write the HTML/Markdown report (in Python: report=True writes it)",
        flag="--no-report",
        action="store_false",
        cli_default=True,
    )
    figures: tuple = option(
        ("png",),
        "report figure formats, a comma list of png, svg, pdf (default: png; the report pages "
        "embed the PNG, so it is always written): --figures png,svg,pdf",
        flag="--figures",
        metavar="FORMATS",
        check=_figure_formats,
    )
    resume: bool = option(
        False,
        "continue an interrupted run to --out from its checkpoint (same inputs and options; the "
        "tables are identical to an uninterrupted run's)",
        flag="--resume",
        action="store_true",
    )
    checkpoint_every: int = option(
        DEFAULT_EVERY,
        f"checkpoint the counts every N batches, for --resume (default: {DEFAULT_EVERY}; 0: never)",
        flag="--checkpoint-every",
        type=int,
        metavar="N",
        check=_at_least(0, " (0: no checkpoints)"),
    )
    progress: bool = option(True, "no progress bars", flag="--quiet", action="store_false")
    pictures: bool = option(True, _pictures_help)
    loaded: tuple | None = option(
        None, "an already loaded (model, tokenizer, name) to reuse", repr=False
    )

    @classmethod
    def of(cls, config=None, /, **options) -> RunConfig:
        """`config` (a RunConfig, with `options` replaced), or a RunConfig of `options`, `config`
        being the model (`headprobe.run("smollm2", treebank=...)`)."""
        if isinstance(config, RunConfig):
            return dataclasses.replace(config, **options) if options else config
        if config is not None:
            if "model" in options:
                raise TypeError("run() got the model twice (positionally and as model=)")
            options["model"] = config
        return cls(**options)

    @staticmethod
    def help_text(name: str) -> str:
        """The help of option `name`."""
        text = RunConfig.__dataclass_fields__[name].metadata["help"]
        if text is ADDED:
            return added_help(name)
        return text() if callable(text) else text

    def checked(self) -> RunConfig:
        """This config with every option checked and normalised (`checks.UsageError` names the option)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        given = [name for name in SENTENCE_SOURCES if values[name] is not None]
        if len(given) > 1:
            raise checks.UsageError(
                "give one of "
                + ", ".join(flag(name) for name in SENTENCE_SOURCES)
                + f", not {' and '.join(flag(name) for name in given)}"
            )
        if not given and values["coref"] is None and values["probe"] is None:  # the bundled data
            values["treebank"] = DEFAULT_TREEBANK  # UD English EWT dev (gold)
            values["coref"] = (
                DEFAULT_COREF if DEFAULT_COREF.is_file() else None
            )  # GUM dev, open part
        for stage in STAGES:
            for f in fields(self):
                spec = f.metadata
                if spec["stage"] != stage:
                    continue
                if spec["choices"] is not None and values[f.name] is not None:
                    checks.check_choice(flag(f.name), values[f.name], spec["choices"])
                if spec["check"] is not None:
                    values[f.name] = spec["check"](flag(f.name), values[f.name], values)
        if values["resume"] and values["out"] is None:
            raise checks.UsageError(
                "--resume needs --out: the checkpoint lives beside the results directory"
            )
        if values["resume"] and values["keep_unit_counts"]:
            raise checks.UsageError(
                "--resume cannot be combined with --keep-unit-counts "
                "(per-unit rows are not checkpointed)"
            )
        return dataclasses.replace(self, **values)

    def pass_settings(self) -> PassSettings:
        """The settings of a scoring pass (`headprobe.scoring.pass_settings`), built once from
        this checked config: the pass reads them and imports nothing of the configuration."""
        return PassSettings(
            layers=self.layers,
            batch_size=self.batch_size,
            from_mode=self.from_mode,
            progress=self.progress,
            seed=self.seed,
            n_boot=self.n_boot,
            keep_unit_counts=self.keep_unit_counts,
            conventions=self.conventions,
            query_block=self.query_block,
            stack=self.stack,
        )

    def options_record(self, device: str) -> dict:
        """The options as results record them (`summary["options"]`, and the checkpoint fingerprint
        that --resume compares), of a checked config, on `device`: each field's `record`,
        `record_as` and `record_value` metadata (`option`) say whether, where and what."""
        config = dataclasses.replace(self, device=device)
        settings = {}
        for f in sorted(fields(self), key=lambda f: f.metadata["record_at"]):
            spec, value = f.metadata, getattr(config, f.name)
            record = spec["record"]
            if not (
                record is True
                or (record == GIVEN and value)
                or (callable(record) and record(config))
            ):
                continue
            if spec["record_value"] is not None:
                value = spec["record_value"](value)
            key = spec["record_as"] or f.name
            if isinstance(key, tuple):
                settings.setdefault(key[0], {})[key[1]] = value
            else:
                settings[key] = value
        return settings


def _assemble() -> type:
    """`RunConfig`: the core options, then every option an analysis or a probe declares in its
    own folder (`registry.declared_options`, the built-ins' and the plugins'), one frozen
    dataclass; a declared option that shadows a core one is a bug."""
    declared = registry.declared_options()
    core = {f.name for f in fields(CoreOptions)}
    shadowing = [o.name for o in declared if o.name in core]
    if shadowing:
        raise ValueError(f"options declared by an analysis shadow core options: {shadowing}")
    return dataclasses.make_dataclass(
        "RunConfig",
        [(o.name, object, _field(o)) for o in declared],
        bases=(CoreOptions,),
        frozen=True,
        namespace={
            "__module__": __name__,
            "__doc__": "Every option of a run (`headprobe run` / `headprobe.run`): the core "
            "options and those the analyses and probes declare; see each field's help "
            "(`help_text`).",
        },
    )


RunConfig = _assemble()


def flag(name: str) -> str:
    """How option `name` is called in messages: its command-line flag, else its Python name."""
    return RunConfig.__dataclass_fields__[name].metadata["flag"] or name


def fingerprinted() -> list[str]:
    """The options that name an input file besides the corpora (`Option.fingerprint`): a resumed
    run finds each unchanged (`summary["inputs"]`)."""
    return [f.name for f in fields(RunConfig) if f.metadata.get("fingerprint")]


def cli_options():
    """(name, flag, argparse keyword arguments, group) of every command-line option, in order."""
    for f in fields(RunConfig):
        spec = f.metadata
        if spec["flag"] is None:
            continue
        kwargs = {
            "dest": f.name,
            "help": RunConfig.help_text(f.name).replace("%", "%%"),  # argparse formats help
            "default": f.default
            if spec["cli_default"] is dataclasses.MISSING
            else spec["cli_default"],
        }
        if spec["action"]:
            kwargs["action"] = spec["action"]
        else:
            kwargs.update(
                {key: spec[key] for key in ("type", "choices", "metavar") if spec[key] is not None}
            )
        yield f.name, spec["flag"], kwargs, spec["group"]


def from_cli(args) -> RunConfig:
    """The RunConfig of parsed `headprobe run` arguments (unchecked)."""
    return RunConfig(**{name: getattr(args, name) for name, *_ in cli_options()})
