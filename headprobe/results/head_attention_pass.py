"""The explorer's second, tiny pass: every head's attention on a few sentences the run drew.

    sentences = explorer_sentences(picker, ["nsubj", "det"])     # after the scoring pass
    kept = collect(model, tokenizer, sentences, layers=[0, 1], n_heads=12)
    kept = collect_for_run(model, tokenizer, results, picker, "mean", None)

One forward pass for all of them (padded), every layer captured at once, after the main pass: the engine's hot
loop is not touched, and the sentences are known only once the main pass has drawn them
(`examples.SentencePicker`, seeded). What is kept, and its file: `headprobe.results.head_attention`.
"""

from __future__ import annotations

import numpy as np

from headprobe.inputs.corpora.base import ALL, Example
from headprobe.results.examples import _best_rows, sentences_word_attention
from headprobe.results.head_attention import BUDGET, MAX_SENTENCES, SCALE, fit_budget
from headprobe.scoring.registry import ARCS


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


def collect(
    model,
    tokenizer,
    sentences: list[Example],
    layers: list[int],
    n_heads: int,
    from_mode: str = "mean",
    stack: str | None = None,
    budget: int = BUDGET,
) -> dict | None:
    """{"layers", "n_heads", "sentences": [{words, heads, deprels, sent_id}], "attention": uint8
    [layer, head, cells]} for `sentences` within `budget`, or None when there is nothing to keep."""
    lengths = fit_budget([len(s.words) for s in sentences], len(layers) * n_heads, budget)
    if not lengths or not layers:
        return None
    blocks, meta = [], []
    cut = [list(example.words[:n]) for example, n in zip(sentences, lengths)]
    every = sentences_word_attention(model, tokenizer, cut, layers, from_mode, stack)
    for example, n, per_layer in zip(sentences, lengths, every):
        stacked = np.stack([per_layer[layer][:, :n, :n].numpy() for layer in layers])
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


def collect_for_run(model, tokenizer, results, picker, from_mode: str, stack: str | None):
    """`collect` for a finished run: the sentences `picker` drew for ALL and for the pictured
    relations (most trials first), every head of every scored layer."""
    labels = list(dict.fromkeys(_best_rows(results.for_measure().best_heads, ARCS, 8)["label"]))
    sentences = explorer_sentences(picker, labels)
    return collect(model, tokenizer, sentences, results.layers, results.n_heads, from_mode, stack)
