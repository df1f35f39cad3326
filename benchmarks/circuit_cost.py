"""Cost of circuits on a task on the bundled SmolLM2 (issue 53, acceptance 4): `headprobe run
--model smollm2 --task ioi --n 256 --analyses patching,circuit`, every one of the 123,211 edges
scored by EAP and EAP-IG (5 steps), the validation sample path-patched, both rankings' circuits
at MIB's ten budgets evaluated in-sample and held out, the tables and the report, as a user runs
it: a child process, its wall time and peak RSS. Target: under 15 minutes and 3 GB on 2 idle
cores.

    .venv/bin/python benchmarks/circuit_cost.py [--n 256] [--no-report] [--keep DIR]

Prints one JSON line: the wall time of the whole run (start-up, loading and the patching
analysis it reads included), the scoring pass's seconds, how the circuit analysis's own time
splits (edge scores in the pass; circuits and the exact sample after it: the summary's
`circuit.seconds`) and the patching analysis's, the child's user + sys CPU seconds, its peak
RSS (MB), the examples, CPR and CMD held out and in-sample, and the smallest faithful circuit.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--no-report", action="store_true")
    p.add_argument("--keep", help="write the results here (default: a temporary directory)")
    args = p.parse_args(argv)
    out = Path(args.keep or tempfile.mkdtemp(prefix="headprobe-circuit-cost-")) / "run"
    command = [
        sys.executable, "-m", "headprobe", "run", "--model", "smollm2", "--task", "ioi",
        "--n", str(args.n), "--analyses", "patching,circuit", "--out", str(out), "--quiet",
    ] + (["--no-report"] if args.no_report else [])  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
        return done.returncode
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = json.loads((out / "summary.json").read_text())
    info = summary.get("circuit", {})
    scores = {}
    for line in (out / "circuit_scores.csv").read_text().splitlines()[1:]:
        scores[line.split(",")[1]] = line
    print(
        json.dumps(
            {
                "command": " ".join(command[1:]),
                "wall_s": round(wall, 1),
                "pass_s": summary["runs"].get("task", {}).get("seconds"),
                "circuit_s": info.get("seconds"),
                "patching_s": summary.get("patching", {}).get("seconds"),
                "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
                "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
                "examples": summary.get("task", {}).get("examples"),
                "edges": info.get("edges"),
                "scores_csv": scores,
                "smallest_faithful": info.get("smallest_faithful"),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
