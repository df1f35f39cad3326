"""What the heap trims cost and what they hold back: one whole run (MiniLM, EWT dev x `--copies`,
no report, `--workers 0`) in this fresh process, with the trimmer's policy set
(`scoring/heap_trim.py`: a trim before the next batch could take the resident set `--growth` MB
past the last trim's, and every `--every` batches where given), or with no trims (`--off`, as
`HEADPROBE_KEEP_MALLOC=1`). Prints one JSON line: the run's wall time (model load excluded), its
peak RSS, the trims made in how many batches, and the seconds spent inside `malloc_trim` itself
(the rest of a trim's cost is paid later, when the pages it handed back are faulted in again).

    python benchmarks/heap_trims.py --copies 4                      # the default policy
    python benchmarks/heap_trims.py --copies 4 --every 8 --growth 48   # the policy before 922ef92
    python benchmarks/heap_trims.py --copies 4 --growth 64
    python benchmarks/heap_trims.py --copies 4 --off

Run each in a fresh process (this script is one): the heap a run starts from changes what a trim
hands back.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout this script is in, not an installed headprobe
sys.path.insert(0, str(Path(__file__).resolve().parent))  # whole_run.py beside it

from whole_run import EWT, replicate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=4, help="EWT dev repeated this many times")
    parser.add_argument("--every", type=int, default=None, help="batches between trims at most")
    parser.add_argument("--growth", type=float, default=None, help="MB of growth that trims")
    parser.add_argument("--off", action="store_true", help="no trims (HEADPROBE_KEEP_MALLOC=1)")
    args = parser.parse_args()
    if args.off:
        os.environ["HEADPROBE_KEEP_MALLOC"] = "1"

    import headprobe
    from headprobe.model import loading as models
    from headprobe.scoring import heap_trim

    every = heap_trim.TRIM_EVERY if args.every is None else args.every
    growth = heap_trim.TRIM_GROWTH if args.growth is None else int(args.growth * 2**20)
    made = []

    class Timed(heap_trim.HeapTrimmer):
        """The policy asked for, and the seconds inside each trim counted."""

        def __init__(self, trim, resident=heap_trim.resident_bytes, **_):
            self.inside = 0.0

            def timed():
                start = time.perf_counter()
                trim()
                self.inside += time.perf_counter() - start

            super().__init__(timed, resident, every=every, growth=growth)
            made.append(self)

    heap_trim.HeapTrimmer.for_this_process = classmethod(
        lambda cls, made_by=heap_trim.HeapTrimmer.for_this_process.__func__: made_by(Timed)
    )
    loaded = models.load(None, device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        treebank = (
            EWT
            if args.copies == 1
            else replicate(EWT, args.copies, Path(tmp) / f"ewt-x{args.copies}.conllu")
        )
        start = time.perf_counter()
        headprobe.run(
            treebank=treebank,
            out=Path(tmp) / "out",
            progress=False,
            loaded=loaded,
            report=False,
            workers=0,
        )
        wall = time.perf_counter() - start
    trimmer = made[-1] if made else None
    print(
        json.dumps(
            {
                "corpus": f"EWT dev x{args.copies}",
                "policy": "off"
                if trimmer is None
                else f"{growth / 2**20:g} MB of growth"
                + (f" or every {every} batches" if every else ""),
                "wall_s": round(wall, 2),
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                "trims": None if trimmer is None else trimmer.trims,
                "batches": None if trimmer is None else trimmer.batches,
                "inside_malloc_trim_s": None if trimmer is None else round(trimmer.inside, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
