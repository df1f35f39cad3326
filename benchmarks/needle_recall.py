"""How often the bundled SmolLM2 recalls the needle, per (length, depth), and seconds per probe.

    python benchmarks/needle_recall.py                          # built-in needles, 500,1000 x 5
    python benchmarks/needle_recall.py --lengths 500,1000,2000 --depths 5 --needles my.jsonl

Each probe of `headprobe.studies.retrieval.needles.needle_stream` is decoded greedily
(`headprobe.model.decoding.decode`, every layer's query row captured and dropped, as a
retrieval scorer would read them); a probe succeeds when the response recalls more than half
of the answer's words (METHODS §16). Seconds per probe include the capture; they are
indicative only on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from headprobe.model.decoding import decode, stop_tokens  # noqa: E402
from headprobe.model.loading import load_lm  # noqa: E402
from headprobe.studies.retrieval.needles import needle_stream, recalled, word_recall  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--lengths", default="500,1000")
    parser.add_argument("--depths", type=int, default=5)
    parser.add_argument("--needles", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None, help="write the rows to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer, name, _ = load_lm(args.model)
    stops = stop_tokens(tokenizer, model)
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = []
    for example in needle_stream(tokenizer, args.needles, lengths, args.depths):
        meta = example.meta
        started = time.perf_counter()
        out = decode(model, torch.tensor([meta["input_ids"]]), stop=stops)
        seconds = time.perf_counter() - started
        response = out.texts(tokenizer)[0].strip()
        rows.append(
            dict(
                needle=meta["needle"],
                length=meta["length"],
                prompt_tokens=len(meta["input_ids"]),
                depth=round(meta["depth"], 3),
                depth_used=round(meta["depth_used"], 3),
                response=response,
                recall=word_recall(response, meta["answer"]),
                success=recalled(response, meta["answer"]),
                seconds=round(seconds, 2),
            )
        )
        print(json.dumps(rows[-1]), flush=True)
    for length in lengths:
        mine = [r for r in rows if r["length"] == length]
        hits = sum(r["success"] for r in mine)
        per = sum(r["seconds"] for r in mine) / len(mine)
        print(f"{name} length {length}: {hits} of {len(mine)} recalled, {per:.2f} s per probe")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
