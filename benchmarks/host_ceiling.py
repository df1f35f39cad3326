"""The host's ceiling: the words per second headprobe's own work sustains with the device's work
excluded, stage by stage and as a whole (no device can make a run faster than this).

    python benchmarks/host_ceiling.py                          # EWT dev x4, 2 trials, every stage
    python benchmarks/host_ceiling.py --copies 4 --workers 0 1 --results results/default \\
        --json benchmarks/results/host_ceiling.json

Each stage is timed alone in this process (best of `--repeat`), on EWT dev x `--copies` (the file
concatenated, ids renamed per copy), with the bundled MiniLM's tokenizer, and given as seconds and
words per second:
- `read`: the CoNLL-U reader (`stream_conllu`: blocks, rows, trees, examples);
- `tokenize`: the fast tokenizer's batched call alone, chunks of `engine.CHUNK` sentences;
- `align`: tokenizing and aligning (`align.align_examples`) less `tokenize`;
- `check`: the length and empty-word checks (`batching.prepare` given the alignments);
- `batching`: the pass's pool (`engine.batch_pool`) and each batch's host arrays (`Batch`);
- `scorer:<name>`: each default sentence scorer's host work on every batch (`prepare(batch)`: what it
  builds before the model runs);
- `input pipeline, workers=N`: reading, tokenizing, aligning and batching together, as the pass
  runs them (`read_ahead`: a thread, or N tokenizing worker processes), no model;
- `whole run, free model`: `headprobe.run` (default analyses, `--no-report`) with a model that
  costs nothing (a random BERT of 1 layer, 1 head, width 16, MiniLM's tokenizer), less a
  5-sentence run of the same (its start-up); `after scoring`: its statistics, tables and save;
- `report`: `build_report` of the results directory `--results` (e.g. the default run's), when given.

Then the ops and syncs per batch of a whole run against a plain forward (`ops.count`, EWT dev's
first 300 sentences, MiniLM). On a GPU the pace of a run is at most the smallest of these words
per second and the device's own (benchmarks/README.md, "The host's ceiling").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout this script is in, not an installed headprobe
sys.path.insert(0, str(Path(__file__).resolve().parent))  # whole_run.py, ops.py beside it

from ops import EWT, count, first_sentences  # noqa: E402
from whole_run import replicate  # noqa: E402


def best(work, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def free_model(tokenizer):
    """A random BERT whose forward costs nothing: 1 layer, 1 head, width 16."""
    import torch
    from transformers import BertConfig, BertModel

    config = BertConfig(
        num_hidden_layers=1,
        num_attention_heads=1,
        hidden_size=16,
        intermediate_size=16,
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    return BertModel(config).eval()


def stages(copies: int, repeat: int, workers: list[int], results: str | None) -> dict:
    import headprobe
    from headprobe.inputs.align import align_examples, tokenize_words
    from headprobe.inputs.batching import Batch, prepare
    from headprobe.inputs.corpora.conllu import read_conllu, stream_conllu
    from headprobe.inputs.read_ahead import Workers, prefetched
    from headprobe.model import loading as models
    from headprobe.scoring.engine import (
        CHUNK,
        PREFETCH,
        Engine,
        batch_pool,
        chunked,
        max_length,
        pool_chunk,
    )
    from headprobe.scoring.pass_settings import PassSettings
    from headprobe.studies.dependency.analysis import DependencyScorer
    from headprobe.studies.positional.analysis import PositionalScorer
    from headprobe.studies.surface.analysis import SurfaceScorer

    _, tokenizer, _ = models.load(None, device="cpu")
    free = free_model(tokenizer)
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        treebank = EWT if copies == 1 else replicate(EWT, copies, tmp / f"ewt-x{copies}.conllu")
        corpus = list(read_conllu(treebank))
        words = sum(len(ex.words) for ex in corpus)
        limit = max_length(free, tokenizer)
        chunks = list(chunked(corpus, CHUNK))
        pad = tokenizer.pad_token_id or 0

        seconds["read"] = best(lambda: sum(1 for _ in stream_conllu(treebank)), repeat)

        def tokenize():
            for chunk in chunks:
                tokenize_words(tokenizer, [ex.words for ex in chunk])

        seconds["tokenize"] = best(tokenize, repeat)
        aligned = [align_examples(tokenizer, chunk) for chunk in chunks]
        both = best(lambda: [align_examples(tokenizer, chunk) for chunk in chunks], repeat)
        seconds["align"] = max(0.0, both - seconds["tokenize"])
        seconds["check"] = best(
            lambda: [prepare(c, tokenizer, limit, alignments=a) for c, a in zip(chunks, aligned)],
            repeat,
        )
        prepared = [prepare(c, tokenizer, limit, alignments=a) for c, a in zip(chunks, aligned)]

        def batches_of(parts):
            """The pass's batches (its pool, the same rule), each built with its host arrays."""
            pool, held, first, out = batch_pool(64, "cpu"), {}, 0, []
            for chunk, done in parts:
                out += [make(held, ordinals) for ordinals in pool_chunk(pool, held, first, done)]
                first += len(chunk)
            out += [make(held, ordinals) for ordinals in pool.drain()]
            return out

        def make(held, ordinals):
            items = [held.pop(i) for i in ordinals]
            return Batch([e for e, _ in items], [a for _, a in items], pad)

        seconds["batching"] = best(lambda: batches_of(zip(chunks, prepared)), repeat)
        batches = batches_of(zip(chunks, prepared))

        scorers = [DependencyScorer(), PositionalScorer(), SurfaceScorer()]  # the default run's
        engine = Engine(free, tokenizer, scorers, PassSettings(progress=False))
        for scorer in engine.scorers:
            if hasattr(scorer, "prepare"):
                seconds[f"scorer:{type(scorer).__name__}"] = best(
                    lambda s=scorer: [s.prepare(b) for b in batches], repeat
                )

        for n in workers:

            def pipeline(n=n):
                parts = chunked(stream_conllu(treebank), CHUNK)
                if not n:
                    tokenize = lambda c: prepare(c, tokenizer, limit)  # noqa: E731
                    return batches_of(prefetched(parts, tokenize, depth=PREFETCH))
                from headprobe.inputs.align import align_in_worker, example_inputs

                with Workers(n, tokenizer=tokenizer) as pool:
                    aligned = pool.ahead(align_in_worker, parts, PREFETCH + n, example_inputs)
                    done = ((c, prepare(c, tokenizer, limit, alignments=a)) for c, a in aligned)
                    return batches_of(done)

            seconds[f"input pipeline, workers={n}"] = best(pipeline, repeat)

        small = first_sentences(EWT, 5, tmp / "ewt-5.conllu")
        loaded = (free, tokenizer, "free BERT 1x1, width 16")

        def run(path, out, report=False):
            start = time.perf_counter()
            done = headprobe.run(
                treebank=path, out=tmp / out, progress=False, loaded=loaded, report=report
            )
            return time.perf_counter() - start, done.summary["runs"]["sentences"]["seconds"]

        run(small, "warm")
        startup = min(run(small, f"s{k}")[0] for k in range(repeat))
        whole = [run(treebank, f"w{k}") for k in range(repeat)]
        total, scoring = min(whole)
        seconds["whole run, free model (start-up excluded)"] = total - startup
        seconds["  of which scoring"] = scoring
        seconds["  of which after scoring (statistics, tables, save)"] = total - scoring
        if results:
            from headprobe.report import build_report

            seconds["report (of --results)"] = best(
                lambda: build_report(results, tmp / "report"), repeat
            )
    return {
        "corpus": f"EWT dev x{copies}",
        "words": words,
        "trials": repeat,
        "cpu_count": os.cpu_count(),
        "stages": {
            name: {"seconds": round(s, 3), "words_per_second": round(words / s) if s else None}
            for name, s in seconds.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=4, help="EWT dev repeated this many times")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[0, 1, 2], help="input pipelines to time"
    )
    parser.add_argument("--results", default=None, help="also time the report of this directory")
    parser.add_argument("--no-ops", action="store_true", help="leave out the ops and syncs count")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args()
    figures = stages(args.copies, args.repeat, args.workers, args.results)
    if not args.no_ops:
        ops = count(300, None, 0)
        figures["ops"] = {
            key: ops[key]
            for key in (
                "corpus",
                "plain_batches",
                "plain_ops_per_batch",
                "run_ops_per_plain_batch",
                "run_over_plain_ops",
                "added_syncs",
                "added_syncs_per_10_batches",
            )
        }
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
