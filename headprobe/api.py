"""The Python API: everything the CLI does, returning DataFrames.

    import headprobe
    results = headprobe.run(treebank="en_ewt-ud-dev.conllu")        # bundled MiniLM
    results.best_heads                                              # pandas DataFrame
    results.save("out/")
    headprobe.run(RunConfig(treebank=..., layers="0-3"))            # the same options as one object

A run: `validate` (every option, `config.RunConfig.checked`) -> `open_session` (the lock on
`out`, the model's config, the checkpoint, the model) -> `plan_passes` (one engine pass per
corpus: sentences, coreference windows, a probe; each read lazily) -> `score` -> `finish`
(statistics, tables, pictures, the save).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch

from headprobe import checks
from headprobe.config import SENTENCE_SOURCES, RunConfig, fingerprinted, flag
from headprobe.core import atomic
from headprobe.inputs.align import apply_bos
from headprobe.inputs.conventions import PRESETS
from headprobe.inputs.corpora.base import Stream
from headprobe.inputs.samples import DEFAULT_TREEBANK, SAMPLE, SAMPLE_COREF, bundled_provenance
from headprobe.model import loading as models
from headprobe.model.capture import text_config
from headprobe.model.control import CONTROL, TRAINED
from headprobe.model.sites import Sites, attention_sites
from headprobe.results import software, store
from headprobe.results.examples import MentionPicker, SentencePicker
from headprobe.results.findings import skipped_counts
from headprobe.results.query import Results, merge_unit_counts
from headprobe.scoring import distributed, registry
from headprobe.scoring.base import KeepsRecord, ReadsInputs, ReadsOptions, RunsModel, TakesHeads
from headprobe.scoring.batch_size import auto_batch_size
from headprobe.scoring.checkpoint import Checkpoint
from headprobe.scoring.engine import CHUNK, FULL_AT, POOL_BATCHES, Engine
from headprobe.scoring.measures import DEFAULT as DEFAULT_MEASURES
from headprobe.scoring.measures import needs_of, tally_key
from headprobe.scoring.options import ModelFacts
from headprobe.scoring.pass_settings import PassSettings
from headprobe.scoring.registry import (
    ANY,
    ARCS,
    COREFERENCE,
    MENTIONS,
    PROBE,
    SENTENCES,
    WEIGHTS_ONLY,
)
from headprobe.stats.engine import SHOWN_COLUMNS

__all__ = ["RunConfig", "run", "headline", "attention_for_sentence", "SAMPLE", "SAMPLE_COREF"]

CAUSAL_NOTE = (
    "{model} is a causal (decoder) model: a word attends only to itself and earlier words. "
    "dep->head can find a head only when the head precedes the dependent, and head<-dep only when "
    "the head follows it; the first word's row and the last word's column are empty (those arcs are "
    "counted as unreachable), and coreference (attention from a mention to earlier words) is fully expressible."
)


def run(config: RunConfig | str | None = None, /, **options) -> Results | None:
    """Score every head of a model and return (and with `out`, save) the results.

        headprobe.run(treebank="en_ewt-ud-dev.conllu", layers="0-3", out="results/")
        headprobe.run("smollm2", coref="en_gum-ud-dev.conllu", analyses=["coreference"])
        headprobe.run(RunConfig(probe="repeated-random"), loaded=(model, tokenizer, "mine"))

    `config`: a `RunConfig`, or the model (hub name, local path, or a bundled alias: `None` /
    "minilm", "smollm2"); `options`: any `RunConfig` field by name (each one's help says what it
    does: `RunConfig.help_text("window")`). With no sentence corpus, no `coref` and no `probe`,
    the bundled data are scored: UD English EWT dev and the openly licensed documents of UD
    English GUM dev (`headprobe.inputs.samples`; their sources and licences go into the summary's
    `bundled_data` and the report's provenance).

    Every option and path is checked before any model is loaded (`checks.UsageError`), and
    `layers` against the model's config before its weights are. Corpora are read lazily, as
    they are scored: memory does not grow with the corpus. With `out`, the run holds the
    directory and writes it whole or not at all (`store.save`), checkpointing the counts
    every `checkpoint_every` batches for `resume`. Under torchrun (`torchrun --nproc_per_node N
    -m headprobe run ...`) each rank scores its share of the examples, the counts are summed
    over the ranks, and rank 0 returns (and writes) the results; the others return None.
    """
    started = time.perf_counter()
    config, world = validate(RunConfig.of(config, **options))
    with contextlib.ExitStack() as held:
        config, session = open_session(config, world, held)
        weighed = weigh(config, session)
        passes = plan_passes(config, session, bool(weighed))
        score(config, session, passes)
        return finish(config, session, passes, started, weighed)


def validate(config: RunConfig) -> tuple[RunConfig, distributed.World]:
    """The checked config for this process (under torchrun: this rank's device, and only rank 0
    writes and shows progress) and its place in the world."""
    config = config.checked()
    world, device, out, checkpoint_every, progress = distributed.for_run(
        config.device,
        out=config.out,
        progress=config.progress,
        checkpoint_every=config.checkpoint_every,
        resume=config.resume,
        keep_unit_counts=config.keep_unit_counts,
        device_map=config.device_map,
    )
    return dataclasses.replace(
        config, device=device, out=out, checkpoint_every=checkpoint_every, progress=progress
    ), world


@dataclass
class Session:
    """A run past its checks: the model, its attention sites and the stack scored (resolved), the
    checkpoint, the summary so far, this rank's world."""

    net: torch.nn.Module
    tokenizer: object
    name: str
    sites: Sites
    stack: str
    analyses: list[str]  # the checked analyses and what they need first on this model
    summary: dict
    checkpoint: Checkpoint | None
    world: distributed.World
    settings: PassSettings  # the passes' settings, built once from the config, the stack resolved


def open_session(config: RunConfig, world, held: contextlib.ExitStack) -> tuple[RunConfig, Session]:
    """Lock `out` (released by `held`), check `layers` against the model's config, open the
    checkpoint, load the model (unless `loaded`), decide the batch size and start the summary:
    the config with its batch size, and the session."""
    if config.out is not None:
        lock = held.enter_context(atomic.OutLock(config.out))
        for note in lock.notes + atomic.recover(config.out):
            _note(note)
    reference = _check_against_config(config)
    inputs = _input_fingerprints(config, reference)
    device = (
        str(models.pick_device(config.device))
        if config.loaded is None
        else str(next(config.loaded[0].parameters()).device)
    )
    settings = config.options_record(device)
    checkpoint = _open_checkpoint(config, inputs, settings)
    net, tokenizer, name = _load_model(config)
    config = _with_batch_size(config, checkpoint, net)
    settings["batch_size"] = config.batch_size
    sites = attention_sites(net)
    stack = sites.resolve(config.stack)
    checks.check_layers_exist(config.layers, sites.n_layers(stack), name)
    facts = ModelFacts(
        name, net.config, sites.n_layers(stack), sites.n_heads(stack), config.layers, _lm(net)
    )
    for check in registry.model_checks(config.analyses, None):
        check(config, facts)
    check_capturable_measures(net, config.measure)
    tokenizer, bos_used = apply_bos(tokenizer, config.bos, sites.causal(stack))
    summary = _start_summary(config, net, name, sites, stack, inputs, settings, bos_used)
    analyses = _with_prerequisites(config.analyses, net, config.heads)
    passes = dataclasses.replace(config.pass_settings(), stack=stack)
    return config, Session(
        net, tokenizer, name, sites, stack, analyses, summary, checkpoint, world, passes
    )


def _with_batch_size(config: RunConfig, checkpoint: Checkpoint | None, net) -> RunConfig:
    """`config` with its batch size decided: the one given, else the interrupted run's when
    resuming, else `scoring.batch_size.auto_batch_size` (64 on the CPU, from free memory on a
    GPU); the checkpoint records it."""
    size = config.batch_size or (checkpoint.batch_size if checkpoint is not None else None)
    size = size or auto_batch_size(net, next(net.parameters()).device)
    if checkpoint is not None:
        checkpoint.batch_size = size
    return dataclasses.replace(config, batch_size=size)


def _check_against_config(config: RunConfig):
    """The model's reference (`checks.check_model`), `None` for a loaded model; the probe's model
    and corpus checks, the stack and layers asked for, and the analyses' model checks
    (`registry.model_checks`), against the model's config first, so that what does not fit fails
    before the weights load."""
    probe = registry.probe(config.probe) if config.probe else None
    if probe is not None:
        _check_corpus(config, probe)
    reference = checks.check_model(config.model) if config.loaded is None else None
    if reference is None:
        net, name = config.loaded[0], config.loaded[2]
        facts = ModelFacts(name, net.config, 0, 0, config.layers, _lm(net))
        for check in getattr(probe, "model_checks", ()):
            check(config, facts)
        return None
    model_config = checks.read_config(*reference)
    facts = ModelFacts(
        reference[2],
        model_config,
        0,
        0,
        config.layers,
        lambda: _causal_lm_class(reference, model_config),
    )
    for check in getattr(probe, "model_checks", ()):
        check(config, facts)
    checks.check_stack_in_config(config.stack, model_config, reference[2])
    facts.n_layers, facts.n_heads = checks.config_layers_heads(model_config, config.stack)
    if facts.n_layers:
        checks.check_layers_exist(config.layers, facts.n_layers, reference[2])
        for check in registry.model_checks(config.analyses, None):
            check(config, facts)
    return reference


def _lm(net) -> Callable[[], bool]:
    """Whether a loaded model is a causal language model, judged by its head, when asked."""

    def causal_lm() -> bool:
        from headprobe.model.objectives import lm_kind

        return lm_kind(net) == "causal_lm"

    return causal_lm


def _causal_lm_class(reference, model_config) -> bool:
    """Whether a checkpoint loads as a causal language model, judged by its config."""
    from transformers import AutoModelForCausalLM

    return models.lm_class(reference[0], reference[1], model_config) is AutoModelForCausalLM


def _check_corpus(config: RunConfig, probe) -> None:
    """The probe's checks of the run's sentence corpus (the needle's haystack), before the model
    loads: its first sentence is read (a malformed one is its `CorpusError`, naming file:line)."""
    given = [key for key in SENTENCE_SOURCES if getattr(config, key) is not None]
    if not given or not probe.corpus_checks:
        return
    source = f"{flag(given[0])} {getattr(config, given[0])}"
    for check in probe.corpus_checks:
        check(config, _sentences(config), source)


def _sentences(config: RunConfig):
    """The run's sentence corpus, read lazily, or None where none is given."""
    if not any(getattr(config, key) is not None for key in SENTENCE_SOURCES):
        return None
    return sentence_stream(
        config.treebank, config.text, config.hf_dataset, config.skip_bad, config.conventions
    )


def _input_fingerprints(config: RunConfig, reference) -> dict:
    """`_input_fingerprints(config, reference)`: a fingerprint of each input given and of the
    model (its name only for a loaded model)."""
    inputs = {
        key: store.input_fingerprint(flag(key), getattr(config, key))
        for key in (*SENTENCE_SOURCES, "coref", *fingerprinted())
        if getattr(config, key) is not None
    }
    inputs["model"] = (
        store.model_fingerprint(reference[0], reference[2])
        if reference is not None
        else {"name": config.loaded[2]}
    )
    return inputs


def _open_checkpoint(config: RunConfig, inputs: dict, settings: dict) -> Checkpoint | None:
    """The run's checkpoint under `out` when one is asked for (and unit counts are not kept)."""
    if config.out is None or not config.checkpoint_every or config.keep_unit_counts:
        return None
    fingerprint = {
        "inputs": inputs,
        # the batch size is the checkpoint's own record (`Checkpoint.batch_size`): left out on
        # --resume, the interrupted run's is used
        "options": {key: value for key, value in settings.items() if key != "batch_size"},
        "batching": {"chunk": CHUNK, "full_at": FULL_AT, "pool_batches": POOL_BATCHES},
        "version": store.version(),
    }
    checkpoint = Checkpoint(
        config.out, fingerprint, config.checkpoint_every, config.resume, config.batch_size
    )
    for note in checkpoint.notes:
        _note(note)
    return checkpoint


def _load_model(config: RunConfig) -> tuple:
    """(model, tokenizer, name): `config.loaded`, else the model loaded (under its language-model
    head where an analysis scores the loss)."""
    if config.loaded is not None:
        return config.loaded
    # head ablation / importance (METHODS §8) score the language-model loss: the model under its head
    lm_head = any(registry.get(name).scorer.needs_lm_head for name in config.analyses)
    with _quiet_loading(not config.progress):
        return (models.load_lm if lm_head else models.load)(
            config.model,
            device=config.device,
            dtype=config.dtype,
            device_map=config.device_map,
            max_memory=config.max_memory,
        )[:3]


def _start_summary(config, net, name, sites, stack, inputs, settings, bos_used) -> dict:
    """The run's summary before anything is scored: the model, options, inputs and sites."""
    return {
        "model": name,
        "dtype": config.dtype,
        "device": str(next(net.parameters()).device),
        "software": software.record(),  # METHODS §15: versions and commit
        "batch_size": config.batch_size,
        "from_mode": config.from_mode,
        "layers": config.layers,
        "notes": [],
        "skipped": {},
        "corpora": {},
        "runs": {},
        "seed": config.seed,
        "bootstrap_resamples": config.n_boot,
        "units": "documents where the corpus marks them (# newdoc id), else sentences",
        "run_id": store.new_run_id(),
        "inputs": inputs,
        # source, licence and credit of each bundled data file read (METHODS §15 provenance)
        "bundled_data": bundled_provenance(
            getattr(config, key) for key in (*SENTENCE_SOURCES, "coref")
        ),
        "options": settings,
        "bos": {"asked": config.bos, "used": bos_used},
        "stack": stack,
        **sites.describe(),
        "conventions": dict(PRESETS[config.conventions].summary(), from_mode_used=config.from_mode),
        "measures": list(config.measure),
    }


def _with_prerequisites(wanted: list[str], net, heads) -> list[str]:
    """`wanted` plus what its second-pass analyses need first on this model (the pruning curve:
    `importance`, or `ablation` on a model without a language-model head)."""
    from headprobe.model.objectives import lm_kind

    more = []
    for name in wanted:
        scorer = registry.get(name).scorer
        if scorer.second_pass:
            more += scorer.prerequisites(lm_kind(net), heads)
    return list(dict.fromkeys(wanted + more))


# ----------------------------------------------------------------------------------- passes
SECOND_PASS = "_second_pass"  # the key of a corpus's second pass: its first pass's key + this


@dataclass
class Pass:
    """One engine pass: its key in the summary (and checkpoint), its analyses and their scorers, its
    examples (a lazy `Stream`, read again by each pass over it), where they come from, its batch
    size; what it records of its corpus once read (`record(summary)`), what it needs done just
    before it (`before(summary)`), the picker that keeps example pictures' candidates as it passes,
    and the model it scores where that is not the session's (`control`: the random-init twin)."""

    key: str
    analyses: list
    scorers: list
    examples: Stream
    source: str
    batch_size: int
    record: Callable[[dict], None] = lambda summary: None
    before: Callable[[dict], None] = lambda summary: None
    picker: SentencePicker | MentionPicker | None = None
    net: torch.nn.Module | None = None
    control: bool = False

    @property
    def label(self) -> str:
        """Its progress bar's name: the corpus (`probe`, `sentences`, ...), or for a second pass
        the analyses it runs (`retrieval_check`, `prune_curve`)."""
        if self.key.endswith(SECOND_PASS):
            return ", ".join(a.name for a in self.analyses)
        return self.key


def _make_scorers(
    analyses, config: RunConfig | None = None, model: str = TRAINED, measures=DEFAULT_MEASURES
) -> list:
    """A scorer per analysis counting `model` (default the trained model) on every measure at once
    (an analysis that takes no attention, ablation or importance, on the first); the run options
    an analysis reads handed over: the heads to ablate (`use_heads`), the options it declares
    (`use_options`: e.g. the groups of heads to gate together, the causal check's k)."""
    scorers = [a.make_scorer(model=model, measures=measures) for a in analyses]
    for analysis, scorer in zip(analyses, scorers):
        if isinstance(scorer, TakesHeads):
            scorer.use_heads(None if config is None else config.heads)
        if isinstance(scorer, ReadsOptions) and config is not None:
            scorer.use_options({name: getattr(config, name) for name in analysis.option_names})
    return scorers


def weigh(config: RunConfig, session: Session) -> list:
    """The scorers of the weights-only analyses asked for (`registry.WEIGHTS_ONLY`), each computed
    once from the loaded model, before any pass."""
    scorers = []
    for analysis in registry.analyses(WEIGHTS_ONLY):
        if analysis.name in session.analyses:
            scorer = analysis.make_scorer()
            scorer.use_model(
                session.net,
                session.tokenizer,
                layers=config.layers,
                stack=session.stack,
                seed=config.seed,
            )
            scorers.append(scorer)
    return scorers


def plan_passes(config: RunConfig, session: Session, weighed: bool = False) -> list[Pass]:
    """The engine passes the analyses asked for need, in order: sentences, coreference, probe.
    Token analyses read the sentence corpus (in its pass) unless a probe is given. None, when
    only weights-only analyses were asked for (`weighed`: they were computed already)."""
    wanted = session.analyses
    on_sentences = [a for a in registry.analyses(SENTENCES) if a.name in wanted]
    on_tokens = [a for a in registry.analyses(PROBE) if a.name in wanted]
    on_coref = [a for a in registry.analyses(COREFERENCE) if a.name in wanted]
    on_any = [a for a in registry.analyses(ANY) if a.name in wanted]
    if config.probe is None:
        on_sentences, on_tokens = on_sentences + on_tokens, []
    has_sentences = any(getattr(config, key) is not None for key in SENTENCE_SOURCES)
    reads_sentences = has_sentences or (config.coref is None and config.probe is None)
    if reads_sentences:
        on_sentences += on_any
    elif config.probe is not None:
        on_tokens += on_any
    else:
        on_coref += on_any
    passes = []
    if on_sentences and reads_sentences:
        passes += with_second_pass(lambda now: sentence_pass(config, now), on_sentences, config)
    if config.coref is not None and on_coref:
        passes += with_second_pass(
            lambda now: coref_pass(config, session.tokenizer, now), on_coref, config
        )
    if config.probe is not None and on_tokens:
        examples = probe_stream(config, session)
        passes += with_second_pass(
            lambda now: Pass(
                PROBE,
                now,
                _make_scorers(now, config, measures=config.measure),
                examples,
                examples.name,
                config.batch_size,
            ),
            on_tokens,
            config,
        )
    if not passes and not weighed:
        raise ValueError(
            "nothing to score: give a sentence corpus and/or coref for the analyses asked for"
        )
    return passes


def probe_stream(config: RunConfig, session: Session) -> Stream:
    """The probe's examples, read lazily: random tokens (the inputs' own), or those of a probe an
    analysis's folder registers (`registry.Probe.stream`; the needle's haystack the run's
    sentence corpus where one is given)."""
    from headprobe.inputs.probes import make_probe

    probe = registry.probe(config.probe)
    if probe is not None:
        return probe.stream(config, session.tokenizer, session.net, _sentences(config))
    return make_probe(
        config.probe,
        session.tokenizer,
        length=config.probe_length,
        n=config.probe_n,
        seed=config.seed,
        specials=config.probe_specials,
        vocab_size=getattr(text_config(session.net), "vocab_size", None),
    )


def sentence_stream(
    treebank=None, text=None, hf_dataset=None, skip_bad=False, conventions=None
) -> Stream:
    """Dependency examples of one source (`RunConfig.checked` allows one; default: the bundled
    UD English EWT dev), read lazily; a treebank's relation subtypes are cut or kept as `conventions` say."""
    if text is not None:
        from headprobe.inputs.corpora.spacy_text import stream_text

        return stream_text(text, skip_bad=skip_bad)
    if hf_dataset is not None:
        from headprobe.inputs.corpora.hf_datasets import stream_hf_dataset

        return stream_hf_dataset(hf_dataset, skip_bad=skip_bad)
    from headprobe.inputs.corpora.conllu import stream_conllu

    return stream_conllu(
        treebank if treebank is not None else DEFAULT_TREEBANK,
        skip_bad=skip_bad,
        conventions=conventions,
    )


def sentence_pass(config: RunConfig, analyses) -> Pass:
    stream = sentence_stream(
        config.treebank, config.text, config.hf_dataset, config.skip_bad, config.conventions
    )

    def record(summary: dict) -> None:
        summary["skipped"]["malformed_sentences"] = len(stream.skipped)
        summary["skipped"]["malformed_sources"] = list(stream.skipped)[:50]

    pictures = config.pictures and any(a.pictures == ARCS for a in analyses)
    return Pass(
        SENTENCES,
        analyses,
        _make_scorers(analyses, config, measures=config.measure),
        stream,
        stream.name,
        config.batch_size,
        record,
        picker=SentencePicker(config.seed) if pictures else None,
    )


def second_pass(first: Pass, later, config: RunConfig | None = None) -> Pass:
    """The analyses that need the first pass's counts (`second_pass`: the pruning curve's order), on
    the same corpus. Under torchrun the counts they read are summed over the ranks first (copies:
    the run's own totals are summed once, at the end)."""
    measure = (
        first.scorers[0].measures[0] if first.scorers else DEFAULT_MEASURES[0]
    )  # the first measure's counts
    scorers = _make_scorers(later, config, measures=(measure,))

    def before(summary: dict) -> None:
        tallies = {s.analysis: s.tally_.copy() for s in first.scorers}  # the first measure's
        distributed.all_reduce_tallies(list(tallies.values()))
        for scorer in scorers:
            scorer.use_tallies(tallies)
            summary.update(scorer.describe())

    return Pass(
        first.key + SECOND_PASS,
        later,
        scorers,
        first.examples,
        first.source,
        first.batch_size,
        before=before,
    )


def with_second_pass(
    make_pass: Callable[[list], Pass], analyses, config: RunConfig | None = None
) -> list[Pass]:
    """`make_pass(analyses)` of the analyses scored in one pass over a corpus, and after it the
    second pass of those that need its counts (`second_pass`), on the same corpus."""
    later = [a for a in analyses if getattr(a.scorer, "second_pass", False)]
    first = make_pass([a for a in analyses if a not in later])
    return [first] + ([second_pass(first, later, config)] if later else [])


def coref_pass(config: RunConfig, tokenizer, analyses) -> Pass:
    from headprobe.inputs.corpora.corefud import stream_coref_examples, tokenizer_piece_counter

    windows = stream_coref_examples(
        config.coref,
        tokenizer_piece_counter(tokenizer),
        window=config.window,
        skip_bad=config.skip_bad,
        single_document=config.coref_single_document,
    )

    def record(summary: dict) -> None:
        summary["skipped"]["coreference_sentences"] = len(windows.skipped)
        summary["skipped"]["coreference_sources"] = list(windows.skipped)[:50]
        summary["coreference_corpus"] = dict(windows.counts)

    pictures = config.pictures and any(a.pictures == MENTIONS for a in analyses)
    return Pass(
        COREFERENCE,
        analyses,
        _make_scorers(analyses, config, measures=config.measure),
        windows,
        str(config.coref),
        max(1, config.batch_size // 4),
        record,
        picker=MentionPicker(config.seed) if pictures else None,
    )


def control_passes(config: RunConfig, session: Session, passes: list[Pass]) -> list[Pass]:
    """The random-init control (`headprobe.model.control`): the analyses that read attention, scored again
    on the model's architecture re-initialised with the run's seed (`models.random_init`), same
    tokenizer, same corpora (read again), into tallies of their own (`model` = "control")."""
    twin = models.random_init(session.net, config.seed)
    control = []
    for one in passes:
        reading = [a for a in one.analyses if not issubclass(a.scorer, RunsModel)]
        if not one.key.endswith(SECOND_PASS) and reading:
            control.append(
                Pass(
                    tally_key(one.key, model=CONTROL),
                    reading,
                    _make_scorers(reading, model=CONTROL, measures=config.measure),
                    one.examples,
                    one.source,
                    one.batch_size,
                    net=twin,
                    control=True,
                )
            )
    session.summary["control"] = {
        "kind": config.control,
        "seed": config.seed,
        "model": f"{session.name}, {config.control} (seed {config.seed})",
        "analyses": list(dict.fromkeys(s.analysis for one in control for s in one.scorers)),
    }
    return control


# ----------------------------------------------------------------------------------- scoring
def score(config: RunConfig, session: Session, passes: list[Pass]) -> None:
    """Run every pass and record it in the summary ("nothing was scored" is an error); then the
    control's passes, if asked for (added to `passes`)."""
    summary = session.summary
    for one in passes:
        score_pass(config, session, one)
    if passes and not any(r["examples"] for r in summary["runs"].values()):
        skipped = skipped_counts(summary["skipped"])
        raise checks.UsageError(
            f"nothing was scored: no example of the corpus could be scored "
            f"(skipped: {skipped or 'none; the corpus is empty'})"
        )
    if config.control is not None:
        control = control_passes(config, session, passes)
        for one in control:
            score_pass(config, session, one)
        passes += control


def score_pass(config: RunConfig, session: Session, one: Pass) -> None:
    """Run one engine pass and record its corpus, speed and skipped examples under its key.

    With a checkpoint: a pass it holds as finished is not scored again (its totals and stats
    are restored; its corpus is read through for the skip accounting and pictures); an
    interrupted one continues where it stopped; a finished pass is saved."""
    net, checkpoint, summary = one.net or session.net, session.checkpoint, session.summary
    one.before(summary)
    state = (
        checkpoint.restore(one.key, one.scorers, next(net.parameters()).device)
        if checkpoint is not None
        else None
    )
    engine = Engine(
        net,
        session.tokenizer,
        one.scorers,
        session.settings,
        batch_size=one.batch_size,
        desc=one.label,
    )
    examples = one.picker.watch(one.examples) if one.picker is not None else one.examples
    if state is not None and state.get("finished"):
        stats = state["stats"]
        for _ in examples:  # read, not scored: fills the skip accounting and pictures
            pass
    else:
        for scorer in one.scorers:  # mean and resample ablation: one pass over the inputs first
            if isinstance(scorer, ReadsInputs):
                scorer.use_inputs(one.examples)
        hook = (
            _CheckpointHook(checkpoint, one.key, one.scorers, state)
            if checkpoint is not None
            else None
        )
        stats = distributed.reduce_stats(
            engine.run(examples, checkpoint=hook, world=distributed.current())
        )
        if checkpoint is not None:
            checkpoint.save(one.key, one.scorers, {"finished": True, "stats": stats})
    summary["corpora"][one.key] = one.source
    summary["runs"][one.key] = _run_stats(stats)
    summary["notes"] += [note for note in stats.get("notes", []) if note not in summary["notes"]]
    summary["skipped"][f"{one.key}_skipped_sources"] = stats["skipped_sources"][:50]
    summary["skipped"].update({f"{one.key}_{k}": v for k, v in stats["skipped"].items()})
    one.record(summary)


# ----------------------------------------------------------------------------------- results
def finish(
    config: RunConfig, session: Session, passes: list[Pass], started: float, weighed=()
) -> Results | None:
    """Sum the counts over the ranks; on rank 0: the results (tables, pictures), saved to `out`.
    `weighed`: the weights-only analyses' scorers (their records go into the summary)."""
    net, summary, world = session.net, session.summary, session.world
    trained = [scorer for one in passes if not one.control for scorer in one.scorers] + [*weighed]
    scorers = trained + [scorer for one in passes if one.control for scorer in one.scorers]
    _describe_run(summary, session, trained)
    stack = session.stack
    tallies = {key: tally for s in scorers for key, tally in s.tallies_.items()}
    distributed.all_reduce_tallies(list(tallies.values()))  # torchrun: summed over the ranks
    if not world.main:
        return None  # rank 0 writes
    if world.size > 1:
        summary["distributed"] = world.describe()
    if getattr(net, "hf_device_map", None):
        summary["device_map"] = {k: str(v) for k, v in net.hf_device_map.items()}
    unit_counts = (
        merge_unit_counts([s.unit_counts() for s in trained if s.tallies_])
        if config.keep_unit_counts
        else None
    )
    results = Results(
        {key: tally.to("cpu") for key, tally in tallies.items()}, summary, unit_counts=unit_counts
    )
    pickers = {one.key: one.picker for one in passes if one.picker is not None}
    drawn = lambda kind: any(name in results.tallies for name in registry.pictured(kind))
    sentences = pickers.get(SENTENCES) if drawn(ARCS) else None
    mentions = pickers.get(COREFERENCE) if drawn(MENTIONS) else None
    if sentences is not None or mentions is not None:
        from headprobe.results.examples import example_pictures, planned_pictures
        from headprobe.scoring.sentence_attention import head_matrices

        best = results.for_measure().best_heads
        planned = planned_pictures(best, sentences, seed=config.seed, coref=mentions)
        requests = [picture.request for picture in planned]
        matrices = head_matrices(net, session.tokenizer, requests, config.from_mode, stack)
        results.examples = example_pictures(planned, matrices)
    results.head_attention = _explorer_attention(config, session, results, sentences)
    results.summary["seconds"] = round(time.perf_counter() - started, 2)
    results.summary["headline"] = headline(results.best_heads)
    out, report, checkpoint = config.out, config.report, session.checkpoint
    if out is not None:
        results.summary["out"] = str(out)
        results.saved_paths = store.save(
            results, out, extra=_staged_report(results, config.figures) if report else None
        )
        if checkpoint is not None:
            checkpoint.remove()
    return results


def _explorer_attention(config: RunConfig, session: Session, results, picker) -> dict | None:
    """Every head's attention on a few sentences `picker` drew: a second, tiny pass after the
    main one (`headprobe.scoring.sentence_attention`), kept by `headprobe.results.head_attention`;
    None without a picker (no pictures)."""
    if picker is None:
        return None
    from headprobe.results import head_attention as kept
    from headprobe.scoring.sentence_attention import sentences_word_attention

    planned = kept.explorer_plan(results, picker)
    every = sentences_word_attention(
        session.net,
        session.tokenizer,
        kept.planned_words(planned),
        results.layers,
        config.from_mode,
        session.stack,
    )
    return kept.keep(planned, every, results.layers, results.n_heads)


def _describe_run(summary: dict, session: Session, trained: list) -> None:
    """The summary's model shape, causality, analyses, objectives and what the trained model's
    scorers keep beside their counts."""
    summary["causal"] = session.sites.causal(session.stack)
    on_words = {a.name for a in registry.analyses() if a.input in (SENTENCES, COREFERENCE)}
    if summary["causal"] and any(s.analysis in on_words for s in trained):
        summary["notes"].append(CAUSAL_NOTE.format(model=session.name))  # arcs and mentions only
    sites, stack = session.sites, session.stack
    summary["n_layers"], summary["n_heads"] = sites.n_layers(stack), sites.n_heads(stack)
    summary["n_kv_heads"] = sites.n_kv_heads(stack)
    summary["analyses"] = list(dict.fromkeys(s.analysis for s in trained))
    objectives = {
        s.analysis: s.objective.description
        for s in trained
        if isinstance(s, RunsModel) and s.objective is not None
    }
    for scorer in trained:  # what a scorer keeps beside its counts (weights-only analyses)
        if isinstance(scorer, KeepsRecord):
            summary.update(scorer.describe())
    if objectives:
        summary["objectives"] = objectives


@contextlib.contextmanager
def _quiet_loading(quiet: bool):
    """No "Loading weights" progress bar from transformers when progress bars are off."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if quiet and was:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if quiet and was:
            hf_logging.enable_progress_bar()


def _staged_report(results, formats):
    """report/ built inside the save, swapped in with the results (`report.staged_report`), its
    figures in `formats`."""
    from headprobe.report import staged_report

    return staged_report(results, formats)


def check_capturable_measures(net, measures) -> None:
    """A model on the legacy output_attentions path has no values: --measure norms is refused."""
    from headprobe.model.capture import CaptureUnavailable, check_capturable

    try:
        check_capturable(net, needs_of(measures))
    except CaptureUnavailable as err:
        raise checks.UsageError(f"--measure {','.join(measures)}: {err}") from None


def _note(text: str) -> None:
    print(f"headprobe: note: {text}", file=sys.stderr, flush=True)


class _CheckpointHook:
    """What `Engine.run` needs to checkpoint one pass: `every`, `start`, `save`."""

    def __init__(self, checkpoint: Checkpoint, key: str, scorers, start):
        self.checkpoint, self.key, self.scorers = checkpoint, key, scorers
        self.every = checkpoint.every
        self.start = start

    def save(self, engine, state: dict) -> None:
        self.checkpoint.save(self.key, self.scorers, dict(state, finished=False))


def _run_stats(stats: dict) -> dict:
    seconds = stats["seconds"]
    return {
        "examples": stats["examples"],
        "words": stats["words"],
        "seconds": round(seconds, 2),
        "words_per_second": round(stats["words"] / seconds, 1) if seconds else None,
        "final_batch_size": stats["batch_size"],
    }


def headline(best_heads: pd.DataFrame, labels=None) -> list[dict]:
    """The whole-data best heads of `labels` (default: those the analyses declare,
    `registry.headline_labels`), as the run's summary keeps them."""
    labels = registry.headline_labels() if labels is None else labels
    rows = best_heads[best_heads["label"].isin(labels) & (best_heads["fold"] == "")]
    keep = SHOWN_COLUMNS[: SHOWN_COLUMNS.index("gap") + 1]
    return rows[keep].round(4).to_dict(orient="records")


def attention_for_sentence(
    model,
    words_or_text,
    layer: int,
    head: int,
    from_mode: str = "mean",
    tokenizer=None,
    stack: str | None = None,
) -> pd.DataFrame:
    """Word x word attention of one head (of `stack`: "encoder", "decoder", "cross"; None: the
    model's default): rows attend (from), columns are attended (to), the last two columns the
    CLS-like and SEP-like specials. `model` is a name/alias, a loaded (model, tokenizer), or a
    model with `tokenizer` given.

        headprobe.attention_for_sentence("minilm", "The cat sat .", layer=2, head=8)"""
    from headprobe.scoring.sentence_attention import word_attention

    if isinstance(model, (str, type(None))):
        net, tokenizer, _ = models.load(model)
    elif isinstance(model, tuple):
        net, tokenizer = model[0], model[1]
    else:
        net = model
    words = words_or_text.split() if isinstance(words_or_text, str) else list(words_or_text)
    with torch.inference_mode():
        matrix = word_attention(net, tokenizer, words, layer, from_mode, stack)[head]
    columns = [*words, "[CLS/BOS]", "[SEP/EOS]"]
    return pd.DataFrame(matrix.numpy(), index=words, columns=columns)
