"""The Python API: everything the CLI does, returning DataFrames.

    import headprobe
    results = headprobe.run(treebank="en_ewt-ud-dev.conllu")        # bundled MiniLM
    results.best_heads                                              # pandas DataFrame
    results.save("out/")
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from headprobe import atomic, checks, models, registry, store
from headprobe.align import BOS_MODES, apply_bos
from headprobe import distributed
from headprobe.capture import text_config
from headprobe.checkpoint import DEFAULT_EVERY, Checkpoint
from headprobe.control import CONTROL, CONTROLS, tally_key
from headprobe.conventions import PRESETS
from headprobe.corpora.conllu import read_conllu
from headprobe.engine import CHUNK, Engine
from headprobe.sites import STACKS, attention_sites
from headprobe.results import Results, merge_unit_counts
from headprobe.tally import N_BOOT, SEED

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample.conllu"
SAMPLE_COREF = Path(__file__).resolve().parents[1] / "data" / "sample_coref.conllu"
CAUSAL_NOTE = (
    "{model} is a causal (decoder) model: a word attends only to itself and earlier words. "
    "dep->head can find a head only when the head precedes the dependent, and head<-dep only when "
    "the head follows it; the first word's row and the last word's column are empty (those arcs are "
    "counted as unreachable), and coreference (attention from a mention to earlier words) is fully expressible."
)


def load_sentences(treebank=None, text=None, hf_dataset=None, skip_bad=False, conventions=None):
    """Dependency examples from exactly one source (default: the bundled sample); a treebank's
    relation subtypes are cut or kept as `conventions` say (`headprobe.conventions`)."""
    given = [x for x in (treebank, text, hf_dataset) if x is not None]
    if len(given) > 1:
        raise ValueError("give one of treebank, text, hf_dataset")
    if text is not None:
        from headprobe.corpora.spacy_text import parse_text
        corpus = parse_text(text, skip_bad=skip_bad)
        return corpus, str(text), corpus.skipped
    if hf_dataset is not None:
        from headprobe.corpora.hf_datasets import read_hf_dataset
        corpus = read_hf_dataset(hf_dataset, skip_bad=skip_bad)
        return corpus, hf_dataset, corpus.skipped
    path = treebank if treebank is not None else SAMPLE
    corpus = read_conllu(path, skip_bad=skip_bad, conventions=conventions)
    return corpus, str(path), corpus.skipped


def check_analyses(analyses) -> list[str]:
    """The analyses to run: the named ones (validated), else every default one."""
    if not analyses:
        return [a.name for a in registry.analyses() if a.default]
    for name in analyses:
        registry.get(name)                     # raises with the list of known analyses
    return list(dict.fromkeys(analyses))


def check_stack(stack, wanted: list[str], named: bool, probe) -> list[str]:
    """The analyses to run on attention stack `stack` (None: the model's default): on
    cross-attention only those defined there (`Analysis.cross`); one named that is not, or a
    probe, is a usage error."""
    if stack is None:
        return wanted
    if stack not in STACKS:
        raise checks.UsageError(f"--stack {stack!r}: must be one of {', '.join(STACKS)}")
    if stack != "cross":
        return wanted
    defined = [a.name for a in registry.analyses() if a.cross]
    undefined = [name for name in wanted if not registry.get(name).cross]
    if undefined and (named or probe is not None):
        raise checks.UsageError(
            f"--stack cross: {', '.join(undefined)} {'is' if len(undefined) == 1 else 'are'} not defined on "
            f"cross-attention (decoder queries over encoder keys: rows and columns are two sequences, so there "
            f"are no arcs or token patterns within one); on cross-attention: {', '.join(defined)}")
    return [name for name in wanted if name in defined]


def run(model=None, *, treebank=None, text=None, hf_dataset=None, coref=None, out=None, analyses=None,
        layers=None, batch_size: int = 64, device=None, dtype: str = "float32", from_mode: str | None = None,
        window: int = 128, skip_bad: bool = False, progress: bool = True, seed: int = SEED,
        n_boot: int = N_BOOT, keep_unit_counts: bool = False, pictures: bool = True, loaded=None,
        report: bool = False, resume: bool = False, checkpoint_every: int = DEFAULT_EVERY,
        probe=None, probe_length: int = 50, probe_n: int = 500, probe_specials: str = "auto",
        bos: str = "none", conventions: str = "spec", device_map=None, max_memory=None,
        query_block: int | None = None, coref_single_document: bool = False,
        stack: str | None = None, heads=None, control: str | None = None,
        prune_curve: bool = False) -> Results | None:
    """Score every head of `model` and return (and with `out`, save) the results.

    model: hub name, local path, or a bundled alias (`None`/"minilm", "smollm2").
    treebank / text / hf_dataset: the sentence corpus (dependency, positional, surface, ...);
      with none of them and no `coref`: the bundled samples `data/sample.conllu` and
      `data/sample_coref.conllu`.
    coref: a CorefUD CoNLL-U file for the coreference analysis.
    analyses: names from `headprobe.registry` (default: every default analysis that has input).
    layers: 0-based layers to score (a list, or text like "0-3,8"); default all.
    keep_unit_counts: also keep per-unit rows (`results.unit_counts`), for small corpora.
    skip_bad: skip (warn and count) malformed sentences of every source, `coref` included.
    coref_single_document: read a `coref` file without `# newdoc` lines as one document.
    probe: a synthetic probe for the token analyses (input "probe": previous_token, duplicate_token,
      induction, sink), e.g. "repeated-random" (`headprobe.probe`: `probe_n` sequences of
      `probe_length` random tokens repeated twice, drawn with `seed`; `probe_specials` auto/bos/none).
      Without a probe, token analyses that are asked for read the sentence corpus at piece level;
      with one and no `analyses`, every token analysis runs on it.
    conventions: "spec" (default), "clark2019-code" or "joanacero" (`headprobe.conventions`): the
      from-pooling (unless `from_mode` is given), which arcs are scored (root, punct in ALL), the
      offset baselines and the subtype cut of the released code behind a published number; the
      summary names it (`summary["conventions"]`).
    from_mode: "mean", "first" or "max"; None: the conventions' (SPEC: mean).
    bos: "none" (the default: inputs as the model's tokenizer makes them), "add" (prepend the
      tokenizer's BOS token), or "auto" (add it for a causal model whose tokenizer has one but
      does not add it); see `align.apply_bos`. The summary says what was done.
    loaded: an already loaded `(model, tokenizer, name)` to reuse.
    out: results directory. The run holds it (a second run on it is refused) and writes it
      whole or not at all (`Results.save`); `report` builds out/report/ in the same save.
    checkpoint_every: with `out`, the counts are checkpointed every this many batches (0: never;
      not with keep_unit_counts) in out's lock area, and removed after the save.
    resume: continue an interrupted run to `out` from its checkpoint; the inputs and options
      must be the same; the tables are identical to an uninterrupted run's.

    device_map: None, or accelerate's big-model dispatch ("auto", "balanced", ... or a dict of
      module -> device) for a model spread over devices; max_memory: per device, e.g.
      "0=10GiB,cpu=30GiB" (or a dict). Each layer's attention is captured where it runs.
    stack: the attention stack scored (`headprobe.sites`): "encoder" (the default where there is
      one), "decoder" (an encoder-decoder's decoder self-attention; the decoder reads its start
      token and then the sentence's pieces) or "cross" (decoder queries over encoder keys: only
      the analyses defined there, surface and positional). A model with one stack has only it.
    query_block: capture N query pieces at a time (memory O(N x keys) per head instead of
      O(keys^2)); counts are the same (`engine.WordRows`). None: whole matrices (the default).
    heads: the heads the `ablation` analysis ablates, "17-3,18-6" or [(17, 3), (18, 6)] (0-based);
      None or "all": every head of the scored layers.
    control: "random-init": also score the attention analyses on the same architecture
      re-initialised with `seed` (`headprobe.control`): best heads gain the control's best
      beside them, and the syntactic role needs a head above the control's held-out best.
    prune_curve: the objective as 0%, 10%, ... 100% of the heads are gated to 0, least important
      first (Michel et al. 2019; the `prune_curve` analysis, with `importance`, or `ablation`
      where the model has no language-model head, added to order the heads).
    Under torchrun (`torchrun --nproc_per_node N -m headprobe run ...`) each rank scores its
      share of the examples, the counts are summed over the ranks, and rank 0 returns (and
      writes) the results; the other ranks return None (`headprobe.distributed`).

    Every option and path is checked before any model is loaded (`checks.UsageError`), and
    `layers` against the model's config before its weights are.
    """
    started = time.perf_counter()
    if all(x is None for x in (treebank, text, hf_dataset, coref, probe)):     # the bundled samples
        treebank = SAMPLE
        coref = SAMPLE_COREF if SAMPLE_COREF.is_file() else None
    wanted = check_analyses(analyses)
    if probe is not None and not analyses:
        wanted += registry.names("probe")
    wanted = check_stack(stack, wanted, bool(analyses), probe)
    wanted, heads = _check_ablation_options(wanted, heads, control, prune_curve, device_map)
    layers = checks.parse_layers(layers)
    batch_size = checks.check_int("--batch-size", batch_size, 1)
    n_boot = checks.check_int("--bootstrap", n_boot, 1, " (resamples for the intervals and held-out selection)")
    window = checks.check_int("--window", window, checks.MIN_WINDOW, " pieces")
    seed = checks.check_int("--seed", seed, 0)
    checkpoint_every = checks.check_int("--checkpoint-every", checkpoint_every, 0, " (0: no checkpoints)")
    if bos not in BOS_MODES:
        raise checks.UsageError(f"--bos {bos!r}: must be one of {', '.join(BOS_MODES)}")
    if conventions not in PRESETS:
        raise checks.UsageError(f"--conventions {conventions!r}: must be one of {', '.join(PRESETS)}")
    from_mode = from_mode or PRESETS[conventions].from_mode
    if from_mode not in ("mean", "first", "max"):
        raise checks.UsageError(f"--from-mode {from_mode!r}: must be mean, first or max")
    if dtype not in models.DTYPES:
        raise checks.UsageError(f"--dtype {dtype!r}: must be one of {', '.join(models.DTYPES)}")
    for option, path in (("--treebank", treebank), ("--text", text), ("--coref", coref)):
        checks.check_input_file(option, path)
    checks.check_hf_dataset(hf_dataset)
    reference = checks.check_model(model) if loaded is None else None
    device = checks.check_device(device) if loaded is None else device
    if out is not None:
        out = store.check_out(out)
    elif resume:
        raise checks.UsageError("--resume needs --out: the checkpoint lives beside the results directory")
    if resume and keep_unit_counts:
        raise checks.UsageError("--resume cannot be combined with --keep-unit-counts "
                                "(per-unit rows are not checkpointed)")
    if query_block is not None:
        query_block = checks.check_int("--query-block", query_block, 1, " query pieces")
    max_memory = models.parse_max_memory(max_memory)
    world, device, out, checkpoint_every, progress = distributed.for_run(     # torchrun: this rank's part
        device, out=out, progress=progress, checkpoint_every=checkpoint_every, resume=resume,
        keep_unit_counts=keep_unit_counts, device_map=device_map)

    with contextlib.ExitStack() as held:
        if out is not None:
            lock = held.enter_context(atomic.OutLock(out))
            for note in lock.notes + atomic.recover(out):
                _note(note)
        if loaded is None:           # the config first: layers that do not exist fail before the weights load
            config = checks.read_config(*reference)
            checks.check_stack_in_config(stack, config, reference[2])
            n_config_layers, _ = checks.config_layers_heads(config, stack)
            if n_config_layers:
                checks.check_layers_exist(layers, n_config_layers, reference[2])
                checks.check_heads_exist(heads, n_config_layers, checks.config_layers_heads(config, stack)[1], layers,
                                         reference[2])
        inputs = {key: store.input_fingerprint(option, path) for key, option, path in (
            ("treebank", "--treebank", treebank), ("text", "--text", text),
            ("hf_dataset", "--hf-dataset", hf_dataset), ("coref", "--coref", coref)) if path is not None}
        inputs["model"] = (store.model_fingerprint(reference[0], reference[2]) if loaded is None
                           else {"name": loaded[2]})
        settings = {"analyses": sorted(wanted), "layers": layers, "batch_size": batch_size, "from_mode": from_mode,
                    "window": window, "seed": seed, "bootstrap_resamples": n_boot, "dtype": dtype,
                    "device": str(models.pick_device(device)) if loaded is None else
                    str(next(loaded[0].parameters()).device),
                    "skip_bad": skip_bad, "keep_unit_counts": keep_unit_counts, "bos": bos,
                    "coref_single_document": coref_single_document,
                    "conventions": conventions}
        if probe is not None:
            settings["probe"] = {"name": probe, "length": probe_length, "n": probe_n, "specials": probe_specials}
        if stack is not None:
            settings["stack"] = stack
        if query_block or device_map is not None:
            settings.update(query_block=query_block, device_map=device_map, max_memory=max_memory)
        settings.update({key: value for key, value in (("heads", heads), ("control", control)) if value})
        checkpoint = None
        if out is not None and checkpoint_every and not keep_unit_counts:
            fingerprint = {"inputs": inputs, "options": settings, "chunk": CHUNK, "version": store.version()}
            checkpoint = Checkpoint(out, fingerprint, checkpoint_every, resume)
            for note in checkpoint.notes:
                _note(note)
        if loaded is None:
            # head ablation / importance (SPEC 8) score the language-model loss: the model under its head
            lm_head = any(getattr(registry.get(name).scorer, "needs_lm_head", False) for name in wanted)
            with _quiet_loading(not progress):
                loaded = (models.load_lm if lm_head else models.load)(
                    model, device=device, dtype=dtype, device_map=device_map, max_memory=max_memory)[:3]
        net, tokenizer, name = loaded
        sites = attention_sites(net)
        stack = sites.resolve(stack)
        checks.check_layers_exist(layers, sites.n_layers(stack), name)
        checks.check_heads_exist(heads, sites.n_layers(stack), sites.n_heads(stack), layers, name)
        wanted = _with_prerequisites(wanted, net, heads)
        causal = sites.causal(stack)
        tokenizer, bos_used = apply_bos(tokenizer, bos, causal)
        summary = {"model": name, "dtype": dtype, "device": str(next(net.parameters()).device),
                   "batch_size": batch_size, "from_mode": from_mode, "layers": layers, "notes": [],
                   "skipped": {}, "corpora": {}, "runs": {}, "seed": seed, "bootstrap_resamples": n_boot,
                   "units": "documents where the corpus marks them (# newdoc id), else sentences",
                   "run_id": store.new_run_id(), "inputs": inputs, "options": settings,
                   "bos": {"asked": bos, "used": bos_used}, "stack": stack, **sites.describe(),
                   "conventions": dict(PRESETS[conventions].summary(), from_mode_used=from_mode)}
        options = dict(layers=layers, from_mode=from_mode, progress=progress, seed=seed, n_boot=n_boot,
                       keep_units=keep_unit_counts, conventions=conventions, query_block=query_block, stack=stack)
        scorers, sentence_corpus, windows, passes = [], None, None, []
        on_sentences = [a for a in registry.analyses("sentences") if a.name in wanted]
        on_tokens = [a for a in registry.analyses("probe") if a.name in wanted]
        if probe is None:                      # token analyses read the sentence corpus, in its pass
            on_sentences, on_tokens = on_sentences + on_tokens, []
        has_sentences = any(x is not None for x in (treebank, text, hf_dataset))
        if on_sentences and (has_sentences or (coref is None and probe is None)):
            sentence_corpus, source, bad = load_sentences(treebank, text, hf_dataset, skip_bad, conventions)
            later = [a for a in on_sentences if getattr(a.scorer, "second_pass", False)]
            first = [a for a in on_sentences if a not in later]
            batch = _make_scorers(first, heads)
            _score(net, tokenizer, batch, sentence_corpus, "sentences", source, summary, checkpoint,
                   batch_size=batch_size, **options)
            summary["skipped"]["malformed_sentences"] = len(bad)
            summary["skipped"]["malformed_sources"] = list(bad)[:50]
            scorers += batch
            passes.append(("sentences", first, sentence_corpus, source, batch_size))
            if later:
                scorers += _second_pass(net, tokenizer, batch, later, sentence_corpus, source, summary, checkpoint,
                                        batch_size=batch_size, **options)
        on_coref = [a for a in registry.analyses("coreference") if a.name in wanted]
        if coref is not None and on_coref:
            from headprobe.corpora.corefud import read_coref_examples, tokenizer_piece_counter
            windows = read_coref_examples(coref, tokenizer_piece_counter(tokenizer), window=window,
                                          skip_bad=skip_bad, single_document=coref_single_document)
            batch = _make_scorers(on_coref, heads)
            _score(net, tokenizer, batch, windows, "coreference", str(coref), summary, checkpoint,
                   batch_size=max(1, batch_size // 4), **options)
            passes.append(("coreference", on_coref, windows, str(coref), max(1, batch_size // 4)))
            summary["skipped"]["coreference_sentences"] = len(windows.skipped)
            summary["skipped"]["coreference_sources"] = list(windows.skipped)[:50]
            summary["coreference_corpus"] = dict(windows.counts)
            scorers += batch
        if probe is not None and on_tokens:
            from headprobe.probe import make_probe
            examples = make_probe(probe, tokenizer, length=probe_length, n=probe_n, seed=seed,
                                  specials=probe_specials, vocab_size=getattr(text_config(net), "vocab_size", None))
            batch = _make_scorers(on_tokens, heads)
            _score(net, tokenizer, batch, examples, "probe", examples.name, summary, checkpoint,
                   batch_size=batch_size, **options)
            scorers += batch
            passes.append(("probe", on_tokens, examples, examples.name, batch_size))
        if not scorers:
            raise ValueError("nothing to score: give a sentence corpus and/or coref for the analyses asked for")
        if not any(r["examples"] for r in summary["runs"].values()):
            skipped = {k: v for k, v in summary["skipped"].items() if v and not k.endswith("_sources")}
            raise checks.UsageError(f"nothing was scored: no example of the corpus could be scored "
                                    f"(skipped: {skipped or 'none; the corpus is empty'})")
        trained = list(scorers)
        if control is not None:
            scorers += _control_passes(net, tokenizer, name, passes, control, summary, checkpoint, **options)
        summary["causal"] = causal
        if summary["causal"]:
            summary["notes"].append(CAUSAL_NOTE.format(model=name))
        summary["n_layers"], summary["n_heads"] = sites.n_layers(stack), sites.n_heads(stack)
        summary["n_kv_heads"] = sites.n_kv_heads(stack)
        summary["analyses"] = [s.analysis for s in trained]
        objectives = {s.analysis: s.objective.description for s in trained if hasattr(s, "objective")}
        if objectives:
            summary["objectives"] = objectives
        distributed.all_reduce_tallies([s.tally_ for s in scorers])         # torchrun: summed over the ranks
        if not world.main:
            return None                                                     # rank 0 writes
        if world.size > 1:
            summary["distributed"] = world.describe()
        if getattr(net, "hf_device_map", None):
            summary["device_map"] = {k: str(v) for k, v in net.hf_device_map.items()}
        unit_counts = merge_unit_counts([s.unit_counts() for s in trained]) if keep_unit_counts else None
        results = Results({s.key: s.tally_.to("cpu") for s in scorers}, summary, unit_counts=unit_counts)
        if pictures and (sentence_corpus is not None and "dependency" in results.tallies
                         or windows is not None and "coreference" in results.tallies):
            from headprobe.pictures import example_pictures
            results.examples = example_pictures(
                net, tokenizer, results.best_heads, sentence_corpus if "dependency" in results.tallies else None,
                from_mode, seed=seed, coref=windows if "coreference" in results.tallies else None, stack=stack)
        results.summary["seconds"] = round(time.perf_counter() - started, 2)
        results.summary["headline"] = headline(results.best_heads)
        if out is not None:
            results.summary["out"] = str(out)
            results.saved_paths = store.save(results, out, extra=_staged_report(results) if report else None)
            if checkpoint is not None:
                checkpoint.remove()
    return results


def _check_ablation_options(wanted: list[str], heads, control, prune_curve: bool, device_map):
    """(analyses, heads) after checking --heads, --control and --prune-curve (before any model loads)."""
    heads = checks.parse_heads(heads)
    if heads is not None and "ablation" not in wanted:
        raise checks.UsageError("--heads selects the heads the ablation analysis ablates: add --analyses ablation")
    if control is not None and control not in CONTROLS:
        raise checks.UsageError(f"--control {control!r}: must be one of {', '.join(CONTROLS)}")
    if control is not None and device_map is not None:
        raise checks.UsageError("--control cannot be combined with --device-map (the control is a second copy "
                                "of the model, built on one device)")
    if prune_curve is not True and prune_curve is not False:
        raise checks.UsageError(f"--prune-curve is a switch (True or False), not {prune_curve!r}")
    return (wanted + ["prune_curve"] if prune_curve and "prune_curve" not in wanted else wanted), heads


def _with_prerequisites(wanted: list[str], net, heads) -> list[str]:
    """`wanted` plus what its second-pass analyses need first on this model (the pruning curve:
    `importance`, or `ablation` on a model without a language-model head)."""
    from headprobe.objectives import lm_kind

    more = []
    for name in wanted:
        scorer = registry.get(name).scorer
        if getattr(scorer, "second_pass", False):
            more += scorer.prerequisites(lm_kind(net), heads)
    return list(dict.fromkeys(wanted + more))


def _make_scorers(analyses, heads=None, model: str | None = None) -> list:
    """A scorer per analysis (counting `model`: default the trained model); the ablation
    analysis's heads set (`use_heads`)."""
    scorers = [a.make_scorer() if model is None else a.make_scorer(model=model) for a in analyses]
    for scorer in scorers:
        if hasattr(scorer, "use_heads"):
            scorer.use_heads(heads)
    return scorers


