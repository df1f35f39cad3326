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
import time

import pandas as pd
import torch

from headprobe.config import RunConfig
from headprobe.inputs.samples import SAMPLE, SAMPLE_COREF
from headprobe.model import loading as models
from headprobe.passes import Pass, plan_passes, score, weigh
from headprobe.results import store
from headprobe.results.query import Results, merge_unit_counts
from headprobe.scoring import distributed, registry
from headprobe.scoring.registry import (
    ARCS,
    COREFERENCE,
    MENTIONS,
    SENTENCES,
)
from headprobe.scoring.scorer_base import KeepsRecord, RunsModel
from headprobe.session import Session, open_session
from headprobe.stats.head_selection import SHOWN_COLUMNS

__all__ = ["RunConfig", "run", "headline", "attention_for_sentence", "SAMPLE", "SAMPLE_COREF"]


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


def _staged_report(results, formats):
    """report/ built inside the save, swapped in with the results (`report.staged_report`), its
    figures in `formats`."""
    from headprobe.report import staged_report

    return staged_report(results, formats)


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


CAUSAL_NOTE = (
    "{model} is a causal (decoder) model: a word attends only to itself and earlier words. "
    "dep->head can find a head only when the head precedes the dependent, and head<-dep only when "
    "the head follows it; the first word's row and the last word's column are empty (those arcs are "
    "counted as unreachable), and coreference (attention from a mention to earlier words) is fully expressible."
)
