"""The Python API: everything the CLI does, returning DataFrames.

    import headprobe
    results = headprobe.run(treebank="en_ewt-ud-dev.conllu")        # bundled MiniLM
    results.best_heads                                              # pandas DataFrame
    results.save("out/")
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import torch

from headprobe import models, registry
from headprobe.capture import n_kv_heads, n_layers_heads, text_config
from headprobe.conventions import PRESETS
from headprobe.corpora.conllu import read_conllu
from headprobe.engine import Engine, is_causal
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
        corpus = parse_text(text)
        return corpus, str(text), list(getattr(corpus, "skipped", []))
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


def run(model=None, *, treebank=None, text=None, hf_dataset=None, coref=None, out=None, analyses=None,
        layers=None, batch_size: int = 64, device=None, dtype: str = "float32", from_mode: str | None = None,
        window: int = 128, skip_bad: bool = False, progress: bool = True, seed: int = SEED,
        n_boot: int = N_BOOT, keep_unit_counts: bool = False, pictures: bool = True, loaded=None,
        probe=None, probe_length: int = 50, probe_n: int = 500, probe_specials: str = "auto",
        conventions: str = "spec") -> Results:
    """Score every head of `model` and return (and with `out`, save) the results.

    model: hub name, local path, or a bundled alias (`None`/"minilm", "smollm2").
    treebank / text / hf_dataset: the sentence corpus (dependency, positional, surface, ...);
      with none of them and no `coref`: the bundled samples `data/sample.conllu` and
      `data/sample_coref.conllu`.
    coref: a CorefUD CoNLL-U file for the coreference analysis.
    analyses: names from `headprobe.registry` (default: every default analysis that has input).
    keep_unit_counts: also keep per-unit rows (`results.unit_counts`), for small corpora.
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
    loaded: an already loaded `(model, tokenizer, name)` to reuse.
    """
    started = time.perf_counter()
    if all(x is None for x in (treebank, text, hf_dataset, coref, probe)):     # the bundled samples
        treebank = SAMPLE
        coref = SAMPLE_COREF if SAMPLE_COREF.is_file() else None
    wanted = check_analyses(analyses)
    if probe is not None and not analyses:
        wanted += registry.names("probe")
    if conventions not in PRESETS:
        raise ValueError(f"--conventions {conventions!r}: must be one of {', '.join(PRESETS)}")
    from_mode = from_mode or PRESETS[conventions].from_mode
    if loaded is None:
        loaded = models.load(model, device=device, dtype=dtype)
    net, tokenizer, name = loaded
    summary = {"model": name, "dtype": dtype, "device": str(next(net.parameters()).device),
               "batch_size": batch_size, "from_mode": from_mode, "layers": layers, "notes": [],
               "skipped": {}, "corpora": {}, "runs": {}, "seed": seed, "bootstrap_resamples": n_boot,
               "units": "documents where the corpus marks them (# newdoc id), else sentences",
               "conventions": dict(PRESETS[conventions].summary(), from_mode_used=from_mode)}
    options = dict(layers=layers, from_mode=from_mode, progress=progress, seed=seed, n_boot=n_boot,
                   keep_units=keep_unit_counts, conventions=conventions)
    scorers, sentence_corpus = [], None
    on_sentences = [a for a in registry.analyses("sentences") if a.name in wanted]
    on_tokens = [a for a in registry.analyses("probe") if a.name in wanted]
    if probe is None:                          # token analyses read the sentence corpus, in its pass
        on_sentences, on_tokens = on_sentences + on_tokens, []
    has_sentences = any(x is not None for x in (treebank, text, hf_dataset))
    if on_sentences and (has_sentences or (coref is None and probe is None)):
        sentence_corpus, source, bad = load_sentences(treebank, text, hf_dataset, skip_bad, conventions)
        batch = [a.make_scorer() for a in on_sentences]
        _score(net, tokenizer, batch, sentence_corpus, "sentences", source, summary, batch_size=batch_size,
               **options)
        summary["skipped"]["malformed_sentences"] = len(bad)
        summary["skipped"]["malformed_sources"] = list(bad)[:50]
        scorers += batch
    on_coref = [a for a in registry.analyses("coreference") if a.name in wanted]
    if coref is not None and on_coref:
        from headprobe.corpora.corefud import read_coref_examples, tokenizer_piece_counter
        windows = read_coref_examples(coref, tokenizer_piece_counter(tokenizer), window=window)
        batch = [a.make_scorer() for a in on_coref]
        _score(net, tokenizer, batch, windows, "coreference", str(coref), summary,
               batch_size=max(1, batch_size // 4), **options)
        summary["skipped"]["coreference_sentences"] = len(windows.skipped)
        summary["skipped"]["coreference_sources"] = list(windows.skipped)[:50]
        summary["coreference_corpus"] = dict(windows.counts)
        scorers += batch
    if probe is not None and on_tokens:
        from headprobe.probe import make_probe
        examples = make_probe(probe, tokenizer, length=probe_length, n=probe_n, seed=seed,
                              specials=probe_specials, vocab_size=getattr(text_config(net), "vocab_size", None))
        batch = [a.make_scorer() for a in on_tokens]
        _score(net, tokenizer, batch, examples, "probe", examples.name, summary, batch_size=batch_size, **options)
        scorers += batch
    if not scorers:
        raise ValueError("nothing to score: give a sentence corpus and/or coref for the analyses asked for")
    summary["causal"] = is_causal(net)
    if summary["causal"]:
        summary["notes"].append(CAUSAL_NOTE.format(model=name))
    summary["n_layers"], summary["n_heads"] = n_layers_heads(net)
    summary["n_kv_heads"] = n_kv_heads(net)
    summary["analyses"] = [s.analysis for s in scorers]
    unit_counts = merge_unit_counts([s.unit_counts() for s in scorers]) if keep_unit_counts else None
    results = Results({s.analysis: s.tally_.to("cpu") for s in scorers}, summary, unit_counts=unit_counts)
    if pictures and sentence_corpus is not None and "dependency" in results.tallies:
        from headprobe.pictures import example_pictures
        results.examples = example_pictures(net, tokenizer, results.best_heads, sentence_corpus, from_mode)
    results.summary["seconds"] = round(time.perf_counter() - started, 2)
    results.summary["headline"] = headline(results.best_heads)
    if out is not None:
        results.summary["out"] = str(out)
        results.save(out)
    return results


def _score(net, tokenizer, scorers, examples, key, source, summary, **engine_options) -> None:
    """Run one engine pass and record its corpus, speed and skipped examples under `key`."""
    engine = Engine(net, tokenizer, scorers, desc=key, **engine_options)
    stats = engine.run(examples)
    summary["corpora"][key] = source
    summary["runs"][key] = _run_stats(stats)
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
                           tokenizer=None) -> pd.DataFrame:
    """Word x word attention of one head; `model` is a name/alias or a loaded (model, tokenizer)."""
    from headprobe.pictures import attention_for_sentence as picture
    if isinstance(model, (str, type(None))):
        net, tokenizer, _ = models.load(model)
    elif isinstance(model, tuple):
        net, tokenizer = model[0], model[1]
    else:
        net = model
    with torch.inference_mode():
        return picture(net, tokenizer, words_or_text, layer, head, from_mode)
