"""Throughput and memory: headprobe against a plain forward pass and a naive loop.

Reports words per second for
  (a) plain:     a batched forward pass without capture (same tokenization and bucketing),
  (b) headprobe: the engine with all sentence analyses (dependency, positional, surface),
  (c) naive:     one sentence at a time, eager `output_attentions=True`, attention moved to
                 NumPy and pooled there per layer and head, then arcs (both directions), offsets and
                 surface masses scored there, as the papers' scripts did,
the ratios b/a and b/c, and peak memory (RSS on CPU, torch.cuda.max_memory_allocated on GPU)
of headprobe on the corpus once and repeated 4 times (each in a fresh subprocess; RSS is
the process's peak at the end of the scoring run, then sampled while `Results` derives its
tables from the streaming tallies: the counts, best heads with bootstrap intervals, roles).

    python benchmarks/throughput.py                               # bundled MiniLM, EWT dev, CPU
    python benchmarks/throughput.py --device cuda --random-bert-base --repeat 10

Nothing here is asserted; numbers go to stdout and to --json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from headprobe.config import RunConfig  # noqa: E402
from headprobe.inputs.align import align_words  # noqa: E402
from headprobe.inputs.batching import iter_batches, prepare  # noqa: E402
from headprobe.inputs.corpora.base import Example  # noqa: E402
from headprobe.inputs.corpora.conllu import read_conllu  # noqa: E402
from headprobe.model import loading as models  # noqa: E402
from headprobe.results.query import Results  # noqa: E402
from headprobe.scoring.engine import Engine, max_length  # noqa: E402
from headprobe.studies.dependency.analysis import DependencyScorer, scored_arcs  # noqa: E402
from headprobe.studies.positional.analysis import PositionalScorer  # noqa: E402
from headprobe.studies.surface.analysis import SurfaceScorer  # noqa: E402

EWT = ROOT.parent / "shared" / "data" / "en_ewt-ud-dev.conllu"


def load(args):
    if args.random_bert_base:  # 12 layers, 768 hidden, random weights, BERT vocabulary
        from transformers import BertConfig, BertModel

        _, tokenizer, _ = models.load(None, device="cpu")
        torch.manual_seed(0)
        dtype = getattr(torch, args.dtype)
        model = (
            BertModel(BertConfig(vocab_size=tokenizer.vocab_size))
            .eval()
            .to(models.pick_device(args.device), dtype)
        )
        return model, tokenizer, "random BERT-base (12x768)"
    return models.load(args.model, device=args.device, dtype=args.dtype)


def corpus(args):
    examples = read_conllu(args.treebank)
    out = []
    for copy in range(args.repeat):
        for ex in examples:
            out.append(
                Example(
                    ex.words,
                    f"{ex.unit}#{copy}",
                    ex.source,
                    ex.heads,
                    ex.deprels,
                    ex.upos,
                    ex.feats,
                )
            )
    return out


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.inference_mode()
def plain(model, tokenizer, examples, batch_size, device) -> float:
    start = time.perf_counter()
    prepared = prepare(examples, tokenizer, max_length(model, tokenizer))
    for batch in iter_batches(prepared, batch_size, tokenizer.pad_token_id or 0, device=device):
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    sync(device)
    return time.perf_counter() - start


def headprobe_run(model, tokenizer, examples, batch_size, device):
    scorers = [DependencyScorer(), PositionalScorer(), SurfaceScorer()]
    start = time.perf_counter()
    Engine(model, tokenizer, scorers, RunConfig(batch_size=batch_size, progress=False)).run(
        examples
    )
    sync(device)
    return time.perf_counter() - start, scorers


@torch.inference_mode()
def naive(eager_model, tokenizer, examples, device) -> tuple[float, dict]:
    """The papers' way: one sentence at a time, every layer's attention to NumPy, then per
    layer and head: pool to words, score arcs (both directions), offsets, surface masses."""
    hits = {}
    start = time.perf_counter()
    for example in examples:
        alignment = align_words(tokenizer, [example.words])[0]
        ids = torch.tensor([alignment.input_ids], device=device)
        out = eager_model(input_ids=ids, output_attentions=True)
        attentions = [
            a[0].float().cpu().numpy() for a in out.attentions
        ]  # per layer [head, piece, piece]
        n = alignment.n_words
        words_of = [
            [p for p, w in enumerate(alignment.piece_word) if w == word] for word in range(n)
        ]
        specials = [p for p, w in enumerate(alignment.piece_word) if w < 0]
        arcs = scored_arcs(example)
        for layer, att in enumerate(attentions):
            for head in range(att.shape[0]):
                a = att[head]  # [piece, piece]
                to = np.stack([a[:, pieces].sum(1) for pieces in words_of], 1)  # [piece, word]
                words = np.stack([to[pieces].mean(0) for pieces in words_of])  # [word, word]
                to_special = a[:, specials].sum(1) if specials else np.zeros(len(a))
                key = (layer, head)
                counts = hits.setdefault(key, np.zeros(2 + 7 + 4))
                for i in range(n):  # positional, self included
                    row = np.append(words[i], [to_special[words_of[i]].mean()])
                    j = int(row.argmax())
                    offset = j - i
                    counts[2 + (5 if j == n else (offset + 2 if abs(offset) <= 2 else 6))] += 1
                    counts[9] += words[i, i]
                    counts[10] += words[i, i - 1] if i > 0 else 0.0
                    counts[11] += words[i, i + 1] if i + 1 < n else 0.0
                    counts[12] += row[-1]
                scored = words.copy()
                np.fill_diagonal(scored, 0.0)
                for i, h, _rel in arcs:
                    counts[0] += int(scored[i].argmax() == h)
                    counts[1] += int(scored[:, i].argmax() == h)
    sync(device)
    return time.perf_counter() - start, hits


def peak_memory(args, repeat: int) -> dict:
    """Run headprobe in a fresh process on the corpus x `repeat`; its peak memory."""
    command = [
        sys.executable,
        __file__,
        "--child-memory",
        "--repeat",
        str(repeat),
        "--treebank",
        str(args.treebank),
        "--batch-size",
        str(args.batch_size),
        "--dtype",
        args.dtype,
    ]
    for flag, value in (("--model", args.model), ("--device", args.device)):
        if value:
            command += [flag, value]
    if args.random_bert_base:
        command.append("--random-bert-base")
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def current_rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class RssSampler(threading.Thread):
    """Peak resident memory while a block runs (sampled every 5 ms from /proc/self/statm)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak = current_rss_mb()
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(0.005):
            self.peak = max(self.peak, current_rss_mb())

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.join()
        self.peak = max(self.peak, current_rss_mb())


