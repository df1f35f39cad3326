"""Peak memory of one layer's capture at 4,096 tokens: query blocks against whole matrices.

One input of 4,096 pieces (UD English EWT dev words, tokenized with the bundled MiniLM
tokenizer, specials included) through a one-layer random BERT-style encoder with room
for 4,096 positions; the engine captures that layer, pools it to words and runs the
dependency, positional and surface scorers. Each setting runs in a fresh process; its
peak memory is measured above the memory held just before scoring (CPU: resident set,
sampled every 2 ms, and the process's true peak; CUDA: `torch.cuda.max_memory_allocated`).
The counts of every setting are compared with the unblocked run's (argmax counts must be
equal; summed masses agree to float rounding).

    python benchmarks/query_block_memory.py                                  # CPU
    python benchmarks/query_block_memory.py --device cuda --heads 12 --hidden 768

Unblocked, one layer holds the scores and probabilities [head, 4096, 4096] (64 MiB per
head each, float32), the key-pooled rows [head, 4096, words] and the word matrix; with
`--query-block N` it holds N query rows of each at a time (plus the word rows waiting
for a block boundary).
"""

from __future__ import annotations

import argparse
import hashlib
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

EWT = ROOT.parent / "shared" / "data" / "en_ewt-ud-dev.conllu"
RESULTS = ROOT / "benchmarks" / "results"


def current_rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class RssSampler(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.peak = current_rss_mb()
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(0.002):
            self.peak = max(self.peak, current_rss_mb())

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.join()
        self.peak = max(
            self.peak, current_rss_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        )


def long_example(tokenizer, pieces: int):
    """UD English EWT dev words, as many as give exactly `pieces` pieces (specials included)
    when tokenized together as one input (dependency arcs kept where both ends are inside)."""
    from headprobe.inputs.align import align_words
    from headprobe.inputs.corpora.base import Example
    from headprobe.inputs.corpora.conllu import read_conllu

    words, heads, deprels, upos = [], [], [], []
    for sentence in read_conllu(EWT):
        offset = len(words)
        words += sentence.words
        heads += [h + offset if h >= 0 else -1 for h in sentence.heads]
        deprels += sentence.deprels
        upos += sentence.upos
        if len(words) > pieces:
            break
    lo, hi = 1, len(words)
    while lo < hi:  # the most words that fit
        mid = (lo + hi + 1) // 2
        if len(align_words(tokenizer, [words[:mid]])[0]) <= pieces:
            lo = mid
        else:
            hi = mid - 1
    n = lo
    heads = [h if h < n else -1 for h in heads[:n]]
    deprels = [r if h >= 0 else "root" for r, h in zip(deprels[:n], heads)]
    example = Example(words[:n], "long", f"{EWT}:1", heads, deprels, upos[:n])
    return example, len(align_words(tokenizer, [example.words])[0])


def child(args) -> None:
    from transformers import BertConfig, BertModel

    from headprobe.config import RunConfig
    from headprobe.model import loading as models
    from headprobe.scoring import registry
    from headprobe.scoring.engine import Engine

    torch.set_num_threads(args.threads)
    _, tokenizer, _ = models.load(None, device="cpu")
    tokenizer.model_max_length = args.tokens
    example, n_pieces = long_example(tokenizer, args.tokens)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=args.hidden,
        num_hidden_layers=1,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=args.tokens,
        attn_implementation="sdpa",
    )
    device = torch.device(args.device)
    model = BertModel(config).eval().to(device)
    scorers = [registry.get(name).make_scorer() for name in ("dependency", "positional", "surface")]
    engine = Engine(
        model,
        tokenizer,
        scorers,
        RunConfig(batch_size=1, progress=False, n_boot=10, query_block=args.query_block or None),
    )
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base_cuda = torch.cuda.memory_allocated()
    before = current_rss_mb()
    start = time.perf_counter()
    with RssSampler() as sampler:
        stats = engine.run([example])
        if device.type == "cuda":
            torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    digest = {}
    masses = {}
    for scorer in scorers:
        tally = scorer.tally_.to("cpu")
        h = hashlib.sha256()
        for label in tally.sorted_labels():
            for key, value in sorted(tally.arrays(label).items()):
                if key == "hits" and tally.value == "mass":
                    masses[f"{scorer.analysis}/{label}"] = value.ravel().tolist()
                else:
                    h.update(np.ascontiguousarray(value).tobytes())
        digest[scorer.analysis] = h.hexdigest()
    result = {
        "query_block": args.query_block,
        "pieces": n_pieces,
        "words": len(example.words),
        "examples_scored": stats["examples"],
        "seconds": round(seconds, 2),
        "rss_before_mb": round(before, 1),
        "peak_rss_mb": round(sampler.peak, 1),
        "peak_above_before_mb": round(sampler.peak - before, 1),
        "count_digests": digest,
        "masses": masses,
    }
    if device.type == "cuda":
        result["cuda_peak_above_before_mb"] = round(
            (torch.cuda.max_memory_allocated() - base_cuda) / 2**20, 1
        )
    print(json.dumps(result))


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--blocks", default="0,1024,256", help="query blocks to compare (0: unblocked)"
    )
    parser.add_argument(
        "--json", default=None, help="default: benchmarks/results/query_block_memory_<device>.json"
    )
    parser.add_argument("--query-block", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    runs = []
    for block in (int(x) for x in args.blocks.split(",")):
        command = [
            sys.executable,
            __file__,
            "--child",
            "--query-block",
            str(block),
            "--tokens",
            str(args.tokens),
            "--heads",
            str(args.heads),
            "--hidden",
            str(args.hidden),
            "--device",
            args.device,
            "--threads",
            str(args.threads),
        ]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        runs.append(json.loads(output.strip().splitlines()[-1]))
        shown = {k: v for k, v in runs[-1].items() if k not in ("masses", "count_digests")}
        print(json.dumps(shown), flush=True)
    reference = runs[0]
    for run in runs:
        run["counts_equal_unblocked"] = run["count_digests"] == reference["count_digests"]
        run["max_abs_mass_difference"] = max(
            (
                float(np.abs(np.array(v) - np.array(reference["masses"][k])).max(initial=0.0))
                for k, v in run["masses"].items()
            ),
            default=0.0,
        )
    for run in runs:
        del run["masses"]
    key = "cuda_peak_above_before_mb" if args.device.startswith("cuda") else "peak_above_before_mb"
    report = {
        "what": "one layer's capture + word pooling + dependency/positional/surface scorers on one input",
        "model": f"random BERT-style encoder, 1 layer, hidden {args.hidden}, {args.heads} heads, "
        f"{args.tokens} positions; bundled MiniLM tokenizer",
        "input": "UD English EWT dev words as one input",
        "device": args.device,
        "device_name": torch.cuda.get_device_name()
        if args.device.startswith("cuda")
        else platform.processor() or platform.machine(),
        "threads": args.threads,
        "torch": torch.__version__,
        "memory_measure": key,
        "runs": runs,
        "ratio_unblocked_to_blocked": {
            str(r["query_block"]): round(reference[key] / r[key], 2) for r in runs[1:] if r[key] > 0
        },
    }
    path = (
        Path(args.json)
        if args.json
        else RESULTS / f"query_block_memory_{args.device.split(':')[0]}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=2))
    print(f"written to {path}")
    return report


if __name__ == "__main__":
    main()
