"""A run past its checks (`headprobe.api`): the session opened once per run.

`open_session` locks `out`, checks `layers` against the model's config before the weights load,
opens the checkpoint, loads the model, decides the batch size, resolves the stack and starts the
summary; `Session` holds what the passes share. The run's sentence corpus is read here
(`sentence_stream`, `sentence_corpus`), lazily.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from headprobe import checks
from headprobe.config import RunConfig, fingerprinted, flag
from headprobe.core import atomic
from headprobe.core_options import SENTENCE_SOURCES
from headprobe.inputs.align import apply_bos
from headprobe.inputs.conventions import PRESETS
from headprobe.inputs.corpora.base import Stream
from headprobe.inputs.samples import DEFAULT_TREEBANK, bundled_provenance
from headprobe.model import loading as models
from headprobe.model.discovery import attention_sites
from headprobe.model.sites import Sites
from headprobe.results import software, store
from headprobe.scoring import distributed, registry
from headprobe.scoring.batch_size import auto_batch_size
from headprobe.scoring.checkpoint import Checkpoint
from headprobe.scoring.engine import CHUNK, POOL_AT, POOL_BATCHES, full_at
from headprobe.scoring.measures import needs_of
from headprobe.scoring.options import ModelFacts
from headprobe.scoring.pass_settings import PassSettings


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
        check(config, sentence_corpus(config), source)


def sentence_corpus(config: RunConfig):
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
    """The run's checkpoint under `out` when one is asked for (and unit counts are not kept).
    A batch's size in pieces depends on the device (`settings["device"]`, `engine.full_at`)."""
    if config.out is None or not config.checkpoint_every or config.keep_unit_counts:
        return None
    fingerprint = {
        "inputs": inputs,
        # the batch size is the checkpoint's own record (`Checkpoint.batch_size`): left out on
        # --resume, the interrupted run's is used
        "options": {key: value for key, value in settings.items() if key != "batch_size"},
        "batching": {
            "chunk": CHUNK,
            "full_at": full_at(settings["device"]),
            "pool_batches": POOL_BATCHES,
            "pool_at": POOL_AT,
        },
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


@contextlib.contextmanager
def _quiet_loading(quiet: bool):
    """No progress bar from transformers while the model loads when progress bars are off: its
    "Loading weights" bar (its logging switch) and a GGUF file's "Converting and de-quantizing"
    bar (drawn with tqdm directly, which that switch does not reach: its tqdm is swapped for a
    silent one meanwhile)."""
    import functools

    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    gguf = _gguf_module() if quiet else None
    drawn = getattr(gguf, "tqdm", None)
    if quiet and was:
        hf_logging.disable_progress_bar()
    if drawn is not None:
        gguf.tqdm = functools.partial(drawn, disable=True)
    try:
        yield
    finally:
        if quiet and was:
            hf_logging.enable_progress_bar()
        if drawn is not None:
            gguf.tqdm = drawn


def _gguf_module():
    """transformers' GGUF loader module, or None where this transformers has none."""
    try:
        from transformers import modeling_gguf_pytorch_utils
    except ImportError:
        return None
    return modeling_gguf_pytorch_utils


def check_capturable_measures(net, measures) -> None:
    """A model on the legacy output_attentions path has no values: --measure norms is refused."""
    from headprobe.model.head_quantities import CaptureUnavailable, check_capturable

    try:
        check_capturable(net, needs_of(measures))
    except CaptureUnavailable as err:
        raise checks.UsageError(f"--measure {','.join(measures)}: {err}") from None


def _note(text: str) -> None:
    print(f"headprobe: note: {text}", file=sys.stderr, flush=True)


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
