"""Every scored head's word-level attention on a seeded handful of example sentences (the explorer's).

    planned = explorer_plan(results, picker)                           # [(sentence, words kept)]
    every = sentences_word_attention(model, tokenizer, planned_words(planned), results.layers)
    kept = keep(planned, every, results.layers, results.n_heads)       # the pass: scoring/
    save(kept, directory / store.HEAD_ATTENTION); kept = load(path)
    matrix(kept, layer=1, head=4, sentence=0)                          # [word, word] floats

This module chooses the sentences and keeps what the pass gives; the attention is drawn by a
second, tiny pass over just these sentences after the main pass, all of them in one forward
(`headprobe.scoring.sentence_attention.sentences_word_attention`, every layer captured at once):
the engine's hot loop is not touched, and the sentences are known only once the main pass has
drawn them (`examples.SentencePicker`, seeded). Kept for
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

from headprobe.inputs.corpora.base import ALL, Example
from headprobe.results.examples import _best_rows
from headprobe.scoring.registry import ARCS

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


def explorer_sentences(picker, labels: list[str], k: int = MAX_SENTENCES) -> list[Example]:
    """Up to `k` distinct sentences a seeded `SentencePicker` drew: the one for ALL first, then
    those of `labels` in order (the same seed gives the same sentences)."""
    if picker is None:
        return []
    chosen = picker.chosen([ALL, *labels])
    out, seen = [], set()
    for label in [ALL, *labels]:
        for example in chosen.get(label, []):
            key = (example.sent_id, tuple(example.words))
            if key not in seen and len(out) < k:
                seen.add(key)
                out.append(example)
    return out


def plan(
    sentences: list[Example], layers: list[int], n_heads: int, budget: int = BUDGET
) -> list[tuple[Example, int]]:
    """(sentence, words kept) for `sentences` within `budget` (`fit_budget`); [] when there is
    nothing to keep."""
    lengths = fit_budget([len(s.words) for s in sentences], len(layers) * n_heads, budget)
    if not lengths or not layers:
        return []
    return list(zip(sentences, lengths))


def explorer_plan(results, picker) -> list[tuple[Example, int]]:
    """`plan` for a finished run: the sentences `picker` drew for ALL and for the pictured
    relations (most trials first), every head of every scored layer."""
    labels = list(dict.fromkeys(_best_rows(results.for_measure().best_heads, ARCS, 8)["label"]))
    return plan(explorer_sentences(picker, labels), results.layers, results.n_heads)


def planned_words(planned: list[tuple[Example, int]]) -> list[list[str]]:
    """The words the pass reads: each planned sentence cut to the words kept."""
    return [list(example.words[:n]) for example, n in planned]


def keep(
    planned: list[tuple[Example, int]], every: list[dict], layers, n_heads: int
) -> dict | None:
    """{"layers", "n_heads", "sentences": [{words, heads, deprels, sent_id}], "attention": uint8
    [layer, head, cells]} from the pass's {layer: [head, word, word + 2]} per planned sentence
    (`sentences_word_attention` of `planned_words(planned)`), None when nothing is planned."""
    if not planned:
        return None
    blocks, meta = [], []
    for (example, n), per_layer in zip(planned, every, strict=True):
        stacked = np.stack([np.asarray(per_layer[layer])[:, :n, :n] for layer in layers])
        blocks.append(stacked.reshape(len(layers), n_heads, n * n))  # [layer, head, n * n]
        meta.append(_sentence_meta(example, n))
    attention = np.concatenate(blocks, axis=2)  # [layer, head, cells]
    quantised = np.clip(np.rint(attention * SCALE), 0, SCALE).astype(np.uint8)
    return {"layers": list(layers), "n_heads": n_heads, "sentences": meta, "attention": quantised}


def _sentence_meta(example: Example, n: int) -> dict:
    heads = list(example.heads[:n]) if example.heads is not None else None
    rels = list(example.deprels[:n]) if example.deprels is not None else None
    if heads is not None:  # an arc to a word cut off points nowhere
        heads = [int(h) if 0 <= h < n else -1 for h in heads]
    return {
        "sent_id": example.sent_id,
        "words": list(example.words[:n]),
        "heads": heads,
        "deprels": rels,
    }


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
