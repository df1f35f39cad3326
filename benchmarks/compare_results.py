"""Are two results directories the same? (torchrun vs one process, GPU vs CPU, blocked vs not)

Compares every table both directories hold as Parquet (counts, best_heads, baselines,
head_tests, roles, derived tables) and every streaming total in `tallies/*.npz`:
whole counts must be equal; summed attention mass (`mass`-valued tallies, the `mass`
column and what derives from it) may differ by float rounding up to `--mass-tolerance`.

    python benchmarks/compare_results.py results/one results/torchrun --json benchmarks/results/x.json

Exit status 0 when everything agrees, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from headprobe.scoring.tally import Tally  # noqa: E402


def compare_tables(a: Path, b: Path, tolerance: float) -> dict:
    out = {}
    for path in sorted(a.glob("*.parquet")):
        other = b / path.name
        if not other.is_file():
            out[path.stem] = "missing in the second directory"
            continue
        x, y = pd.read_parquet(path), pd.read_parquet(other)
        try:
            pd.testing.assert_frame_equal(x, y, check_exact=True)
            out[path.stem] = "identical"
        except AssertionError:
            try:
                pd.testing.assert_frame_equal(
                    x, y, check_exact=False, rtol=tolerance, atol=tolerance
                )
                out[path.stem] = f"equal within {tolerance:g} (float rounding)"
            except AssertionError as exc:
                out[path.stem] = "DIFFERENT: " + " ".join(str(exc).split())[:300]
    return out


def compare_tallies(a: Path, b: Path, tolerance: float) -> dict:
    out = {}
    for path in sorted((a / "tallies").glob("*.npz")):
        x, y = Tally.load(path), Tally.load(b / "tallies" / path.name)
        if x.sorted_labels() != y.sorted_labels():
            out[path.stem] = "DIFFERENT: labels differ"
            continue
        cells = differing = 0
        mass = 0.0
        for label in x.sorted_labels():
            p, q = x.arrays(label), y.arrays(label)
            for key, values in p.items():
                if key == "hits" and x.value == "mass":
                    mass = max(mass, float(np.abs(values - q[key]).max(initial=0.0)))
                else:
                    cells += values.size
                    differing += int((values != q[key]).sum())
        verdict = (
            "identical"
            if differing == 0 and mass == 0
            else (
                f"counts identical, mass within {mass:.3g}"
                if differing == 0 and mass <= tolerance
                else "DIFFERENT"
            )
        )
        out[path.stem] = {
            "verdict": verdict,
            "count_cells": cells,
            "count_cells_differing": differing,
            "max_abs_mass_difference": mass,
        }
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--mass-tolerance", type=float, default=1e-6)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    a, b = Path(args.first), Path(args.second)
    report = {
        "first": str(a),
        "second": str(b),
        "tables": compare_tables(a, b, args.mass_tolerance),
        "tallies": compare_tallies(a, b, args.mass_tolerance),
    }
    verdicts = list(report["tables"].values()) + [
        t["verdict"] if isinstance(t, dict) else t for t in report["tallies"].values()
    ]
    report["agree"] = not any(str(v).startswith(("DIFFERENT", "missing")) for v in verdicts)
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if report["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
