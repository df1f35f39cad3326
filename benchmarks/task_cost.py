"""Cost of heads on a task on the bundled SmolLM2 (issue 51, acceptance 4): `headprobe run --model
smollm2 --task ioi --n 256 --estimate atp,ig`, every node (the embeddings, 270 heads, 30 MLPs)
noised, denoised and its direct effect, the estimates and their check, the tables and the
report, as a user runs it: a child process, its wall time and peak RSS. Target: under 10
minutes and 2.5 GB on 2 idle cores.

    .venv/bin/python benchmarks/task_cost.py [--n 256] [--estimate atp,ig] [--task ioi|FILE]
        [--no-report] [--keep DIR]

Prints one JSON line: the wall time of the whole run (start-up and loading included), the
scoring pass's seconds and how they split (exact patching, direct effects, estimates, attention:
the summary's `patching.seconds`), the child's user + sys CPU seconds, its peak RSS (MB), the
examples, the shared prefix's pieces, and the metric.
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
    p.add_argument("--task", default="ioi")
    p.add_argument("--estimate", default="atp,ig")
    p.add_argument("--no-report", action="store_true")
    p.add_argument("--keep", help="write the results here (default: a temporary directory)")
    args = p.parse_args(argv)
    out = Path(args.keep or tempfile.mkdtemp(prefix="headprobe-task-cost-")) / "run"
    command = [
        sys.executable, "-m", "headprobe", "run", "--model", "smollm2", "--task", args.task,
        "--n", str(args.n), "--estimate", args.estimate, "--out", str(out), "--quiet",
    ] + (["--no-report"] if args.no_report else [])  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
        return done.returncode
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = json.loads((out / "summary.json").read_text())
    info = summary.get("patching", {})
    run = summary["runs"].get("task", {})
    metric = {}
    for line in (out / "patching_metric.csv").read_text().splitlines()[1:]:
        parts = line.split(",")
        metric[parts[-5]] = round(float(parts[-4]), 3)
    print(
        json.dumps(
            {
                "command": " ".join(command[1:]),
                "wall_s": round(wall, 1),
                "pass_s": run.get("seconds"),
                "split_s": info.get("seconds"),
                "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
                "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
                "examples": summary.get("task", {}).get("examples"),
                "shared_prefix_pieces": info.get("shared_prefix_pieces"),
                "metric": metric,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
