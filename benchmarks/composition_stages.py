"""Resident memory per stage of the composition on the bundled SmolLM2 (issue 44, the cost): the
repeated-random probe N x 50 in one batch, mean ablation per position, the receivers of the
layers given (default the last, which has the most senders), then 5 edges patched exactly.

    PYTHONPATH=. .venv/bin/python benchmarks/composition_stages.py [--n 20] [--layers 29]
        [--threads 2]

A thread reads the process's RSS (`/proc/self/statm`) every 20 ms; prints each stage's largest
reading (MB, of the whole process: the model included), the sizes of the clean cache's parts
and the peak RSS (`ru_maxrss`) as one JSON line. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


class Stages:
    """The largest RSS seen during each named stage."""

    def __init__(self):
        self.stage, self.peak, self.running = "start", {}, True
        threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self):
        while self.running:
            now, stage = rss_mb(), self.stage
            self.peak[stage] = max(self.peak.get(stage, 0.0), now)
            time.sleep(0.02)

    def __call__(self, name: str) -> None:
        time.sleep(0.05)
        self.stage = name


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--layers", default="29", help="receiver layers, comma-separated")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)

    import torch

    from headprobe.model.gates import head_means
    from headprobe.model.layer_cache import clean_cache
    from headprobe.model.loading import load_lm
    from headprobe.model.objectives import Objective
    from headprobe.studies.composition import sweep
    from headprobe.studies.composition.first_order import input_gradients, slice_gradients
    from headprobe.studies.composition.intervention import edge_sums

    torch.set_num_threads(args.threads)
    stage, sizes = Stages(), {}
    stage("load")
    model, tokenizer, _, _ = load_lm("smollm2")
    stage("means")
    batches = sweep.probe_batches(model, tokenizer, 50, args.n, batch_size=args.n)
    means = head_means(model, batches, per_position=True)
    batch, stack = batches[0], "decoder"
    objective = Objective.for_model(model, stack=stack)
    stage("clean_cache")
    targets = objective.targets(model, batch)
    cache = clean_cache(model, targets.inputs, stack)
    mb = lambda ts: round(sum(t.numel() * t.element_size() for t in ts if t is not None) / 2**20)
    sizes["x"], sizes["slices"] = mb(cache.x.values()), mb(cache.slices.values())
    sizes["attention_out"] = mb(cache.attention_out.values())
    sizes["qkv"] = mb(t for c in cache.calls.values() for t in (c.query, c.key, c.value))
    half = sweep.repeated_half(batch)
    rows = sweep.scored_rows(batch, half)
    roles = sweep.batch_roles(targets.inputs["input_ids"], half)
    stage("slice_gradients")
    grad_z = slice_gradients(model, cache, objective, targets)
    sizes["grad_z"] = mb([grad_z])
    budget = sweep.memory_budget()
    layers = [int(x) for x in args.layers.split(",")]
    for layer in layers:
        stage(f"input_gradients {layer}")
        grads = input_gradients(model, cache, layer, grad_z, None, budget)
        sizes["grads"] = mb([grads])
        stage(f"edge_sums {layer}")
        edge_sums(model, cache, layer, None, means, rows, roles, None, budget, grads)
        del grads
        cache.shortcuts.pop(layer, None)
    del cache, grad_z
    stage("exact (5 edges)")
    top = layers[0]
    edges = [((0, 1), (top, 2), "k"), ((3, 1), (top, 0), "q"), ((0, 0), (1, 0), "v")]
    edges += [((10, 0), (20, 3), "v"), ((5, 5), (15, 1), "q")]
    sweep.exact_sums(model, batches, edges, means, objective, stack)
    stage("end")
    stage.running = False
    out = {
        "stage_peak_rss_mb": {k: round(v) for k, v in stage.peak.items()},
        "cache_mb": sizes,
        "budget_mb": round(budget / 2**20),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