SECOND_PASS = "sentences_second_pass"


def _second_pass(net, tokenizer, first: list, later, corpus, source: str, summary: dict, checkpoint,
                 **engine_options) -> list:
    """Score the analyses that need the first pass's counts (`second_pass`: the pruning curve's order)
    on the same corpus. Under torchrun the counts they read are summed over the ranks first (copies:
    the run's own totals are summed once, at the end)."""
    tallies = {s.analysis: s.tally_.copy() for s in first}
    distributed.all_reduce_tallies(list(tallies.values()))
    scorers = _make_scorers(later)
    for scorer in scorers:
        scorer.use_tallies(tallies)
        summary.update(scorer.describe())
    _score(net, tokenizer, scorers, corpus, SECOND_PASS, source, summary, checkpoint, **engine_options)
    return scorers


def _control_passes(net, tokenizer, name: str, passes: list, control: str, summary: dict, checkpoint,
                    **engine_options) -> list:
    """The random-init control (`headprobe.control`): the analyses that read attention, scored again
    on `net`'s architecture re-initialised with the run's seed (`models.random_init`), same
    tokenizer, same corpora, into tallies of their own (`model` = "control")."""
    seed = engine_options["seed"]
    twin = models.random_init(net, seed)
    scorers = []
    for key, analyses, examples, source, batch_size in passes:
        reading = [a for a in analyses if not hasattr(a.scorer, "model_pass")]
        if reading:
            batch = _make_scorers(reading, model=CONTROL)
            _score(twin, tokenizer, batch, examples, tally_key(key, CONTROL), source, summary, checkpoint,
                   batch_size=batch_size, **engine_options)
            scorers += batch
    summary["control"] = {"kind": control, "model": f"{name}, {control} (seed {seed})", "seed": seed,
                          "analyses": [s.analysis for s in scorers]}
    return scorers


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


