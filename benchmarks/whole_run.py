"""Time and peak memory of what a user runs: a whole `headprobe run` (scoring, statistics, tables).

    python benchmarks/whole_run.py memory --json benchmarks/results/whole_run_memory.json
    python benchmarks/whole_run.py memory --cases x1 x8 x40     # only these
    python benchmarks/whole_run.py memory --cases x4 x40        # words/s at 1M words over 100k
    python benchmarks/whole_run.py speed  --json benchmarks/results/whole_run_speed.json

`memory`: each case runs in a fresh subprocess (peak RSS is the child's `ru_maxrss`):
- `x1`, `x4`, `x8`, `x40`: MiniLM on EWT dev x1 ... x40 (the file concatenated 4, 8 or 40 times,
  sentence and document ids renamed per copy; x40 is about 1M words), `--no-report`;
- `llama`: a random-weight Llama, 32 layers x 32 heads (8 KV heads), hidden 256, on the whole
  of EWT dev (SmolLM2's tokenizer), `--no-report`.
For each: the scoring pass, everything after it (statistics, tables, saving) and the peak;
then the peaks of x8 and x40 over x1's (the corpus is read lazily: targets <= 1.15 at x8,
under 1.0 GB at x40).

`speed`: in one process, start-up (imports, model load) excluded: a plain batched forward
pass over EWT dev x `--copies` (default 4, ~100k words; the same exact-length batches)
against a whole run with the report, best of `--repeat` alternating trials; also the run's
own scoring pass, and the whole run less its start-up (a run on 5 sentences without the report:
`whole_less_startup_over_plain`). `--measure weights,norms` times the run with both measures.

    python benchmarks/whole_run.py speed --copies 4 --repeat 2
    python benchmarks/whole_run.py speed --copies 1 --measure weights,norms --no-report

`knobs`: in one process, the plain forward (as `speed`), the same with the attention captured as
the pass captures it (no scorer), and whole runs without the report
under each setting of two knobs, `--workers` 0 and 1 and the heap trims on and off
(`HEADPROBE_KEEP_MALLOC=1`), every setting once per trial, in turn, `--repeat` trials: what each
costs, measured side by side on the same machine state (means and bests):

    python benchmarks/whole_run.py knobs --copies 4 --repeat 2

`profile`: one whole run (report included), sampled, its time as shares of forward,
capture, pooling, scorers, statistics, tables, save, report and the rest:

    python benchmarks/whole_run.py profile --copies 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout this script is in, not an installed headprobe
EWT = ROOT.parent / "shared" / "data" / "en_ewt-ud-dev.conllu"


def replicate(path: Path, copies: int, out: Path) -> Path:
    """`copies` concatenated copies of a CoNLL-U file, ids renamed (`-copyK`) so units stay distinct
    (written a copy at a time)."""
    lines = path.read_text(encoding="utf-8").rstrip("\n").splitlines()
    with open(out, "w", encoding="utf-8") as handle:
        for k in range(copies):
            renamed = (
                f"{line}-copy{k}" if line.startswith(("# sent_id =", "# newdoc id =")) else line
                for line in lines
            )
            handle.write("\n".join(renamed) + "\n\n")
    return out


def random_llama():
    """32 layers x 32 heads (8 KV heads), hidden 256, random weights, SmolLM2's tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaModel

    from headprobe.inputs.align import prepare_tokenizer
    from headprobe.model.loading import SMOLLM2_GGUF, smollm2_dir

    tokenizer = prepare_tokenizer(
        AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF)
    )
    config = LlamaConfig(
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        hidden_size=256,
        intermediate_size=512,
        vocab_size=len(tokenizer),
        max_position_embeddings=2048,
    )
    torch.manual_seed(0)
    model = LlamaModel(config).eval()
    return model, tokenizer, "random Llama 32x32 (8 KV), hidden 256"


