"""Small `Results` with planted heads, built from real streaming tallies (for report tests).

    from tests.fixtures_results import make_results, make_results_dir
    results = make_results()                          # 2 layers x 3 heads, seed 0
    make_results_dir(tmp_path / "results")            # the same, saved as `headprobe run` does

Item-level outcomes (an arc, a mention, a word) are drawn here with fixed
probabilities and added, one row per (unit, label), into the project's own
`headprobe.scoring.tally.Tally` objects, shaped by each registered scorer's declarations
(directions, baselines, extras, hits or mass). `headprobe.results.query.Results` then
derives every table (counts, best heads in-sample and held-out with bootstrap
intervals, McNemar and Holm, roles), so the report tests do not depend on a model.
Heads are planted so that every role rule fires:

| head | planted behaviour |
|---|---|
| 0-0 | positional, argmax at +1 for ~95% of words |
| 0-1 | coreference, 0.75 accuracy (strongest baseline, rules, 0.6) |
| 0-2 | broad: entropy ~0.95 of uniform |
| 1-0 | syntactic: det dep->head 0.9 (baseline offset=+1 ~0.55) |
| 1-1 | sink: ~0.75 of its mass on the first position + SEP |
| 1-2 | syntactic: nsubj dep->head 0.8 (baseline offset=+1 ~0.35) |

`iobj` has 3 arcs, all in units of fold 0: its best-heads rows carry notes (fewer
than 30 trials; no held-out selection). With `causal=True` some arcs are
unreachable in each direction (a miss for every head), as in a decoder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from headprobe.inputs.corpora.base import ALL
from headprobe.scoring import registry
from headprobe.scoring.tally import Tally, unit_fold

DEP_LABELS = ("nsubj", "det", "obj")
RARE_LABEL = "iobj"
COREF_KINDS = ("pronoun", "proper", "nominal")
COREF_BASELINES = {"nearest": 0.3, "head_match": 0.45, "rules": 0.6}
SURFACE_MASS = ("self", "prev", "next", "cls", "sep", "punct", "first")
N_SENTENCES, N_DOCS = 60, 12
UNREACHABLE_P = 0.08  # causal fixture: share of arcs with an empty row / column, per direction


def new_tally(name: str, n_layers: int, n_heads: int) -> Tally:
    """An empty tally shaped like the registered scorer of `name` (its real declarations)."""
    scorer = registry.get(name).make_scorer()
    return Tally(
        name,
        directions=scorer.directions,
        variants=scorer.variants,
        layers=range(n_layers),
        n_heads=n_heads,
        value=scorer.value,
        bootstrap=scorer.bootstrap,
        extras=scorer.extras,
    )


def add_items(
    tally: Tally,
    unit: str,
    labels: list[str],
    hits: np.ndarray,
    base: np.ndarray | None = None,
    extra: dict | None = None,
) -> None:
    """Add one unit's items to `tally`, each item counting for its own label and for ALL.

    hits [item, layer, head, direction] 0/1, base [item, variant] 0/1,
    extra {name: [item, direction]}."""
    rows = list(dict.fromkeys(labels)) + [ALL]
    member = np.array(
        [[lab == row or row == ALL for lab in labels] for row in rows], dtype=np.float64
    )
    n_dirs = hits.shape[-1]
    values = np.einsum("ri,ilhd->rlhd", member, hits)  # [row, layer, head, dir]
    n = np.repeat(member.sum(1)[:, None], n_dirs, axis=1)  # [row, direction]
    both = None
    if base is not None:
        both = torch.from_numpy(np.einsum("ri,ilhd,iv->rlhdv", member, hits, base))
        base = member @ base  # [row, variant]
    extra = {k: (member @ v).astype(np.int64) for k, v in (extra or {}).items()}  # [row, direction]
    tally.add(
        [unit] * len(rows), rows, values=torch.from_numpy(values), n=n, base=base, extra=extra
    )
    if both is not None:
        tally.add_both(rows, both)


def _baseline_p(label: str, variant: str) -> float:
    if variant == "first":
        return 0.05
    k = int(variant.split("=")[1])
    peak = {"nsubj": (1, 0.35), "det": (1, 0.55), "obj": (-1, 0.35), RARE_LABEL: (2, 0.4)}[label]
    return peak[1] if k == peak[0] else 0.3 * peak[1] / abs(k)


def dependency_tally(rng, n_layers, n_heads, causal=False) -> Tally:
    tally = new_tally("dependency", n_layers, n_heads)
    p = rng.uniform(
        0.05, 0.3, size=(len(DEP_LABELS) + 1, n_layers, n_heads, 2)
    )  # [label, layer, head, dir]
    p[DEP_LABELS.index("det"), 1, 0, 0] = 0.9
    p[DEP_LABELS.index("nsubj"), 1, 2, 0] = 0.8
    all_labels = DEP_LABELS + (RARE_LABEL,)
    rare_units = [u for u in _units("s", N_SENTENCES) if unit_fold(u) == 0][:3]
    for unit in _units("s", N_SENTENCES):
        labels = [lab for lab in DEP_LABELS for _ in range(int(rng.integers(1, 6)))]
        if unit in rare_units:
            labels.append(RARE_LABEL)
        index = [all_labels.index(lab) for lab in labels]
        hits = (rng.random((len(labels), n_layers, n_heads, 2)) < p[index]).astype(np.float64)
        base = np.array(
            [[rng.random() < _baseline_p(lab, v) for v in tally.variants] for lab in labels],
            dtype=np.float64,
        )  # [item, variant]
        unreachable = np.zeros((len(labels), 2))
        if causal:
            unreachable = (rng.random((len(labels), 2)) < UNREACHABLE_P).astype(np.float64)
            hits *= 1 - unreachable[:, None, None, :]  # predicts nothing: a miss
        add_items(tally, unit, labels, hits, base, {"unreachable": unreachable})
    return tally


def coreference_tally(rng, n_layers, n_heads) -> Tally:
    tally = new_tally("coreference", n_layers, n_heads)
    p = rng.uniform(0.15, 0.4, size=(len(COREF_KINDS), n_layers, n_heads))
    p[:, 0, 1] = 0.75
    q = np.array([COREF_BASELINES[v] for v in tally.variants])
    for unit in _units("d", N_DOCS):
        labels = [kind for kind in COREF_KINDS for _ in range(int(rng.integers(3, 11)))]
        index = [COREF_KINDS.index(kind) for kind in labels]
        hits = (rng.random((len(labels), n_layers, n_heads)) < p[index]).astype(np.float64)[
            ..., None
        ]
        base = (rng.random((len(labels), len(q))) < q).astype(np.float64)
        add_items(tally, unit, labels, hits, base)
    return tally


def positional_tally(rng, n_layers, n_heads) -> Tally:
    tally = new_tally("positional", n_layers, n_heads)
    labels = registry.get("positional").scorer.labels  # -2, -1, 0, +1, +2, special, other
    shares = rng.dirichlet(np.ones(len(labels)), size=(n_layers, n_heads))  # [layer, head, label]
    shares[0, 0] = [0.01, 0.01, 0.01, 0.95, 0.01, 0.005, 0.005]
    for unit in _units("s", N_SENTENCES):
        words = int(rng.integers(6, 16))
        counts = np.stack(
            [
                [
                    rng.multinomial(words, shares[layer, head] / shares[layer, head].sum())
                    for head in range(n_heads)
                ]
                for layer in range(n_layers)
            ]
        )  # [layer, head, label]
        values = torch.from_numpy(
            counts.transpose(2, 0, 1)[..., None].astype(np.float64)
        )  # [label, layer, head, 1]
        tally.add(
            [unit] * len(labels),
            list(labels),
            values=values,
            n=np.full((len(labels), 1), float(words)),
        )
    return tally


def surface_tally(rng, n_layers, n_heads, first_is_cls: bool = False) -> Tally:
    """Surface masses per head; with `first_is_cls` the first position is the [CLS] token (an
    encoder): its mass is the cls mass, item for item."""
    tally = new_tally("surface", n_layers, n_heads)
    mean = rng.uniform(0.02, 0.2, size=(n_layers, n_heads, len(SURFACE_MASS)))
    mean[1, 1] = [0.05, 0.05, 0.05, 0.3, 0.4, 0.05, 0.35]  # sink: first 0.35 + sep 0.4
    ratio = rng.uniform(0.3, 0.75, size=(n_layers, n_heads))
    ratio[0, 2] = 0.95
    for unit in _units("s", N_SENTENCES):
        words = int(rng.integers(6, 16))
        pieces = words + int(rng.integers(2, 6))
        uniform = pieces * float(np.log(pieces))
        labels, n, values = [], [], []
        for k, label in enumerate(SURFACE_MASS):
            trials = words - 1 if label in ("prev", "next") else words
            noise = rng.normal(0, 0.02, size=(n_layers, n_heads))
            (
                labels.append(label),
                n.append(trials),
                values.append(np.clip(mean[..., k] + noise, 0, 1) * trials),
            )
        if first_is_cls:
            values[SURFACE_MASS.index("first")] = values[SURFACE_MASS.index("cls")]
        noise = rng.normal(0, 0.01, size=(n_layers, n_heads))
        labels += ["entropy", "entropy_uniform"]
        n += [pieces, pieces]
        values += [uniform * np.clip(ratio + noise, 0, 1), np.full((n_layers, n_heads), uniform)]
        block = torch.from_numpy(np.stack(values)[..., None])  # [label, layer, head, 1]
        tally.add(
            [unit] * len(labels), labels, values=block, n=np.asarray(n, dtype=np.float64)[:, None]
        )
    return tally


def _units(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i:03d}" for i in range(count)]


EXAMPLE_DEP = {
    "words": ["The", "old", "lighthouse", "still", "guides", "the", "boats", "home", "."],
    "heads": [2, 2, 4, 4, -1, 6, 4, 4, 4],
    "deprels": ["det", "amod", "nsubj", "advmod", "root", "det", "obj", "advmod", "punct"],
}
EXAMPLE_COREF = {
    "words": ["Maria", "says", "that", "she", "keeps", "the", "light", "."],
    "gold": [[3, 0]],
}


def _attention(rng, n, targets):
    logits = rng.normal(0, 1, size=(n, n))
    for q, k in targets:
        logits[q, k] += 4.0
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).round(5).tolist()


def make_examples(results, seed: int = 0) -> list[dict]:
    """Example pictures for the in-sample best heads (attention drawn at random, gold arcs boosted)."""
    rng = np.random.default_rng(seed + 3)
    out = []
    ex = EXAMPLE_DEP
    for label in (ALL, "nsubj", "det"):
        row = results.best_head("dependency", label)
        gold = [
            [i, h]
            for i, (h, r) in enumerate(zip(ex["heads"], ex["deprels"]))
            if h >= 0 and r != "punct" and (label == ALL or r == label)
        ]
        pairs = gold if row["direction"] == "dep->head" else [[h, d] for d, h in gold]
        out.append(
            {
                "analysis": "dependency",
                "label": label,
                "layer": int(row["layer"]),
                "head": int(row["head"]),
                "direction": row["direction"],
                "words": ex["words"],
                "attention": _attention(rng, len(ex["words"]), pairs),
                "gold": gold,
            }
        )
    row = results.best_head("coreference", ALL)
    out.append(
        {
            "analysis": "coreference",
            "label": ALL,
            "layer": int(row["layer"]),
            "head": int(row["head"]),
            "direction": "",
            "words": EXAMPLE_COREF["words"],
            "attention": _attention(rng, len(EXAMPLE_COREF["words"]), EXAMPLE_COREF["gold"]),
            "gold": EXAMPLE_COREF["gold"],
        }
    )
    return out


PROVENANCE = {
    "run_id": "fixture-run-0001",
    "inputs": {
        "treebank": {
            "option": "--treebank",
            "path": "fixture.conllu",
            "bytes": 4321,
            "sha256": "5e" * 32,
        }
    },
    "options": {"batch_size": 8, "from_mode": "mean", "window": 128},
    "conventions": {"name": "headprobe", "offsets": [-5, 5]},
}


def make_results(
    seed: int = 0,
    n_layers: int = 2,
    n_heads: int = 3,
    examples: bool = True,
    causal: bool = False,
    bos: str | None = None,
    first_is_cls: bool = False,
):
    """A `headprobe.results.query.Results` derived by the project's own stats from planted tallies
    (summary with a run id, an input and its SHA-256, options and conventions: PROVENANCE)."""
    from headprobe.results.query import Results

    rng = np.random.default_rng(seed)
    tallies = {
        "dependency": dependency_tally(rng, n_layers, n_heads, causal),
        "coreference": coreference_tally(rng, n_layers, n_heads),
        "positional": positional_tally(rng, n_layers, n_heads),
        "surface": surface_tally(rng, n_layers, n_heads, first_is_cls),
    }
    summary = {
        "model": f"fixture/tiny-{n_layers}x{n_heads}",
        "n_layers": n_layers,
        "n_heads": n_heads,
        "analyses": list(tallies),
        "causal": causal,
        "skipped": {"sentences_too_long": 1, "sentences_no_pieces": 0, "coreference_sentences": 0},
        "notes": ["fabricated by tests/fixtures_results.py (planted probabilities, fixed seed)"],
        "seed": seed,
        **PROVENANCE,
    }
    if bos is not None:
        summary["bos"] = bos
    results = Results(tallies, summary)
    if examples:
        results.examples = make_examples(results, seed)
    return results


def make_results_dir(
    path,
    *,
    seed: int = 0,
    n_layers: int = 2,
    n_heads: int = 3,
    examples: bool = True,
    causal: bool = False,
    bos: str | None = None,
    first_is_cls: bool = False,
) -> Path:
    """Save `make_results(...)` under `path` with `Results.save` (the pipeline's file layout;
    without `examples`, examples.json holds none). Returns the path."""
    path = Path(path)
    make_results(seed, n_layers, n_heads, examples, causal, bos, first_is_cls).save(path)
    return path


if __name__ == "__main__":  # python tests/fixtures_results.py OUT_DIR
    import sys

    print(make_results_dir(sys.argv[1] if len(sys.argv) > 1 else "results/fixture"))
