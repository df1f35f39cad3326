"""The options of `headprobe run`: one frozen `RunConfig`, assembled from the core options here and
those every analysis and probe declares in its own folder (`headprobe.scoring.options.Option`).

    from headprobe.config import RunConfig
    config = RunConfig(treebank="en_ewt-ud-dev.conllu", layers="0-3", analyses="dependency")
    headprobe.run(config)                         # the same as headprobe.run(treebank=..., layers=...)
    checked = config.checked()                    # every option checked (UsageError naming it), normalised
    checked.layers, checked.analyses              # [0, 1, 2, 3], ["dependency"]

Each core field is declared with `option(default, help, flag=..., check=..., ...)` (its checks, help
texts and record rules are in `headprobe.core_options`), each analysis's
with an `Option` in its folder (`Analysis.options`, `Probe.options`; `_assemble` joins them, the
plugins' included): the command line's `headprobe run` options are generated from these fields (`headprobe.cli`), `headprobe.run` takes a
`RunConfig` or the same names as keyword arguments, and `RunConfig.checked` runs the checks in
stages (`STAGES`: plain values, values that depend on others, input files, the model, the device,
`--out`, combinations), all before any model is loaded. `options_record` is
what results record as `summary["options"]` (the resume fingerprint compares it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path

from headprobe import checks
from headprobe.core.seeds import SEED
from headprobe.core_options import (
    SENTENCE_SOURCES,
    added_help,
    analyses_help,
    at_least,
    blocked_or_mapped,
    check_analyses,
    check_control,
    check_device,
    check_figure_formats,
    check_from_mode,
    check_hf_dataset,
    check_input_file,
    check_layers,
    check_max_memory,
    check_measures,
    check_model,
    check_out,
    check_task,
    coref_help,
    maybe_at_least,
    measure_asked,
    option,
    option_field,
    pictures_help,
    probe_help,
    probe_names,
    probe_reads,
    stack_help,
    task_help,
    task_record,
)
from headprobe.inputs.align import BOS_MODES, FROM_MODES
from headprobe.inputs.conventions import PRESETS
from headprobe.inputs.probes import PROBE_MARKERS
from headprobe.inputs.samples import DEFAULT_COREF, DEFAULT_TREEBANK
from headprobe.model import loading as models
from headprobe.model.control import CONTROLS
from headprobe.model.stacks import STACKS
from headprobe.scoring import registry
from headprobe.scoring.checkpoint import DEFAULT_EVERY
from headprobe.scoring.measures import DEFAULT as DEFAULT_MEASURES
from headprobe.scoring.options import ADDED, GIVEN, STAGES
from headprobe.scoring.pass_settings import PassSettings
from headprobe.scoring.tally import N_BOOT


# ------------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class CoreOptions:
    """The options of every run, whatever it analyses; `RunConfig` adds those the registered
    analyses and probes declare (`_assemble`). See each field's help (`help_text`)."""

    model: str | None = option(
        None,
        "hub name or path; bundled aliases: minilm (default), smollm2",
        flag="--model",
        check=check_model,
        stage="model",
    )
    treebank: str | Path | None = option(
        None,
        "CoNLL-U file with gold dependencies, plain or .gz (default: the bundled UD English EWT dev)",
        flag="--treebank",
        check=check_input_file,
        stage="input",
        group="source",
    )
    text: str | Path | None = option(
        None,
        "raw text file, parsed with the bundled spaCy en_core_web_sm (silver arcs)",
        flag="--text",
        check=check_input_file,
        stage="input",
        group="source",
    )
    hf_dataset: str | None = option(
        None,
        "Hugging Face dataset NAME[:CONFIG[:SPLIT]] or a save_to_disk dir",
        flag="--hf-dataset",
        check=check_hf_dataset,
        stage="input",
        group="source",
    )
    coref: str | Path | None = option(
        None,
        coref_help,
        flag="--coref",
        check=check_input_file,
        stage="input",
    )
    probe: str | None = option(
        None,
        probe_help,
        flag="--probe",
        choices=probe_names(),
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
        check=at_least(1, " (tokens per half of a probe sequence)"),
        record=probe_reads("probe_length"),
        record_at=15,
        record_as=("probe", "length"),
    )
    probe_n: int = option(
        500,
        "--probe: sequences; --task ioi: examples (default: 500)",
        flag="--n",
        type=int,
        metavar="N",
        check=at_least(1, " (probe sequences)"),
        record=probe_reads("probe_n"),
        record_at=16,
        record_as=("probe", "n"),
    )
    probe_specials: str = option(
        "auto",
        "--probe: special tokens around each sequence: auto (the tokenizer's own, as for text), bos "
        "(BOS in front where the tokenizer has one), none (default: auto)",
        flag="--probe-specials",
        choices=PROBE_MARKERS,
        record=probe_reads("probe_specials"),
        record_at=17,
        record_as=("probe", "specials"),
    )
    task: str | Path | list | None = option(
        None,
        task_help,
        flag="--task",
        metavar="FILE.jsonl|ioi",
        check=check_task,
        stage="input",
        record=GIVEN,
        record_at=26,
        record_as=("task", "name"),
        record_value=task_record,
    )
    out: str | Path | None = option(
        None,
        "output directory (default: results; in Python: none, nothing is written). The run holds it "
        "(a second run on it is refused) and writes it whole or not at all",
        flag="--out",
        check=check_out,
        stage="out",
        cli_default="results",
    )
    analyses: list[str] | str | None = option(
        None,
        analyses_help,
        flag="--analyses",
        check=check_analyses,
        stage="derived",
        record=True,
        record_at=0,
        record_value=sorted,
    )
    device: str | None = option(
        None,
        "cuda, cpu (default: cuda when available)",
        flag="--device",
        check=check_device,
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
        record=blocked_or_mapped,
        record_at=20,
    )
    max_memory: str | dict | None = option(
        None,
        "with --device-map: memory per device, e.g. 0=10GiB,cpu=30GiB",
        flag="--max-memory",
        metavar="SIZES",
        check=check_max_memory,
        record=blocked_or_mapped,
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
        check=maybe_at_least(1, " query pieces"),
        record=blocked_or_mapped,
        record_at=19,
    )
    stack: str | None = option(
        None, stack_help, flag="--stack", choices=STACKS, record=GIVEN, record_at=18
    )
    control: str | None = option(
        None,
        "random-init: also score the attention analyses on the same architecture re-initialised with "
        "--seed (same tokenizer); best heads gain the control's best, and a role rule may ask for a "
        "head above the control's held-out best",
        flag="--control",
        choices=CONTROLS,
        check=check_control,
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
        check=check_measures,
        record=measure_asked,
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
        check=maybe_at_least(1),
        record=True,
        record_at=2,
    )
    workers: int | None = option(
        None,
        "processes that tokenize the corpus ahead of the model (default: the cores the model's "
        "forward leaves free: those this process may use less one on a GPU, less torch's threads "
        "on the CPU, usually 0; 0: a thread of the run's own process); the results do not "
        "depend on it",
        flag="--workers",
        type=int,
        check=maybe_at_least(0),
    )
    layers: str | list[int] | None = option(
        None,
        "layers to score, e.g. 0-3,8 (0-based; in Python also a list) (default: all)",
        flag="--layers",
        check=check_layers,
        record=True,
        record_at=1,
    )
    from_mode: str | None = option(
        None,
        "pooling of attention FROM a word over its pieces: mean, first or max (default: the "
        "conventions'; headprobe: mean)",
        flag="--from-mode",
        choices=FROM_MODES,
        check=check_from_mode,
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
        check=at_least(checks.MIN_WINDOW, " pieces"),
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
        check=at_least(0),
        record=True,
        record_at=5,
    )
    n_boot: int = option(
        N_BOOT,
        f"bootstrap resamples (default: {N_BOOT})",
        flag="--bootstrap",
        type=int,
        metavar="N",
        check=at_least(1, " (resamples for the intervals and held-out selection)"),
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
        check=check_figure_formats,
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
        check=at_least(0, " (0: no checkpoints)"),
    )
    progress: bool = option(True, "no progress bars", flag="--quiet", action="store_false")
    pictures: bool = option(True, pictures_help)
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
        asked = (values["coref"], values["probe"], values["task"])
        if not given and all(v is None for v in asked):  # the bundled data
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
            workers=self.workers,
        )

    def options_record(self, device: str) -> dict:
        """The options as results record them (`summary["options"]`, and the checkpoint fingerprint
        that --resume compares), of a checked config, on `device`: each field's `record`,
        `record_as` and `record_value` metadata (`option`) say whether, where and what."""
        config = dataclasses.replace(self, device=device)
        settings = {}
        probe = registry.probe(config.probe) if config.probe is not None else None
        # a registered probe's own options are recorded with it, under "probe" after
        # --probe-specials, where they say nothing of themselves (a plugin's probe, as built-ins)
        own = {
            o.name
            for o in (probe.options if probe else ())
            if not isinstance(o, str) and not o.record
        }
        at = lambda f: 17.5 if f.name in own else f.metadata["record_at"]  # noqa: E731
        for f in sorted(fields(self), key=at):
            spec, value = f.metadata, getattr(config, f.name)
            record = spec["record"]
            if not (
                record is True
                or (record == GIVEN and value)
                or (callable(record) and record(config))
                or f.name in own
            ):
                continue
            if spec["record_value"] is not None:
                value = spec["record_value"](value)
            key = spec["record_as"] or (("probe", f.name) if f.name in own else f.name)
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
        [(o.name, object, option_field(o)) for o in declared],
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
