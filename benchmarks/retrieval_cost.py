"""Where a needle probe's time goes on CPU: the prefill against the decoding steps, a batch of one
needle's probes of one length (their prompts are equally long: the same sentences, the needle
moved) against one probe alone.

    python benchmarks/retrieval_cost.py                       # SmolLM2, lengths 500,1000, 1 thread
    python benchmarks/retrieval_cost.py --threads 2 --json benchmarks/results/x.json

For needle 0 at each length: its probes (one per depth) decoded together as the `retrieval`
analysis decodes a batch (`headprobe.model.decoding.decode`, every layer's query row captured,
a callback that reads the step's argmax per head), the prompt's prefill alone (the same call
`decode` makes first), and the first probe decoded alone. Seconds are wall-clock on whatever the
machine is doing (the load average is recorded beside them): indicative only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from headprobe.model.decoding import _prefill, decode, stop_tokens  # noqa: E402
from headprobe.model.loading import load_lm  # noqa: E402
from headprobe.studies.retrieval.needles import needle_stream  # noqa: E402


def timed(function) -> tuple[float, object]:
    started = time.perf_counter()
    out = function()
    return time.perf_counter() - started, out


def measure(model, stops, probes) -> dict:
    """Seconds of the batch's prefill, of its whole decoding, and of its first probe alone."""
    ids = torch.tensor([p.meta["input_ids"] for p in probes])  # [probe, piece]: equal lengths
    mask = torch.ones_like(ids)
    positions = mask.cumsum(-1) - 1
    with torch.inference_mode():
        prefill, _ = timed(lambda: _prefill(model, ids[:, :-1], mask, positions[:, :-1], 1024))
    argmax = lambda step: [rows.argmax(-1) for rows in step.rows.values()]  # noqa: E731
    batch, out = timed(lambda: decode(model, ids, argmax, stop=stops))
    alone, _ = timed(lambda: decode(model, ids[:1], argmax, stop=stops))
    return {
        "probes": len(probes),
        "prompt_tokens": int(ids.shape[1]),
        "steps": int(out.ids.shape[1]),
        "prefill_seconds": round(prefill, 2),
        "batch_seconds": round(batch, 2),
        "batch_seconds_per_probe": round(batch / len(probes), 2),
        "one_probe_alone_seconds": round(alone, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--lengths", default="500,1000")
    parser.add_argument("--depths", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="write the rows to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer, name, _ = load_lm(args.model)
    stops = stop_tokens(tokenizer, model)
    lengths = [int(x) for x in args.lengths.split(",")]
    probes = list(needle_stream(tokenizer, None, lengths, args.depths))
    rows = []
    for length in lengths:
        mine = [p for p in probes if p.meta["needle"] == 0 and p.meta["length"] == length]
        row = {"model": name, "length": length, "threads": args.threads}
        row.update(measure(model, stops, mine))
        row["load_average"] = round(os.getloadavg()[0], 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
