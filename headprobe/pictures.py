"""Word-level attention of one head on one sentence (for reports and notebooks)."""

from __future__ import annotations

import pandas as pd
import torch

from headprobe.batching import Batch
from headprobe.align import align_words
from headprobe.capture import AttentionCapture
from headprobe.corpora.base import Example
from headprobe.engine import LayerAttention
from headprobe.sites import attention_sites


@torch.inference_mode()
def word_attention(model, tokenizer, words: list[str], layer: int, from_mode: str = "mean",
                   stack: str | None = None) -> torch.Tensor:
    """[head, word, word + 2] word-level attention of one layer of `stack` (last columns: CLS-, SEP-like)."""
    sites = attention_sites(model)
    stack = sites.resolve(stack)
    alignment = sites.scoring_alignment(align_words(tokenizer, [list(words)])[0], stack)
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batch = Batch([Example(list(words), unit="sentence", source="<input>")], [alignment], pad, device=device, from_mode=from_mode)
    offset = sites.query_offset(stack)
    kept = {}

    def keep(layer_index, probs):
        kept["words"] = LayerAttention(layer_index, probs[:, :, offset:], batch).words[0].float().cpu()

    with AttentionCapture(model, [layer], keep, stack=stack):
        model(**sites.model_inputs(batch, stack))
    return kept["words"]


def attention_for_sentence(model, tokenizer, words_or_text, layer: int, head: int,
                           from_mode: str = "mean", stack: str | None = None) -> pd.DataFrame:
    """Word x word attention of (layer, head): rows attend (from), columns are attended (to)."""
    words = words_or_text.split() if isinstance(words_or_text, str) else list(words_or_text)
    matrix = word_attention(model, tokenizer, words, layer, from_mode, stack)[head]
    columns = [*words, "[CLS/BOS]", "[SEP/EOS]"]
    return pd.DataFrame(matrix.numpy(), index=words, columns=columns)


def example_pictures(model, tokenizer, best_heads: pd.DataFrame, examples, from_mode="mean",
                     max_words: int = 25, per_label: int = 1, max_labels: int = 8, stack: str | None = None) -> list[dict]:
    """For the in-sample best dependency heads, attention on a short sentence with that relation."""
    rows = best_heads[(best_heads["analysis"] == "dependency") & (best_heads["selection"] == "in-sample")
                      & (best_heads["layer"] >= 0)]          # small-sample labels name no head
    rows = rows.sort_values("n", ascending=False).head(max_labels)
    pictures = []
    for row in rows.itertuples():
        found = 0
        for example in examples:
            if example.heads is None or len(example.words) > max_words:
                continue
            gold = [[i, h] for i, (h, rel) in enumerate(zip(example.heads, example.deprels))
                    if h >= 0 and (rel == row.label or (row.label == "ALL" and rel not in ("root", "punct")))]
            if not gold:
                continue
            matrix = word_attention(model, tokenizer, example.words, int(row.layer), from_mode, stack)[int(row.head)]
            pictures.append(dict(analysis="dependency", label=row.label, layer=int(row.layer), head=int(row.head),
                                 direction=row.direction, unit=example.unit, sentence=example.sent_id,
                                 words=list(example.words),
                                 attention=matrix[:, :len(example.words)].tolist(), gold=gold))
            found += 1
            if found >= per_label:
                break
    return pictures
