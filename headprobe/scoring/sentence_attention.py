"""Word-level attention of a model's heads on a few given sentences: the pass the example pictures
and the head explorer read (`headprobe.results.examples`, `headprobe.results.head_attention`).

    every = sentences_word_attention(model, tokenizer, [["The", "cat", "sat"]], layers=[0, 1])
    matrix = word_attention(model, tokenizer, words, layer=2)[8]      # [word, word + 2] of head 8
    matrices = head_matrices(model, tokenizer, [(words, 2, 8)])      # one per (words, layer, head)

A forward pass of the model over the sentences (padded to the longest), after the scoring pass:
the engine's hot loop is not touched. The attention is captured (`model.capture`) and pooled to
words as the scorers see it (`LayerAttention.words`: the last two columns are the CLS-like and
SEP-like specials). `results/` only reads what this produces: it chooses the sentences and the
heads, and keeps the matrices.
"""

from __future__ import annotations

import numpy as np
import torch

from headprobe.inputs.align import align_words
from headprobe.inputs.batching import Batch
from headprobe.inputs.corpora.base import Example
from headprobe.model.capture import AttentionCapture
from headprobe.model.discovery import attention_sites
from headprobe.model.padding import padding_id
from headprobe.scoring.layer_attention import LayerAttention


@torch.inference_mode()
def word_attention(
    model,
    tokenizer,
    words: list[str],
    layer: int,
    from_mode: str = "mean",
    stack: str | None = None,
) -> torch.Tensor:
    """[head, word, word + 2] word-level attention of one layer of `stack` (last columns: CLS-, SEP-like)."""
    return layers_word_attention(model, tokenizer, words, [layer], from_mode, stack)[layer]


@torch.inference_mode()
def layers_word_attention(
    model,
    tokenizer,
    words: list[str],
    layers: list[int],
    from_mode: str = "mean",
    stack: str | None = None,
) -> dict[int, torch.Tensor]:
    """{layer: [head, word, word + 2]} word-level attention of `layers` of `stack`, one forward
    pass (last columns: CLS-, SEP-like)."""
    return sentences_word_attention(model, tokenizer, [words], layers, from_mode, stack)[0]


@torch.inference_mode()
def sentences_word_attention(
    model,
    tokenizer,
    sentences: list[list[str]],
    layers: list[int],
    from_mode: str = "mean",
    stack: str | None = None,
) -> list[dict[int, torch.Tensor]]:
    """Per sentence, {layer: [head, word, word + 2]} word-level attention of `layers` of `stack`:
    every sentence in one forward pass, padded to the longest (padding is masked: no real piece
    attends to it, and its rows and columns are pooled into no word)."""
    if not sentences:
        return []
    sites = attention_sites(model)
    stack = sites.resolve(stack)
    alignments = [
        sites.scoring_alignment(a, stack)
        for a in align_words(tokenizer, [list(words) for words in sentences])
    ]
    device = next(model.parameters()).device
    pad = padding_id(tokenizer)
    batch = Batch(
        [Example(list(words), unit="sentence", source="<input>") for words in sentences],
        alignments,
        pad,
        device=device,
        from_mode=from_mode,
    )
    offset = sites.query_offset(stack)
    kept = {}

    def keep(layer_index, probs):  # probs: [batch, head, query, key]
        # [batch, head, word, word + 2]
        kept[layer_index] = LayerAttention(layer_index, probs[:, :, offset:], batch).words[0]

    with AttentionCapture(model, list(layers), keep, stack=stack, stop=True):
        model(**sites.model_inputs(batch, stack))
    # on the host once, then cut per sentence with NumPy: [batch, head, word, word + 2] a layer
    every = {layer: words.float().cpu().numpy() for layer, words in kept.items()}
    out = []
    for i, alignment in enumerate(alignments):
        n = alignment.n_words  # its words, then the CLS-like and SEP-like columns
        out.append(
            {
                layer: torch.from_numpy(
                    np.concatenate([words[i, :, :n, :n], words[i, :, :n, -2:]], axis=-1)
                )
                for layer, words in every.items()
            }
        )
    return out


@torch.inference_mode()
def head_matrices(
    model, tokenizer, requests, from_mode: str = "mean", stack: str | None = None
) -> list[np.ndarray]:
    """[word, word + 2] float32 of each request (words, layer, head): one forward pass per
    request, as a picture has always been drawn (`word_attention`)."""
    return [
        word_attention(model, tokenizer, list(words), int(layer), from_mode, stack)[int(head)]
        .float()
        .numpy()
        for words, layer, head in requests
    ]
