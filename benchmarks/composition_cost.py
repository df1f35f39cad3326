"""Cost of the composition on the bundled SmolLM2 (issue 44, acceptance 4): every receiver, every
sender, 3 channels, Olsson's probe (repeated-random) 20 x 50, mean ablation (per position),
including the first-order estimates and the check (exact path patching of the validation
sample), with the peak RSS of the process. Target: under 10 minutes and 2.5 GB on 2 idle cores.

    .venv/bin/python benchmarks/composition_cost.py [--threads 2] [--n 20] [--length 50]
        [--batch-size 20] [--ablation mean|zero|resample]
    .venv/bin/python benchmarks/composition_cost.py --model minilm --conllu ../shared/data/en_ewt-ud-dev.conllu

The second: MiniLM (post-norm, no language-model head: the representation objective) on a
treebank's sentences, mean ablation over all pieces (sentences differ in length); target
under 5 minutes.

Prints one JSON line: seconds per stage and in all, the composition's CPU seconds (user + sys,
which load on a shared machine does not inflate as it does wall time), peak RSS (MB), edges,
the check's Spearman.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--length", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=20, help="sequences per batch (default 20)")
    p.add_argument("--ablation", default="mean", choices=("zero", "mean", "resample"))
    p.add_argument("--receivers", default="all", help="all, or L-H,L-H,...")
    p.add_argument("--model", default="smollm2", help="a bundled model (default smollm2)")
    p.add_argument("--conllu", help="a CoNLL-U file's sentences instead of the probe")
    p.add_argument("--limit", type=int, help="the file's first N sentences only")
    args = p.parse_args(argv)

    import torch

    from headprobe.model.gates import head_means
    from headprobe.model.loading import load_lm
    from headprobe.studies.ablation.kinds import Baselines
    from headprobe.studies.composition.sweep import probe_batches, resampled
    from headprobe.studies.composition.tables import composition

    torch.set_num_threads(args.threads)
    times = {}
    start = time.perf_counter()
    model, tokenizer, display, _ = load_lm(args.model)
    times["load_s"] = time.perf_counter() - start
    t = time.perf_counter()
    if args.conllu:
        batches = _sentences(model, tokenizer, args.conllu, args.batch_size, args.limit)
    else:
        batches = probe_batches(model, tokenizer, args.length, args.n, batch_size=args.batch_size)
    if args.ablation == "mean":
        baseline = head_means(model, batches, per_position=not args.conllu)
    elif args.ablation == "resample":
        baselines = Baselines(("resample",), seed=0)
        baselines.read(model, tokenizer, [e for b in batches for e in b.examples])
        baseline = resampled(baselines)
    else:
        baseline = None
    times["means_s"] = time.perf_counter() - t
    receivers = None
    if args.receivers != "all":
        receivers = [tuple(map(int, r.split("-"))) for r in args.receivers.split(",")]
    t, cpu = time.perf_counter(), _cpu()
    tick = lambda i: print(
        f"batch {i + 1}/{len(batches)} {time.perf_counter() - t:.0f} s", file=sys.stderr
    )
    frames = composition(
        model, batches, args.ablation, baseline, receivers, token_id=None, progress=tick
    )
    times["composition_s"] = time.perf_counter() - t
    times["composition_cpu_s"] = _cpu() - cpu
    times["total_s"] = time.perf_counter() - start
    corr = frames["composition_check_correlation"]
    out = {
        "model": display,
        "threads": args.threads,
        "batch_size": args.batch_size,
        "inputs": args.conllu or f"repeated-random {args.n} x {args.length}",
        "ablation": args.ablation,
        **{k: round(v, 1) for k, v in times.items()},
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "edges": len(frames["composition_edges"]),
        "check_edges": len(frames["composition_check"]),
        "check_spearman": None
        if not len(corr) or corr["spearman"].isna().iloc[0]  # no estimate: the warning says why
        else round(float(corr["spearman"].iloc[0]), 3),
    }
    print(json.dumps(out))
    return 0


def _sentences(model, tokenizer, path: str, batch_size: int, limit=None) -> list:
    """A CoNLL-U file's sentences as a list of `Batch`es, as a run tokenizes them."""
    from headprobe.inputs.batching import iter_batches, prepare
    from headprobe.inputs.corpora.conllu import read_conllu
    from headprobe.model.sites import model_device
    from headprobe.scoring.engine import max_length

    examples = list(read_conllu(path))[:limit]
    prepared = prepare(examples, tokenizer, max_length(model, tokenizer))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return list(iter_batches(prepared, batch_size, pad, device=model_device(model)))


def _cpu() -> float:
    """User + system CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    raise SystemExit(main())
