"""Peak memory of one needle probe decoded with every layer's query row captured (SmolLM2).

    python benchmarks/retrieval_memory.py                      # a 4,000-token context
    python benchmarks/retrieval_memory.py --length 2000 --prefill-chunk 512

Run it as its own process (the peak is the process's): the bundled SmolLM2-135M-Instruct is
loaded under its language-model head (`load_lm`, float32, CPU), one probe of
`headprobe.studies.retrieval.needles` is built (built-in needle 0, the given context length, depth 0.5), and
`headprobe.model.decoding.decode` runs it: the prompt prefilled in chunks with nothing captured,
then up to 32 greedy steps, each handing every layer's query row ([1, 9 heads, keys]) to a
callback that keeps what a retrieval scorer keeps (the argmax key per head) and drops the rows.
Reported: resident memory after loading, the process's peak (sampled every 2 ms and the kernel's
maximum), seconds, the response. Times on a shared machine are indicative only.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from query_block_memory import RssSampler, current_rss_mb  # noqa: E402

from headprobe.model.decoding import decode, stop_tokens  # noqa: E402
from headprobe.model.loading import load_lm  # noqa: E402
from headprobe.studies.retrieval.needles import NEEDLES, needle_stream  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=4000, help="context length in tokens")
    parser.add_argument("--prefill-chunk", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer, name, _ = load_lm("smollm2", device="cpu")
    stops = stop_tokens(tokenizer, model)
    (probe,) = needle_stream(tokenizer, NEEDLES[:1], lengths=[args.length], depths=1)
    ids = torch.tensor([probe.meta["input_ids"]])  # [1, piece]
    argmax_keys = []  # per step: {layer: [head]} argmax key, what a retrieval scorer keeps

    def keep(step) -> None:
        argmax_keys.append({layer: row[0].argmax(-1) for layer, row in step.rows.items()})

    loaded = current_rss_mb()
    started = time.perf_counter()
    with RssSampler() as sampler:
        out = decode(model, ids, keep, stop=stops, prefill_chunk=args.prefill_chunk)
    seconds = time.perf_counter() - started
    result = {
        "model": name,
        "context_tokens": probe.meta["context_tokens"],
        "prompt_tokens": ids.shape[1],
        "prefill_chunk": args.prefill_chunk,
        "steps": len(argmax_keys),
        "response": out.texts(tokenizer)[0].strip(),
        "rss_after_loading_mb": round(loaded, 1),
        "peak_rss_mb": round(sampler.peak, 1),
        "peak_above_loading_mb": round(sampler.peak - loaded, 1),
        "kernel_max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "seconds": round(seconds, 1),
        "threads": args.threads,
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
