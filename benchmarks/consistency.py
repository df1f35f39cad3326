"""Do results depend on how they were computed? (issue: streaming engine, point 3)

Scores a treebank with all sentence analyses and compares the streaming tallies
(`scorer.tally_`: every fold and bootstrap resample, baselines, McNemar's joint
hits, unreachable arcs):
- batch size 1 against batch size 64 (fp32): counts must be equal;
- bfloat16 against float32: per-head accuracy differences, in accuracy points;
- CPU against CUDA in fp32 (when a GPU is present): counts must be equal.

    python benchmarks/consistency.py                    # bundled MiniLM, EWT dev
    python benchmarks/consistency.py --sentences 500    # a quicker look
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from headprobe.config import RunConfig  # noqa: E402
from headprobe.inputs.corpora.conllu import read_conllu  # noqa: E402
from headprobe.model import loading as models  # noqa: E402
from headprobe.results.query import Results  # noqa: E402
from headprobe.scoring import registry  # noqa: E402
from headprobe.scoring.engine import Engine  # noqa: E402

EWT = ROOT.parent / "shared" / "data" / "en_ewt-ud-dev.conllu"
ANALYSES = ("dependency", "positional", "surface")


def score(model, tokenizer, examples, batch_size) -> dict:
    """{analysis: Tally} of one engine pass."""
    scorers = [registry.get(name).make_scorer() for name in ANALYSES]
    Engine(model, tokenizer, scorers, RunConfig(batch_size=batch_size, progress=False)).run(
        examples
    )
    return {s.analysis: s.tally_.to("cpu") for s in scorers}


def compare_counts(a: dict, b: dict) -> dict:
    """Every total of two runs' tallies: whole counts must be equal; summed masses may differ by rounding."""
    cells = differing = 0
    mass_diff = 0.0
    for name, tally in a.items():
        other = b[name]
        if tally.sorted_labels() != other.sorted_labels():
            return {"counts_equal": False, "problem": f"{name}: labels differ"}
        for label in tally.sorted_labels():
            x, y = tally.arrays(label), other.arrays(label)
            for key, values in x.items():
                if key == "hits" and tally.value == "mass":
                    mass_diff = max(mass_diff, float(np.abs(values - y[key]).max(initial=0.0)))
                else:
                    cells += values.size
                    differing += int((values != y[key]).sum())
    return {
        "count_cells": cells,
        "count_cells_differing": differing,
        "counts_equal": differing == 0,
        "max_abs_mass_difference": mass_diff,
    }


def accuracy_points(a: dict, b: dict, min_arcs: int = 100) -> dict:
    """Per (label, layer, head, direction) dependency accuracy, difference in points."""

    def acc(tallies):
        scores = Results({"dependency": tallies["dependency"]}).head_scores("dependency")
        return scores[scores["n"] >= min_arcs].set_index(["label", "layer", "head", "direction"])[
            "accuracy"
        ]

    x, y = acc(a), acc(b)
    diff = 100 * (x - y.reindex(x.index)).abs()
    best_diff = 100 * (x.groupby("label").max() - y.groupby("label").max()).abs()
    return {
        "max_points_any_head": float(diff.max()),
        "mean_points": float(diff.mean()),
        "max_points_best_head_per_label": float(best_diff.max()),
        "labels_with_min_arcs": int(len(best_diff)),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None)
    parser.add_argument("--treebank", default=str(EWT))
    parser.add_argument("--sentences", type=int, default=None, help="only the first N sentences")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    examples = read_conllu(args.treebank)[: args.sentences]
    report = {"model": args.model or "minilm", "sentences": len(examples)}

    model, tokenizer, _ = models.load(args.model, device="cpu", dtype="float32")
    fp32_64 = score(model, tokenizer, examples, 64)
    report["batch_1_vs_64"] = compare_counts(fp32_64, score(model, tokenizer, examples, 1))
    bf16, tokenizer, _ = models.load(args.model, device="cpu", dtype="bfloat16")
    report["bfloat16_vs_float32"] = accuracy_points(score(bf16, tokenizer, examples, 64), fp32_64)
    if torch.cuda.is_available():
        gpu, tokenizer, _ = models.load(args.model, device="cuda", dtype="float32")
        report["cuda_vs_cpu_fp32"] = compare_counts(fp32_64, score(gpu, tokenizer, examples, 64))
        report["cuda_device"] = torch.cuda.get_device_name()
    else:
        report["cuda_vs_cpu_fp32"] = "no GPU on this machine"
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
