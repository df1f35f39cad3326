"""A run's engine passes (`headprobe.api`): which analyses read which corpus, and scoring them.

`weigh` runs the weights-only analyses; `plan_passes` makes one `Pass` per corpus (sentences,
coreference windows, a probe; each read lazily), a second pass over the same inputs for the
analyses that need the first pass's tallies, and the control model's passes; `score` runs each
through `scoring.engine.Engine`, checkpointing as it goes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from headprobe import checks
from headprobe.config import RunConfig
from headprobe.core_options import SENTENCE_SOURCES
from headprobe.inputs.corpora.base import Stream
from headprobe.model import loading as models
from headprobe.model.control import CONTROL, TRAINED
from headprobe.model.sites import text_config
from headprobe.results.examples import MentionPicker, SentencePicker
from headprobe.results.findings import skipped_counts
from headprobe.scoring import distributed, registry
from headprobe.scoring.checkpoint import Checkpoint
from headprobe.scoring.engine import Engine
from headprobe.scoring.measures import DEFAULT as DEFAULT_MEASURES
from headprobe.scoring.measures import tally_key
from headprobe.scoring.registry import (
    ANY,
    ARCS,
    COREFERENCE,
    MENTIONS,
    PROBE,
    SENTENCES,
    TASK,
    WEIGHTS_ONLY,
)
from headprobe.scoring.scorer_base import ReadsInputs, ReadsOptions, RunsModel, TakesHeads
from headprobe.session import Session, sentence_corpus, sentence_stream

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
    on_task = [a for a in registry.analyses(TASK) if a.name in wanted]
    if config.probe is None:
        on_sentences, on_tokens = on_sentences + on_tokens, []
    has_sentences = any(getattr(config, key) is not None for key in SENTENCE_SOURCES)
    reads_sentences = has_sentences or all(
        v is None for v in (config.coref, config.probe, config.task)
    )
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
    if config.task is not None and on_task:
        passes.append(task_pass(config, session, on_task))
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
        return probe.stream(config, session.tokenizer, session.net, sentence_corpus(config))
    return make_probe(
        config.probe,
        session.tokenizer,
        length=config.probe_length,
        n=config.probe_n,
        seed=config.seed,
        specials=config.probe_specials,
        vocab_size=getattr(text_config(session.net), "vocab_size", None),
    )


def task_pass(config: RunConfig, session: Session, analyses) -> Pass:
    """The task's examples (`headprobe.inputs.tasks`), every one checked before the pass: the
    analyses that read a task patch the model on them."""
    from headprobe.inputs.tasks import BATCH, task_examples, task_items, task_name, task_stream
    from headprobe.model.objectives import lm_kind

    masked = lm_kind(session.net) == "masked_lm"
    mask = getattr(session.tokenizer, "mask_token", None) if masked else None
    items = task_items(
        config.task, n=config.probe_n, seed=config.seed, tokenizer=session.tokenizer, mask=mask
    )
    name = task_name(config.task)
    examples = task_examples(items, session.tokenizer, masked=masked, name=name)

    def record(summary: dict) -> None:
        summary["task"] = {
            "name": name,
            "examples": len(examples),
            "units": len({e.unit for e in examples}),
            **({"n": config.probe_n, "seed": config.seed} if name == config.task else {}),
        }

    return Pass(
        TASK,
        analyses,
        _make_scorers(analyses, config),
        task_stream(examples, name),
        name,
        min(config.batch_size, BATCH),
        record,
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
    from headprobe.inputs.corpora.coref_windows import (
        stream_coref_examples,
        tokenizer_piece_counter,
    )

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