def _staged_report(results):
    """report/ built inside the save, swapped in with the results (`report.staged_report`)."""
    from headprobe.report import staged_report
    return staged_report(results)


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


def _score(net, tokenizer, scorers, examples, key, source, summary, checkpoint=None, **engine_options) -> None:
    """Run one engine pass and record its corpus, speed and skipped examples under `key`.

    With a checkpoint: a pass it holds as finished is not scored again (its totals and stats
    are restored); an interrupted one continues where it stopped; a finished pass is saved."""
    state = checkpoint.restore(key, scorers, next(net.parameters()).device) if checkpoint is not None else None
    engine = Engine(net, tokenizer, scorers, desc=key, **engine_options)
    if state is not None and state.get("finished"):
        stats = state["stats"]
    else:
        hook = _CheckpointHook(checkpoint, key, scorers, state) if checkpoint is not None else None
        stats = distributed.reduce_stats(engine.run(distributed.shard(examples), checkpoint=hook))
        if checkpoint is not None:
            checkpoint.save(key, scorers, {"finished": True, "stats": stats})
    summary["corpora"][key] = source
    summary["runs"][key] = _run_stats(stats)
    summary["notes"] += [note for note in stats.get("notes", []) if note not in summary["notes"]]
    summary["skipped"][f"{key}_skipped_sources"] = stats["skipped_sources"][:50]
    summary["skipped"].update({f"{key}_{k}": v for k, v in stats["skipped"].items()})


