"""Fabricate a small, schema-correct results directory (for report tests).

    from tests.fixtures_results import make_results_dir
    make_results_dir(tmp_path / "results")          # 2 layers x 3 heads, seed 0

Per-unit counts are fabricated here (schema of docs/ARCHITECTURE.md); the
tidy counts, folds and best heads (in-sample and held-out, bootstrap intervals)
are then made by the project's own `headprobe.results.Results`, and saved in
the pipeline's file layout, with `summary.json` and `examples.json`. Heads are
planted so that every role rule fires:

| head | planted behaviour |
|---|---|
| 0-0 | positional, argmax at +1 for ~95% of words |
| 0-1 | coreference, 0.75 accuracy (head_match baseline ~0.45) |
| 0-2 | broad: entropy ~0.95 of uniform |
| 1-0 | syntactic: det dep->head 0.9 (baseline offset=+1 ~0.55) |
| 1-1 | sink: ~0.75 of its mass on CLS + SEP |
| 1-2 | syntactic: nsubj dep->head 0.8 (baseline offset=+1 ~0.35) |
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

DEP_LABELS = ("nsubj", "det", "obj")
COREF_KINDS = ("pronoun", "proper", "nominal")
DIRECTIONS = ("dep->head", "head<-dep")
POS_LABELS = ("-2", "-1", "0", "+1", "+2", "special", "other")
OFFSETS = [k for k in range(-5, 6) if k != 0]

COLUMNS = ["analysis", "label", "unit", "layer", "head", "direction", "variant", "n", "hits",
           "mass"]


def _dep_p(label, layer, head, direction, rng_table):
    if (layer, head, direction, label) == (1, 0, "dep->head", "det"):
        return 0.9
    if (layer, head, direction, label) == (1, 2, "dep->head", "nsubj"):
        return 0.8
    return rng_table[(label, layer, head, direction)]


def _baseline_p(label, k):
    peak = {"nsubj": (1, 0.35), "det": (1, 0.55), "obj": (-1, 0.35)}[label]
    return peak[1] if k == peak[0] else 0.3 * peak[1] / abs(k)


def make_unit_counts(seed: int = 0, n_layers: int = 2, n_heads: int = 3,
                     n_sentences: int = 60, n_docs: int = 12) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    heads = [(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    sentences = [f"s{i:03d}" for i in range(n_sentences)]
    docs = [f"d{i:02d}" for i in range(n_docs)]

    # dependency
    table = {(lab, layer, head, d): float(rng.uniform(0.05, 0.3))
             for lab in DEP_LABELS for layer, head in heads for d in DIRECTIONS}
    for unit in sentences:
        arcs = {lab: int(rng.integers(1, 6)) for lab in DEP_LABELS}
        for layer, head in heads:
            for d in DIRECTIONS:
                all_hits = 0
                for lab in DEP_LABELS:
                    h = int(rng.binomial(arcs[lab], _dep_p(lab, layer, head, d, table)))
                    all_hits += h
                    rows.append(("dependency", lab, unit, layer, head, d, "", arcs[lab], h,
                                 np.nan))
                rows.append(("dependency", "ALL", unit, layer, head, d, "",
                             sum(arcs.values()), all_hits, np.nan))
        for k in OFFSETS:
            all_hits = 0
            for lab in DEP_LABELS:
                h = int(rng.binomial(arcs[lab], _baseline_p(lab, k)))
                all_hits += h
                rows.append(("dependency", lab, unit, -1, -1, "", f"offset={k:+d}", arcs[lab],
                             h, np.nan))
            rows.append(("dependency", "ALL", unit, -1, -1, "", f"offset={k:+d}",
                         sum(arcs.values()), all_hits, np.nan))

    # coreference
    ctable = {(kind, layer, head): float(rng.uniform(0.15, 0.4))
              for kind in COREF_KINDS for layer, head in heads}
    base_p = {"nearest": 0.3, "head_match": 0.45, "rules": 0.6}
    for unit in docs:
        ments = {kind: int(rng.integers(3, 11)) for kind in COREF_KINDS}
        for layer, head in heads:
            all_hits = 0
            for kind in COREF_KINDS:
                p = 0.75 if (layer, head) == (0, 1) else ctable[(kind, layer, head)]
                h = int(rng.binomial(ments[kind], p))
                all_hits += h
                rows.append(("coreference", kind, unit, layer, head, "", "", ments[kind], h,
                             np.nan))
            rows.append(("coreference", "ALL", unit, layer, head, "", "",
                         sum(ments.values()), all_hits, np.nan))
        for variant, p in base_p.items():
            all_hits = 0
            for kind in COREF_KINDS:
                h = int(rng.binomial(ments[kind], p))
                all_hits += h
                rows.append(("coreference", kind, unit, -1, -1, "", variant, ments[kind], h,
                             np.nan))
            rows.append(("coreference", "ALL", unit, -1, -1, "", variant, sum(ments.values()),
                         all_hits, np.nan))

    # positional and surface
    planted_pos = {(0, 0): [0.01, 0.01, 0.01, 0.95, 0.01, 0.005, 0.005]}
    pos_p = {h: np.asarray(planted_pos.get(h, rng.dirichlet(np.ones(len(POS_LABELS)))))
             for h in heads}
    surf_mean = {}
    for h in heads:
        m = dict(zip(("self", "prev", "next", "cls", "sep", "punct"),
                     rng.dirichlet(np.ones(7))[:6] * 0.9))
        if h == (1, 1):
            m.update(cls=0.35, sep=0.4, self=0.05, prev=0.05, next=0.05, punct=0.05)
        surf_mean[h] = m
    ratio = {h: (0.95 if h == (0, 2) else float(rng.uniform(0.3, 0.75))) for h in heads}
    for unit in sentences:
        n_words = int(rng.integers(6, 16))
        n_pieces = n_words + int(rng.integers(2, 6))          # specials and extra pieces
        uniform = n_pieces * float(np.log(n_pieces))
        for layer, head in heads:
            p = pos_p[(layer, head)] / pos_p[(layer, head)].sum()
            hits = rng.multinomial(n_words, p)
            for lab, h in zip(POS_LABELS, hits):
                rows.append(("positional", lab, unit, layer, head, "", "", n_words, int(h),
                             np.nan))
            for lab, mean in surf_mean[(layer, head)].items():
                mass = float(np.clip(mean + rng.normal(0, 0.02), 0, 1)) * n_words
                rows.append(("surface", lab, unit, layer, head, "", "", n_words, np.nan, mass))
            ent = uniform * float(np.clip(ratio[(layer, head)] + rng.normal(0, 0.01), 0, 1))
            rows.append(("surface", "entropy", unit, layer, head, "", "", n_pieces, np.nan, ent))
            rows.append(("surface", "entropy_uniform", unit, layer, head, "", "", n_pieces,
                         np.nan, uniform))

    df = pd.DataFrame(rows, columns=COLUMNS)
    df["n"] = df["n"].astype("int64")
    df["hits"] = df["hits"].astype(float)
    return df


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


def make_examples(best_heads: pd.DataFrame, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed + 3)
    ins = best_heads[best_heads["selection"] == "in-sample"]
    out = []
    ex = EXAMPLE_DEP
    for label in ("ALL", "nsubj", "det"):
        row = ins[(ins["analysis"] == "dependency") & (ins["label"] == label)].iloc[0]
        gold = [[i, h] for i, (h, r) in enumerate(zip(ex["heads"], ex["deprels"]))
                if h >= 0 and r != "punct" and (label == "ALL" or r == label)]
        pairs = gold if row["direction"] == "dep->head" else [[h, d] for d, h in gold]
        out.append({"analysis": "dependency", "label": label, "layer": int(row["layer"]),
                    "head": int(row["head"]), "direction": row["direction"],
                    "words": ex["words"], "attention": _attention(rng, len(ex["words"]), pairs),
                    "gold": gold})
    row = ins[(ins["analysis"] == "coreference") & (ins["label"] == "ALL")].iloc[0]
    out.append({"analysis": "coreference", "label": "ALL", "layer": int(row["layer"]),
                "head": int(row["head"]), "direction": "", "words": EXAMPLE_COREF["words"],
                "attention": _attention(rng, len(EXAMPLE_COREF["words"]), EXAMPLE_COREF["gold"]),
                "gold": EXAMPLE_COREF["gold"]})
    return out


def make_results(seed: int = 0, n_layers: int = 2, n_heads: int = 3, examples: bool = True):
    """A `headprobe.results.Results` built by the project's own stats from fabricated unit
    counts (tidy counts, folds, best heads with bootstrap intervals)."""
    from headprobe.results import Results

    uc = make_unit_counts(seed, n_layers, n_heads)
    summary = {
        "model": f"fixture/tiny-{n_layers}x{n_heads}", "n_layers": n_layers, "n_heads": n_heads,
        "analyses": ["coreference", "dependency", "positional", "surface"],
        "skipped": {"sentences_too_long": 1, "sentences_no_pieces": 0,
                    "coreference_sentences_too_long": 0},
        "notes": ["fabricated by tests/fixtures_results.py (random numbers, fixed seed)"],
    }
    results = Results.from_unit_counts(uc, summary, seed=seed)
    if examples:
        results.examples = make_examples(results.best_heads, seed)
    return results


def make_results_dir(path, *, seed: int = 0, n_layers: int = 2, n_heads: int = 3,
                     examples: bool = True) -> Path:
    """Save `make_results(...)` under `path` (the pipeline's file layout); without
    `examples`, examples.json is removed. Returns the path."""
    path = Path(path)
    make_results(seed, n_layers, n_heads, examples).save(path)
    if not examples:
        (path / "examples.json").unlink(missing_ok=True)
    return path


if __name__ == "__main__":      # python tests/fixtures_results.py OUT_DIR
    import sys
    print(make_results_dir(sys.argv[1] if len(sys.argv) > 1 else "results/fixture"))
