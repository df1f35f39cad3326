"""How full and how padded the engine's batches are: the pool against chunks (no model:
tokenizer only).

    python benchmarks/batch_fill.py                       # EWT dev
    python benchmarks/batch_fill.py --copies 4 --chunks 1024 4096 0 --pools 16 64 0 --json out.json

The engine reads and tokenizes `CHUNK` examples at a time; each example then waits in a pool
(`inputs.batching.Pool`) with those of its exact piece count, across chunks, until they make a
full batch (the batch size, or batch size x `full_at("cpu")` pieces), the pool holds more than
`POOL_BATCHES` x batch size x `POOL_AT` pieces (its fullest length goes), or the corpus ends. For each
pool bound (in batches of batch size x `POOL_AT` pieces; 0: no bound) this counts the pool's batches, their mean size,
the share under the batch size, the largest batch in pieces x examples and the most pieces the
pool held (its examples' pieces; what the pool adds to memory). Beside them, the batches of the former chunked bucketing (`inputs.batching.bucket`
per chunk of examples; 0: the whole corpus in one chunk). Padding is 0 in both (one length
per batch).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.whole_run import EWT, replicate  # noqa: E402


def summary(sizes: list[int], batch_size: int) -> dict:
    return {
        "batches": len(sizes),
        "mean_batch_size": round(sum(sizes) / len(sizes), 2),
        "batches_not_full": round(sum(s < batch_size for s in sizes) / len(sizes), 3),
    }


def chunked_fill(lengths: list[int], chunk: int, batch_size: int) -> dict:
    """Batch statistics of examples with these piece counts, bucketed `chunk` at a time."""
    from headprobe.inputs.batching import Prepared, bucket

    size = chunk or len(lengths)
    sizes, pieces, padded, largest = [], 0, 0, 0
    for start in range(0, len(lengths), size):
        part = lengths[start : start + size]
        prepared = Prepared([None] * len(part), [range(n) for n in part])
        for batch in bucket(prepared, batch_size):
            longest = max(part[i] for i in batch)
            sizes.append(len(batch))
            pieces += sum(part[i] for i in batch)
            padded += longest * len(batch)
            largest = max(largest, longest * len(batch))
    return {
        "chunk": chunk or "whole corpus",
        **summary(sizes, batch_size),
        "largest_batch_pieces": largest,
        "padding_share": round(1 - pieces / padded, 4),
    }


def pool_fill(lengths: list[int], pool_batches: int, batch_size: int) -> dict:
    """Batch statistics of examples with these piece counts through the engine's pool, bounded
    at `pool_batches` x batch size x `POOL_AT` pieces (0: unbounded)."""
    from headprobe.inputs.batching import Pool
    from headprobe.scoring.engine import POOL_AT, full_at

    budget = batch_size * full_at("cpu")
    bound = pool_batches * batch_size * POOL_AT
    pool = Pool(batch_size, budget, bound if pool_batches else 2**62)
    batches, held = [], 0
    for ordinal, n in enumerate(lengths):
        batches += pool.add(ordinal, n)
        held = max(held, pool.pieces)
    batches += pool.drain()
    return {
        "pool_bound_batches": pool_batches or "none",
        "pool_bound_pieces": pool.bound if pool_batches else None,
        **summary([len(b) for b in batches], batch_size),
        "largest_batch_pieces": max(len(b) * lengths[b[0]] for b in batches),
        "most_pieces_held": held,
        "padding_share": 0.0,
    }


def main() -> None:
    from headprobe.scoring.engine import POOL_BATCHES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=1, help="EWT dev repeated this many times")
    parser.add_argument("--chunks", type=int, nargs="+", default=[1024, 0])
    parser.add_argument("--pools", type=int, nargs="+", default=[POOL_BATCHES, 0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from headprobe.inputs.align import align_examples
    from headprobe.inputs.corpora.conllu import read_conllu
    from headprobe.model import loading as models

    tokenizer = AutoTokenizer.from_pretrained(models.minilm_path())
    with tempfile.TemporaryDirectory() as tmp:
        path = EWT if args.copies == 1 else replicate(EWT, args.copies, Path(tmp) / "ewt.conllu")
        examples = list(read_conllu(path))
    lengths = [len(a) for a in align_examples(tokenizer, examples)]
    figures = {
        "examples": len(lengths),
        "pieces": sum(lengths),
        "pool": [pool_fill(lengths, bound, args.batch_size) for bound in args.pools],
        "chunked": [chunked_fill(lengths, chunk, args.batch_size) for chunk in args.chunks],
    }
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