def child(case: str, treebank: str, out: str) -> dict:
    """One whole run, in this process: returns its times and peak RSS."""
    import headprobe
    from headprobe.model import loading as models

    started = time.perf_counter()
    loaded = random_llama() if case == "llama" else models.load(None, device="cpu")
    loaded_at = time.perf_counter()
    results = headprobe.run(
        treebank=treebank, out=out, progress=False, pictures=False, loaded=loaded
    )
    done = time.perf_counter()
    scoring = results.summary["runs"]["sentences"]["seconds"]
    whole = done - loaded_at
    return {
        "case": case,
        "treebank": treebank,
        "words": results.summary["runs"]["sentences"]["words"],
        "load_seconds": round(loaded_at - started, 2),
        "scoring_seconds": round(scoring, 2),
        "after_scoring_seconds": round(whole - scoring, 2),
        "whole_run_seconds": round(whole, 2),
        "after_over_scoring": round((whole - scoring) / scoring, 3),
        "whole_run_words_per_second": round(
            results.summary["runs"]["sentences"]["words"] / whole, 1
        ),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def run_child(case: str, treebank: Path, out: Path) -> dict:
    command = [sys.executable, __file__, "child", case, str(treebank), str(out)]
    done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


CASES = {
    "x1": ("minilm", 1),
    "x4": ("minilm", 4),
    "x8": ("minilm", 8),
    "x40": ("minilm", 40),
    "llama": ("llama", 1),
}


def memory(cases=tuple(CASES), keep: str | None = None) -> list[dict]:
    """keep: write each case's results directory under this folder (to time its report) instead
    of a temporary one."""
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        outs = Path(keep) if keep else tmp
        for name in cases:
            model, copies = CASES[name]
            treebank = EWT if copies == 1 else replicate(EWT, copies, tmp / f"ewt-x{copies}.conllu")
            row = run_child(model, treebank, outs / f"out-{name}")
            row["corpus"] = "EWT dev" if copies == 1 else f"EWT dev x{copies}"
            print(json.dumps(row), flush=True)
            rows[name] = row
            if copies > 1:
                treebank.unlink()
    ratios = {
        f"{name}_over_x1_peak": round(rows[name]["peak_rss_mb"] / rows["x1"]["peak_rss_mb"], 3)
        for name in ("x8", "x40")
        if name in rows and "x1" in rows
    }
    if "x4" in rows and "x40" in rows:  # words per second hold at scale (target >= 0.9)
        ratios["x40_over_x4_words_per_second"] = round(
            rows["x40"]["whole_run_words_per_second"] / rows["x4"]["whole_run_words_per_second"], 3
        )
    return list(rows.values()) + ([ratios] if ratios else [])


def _minilm():
    """(model, tokenizer, name): the bundled MiniLM on the CPU, torch seeded."""
    import torch

    from headprobe.model import loading as models

    torch.manual_seed(0)
    return models.load(None, device="cpu")


def plain_forward(model, tokenizer, copies: int, tmp: Path):
    """(treebank, words, plain): EWT dev x `copies` (written under `tmp`), its words, and a plain
    batched forward over it: exact-length batches of up to 64, no padding, fed no mask."""
    import torch

    from headprobe.inputs.batching import iter_batches, prepare
    from headprobe.inputs.corpora.conllu import read_conllu
    from headprobe.scoring.engine import max_length

    treebank = EWT if copies == 1 else replicate(EWT, copies, tmp / f"ewt-x{copies}.conllu")
    corpus = read_conllu(treebank)
    pad = tokenizer.pad_token_id or 0

    @torch.inference_mode()
    def plain():
        prepared = prepare(list(corpus), tokenizer, max_length(model, tokenizer))
        for batch in iter_batches(prepared, 64, pad):
            model(input_ids=batch.input_ids)

    return treebank, sum(len(ex.words) for ex in corpus), plain


def speed(repeat: int, copies: int = 4, measure: str = "weights", report: bool = True) -> dict:
    """A plain batched forward pass over EWT dev x `copies` (the same exact-length batches)
    against a whole run with the report, best of `repeat` alternating trials, in one process,
    start-up excluded. `scoring` is the run's own scoring pass (summary runs.sentences.seconds)."""
    import torch

    import headprobe

    model, tokenizer, name = _minilm()
    with tempfile.TemporaryDirectory() as tmp:
        treebank, words, plain = plain_forward(model, tokenizer, copies, Path(tmp))

        def whole(out):
            extra = {} if measure == "weights" else {"measure": measure}
            results = headprobe.run(
                treebank=treebank,
                out=out,
                progress=False,
                loaded=(model, tokenizer, name),
                report=report,
                **extra,
            )
            return results.summary["runs"]["sentences"]["seconds"]

        from ops import first_sentences  # benchmarks/ops.py, beside this script

        small = first_sentences(EWT, 5, Path(tmp) / "ewt-5.conllu")

        def startup(out):  # what a run costs however little it scores: 5 sentences, no report
            headprobe.run(
                treebank=small,
                out=out,
                progress=False,
                loaded=(model, tokenizer, name),
                report=False,
            )

        plain()  # warm-up
        startup(Path(tmp) / "warm")
        times = {"plain": [], "whole": [], "scoring": [], "startup": []}
        for trial in range(repeat):
            start = time.perf_counter()
            plain()
            times["plain"].append(time.perf_counter() - start)
            start = time.perf_counter()
            startup(Path(tmp) / f"s{trial}")
            times["startup"].append(time.perf_counter() - start)
            start = time.perf_counter()
            times["scoring"].append(whole(Path(tmp) / f"r{trial}"))
            times["whole"].append(time.perf_counter() - start)
    best = {k: min(v) for k, v in times.items()}
    best["whole_less_startup"] = best["whole"] - best["startup"]
    return {
        "model": name,
        "corpus": f"EWT dev x{copies}",
        "words": words,
        "trials": repeat,
        "measure": measure,
        "report": report,
        "plain_words_per_second": round(words / best["plain"], 1),
        "whole_run_words_per_second": round(words / best["whole"], 1),
        "whole_over_plain": round(best["plain"] / best["whole"], 3),
        # the measure: the whole run less a 5-sentence run without the report
        "whole_less_startup_over_plain": round(best["plain"] / best["whole_less_startup"], 3),
        "scoring_over_plain": round(best["plain"] / best["scoring"], 3),
        "seconds": {k: [round(x, 2) for x in v] for k, v in times.items()},
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
    }


def knobs(repeat: int, copies: int = 4) -> dict:
    """The plain forward, the same with the attention captured, and whole runs without the report
    for each (workers, trims) setting, alternated in one process, `repeat` trials (module
    docstring: `knobs`)."""
    import torch

    import headprobe
    from headprobe.model.capture import AttentionCapture

    model, tokenizer, name = _minilm()
    settings = [(w, trims) for w in (0, 1) for trims in (True, False)]
    times: dict[str, list[float]] = {"plain": [], "plain, attention captured": []}
    with tempfile.TemporaryDirectory() as tmp:
        treebank, words, plain = plain_forward(model, tokenizer, copies, Path(tmp))

        def captured():  # the capture as the pass runs it: each layer's probabilities in a buffer
            buffer = lambda layer, shape, device: torch.empty(shape, device=device)  # noqa: E731
            with AttentionCapture(model, callback=lambda layer, probs: None, into=buffer):
                plain()

        def whole(out, workers: int, trims: bool):
            saved = os.environ.pop("HEADPROBE_KEEP_MALLOC", None)
            if not trims:
                os.environ["HEADPROBE_KEEP_MALLOC"] = "1"
            try:
                start = time.perf_counter()
                headprobe.run(
                    treebank=treebank,
                    out=out,
                    progress=False,
                    loaded=(model, tokenizer, name),
                    report=False,
                    workers=workers,
                )
                return time.perf_counter() - start
            finally:
                os.environ.pop("HEADPROBE_KEEP_MALLOC", None)
                if saved is not None:
                    os.environ["HEADPROBE_KEEP_MALLOC"] = saved

        plain()  # warm-up
        whole(Path(tmp) / "warm", 0, True)
        for trial in range(repeat):
            start = time.perf_counter()
            plain()
            times["plain"].append(time.perf_counter() - start)
            start = time.perf_counter()
            captured()
            times["plain, attention captured"].append(time.perf_counter() - start)
            for workers, trims in settings:
                key = f"workers={workers}, trims {'on' if trims else 'off'}"
                seconds = whole(Path(tmp) / f"r{trial}-{workers}-{trims}", workers, trims)
                times.setdefault(key, []).append(seconds)
    plain_mean = sum(times["plain"]) / repeat
    return {
        "model": name,
        "corpus": f"EWT dev x{copies}",
        "words": words,
        "trials": repeat,
        "seconds": {k: [round(t, 2) for t in v] for k, v in times.items()},
        "mean": {k: round(sum(v) / len(v), 2) for k, v in times.items()},
        "plain_over_mean": {k: round(plain_mean / (sum(v) / len(v)), 3) for k, v in times.items()},
    }


# where a whole run's time goes: each stage's functions (a file part, and a function name or
# None for all of the file's). A sample of the running stack counts for the innermost stage on
# it: the capture's hooks run inside the forward pass, the scorers inside them, pooling when a
# scorer first reads the words, statistics inside the tables, tables inside the report and save.
STAGES = {
    "forward": ("torch/nn/modules/module.py", "_call_impl"),
    "capture": ("headprobe/model/capture.py", None),
    "pooling": ("headprobe/scoring/engine.py", "pool_words"),
    "scorers": ("headprobe/studies/", None),
    "statistics": ("headprobe/stats/", None),
    "tables": ("headprobe/results/query.py", None),
    "save": ("headprobe/results/store.py", "save"),
    "report": ("headprobe/report/", None),
}


def stage_of(frame) -> str:
    """The innermost stage on a stack (`frame` and its callers), else "other"."""
    while frame is not None:
        code = frame.f_code
        for stage, (where, name) in STAGES.items():
            if where in code.co_filename and (name is None or code.co_name == name):
                return stage
        frame = frame.f_back
    return "other"


class StackSampler:
    """Samples the calling thread's stack every `interval` seconds from a thread of its own
    (torch kernels release the GIL; Python code is sampled at the interpreter's switch
    interval) and counts each sample for `stage_of` it: `with StackSampler() as s: ...`,
    then `s.counts`."""

    def __init__(self, interval: float = 0.005):
        import collections
        import threading

        self.interval, self.counts = interval, collections.Counter()
        self.target = threading.get_ident()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stop.wait(self.interval):
            frame = sys._current_frames().get(self.target)
            self.counts[stage_of(frame)] += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def profile(copies: int = 4, treebank: str | None = None) -> dict:
    """One whole run (report included), its time as shares of the `STAGES` (forward, capture,
    pooling, scorers, statistics, tables, save, report; `other`: reading, tokenizing, batching,
    the tally's bootstrap, example pictures), from samples of the running stack (shares, not
    timings: read them on any machine). `treebank`: this file instead of EWT dev x `copies`."""
    import headprobe
    from headprobe.model import loading as models

    loaded = models.load(None, device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        name = f"EWT dev x{copies}" if treebank is None else Path(treebank).name
        if treebank is None:
            treebank = (
                EWT if copies == 1 else replicate(EWT, copies, Path(tmp) / f"ewt-x{copies}.conllu")
            )
        start = time.perf_counter()
        with StackSampler() as sampler:
            headprobe.run(
                treebank=treebank, out=Path(tmp) / "out", progress=False, loaded=loaded, report=True
            )
        total = time.perf_counter() - start
    samples = sum(sampler.counts.values())
    order = [*STAGES, "other"]
    return {
        "corpus": name,
        "seconds": round(total, 2),
        "samples": samples,
        "shares": {stage: round(sampler.counts[stage] / samples, 3) for stage in order},
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        print(json.dumps(child(*sys.argv[2:5])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["memory", "speed", "knobs", "profile"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--cases", nargs="+", choices=list(CASES), default=list(CASES), help="memory: which runs"
    )
    parser.add_argument(
        "--keep", default=None, help="memory: keep each case's results directory under this folder"
    )
    parser.add_argument(
        "--copies",
        type=int,
        default=4,
        help="speed/knobs/profile: EWT dev repeated this many times",
    )
    parser.add_argument(
        "--measure", default="weights", help="speed: the run's --measure (weights, weights,norms)"
    )
    parser.add_argument("--treebank", default=None, help="profile: this CoNLL-U file, not EWT dev")
    parser.add_argument(
        "--no-report", action="store_true", help="speed: the whole run without the report"
    )
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args()
    if args.what == "memory":
        figures = memory(args.cases, args.keep)
    elif args.what == "speed":
        figures = speed(args.repeat, args.copies, args.measure, not args.no_report)
    elif args.what == "knobs":
        figures = knobs(args.repeat, args.copies)
    else:
        figures = profile(args.copies, args.treebank)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
