"""The streaming engine: examples -> batches -> capture -> scorers.

For each batch, each asked-for layer's attention block is pooled to words once
(`LayerAttention`), handed to every scorer on the device where it was produced,
and dropped. Scorers keep only counts. A batch that runs out of memory is
retried in halves; nothing is dropped or counted twice (scorers commit a
batch's counts only in `end_batch`).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections import Counter
from functools import cached_property

import torch
from tqdm.auto import tqdm

from headprobe.align import WORD
from headprobe.batching import Batch, bucket, prepare
from headprobe.capture import AttentionCapture, n_layers_heads, text_config
from headprobe.conventions import get_conventions
from headprobe.tally import N_BOOT, SEED


TRIM_EVERY = 64        # batches between heap trims on CPU
CHUNK = 4096           # examples tokenized and bucketed together


def chunked(items, size: int):
    """Lists of up to `size` consecutive items of any iterable."""
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class LayerAttention:
    """One layer of one batch, at piece level and pooled to words (computed once, shared)."""

    def __init__(self, layer: int, pieces: torch.Tensor, batch: Batch):
        self.layer = layer
        self.pieces = pieces                                   # [batch, head, piece, piece]
        self.batch = batch

    @cached_property
    def words(self) -> torch.Tensor:
        """[batch, head, word, word + 2]: to = sum over pieces; from = mean/first/max; + CLS-, SEP-like."""
        batch = self.batch
        to = torch.matmul(self.pieces, batch.to_words[:, None])          # [batch, head, piece, word + 2]
        if batch.from_mode != "max":
            return torch.matmul(batch.from_words[:, None], to)           # [batch, head, word, word + 2]
        b, h, t, k = to.shape
        w = batch.max_words
        row = torch.where(batch.piece_kind == WORD, batch.piece_word, torch.full_like(batch.piece_word, w))
        index = row[:, None, :, None].expand(b, h, t, k)                 # [batch, head, piece, word + 2]
        out = to.new_full((b, h, w + 1, k), float("-inf"))
        out.scatter_reduce_(2, index, to, reduce="amax", include_self=True)
        return out[:, :, :w].clamp_min(0)                                # [batch, head, word, word + 2]


def is_causal(model) -> bool:
    return any(getattr(module, "is_causal", False) is True for module in model.modules())


def max_length(model, tokenizer) -> int:
    config = text_config(model)
    positions = getattr(config, "max_position_embeddings", None)
    offset = getattr(getattr(model, "embeddings", None), "padding_idx", None)
    if isinstance(positions, int) and isinstance(offset, int):
        positions -= offset + 1          # RoBERTa-style position ids start after the padding index
    limits = [positions, getattr(config, "n_positions", None), getattr(tokenizer, "model_max_length", None)]
    limits = [int(x) for x in limits if isinstance(x, int) and 0 < x < 10**7]
    return min(limits) if limits else 512


def heap_trimmer():
    """A function that hands freed heap memory back to the OS (Linux / glibc), or None.

    Attention blocks of many shapes are allocated and freed per layer; the small, long-lived
    count arrays in between pin the freed space, so without an occasional trim the process
    grows with the corpus. Set HEADPROBE_KEEP_MALLOC=1 to leave the allocator alone.
    """
    if os.environ.get("HEADPROBE_KEEP_MALLOC") or not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    return lambda: trim(0)


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


class Engine:
    """Run `scorers` over `examples` with `model`.

    After `run`: `stats_` holds examples/words scored, skipped counts and seconds;
    `batch_size_` is the batch size in use at the end (smaller after an OOM backoff).

    conventions: a `headprobe.conventions` preset (name or object); it gives the from-pooling
    when `from_mode` is None, and scorers that read conventions (`use_conventions`) get it
    before they are bound. None: SPEC's pooling, and scorers keep their own conventions.
    """

    def __init__(self, model, tokenizer, scorers, *, layers=None, batch_size: int = 64,
                 from_mode: str | None = None, device=None, progress: bool = True, desc: str = "scoring",
                 seed: int = SEED, n_boot: int = N_BOOT, keep_units: bool = False, conventions=None):
        self.model = model
        self.tokenizer = tokenizer
        self.scorers = list(scorers)
        self.layers = layers
        self.batch_size = batch_size
        self.conventions = get_conventions(conventions)
        self.from_mode = from_mode or self.conventions.from_mode
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.progress = progress
        self.desc = desc
        self.n_layers, self.n_heads = n_layers_heads(model)
        self.causal = is_causal(model)
        for scorer in self.scorers:
            if conventions is not None and hasattr(scorer, "use_conventions"):
                scorer.use_conventions(self.conventions)
            scorer.bind(self.n_layers, self.n_heads, layers, seed=seed, n_boot=n_boot, keep_units=keep_units,
                        device=self.device)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (tokenizer.eos_token_id or 0)

    def run(self, examples) -> dict:
        """Score `examples` (any iterable), `CHUNK` examples at a time: each chunk is tokenized,
        bucketed by exact length and scored, then let go, so memory does not grow with the
        corpus. Counts do not depend on the chunking (no padding: a sentence's attention is the
        same in any batch)."""
        start = time.perf_counter()
        trim = heap_trimmer() if self.device.type == "cpu" else None
        limit = max_length(self.model, self.tokenizer)
        self.batch_size_ = self.batch_size
        total = sum(len(ex.words) for ex in examples) if hasattr(examples, "__len__") else None
        bar = tqdm(total=total, unit="word", desc=self.desc, disable=not self.progress)
        self.stats_ = {"examples": 0, "words": 0, "skipped": Counter(), "skipped_sources": [], "seconds": 0.0,
                       "batch_size": self.batch_size}
        done = 0
        for chunk in chunked(examples, CHUNK):
            prepared = prepare(chunk, self.tokenizer, limit)
            self.stats_["skipped"].update(prepared.skipped)
            self.stats_["skipped_sources"] += prepared.skipped_sources
            self.stats_["examples"] += len(prepared.examples)
            self.stats_["words"] += sum(a.n_words for a in prepared.alignments)
            bar.update(sum(len(ex.words) for ex in chunk) - sum(a.n_words for a in prepared.alignments))
            queue = bucket(prepared, self.batch_size)
            while queue:
                indices = queue.pop(0)
                batch = Batch([prepared.examples[i] for i in indices], [prepared.alignments[i] for i in indices],
                              self.pad_id, device=self.device, from_mode=self.from_mode, causal=self.causal)
                words = batch.n_real_words
                try:
                    self._score(batch)
                except (torch.OutOfMemoryError, RuntimeError) as exc:
                    if not is_out_of_memory(exc) or len(indices) == 1:
                        raise
                    del batch
                    if self.device.type == "cuda":
                        torch.cuda.empty_cache()
                    half = len(indices) // 2
                    self.batch_size_ = max(1, half)
                    queue[:0] = [indices[:half], indices[half:]]
                    continue
                for i in indices:                  # scored: this run needs its pieces no more
                    prepared.alignments[i] = None
                bar.update(words)
                done += 1
                if trim is not None and done % TRIM_EVERY == 0:
                    trim()
            del prepared
        bar.close()
        for scorer in self.scorers:
            scorer.finish()
        self.stats_.update(skipped=dict(self.stats_["skipped"]), seconds=time.perf_counter() - start,
                           batch_size=self.batch_size_)
        return self.stats_

    @torch.inference_mode()
    def _score(self, batch: Batch) -> None:
        for scorer in self.scorers:
            scorer.begin_batch(batch)

        def hand_on(layer: int, probs: torch.Tensor) -> None:
            att = LayerAttention(layer, probs, batch)
            for scorer in self.scorers:
                scorer.update(layer, att, batch)

        with AttentionCapture(self.model, self.layers, hand_on):
            self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        for scorer in self.scorers:
            scorer.end_batch(batch)
