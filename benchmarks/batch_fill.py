"""How full and how padded the engine's batches are, per chunk size (no model: tokenizer only).

    python benchmarks/batch_fill.py                       # EWT dev, chunks of 1,024 and 4,096
    python benchmarks/batch_fill.py --copies 4 --chunks 1024 4096 0 --json out.json

The engine tokenizes and buckets `CHUNK` examples at a time (`scoring.engine.chunked`,
`inputs.batching.bucket`: batches of up to 64 examples of exactly one length). For each chunk
size (0: the whole corpus in one chunk) this counts the batches, their mean size, the share of
batches under the batch size, and the padding share (padded pieces over all pieces; 0 by
construction, as every batch holds one length).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.whole_run import EWT, replicate  # noqa: E402


def fill(lengths: list[int], chunk: int, batch_size: int) -> dict:
    """Batch statistics of examples with these piece counts, bucketed `chunk` at a time."""
    from headprobe.inputs.batching import Prepared, bucket

    size = chunk or len(lengths)
    sizes, pieces, padded = [], 0, 0
    for start in range(0, len(lengths), size):
        part = lengths[start : start + size]
        prepared = Prepared([None] * len(part), [range(n) for n in part])
        for batch in bucket(prepared, batch_size):
            longest = max(part[i] for i in batch)
            sizes.append(len(batch))
            pieces += sum(part[i] for i in batch)
            padded += longest * len(batch)
    return {
        "chunk": chunk or "whole corpus",
        "examples": len(lengths),
        "batches": len(sizes),
        "mean_batch_size": round(sum(sizes) / len(sizes), 2),
        "batches_not_full": round(sum(s < batch_size for s in sizes) / len(sizes), 3),
        "padding_share": round(1 - pieces / padded, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=1, help="EWT dev repeated this many times")
    parser.add_argument("--chunks", type=int, nargs="+", default=[1024, 4096, 0])
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
    figures = [fill(lengths, chunk, args.batch_size) for chunk in args.chunks]
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