def child_memory(args):
    model, tokenizer, _ = load(args)
    device = next(model.parameters()).device
    examples = corpus(args)
    before = current_rss_mb()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with RssSampler() as scoring:
        seconds, scorers = headprobe_run(model, tokenizer, examples, args.batch_size, device)
    # the process's true peak so far (loading peaked lower than scoring); the sampler can miss spikes
    true_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {
        "repeat": args.repeat,
        "words": sum(len(e.words) for e in examples),
        "seconds": seconds,
        "rss_before_run_mb": before,
        "peak_rss_mb": max(true_peak, scoring.peak),
        "rss_after_run_mb": current_rss_mb(),
    }
    if device.type == "cuda":
        result["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    with RssSampler() as tables:
        results = Results({s.analysis: s.tally_.to("cpu") for s in scorers})
    result["peak_rss_with_tables_mb"] = tables.peak
    result["count_rows"] = int(len(results.counts))
    print(json.dumps(result))


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default=None, help="bundled alias, hub name or path (default: MiniLM)"
    )
    parser.add_argument(
        "--random-bert-base", action="store_true", help="12-layer 768-hidden random BERT"
    )
    parser.add_argument("--treebank", default=str(EWT))
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default="float32", choices=sorted(models.DTYPES))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--repeat", type=int, default=1, help="score the corpus this many times over"
    )
    parser.add_argument(
        "--naive-sentences",
        type=int,
        default=500,
        help="sentences for the naive loop (words/s is measured on them; default 500)",
    )
    parser.add_argument(
        "--trials", type=int, default=3, help="alternating timed runs of (a) and (b); best kept"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's)"
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the 1x / 4x memory runs")
    parser.add_argument("--json", default=None, help="write the numbers here too")
    parser.add_argument("--child-memory", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child_memory:
        return child_memory(args)

    model, tokenizer, name = load(args)
    device = next(model.parameters()).device
    examples = corpus(args)
    words = sum(len(e.words) for e in examples)
    warm = examples[: args.batch_size]
    plain(model, tokenizer, warm, args.batch_size, device)  # warm-up
    headprobe_run(model, tokenizer, warm, args.batch_size, device)

    t_plain = t_probe = float("inf")
    for _ in range(args.trials):  # alternate, keep each one's best time
        t_plain = min(t_plain, plain(model, tokenizer, examples, args.batch_size, device))
        t_probe = min(
            t_probe, headprobe_run(model, tokenizer, examples, args.batch_size, device)[0]
        )
    eager = model
    if getattr(model.config, "_attn_implementation", "eager") != "eager":
        model.set_attn_implementation("eager")
    naive_examples = examples[: args.naive_sentences]
    naive_words = sum(len(e.words) for e in naive_examples)
    t_naive, _ = naive(eager, tokenizer, naive_examples, device)
    model.set_attn_implementation("sdpa")

    result = {
        "model": name,
        "device": str(device),
        "device_name": torch.cuda.get_device_name()
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "dtype": args.dtype,
        "batch_size": args.batch_size,
        "trials": args.trials,
        "treebank": str(args.treebank),
        "repeat": args.repeat,
        "words": words,
        "plain_words_per_s": words / t_plain,
        "headprobe_words_per_s": words / t_probe,
        "naive_words_per_s": naive_words / t_naive,
        "naive_sentences": len(naive_examples),
    }
    result["ratio_headprobe_to_plain"] = (
        result["headprobe_words_per_s"] / result["plain_words_per_s"]
    )
    result["ratio_headprobe_to_naive"] = (
        result["headprobe_words_per_s"] / result["naive_words_per_s"]
    )
    if not args.no_memory:
        result["memory_1x"] = peak_memory(args, 1)
        result["memory_4x"] = peak_memory(args, 4)
        key = "cuda_peak_mb" if device.type == "cuda" else "peak_rss_mb"
        result["memory_ratio_4x_to_1x"] = result["memory_4x"][key] / result["memory_1x"][key]
        key = "peak_rss_with_tables_mb"
        result["memory_ratio_4x_to_1x_with_tables"] = (
            result["memory_4x"][key] / result["memory_1x"][key]
        )
    for key, value in result.items():
        print(f"{key:>36}: {value:.3f}" if isinstance(value, float) else f"{key:>36}: {value}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