def _run_stats(stats: dict) -> dict:
    seconds = stats["seconds"]
    return {"examples": stats["examples"], "words": stats["words"], "seconds": round(seconds, 2),
            "words_per_second": round(stats["words"] / seconds, 1) if seconds else None,
            "final_batch_size": stats["batch_size"]}


def headline(best_heads: pd.DataFrame, labels=("ALL", "nsubj", "det", "obj", "amod", "aux", "pronoun",
                                                "proper", "nominal")) -> list[dict]:
    rows = best_heads[best_heads["label"].isin(labels) & (best_heads["fold"] == "")]
    keep = ["analysis", "label", "selection", "heads", "direction", "n", "accuracy", "ci_low", "ci_high",
            "baseline_variant", "baseline_accuracy", "gap"]
    return rows[keep].round(4).to_dict(orient="records")


def attention_for_sentence(model, words_or_text, layer: int, head: int, from_mode: str = "mean",
                           tokenizer=None, stack: str | None = None) -> pd.DataFrame:
    """Word x word attention of one head (of `stack`: "encoder", "decoder", "cross"; None: the
    model's default); `model` is a name/alias or a loaded (model, tokenizer)."""
    from headprobe.pictures import attention_for_sentence as picture
    if isinstance(model, (str, type(None))):
        net, tokenizer, _ = models.load(model)
    elif isinstance(model, tuple):
        net, tokenizer = model[0], model[1]
    else:
        net = model
    with torch.inference_mode():
        return picture(net, tokenizer, words_or_text, layer, head, from_mode, stack)
