"""Do results depend on how they were computed? (issue: streaming engine, point 3)

Scores a treebank with all sentence analyses and compares per-unit counts:
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
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from headprobe import models                                             # noqa: E402
from headprobe.corpora.conllu import read_conllu                         # noqa: E402
from headprobe.engine import Engine                                      # noqa: E402
from headprobe.results import merge_unit_counts                          # noqa: E402
from headprobe.scorers.dependency import DependencyScorer                # noqa: E402
from headprobe.scorers.positional import PositionalScorer                # noqa: E402
from headprobe.scorers.surface import SurfaceScorer                      # noqa: E402

EWT = ROOT.parent / "shared" / "data" / "en_ewt-ud-dev.conllu"
KEY = ["analysis", "label", "unit", "layer", "head", "direction", "variant"]


def score(model, tokenizer, examples, batch_size) -> pd.DataFrame:
    scorers = [DependencyScorer(), PositionalScorer(), SurfaceScorer()]
    Engine(model, tokenizer, scorers, batch_size=batch_size, progress=False).run(examples)
    frame = merge_unit_counts([s.unit_counts() for s in scorers])
    for column in KEY:
        if isinstance(frame[column].dtype, pd.CategoricalDtype):
            frame[column] = frame[column].astype(str)
    return frame.set_index(KEY).sort_index()


def compare_counts(a: pd.DataFrame, b: pd.DataFrame) -> dict:
    hits = a[a["hits"].notna()]["hits"], b[b["hits"].notna()]["hits"]
    differing = int((hits[0] != hits[1].reindex(hits[0].index)).sum())
    mass = a["mass"].dropna(), b["mass"].dropna()
    mass_diff = float(np.abs(mass[0] - mass[1].reindex(mass[0].index)).max()) if len(mass[0]) else 0.0
    return {"rows": int(len(a)), "hit_rows_differing": differing, "counts_equal": differing == 0,
            "max_abs_mass_difference": mass_diff}


def accuracy_points(a: pd.DataFrame, b: pd.DataFrame, min_arcs: int = 100) -> dict:
    """Per (label, layer, head, direction) dependency accuracy, difference in points."""
    def acc(frame):
        rows = frame.reset_index()
        rows = rows[(rows["analysis"] == "dependency") & (rows["variant"] == "")]
        grouped = rows.groupby(["label", "layer", "head", "direction"])[["hits", "n"]].sum()
        return grouped[grouped["n"] >= min_arcs]
    x, y = acc(a), acc(b)
    diff = 100 * (x["hits"] / x["n"] - y["hits"] / y["n"]).abs()
    best = lambda g: (g["hits"] / g["n"]).groupby("label").max()
    best_diff = 100 * (best(x) - best(y)).abs()
    return {"max_points_any_head": float(diff.max()), "mean_points": float(diff.mean()),
            "max_points_best_head_per_label": float(best_diff.max()), "labels_with_min_arcs": int(len(best_diff))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
