"""Every scored head's word-level attention on a seeded handful of example sentences (the explorer's).

    kept = head_attention_pass.collect(model, tokenizer, sentences, layers=[0, 1], n_heads=12)
    save(kept, directory / store.HEAD_ATTENTION); kept = load(path)
    matrix(kept, layer=1, head=4, sentence=0)                          # [word, word] floats

Collected (`headprobe.results.head_attention_pass`) by a second, tiny pass over just these sentences after the main pass (one forward per
sentence, every layer captured at once): the engine's hot loop is not touched, and the sentences
are known only once the main pass has drawn them (`examples.SentencePicker`, seeded). Kept for
every head of every scored layer, quantised to uint8 (value / 255; a row sums to at most 1, the
rest going to the CLS- and SEP-like positions, which are not kept), within `BUDGET` bytes:
sentences are dropped from the end, and a single sentence cut to its first words, until
heads x sum(words^2) fits. File layout (one .npz): `attention` uint8 [layer, head, cells] (the
sentences' [word, word] matrices flattened one after another), `layers` int [layer] (their
0-based indices), and `meta` (UTF-8 JSON: the sentences' words, heads, relations and ids).
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np

BUDGET = 2_000_000  # bytes of uint8 attention: 32 x 32 heads x 4 sentences of ~22 words
MAX_SENTENCES = 4
SCALE = 255


def fit_budget(lengths: list[int], heads: int, budget: int = BUDGET) -> list[int]:
    """Word counts kept per sentence so that heads x sum(n^2) <= budget: whole sentences from
    the first on; when not even the first fits, its first floor(sqrt(budget / heads)) words."""
    kept, used = [], 0
    for n in lengths:
        if heads * (used + n * n) > budget:
            break
        kept.append(n)
        used += n * n
    if not kept and lengths:
        kept = [min(lengths[0], int(math.isqrt(max(budget // max(heads, 1), 0))))]
    return [n for n in kept if n > 0]


def save(kept: dict, path: Path) -> None:
    meta = json.dumps({"n_heads": kept["n_heads"], "sentences": kept["sentences"]})
    buffer = io.BytesIO()
    np.savez_compressed(
        buffer,
        attention=kept["attention"],
        layers=np.asarray(kept["layers"], dtype=np.int32),
        meta=np.frombuffer(meta.encode("utf-8"), dtype=np.uint8),
    )
    Path(path).write_bytes(buffer.getvalue())


def load(path: Path) -> dict | None:
    """What `save` wrote, or None when `path` is absent."""
    path = Path(path)
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(data["meta"].tobytes().decode("utf-8"))
        return {
            "layers": [int(x) for x in data["layers"]],
            "n_heads": int(meta["n_heads"]),
            "sentences": meta["sentences"],
            "attention": np.asarray(data["attention"], dtype=np.uint8),
        }


def matrix(kept: dict, layer: int, head: int, sentence: int) -> np.ndarray:
    """[word, word] attention (floats, value / 255) of (layer, head) on sentence `sentence`."""
    sizes = [len(s["words"]) ** 2 for s in kept["sentences"]]
    start = sum(sizes[:sentence])
    n = len(kept["sentences"][sentence]["words"])
    row = kept["attention"][kept["layers"].index(layer), head, start : start + n * n]
    return row.reshape(n, n).astype(np.float32) / SCALE  # [word, word]
