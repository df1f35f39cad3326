"""Torch ops and host syncs of a whole run against a plain forward pass (counts, not timings).

    python benchmarks/ops.py                       # EWT dev's first 300 sentences, bundled MiniLM
    python benchmarks/ops.py --sentences 300 --json benchmarks/results/ops_minilm_ewt300.json
    python benchmarks/ops.py --top 25              # also the most frequent ops of the run

What is counted, with `torch.profiler` (CPU activity, every thread):
- an **op** is an `aten::` event that has no `aten::` event above it on its thread (its outermost
  `aten::` event), so `aten::to` calling `aten::_to_copy` calling `aten::copy_` counts once;
- a **sync** is one of the ops that make a GPU wait for the host (`SYNC_OPS`: nonzero, item /
  `_local_scalar_dense`, unique, masked_select, is_nonzero, equal, repeat_interleave, bincount),
  counted once, at its outermost such event (an `aten::item` calling `_local_scalar_dense` is one).

The run is `headprobe.run` on the first `--sentences` sentences of UD English EWT dev, report
included, with the model loaded once before. Its start-up (whatever a run does however few
sentences it scores) is the same run on the first 5 sentences, subtracted. The plain forward is
the model on the same sentences in exact-length batches of up to 64 (`inputs.batching`), fed no
attention mask (the batches have no padding), as a user's fastest code would run it: a given
mask costs a sync a batch (transformers reads it back to see whether it can skip it). Both
are divided by the plain forward's batches: ops per plain batch, and the run's over the plain's.
`added_syncs` is the run's count less the plain forward's.
Counts do not depend on the machine's load; they do on the corpus, the model and torch's version.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout this script is in, not an installed headprobe
EWT = ROOT.parent / "shared" / "data" / "en_ewt-ud-dev.conllu"

SYNC_OPS = frozenset(
    f"aten::{name}"
    for name in (
        "nonzero",
        "item",
        "_local_scalar_dense",
        "unique",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "masked_select",
        "is_nonzero",
        "equal",
        "repeat_interleave",
        "bincount",
    )
)


def first_sentences(path: Path, n: int, out: Path) -> Path:
    """The first `n` sentences (blank-line separated blocks) of a CoNLL-U file, written to `out`."""
    blocks = path.read_text(encoding="utf-8").strip().split("\n\n")[:n]
    out.write_text("\n\n".join(blocks) + "\n\n", encoding="utf-8")
    return out


def outermost(events) -> tuple[Counter, Counter]:
    """(ops, syncs): each `aten::` event with no `aten::` ancestor, by name; each sync op with no
    sync-op ancestor, by name."""
    ops, syncs = Counter(), Counter()
    for event in events:
        name = event.name
        if not name.startswith("aten::"):
            continue
        parent, aten_above, sync_above = event.cpu_parent, False, False
        while parent is not None:
            if parent.name.startswith("aten::"):
                aten_above = True
                sync_above = sync_above or parent.name in SYNC_OPS
            parent = parent.cpu_parent
        if not aten_above:
            ops[name] += 1
        if name in SYNC_OPS and not sync_above:
            syncs[name] += 1
    return ops, syncs


def profiled(work) -> tuple[Counter, Counter]:
    """(ops, syncs) of `work()`, every thread."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        work()
    return outermost(prof.events())


def count(sentences: int, analyses: str | None, top: int) -> dict:
    import torch

    import headprobe
    from headprobe.inputs.batching import iter_batches, prepare
    from headprobe.inputs.corpora.conllu import read_conllu
    from headprobe.model import loading as models
    from headprobe.scoring.engine import max_length

    torch.manual_seed(0)
    loaded = models.load(None, device="cpu")
    model, tokenizer, name = loaded
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        small = first_sentences(EWT, 5, tmp / "ewt-5.conllu")
        treebank = first_sentences(EWT, sentences, tmp / f"ewt-{sentences}.conllu")
        corpus = list(read_conllu(treebank))
        prepared = prepare(corpus, tokenizer, max_length(model, tokenizer))
        pad = tokenizer.pad_token_id or 0
        batches = list(iter_batches(prepared, 64, pad))

        @torch.inference_mode()
        def plain():
            for batch in batches:
                model(input_ids=batch.input_ids)  # exact-length batches: no padding, no mask

        def whole(path, out):
            extra = {"analyses": analyses} if analyses else {}
            headprobe.run(
                treebank=path, out=tmp / out, progress=False, loaded=loaded, report=True, **extra
            )

        whole(small, "warm")  # imports and caches, outside every count
        plain_ops, plain_syncs = profiled(plain)
        start_ops, start_syncs = profiled(lambda: whole(small, "start"))
        run_ops, run_syncs = profiled(lambda: whole(treebank, "run"))
    n = len(batches)
    ops = run_ops - start_ops  # Counter subtraction keeps positive counts only
    ops.update({k: -v for k, v in (start_ops - run_ops).items()})
    syncs = run_syncs - start_syncs
    syncs.update({k: -v for k, v in (start_syncs - run_syncs).items()})
    total_ops, total_plain = sum(ops.values()), sum(plain_ops.values())
    return {
        "model": name,
        "corpus": f"EWT dev, first {sentences} sentences",
        "words": sum(len(ex.words) for ex in corpus),
        "analyses": analyses or "the default",
        "plain_batches": n,
        "plain_ops": total_plain,
        "plain_ops_per_batch": round(total_plain / n, 1),
        "plain_syncs": sum(plain_syncs.values()),
        "run_ops": total_ops,
        "run_ops_per_plain_batch": round(total_ops / n, 1),
        "run_over_plain_ops": round(total_ops / total_plain, 3),
        "run_syncs": sum(syncs.values()),
        "run_syncs_by_op": dict(syncs.most_common()),
        # the syncs the run adds to those of the model's own forward passes (the plain's)
        "added_syncs": sum(syncs.values()) - sum(plain_syncs.values()),
        "added_syncs_per_10_batches": round(
            10 * (sum(syncs.values()) - sum(plain_syncs.values())) / n, 2
        ),
        "startup_ops": sum(start_ops.values()),
        "top_ops": dict(ops.most_common(top)),
        "torch": torch.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--analyses", default=None, help="the run's --analyses (default: its own)")
    parser.add_argument("--top", type=int, default=15, help="list this many of the run's ops")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args()
    figures = count(args.sentences, args.analyses, args.top)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
