"""The streaming engine (the pass): examples -> batches -> capture -> scorers.

For each batch, each asked-for layer's attention block is pooled to words once
(`scoring.layer_attention.LayerAttention`, pooled by `scoring.pooling`), handed to every
scorer on the device where it was produced, and dropped; layers are captured and scored in
groups (`scoring.layer_stack.LayerStack`). Scorers keep only counts. A batch that runs out
of memory is retried in halves; nothing is dropped or counted twice (scorers commit a batch's
counts only in `end_batch`).

Models over several devices (accelerate `device_map`): a layer's attention is pooled to
words on the device where the layer runs (the batch's word maps are copied there once per
batch and device); the word-level block, smaller than the piece-level one, is then handed
to the scorers on the batch's device (`sites.model_device`), where their counts live.

Scorers that run the model themselves (head ablation and importance,
`scoring.model_scorer`: they have `model_pass`) get each batch first, outside inference
mode; the attention pass follows (skipped when no scorer needs attention).

Query blocks (`PassSettings.query_block = N`, `--query-block`): capture hands a layer N query
pieces at a time (`capture.QueryBlock`); `pooling.WordRows` pools them into the word rows that
are complete (all of a word's pieces seen, in every example of the batch) and each block goes to the
scorers as a `LayerAttention` with `query_pieces`, `query_words`, `first`, `last` (the
block API, `scoring.scorer_base.CountScorer.blocks`). Only when every scorer supports blocks;
otherwise the run is unblocked and `stats_["notes"]` says why. Unblocked (the default) is
one block of every row, computed exactly as before.

Measures (METHODS §7, `headprobe.scoring.measures`): each scorer scores every measure of the run
at once (`scorer.measures`) and says how it reads one (`scorer.reads`). The capture is asked for
what the measures need (`value_norms` for `norms`), once per batch; per layer (or block) every
distinct matrix (the weights, N, N by rows) is stacked on a leading axis and pooled to words in
one call, and each scorer gets the `LayerAttention` of its (measures, reading), shared by the
scorers that read the same; it counts every measure in one call per layer.

A scorer's per-batch state is a value (`scoring.scorer_base.BatchState`): `prepare(batch)` (or, for a
scorer that runs the model, `model_pass`) returns it, `update(attention, state)` adds to
it, `end_batch(state)` commits it to the tallies.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from tqdm.auto import tqdm

from headprobe.core.atomic import test_pause
from headprobe.inputs.align import align_in_worker, example_inputs
from headprobe.inputs.batching import Batch, Pool, prepare
from headprobe.inputs.conventions import get_conventions
from headprobe.inputs.read_ahead import Workers, default_workers, prefetched
from headprobe.model.capture import AttentionCapture, QueryBlock
from headprobe.model.discovery import attention_sites
from headprobe.model.head_quantities import check_capturable
from headprobe.model.padding import padding_id
from headprobe.model.sites import model_device, text_config
from headprobe.scoring.batch_size import TYPICAL_PIECES, auto_batch_size
from headprobe.scoring.distributed import World, owns
from headprobe.scoring.heap_trim import HeapTrimmer
from headprobe.scoring.layer_attention import measured_attention, view_of, without_rows
from headprobe.scoring.layer_stack import LayerStack, with_layer_axis
from headprobe.scoring.measures import WEIGHTS, needs_of
from headprobe.scoring.pooling import WordRows
from headprobe.scoring.scorer_base import ReadsConventions, RunsModel

if TYPE_CHECKING:
    from headprobe.scoring.pass_settings import PassSettings

# examples read and tokenized together (one batched tokenizer call); they then wait in the pool.
# About 9 kB each held (an EWT sentence and its pieces): 1,024 a chunk held ~27 MB more read ahead
CHUNK = 256
# chunks read and tokenized ahead by the reading thread (`read_ahead.prefetched`), besides the one
# it works on and the one the engine takes from: at most (PREFETCH + 2) x CHUNK examples ahead of
# the pool; with worker processes (`--workers N`), PREFETCH + N chunks (each worker busy)
PREFETCH = 2
# a batch is full at the batch size or at batch size x FULL_AT pieces, whichever comes first
# (`full_at`). On the CPU 64 x 16 = 1,024 pieces: a full batch's blocks, which glibc's heap
# keeps (benchmarks/README.md, "What grew with the corpus"), are no larger on a long corpus,
# whose pool fills batches of long inputs, than on a short one (EWT dev x8 over x1 peak RSS: 1.09
# against 1.38 at 64 x 64). On a GPU, the batch size is reckoned from memory for examples of
# `TYPICAL_PIECES` (`batch_size`), and a batch holds up to that many
FULL_AT = {"cpu": 16, "cuda": TYPICAL_PIECES}
# the pool holds at most POOL_BATCHES x batch size x POOL_AT pieces (65,536 at batch size 64),
# then lets its fullest lengths go: examples held do not grow with the corpus
# (benchmarks/batch_fill.py)
POOL_BATCHES = 16
POOL_AT = TYPICAL_PIECES
# a batch's layers are captured into one buffer and scored together while their probabilities
# (times the matrices the measures stack) fit this many bytes; longer inputs go in smaller groups
# of layers, down to one layer at a time (and query blocks, `--query-block`, below that)
# (on the CPU the measures' temporaries are about five times the buffer, and each size of them
# is cut from glibc's heap: 4 MiB against 64 MiB took ~40 MB off EWT dev x8's peak, no slower)
STACK_BYTES = {"cpu": 4 * 2**20, "cuda": 2 * 2**30}


def full_at(device) -> int:
    """Pieces per example of a full batch on `device` (`FULL_AT`; another device as the CPU)."""
    return FULL_AT.get(torch.device(device).type, FULL_AT["cpu"])


def batch_pool(batch_size: int, device) -> Pool:
    """The pass's pool (`Engine.run`): batches of `batch_size` examples, or fewer within
    `full_at(device)` pieces an example, the pool bounded at POOL_BATCHES x batch size x POOL_AT
    pieces."""
    return Pool(batch_size, batch_size * full_at(device), POOL_BATCHES * batch_size * POOL_AT)


def pool_chunk(pool: Pool, held: dict, first: int, prepared) -> list[list[int]]:
    """Hold each example `prepared` (`batching.prepare` of a chunk whose first example is ordinal
    `first`) kept, `held[ordinal] = (example, alignment)`, and add it to `pool`; returns the
    batches (lists of ordinals) that came due, in order. The pass deals them (`Engine._read`);
    `benchmarks/host_ceiling.py` times it without a model."""
    due = []
    for index, example, alignment in zip(prepared.kept, prepared.examples, prepared.alignments):
        held[first + index] = (example, alignment)
        due += pool.add(first + index, len(alignment))
    return due


def group_size(n_layers: int, per_layer: int, stack_bytes: int) -> int:
    """Layers scored together: as few groups as `stack_bytes` allows, of even size (six layers
    that fit five at a time go as 3 + 3, not 5 + 1: the same calls, a smaller largest group)."""
    fit = max(1, stack_bytes // max(per_layer, 1))
    groups = max(1, -(-n_layers // fit))
    return max(1, -(-n_layers // groups))


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


def max_length(model, tokenizer) -> int:
    config = text_config(model)
    positions = getattr(config, "max_position_embeddings", None)
    offset = getattr(
        getattr(getattr(model, "base_model", model), "embeddings", None), "padding_idx", None
    )
    if isinstance(positions, int) and isinstance(offset, int):
        positions -= offset + 1  # RoBERTa-style position ids start after the padding index
    limits = [
        positions,
        getattr(config, "n_positions", None),
        getattr(tokenizer, "model_max_length", None),
    ]
    limits = [int(x) for x in limits if isinstance(x, int) and 0 < x < 10**7]
    return min(limits) if limits else 512


def forward_cores(device) -> int:
    """The cores the model's forward keeps working on `device`: on the CPU, torch's intra-op
    threads (every core by default: tokenizing workers beside them would slow the forward, as
    `benchmarks/whole_run.py knobs` measured); on an accelerator, the one process that feeds it."""
    return torch.get_num_threads() if torch.device(device).type == "cpu" else 1


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


@runtime_checkable
class ReadsTokenizer(Protocol):
    """A scorer that reads tokens as strings (a token pattern's `PatternExample.tokens`): the
    engine hands it the run's tokenizer when it binds it (beside `scorer_base`'s other hooks)."""

    def use_tokenizer(self, tokenizer) -> None: ...


@dataclass
class _Pass:
    """One `Engine.run` in progress: when it started, its checkpoint hook, heap trimmer, bar,
    batches done; the examples read so far (`read`, counted in corpus order), those read and
    not yet scored (`held`: ordinal -> (example, alignment)), the pool they wait in, the batches
    dealt so far (`dealt`) and those this rank is to score next (`queue`: lists of ordinals)."""

    start: float
    checkpoint: object
    trim: HeapTrimmer | None
    bar: object
    pool: Pool
    world: World
    batches: int = 0
    read: int = 0
    dealt: int = 0
    held: dict = field(default_factory=dict)
    queue: list = field(default_factory=list)


def total_words(examples) -> int | None:
    """Words of `examples` for the progress bar's total, where that is cheap: a list's, or the
    `total_words()` a lazy corpus offers; None (no total) otherwise. A lazy corpus is not read."""
    if isinstance(examples, (list, tuple)):
        return sum(len(ex.words) for ex in examples)
    count = getattr(examples, "total_words", None)
    return count() if callable(count) else None


class Engine:
    """Run `scorers` over `examples` with `model`.

        engine = Engine(model, tokenizer, scorers, PassSettings(progress=False, n_boot=10))
        stats = engine.run(examples)             # the scorers' tallies hold the counts

    After `run`: `stats_` holds examples/words scored, skipped counts and seconds;
    `batch_size_` is the batch size in use at the end (smaller after an OOM backoff).

    The settings are the pass's own value (`headprobe.scoring.pass_settings.PassSettings`), read
    whole: `layers`, `batch_size`, `from_mode`, `progress`, `seed`, `n_boot`, `keep_unit_counts`,
    `conventions`, `query_block`, `stack`. `headprobe.run` hands over the one its checked
    configuration builds (`RunConfig.pass_settings`); a caller of its own builds one: the engine
    sits below the options and imports nothing of them. `batch_size` overrides the settings'
    for one pass (coreference windows: a quarter); `desc` names the progress bar. The batches go
    where the model takes its inputs (`sites.model_device`).

    conventions: a `headprobe.inputs.conventions` preset (name or object); it gives the
    from-pooling when `from_mode` is None, and scorers that read conventions
    (`scorer_base.ReadsConventions`) get it before they are bound. None: the default pooling
    (METHODS §1), and scorers keep their own conventions.

    stack: the attention stack scored ("encoder", "decoder", "cross"; `headprobe.model.sites`; None:
    the model's default). Its layers, heads and causality are the stack's; an encoder-decoder
    is fed as `Sites.model_inputs` says, and the batches' pieces are the stack's
    (`Sites.scoring_alignment`: the decoder's start token first for the decoder stack).
    """

    def __init__(
        self,
        model,
        tokenizer,
        scorers,
        config: PassSettings,
        *,
        batch_size: int | None = None,
        desc: str = "scoring",
    ):
        conventions, query_block = config.conventions, config.query_block
        self.model = model
        self.tokenizer = tokenizer
        self.scorers = list(scorers)
        self.layers = config.layers
        self.device = model_device(model)
        self.batch_size = batch_size or config.batch_size or auto_batch_size(model, self.device)
        self.conventions = get_conventions(conventions)
        self.from_mode = self.conventions.pooling(config.from_mode)
        self.notes: list[str] = []
        unblocked = [type(s).__name__ for s in self.scorers if not getattr(s, "blocks", False)]
        if query_block and unblocked:
            self.notes.append(
                f"query blocks ({query_block} pieces) not used: {', '.join(unblocked)} "
                f"needs whole attention matrices; the attention was captured unblocked"
            )
            query_block = None
        self.query_block = int(query_block) if query_block else None
        self.progress = config.progress
        self.workers = (
            default_workers(forward_cores(self.device))
            if config.workers is None
            else int(config.workers)
        )
        self.stack_bytes = STACK_BYTES.get(self.device.type, STACK_BYTES["cpu"])
        self.desc = desc
        self.sites = attention_sites(model)
        self.stack = self.sites.resolve(config.stack)
        self.n_layers, self.n_heads = (
            self.sites.n_layers(self.stack),
            self.sites.n_heads(self.stack),
        )
        self.causal = self.sites.causal(self.stack)
        # scorers that run the model themselves (head ablation, importance): `model_pass` per batch
        self.model_scorers = [s for s in self.scorers if isinstance(s, RunsModel)]
        self.measures = tuple(
            dict.fromkeys(
                m for s in self.scorers if s not in self.model_scorers for m in s.measures
            )
        )
        self.needs = (
            needs_of(self.measures) if set(self.measures) - {WEIGHTS} else None
        )  # None: probs only
        check_capturable(model, self.needs)
        self._bind_scorers(
            conventions is not None, config.seed, config.n_boot, config.keep_unit_counts
        )
        self.pad_id = padding_id(tokenizer)

    def _bind_scorers(self, give_conventions: bool, seed: int, n_boot: int, keep_units: bool):
        """Bind every scorer to the stack's layers and heads (the conventions given to those that
        read them when `give_conventions`); the model handed to the scorers that run it."""
        for scorer in self.scorers:
            if give_conventions and isinstance(scorer, ReadsConventions):
                scorer.use_conventions(self.conventions)
            scorer.bind(
                self.n_layers,
                self.n_heads,
                self.layers,
                seed=seed,
                n_boot=n_boot,
                keep_units=keep_units,
                device=self.device,
                causal=self.causal,
            )
        for scorer in self.model_scorers:
            scorer.use_model(self.model, self.tokenizer, stack=self.stack)
        for scorer in self.scorers:
            if isinstance(scorer, ReadsTokenizer):
                scorer.use_tokenizer(self.tokenizer)

    def run(self, examples, checkpoint=None, world: World | None = None) -> dict:
        """Score `examples` (any iterable, read once: a lazy `corpora.base.Stream` is never held
        whole). The corpus is read and tokenized `CHUNK` examples at a time; each example then
        waits in a `batching.Pool` with the others of its exact piece count, across chunks, until
        they make a full batch (the batch size, or fewer within batch size x `full_at` pieces),
        the pool grows past `POOL_BATCHES` x batch size x `POOL_AT` pieces, or the corpus ends. Memory does not
        grow with the corpus (a chunk, the pool, one batch), and counts do not depend on the
        batching (no padding: a sentence's attention is the same in any batch).

        checkpoint: None, or an object with `every` (batches), `start` (None, or the state a
        previous `save` was given: `Engine.state`) and `save(engine, state)`, called every
        `every` batches. A run started from a state reads past the examples read before,
        tokenizes again those it held unscored, and rebuilds the same batches.

        world: the torchrun world (`distributed.World`; None: one process). Every rank reads
        the whole corpus and makes the same batches; it scores those `distributed.owns` deals
        it, so each batch is a one-process batch."""
        resume = checkpoint.start if checkpoint is not None else None
        start = self._start_stats(resume)
        run = self._pass = _Pass(
            start,
            checkpoint,
            HeapTrimmer.for_this_process() if self.device.type == "cpu" else None,
            tqdm(
                total=total_words(examples), unit="word", desc=self.desc, disable=not self.progress
            ),
            batch_pool(self.batch_size, self.device),
            world or World(),
        )
        try:
            # the decoder reads the start token and the sentence: one piece more
            limit = max_length(self.model, self.tokenizer) - (
                self.sites.encoder_decoder and self.stack != "encoder"
            )
            chunks = chunked(examples, CHUNK)
            if resume:
                self._resume(chunks, resume, limit)
                self._score_queue()
            for chunk, prepared in self._read_ahead(chunks, limit):
                self._read(chunk, prepared)
                self._score_queue()
            self._deal(run.pool.drain())  # the corpus ended: what waits, in partial batches
            self._score_queue()
            run.bar.close()
        finally:  # the pass's bookkeeping (held examples, pool, bar) ends with it
            self._pass = None
        for scorer in self.scorers:
            scorer.finish()
        self.stats_.update(
            skipped=dict(self.stats_["skipped"]),
            seconds=time.perf_counter() - start,
            batch_size=self.batch_size_,
        )
        if self.notes:
            self.stats_["notes"] = list(self.notes)
        return self.stats_

    def _read_ahead(self, chunks, limit: int):
        """(chunk, its `batching.prepare`) for each chunk, in order: the corpus read by a thread
        (`read_ahead.prefetched`), each chunk tokenized there, or with `workers` by worker
        processes (`read_ahead.Workers`: the words sent, the alignments sent back) while the
        model scores the batches before it."""
        if not self.workers:
            tokenize = lambda c: prepare(c, self.tokenizer, limit)  # noqa: E731
            yield from prefetched(chunks, tokenize, depth=PREFETCH)
            return
        with Workers(self.workers, tokenizer=self.tokenizer) as workers:
            depth = PREFETCH + self.workers
            for chunk, aligned in workers.ahead(align_in_worker, chunks, depth, example_inputs):
                yield chunk, prepare(chunk, self.tokenizer, limit, alignments=aligned)

    def _start_stats(self, resume: dict | None) -> float:
        """Fresh `stats_` (those a checkpoint saved when resuming); returns the start time, moved
        back by the seconds already spent."""
        start = time.perf_counter()
        self.batch_size_ = self.batch_size
        self.stats_ = {
            "examples": 0,
            "words": 0,
            "skipped": Counter(),
            "skipped_sources": [],
            "seconds": 0.0,
            "batch_size": self.batch_size,
        }
        if resume:
            saved = resume["stats"]
            self.stats_.update(
                saved,
                skipped=Counter(saved["skipped"]),
                skipped_sources=list(saved["skipped_sources"]),
            )
            start -= saved["seconds"]
        return start

    def _read(self, chunk: list, prepared) -> None:
        """Take one chunk of the corpus and its tokenization (`batching.prepare`), count its
        skipped examples (one rank counts them: every rank reads them), and add the others to the
        pool; the batches due are dealt."""
        run = self._pass
        first, run.read = run.read, run.read + len(chunk)
        if run.world.main:
            self.stats_["skipped"].update(prepared.skipped)
            self.stats_["skipped_sources"] += prepared.skipped_sources
        unscored = sum(len(ex.words) for ex in chunk)  # the skipped examples' words
        run.bar.update(unscored - sum(a.n_words for a in prepared.alignments))
        self._deal(pool_chunk(run.pool, run.held, first, prepared))

    def _deal(self, batches: list[list[int]]) -> None:
        """Queue the batches (lists of ordinals) this rank scores; let go of the others."""
        run = self._pass
        for ordinals in batches:
            if owns(run.dealt, run.world):
                run.queue.append(ordinals)
            else:
                run.bar.update(sum(run.held.pop(i)[1].n_words for i in ordinals))
            run.dealt += 1

    def _resume(self, chunks, resume: dict, limit: int) -> None:
        """Continue from a checkpoint's `state`: read past the examples it had read, keeping those
        it held unscored (`queued` batches, `waiting` in the pool), tokenize them again (an
        example's pieces do not depend on its chunk) and put them back where they were."""
        run = self._pass
        queued, waiting = resume["queued"], resume["waiting"]
        wanted = {i for ordinals in queued for i in ordinals} | set(waiting)
        kept = {}  # ordinal -> example, in corpus order
        for chunk in itertools.islice(chunks, -(-resume["read"] // CHUNK)):
            for example in chunk:
                if run.read in wanted:
                    kept[run.read] = example
                else:  # scored or skipped before
                    run.bar.update(len(example.words))
                run.read += 1
        prepared = prepare(list(kept.values()), self.tokenizer, limit)
        if len(prepared.kept) != len(wanted) or run.read != resume["read"]:
            raise RuntimeError("the checkpoint's examples are not those of this corpus")
        run.held = dict(zip(kept, zip(prepared.examples, prepared.alignments)))
        run.queue = [list(ordinals) for ordinals in queued]
        run.pool.restore([(i, len(run.held[i][1])) for i in waiting])

    def _score_queue(self) -> None:
        """Score the queued batches in order. A batch that runs out of memory is retried in
        halves (each its own batch; nothing is committed twice: a batch's state is a value of
        `_score`, committed only at its end)."""
        run = self._pass
        while run.queue:
            ordinals = run.queue[0]
            batch = self._batch(ordinals)
            try:
                self._score(batch)
            except (torch.OutOfMemoryError, RuntimeError) as exc:
                if not is_out_of_memory(exc) or len(ordinals) == 1:
                    raise
                del batch
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                half = len(ordinals) // 2
                self.batch_size_ = max(1, half)
                run.queue[:1] = [ordinals[:half], ordinals[half:]]
                continue
            run.queue.pop(0)
            for i in ordinals:  # scored: this run needs its pieces no more
                del run.held[i]
            self.stats_["examples"] += len(batch)
            self.stats_["words"] += batch.n_real_words
            run.bar.update(batch.n_real_words)
            self._batch_done()

    def _batch_done(self) -> None:
        """After each batch: the occasional heap trim and checkpoint, and the test pause point."""
        run = self._pass
        run.batches += 1
        if run.trim is not None:
            run.trim.after_batch()
        if (
            run.checkpoint is not None
            and run.checkpoint.every
            and run.batches % run.checkpoint.every == 0
        ):
            run.checkpoint.save(self, self.state())
        test_pause("scoring")

    def state(self) -> dict:
        """Where the run is (for a checkpoint), every example by its ordinal in the corpus:
        `read` examples read (each scored, skipped, or held); of those held, the batches dealt
        to this rank and not yet scored (`queued`, in order) and those `waiting` in the pool."""
        run = self._pass
        stats = dict(
            self.stats_,
            skipped=dict(self.stats_["skipped"]),
            skipped_sources=list(self.stats_["skipped_sources"]),
            seconds=time.perf_counter() - run.start,
            batch_size=self.batch_size_,
        )
        return {
            "read": run.read,
            "chunk_size": CHUNK,
            "queued": [list(ordinals) for ordinals in run.queue],
            "waiting": sorted(i for i, _ in run.pool.waiting()),
            "stats": stats,
        }

    def _batch(self, ordinals: list[int]) -> Batch:
        held = self._pass.held
        alignments = [self.sites.scoring_alignment(held[i][1], self.stack) for i in ordinals]
        return Batch(
            [held[i][0] for i in ordinals],
            alignments,
            self.pad_id,
            device=self.device,
            from_mode=self.from_mode,
        )

    def _score(self, batch: Batch) -> None:
        """Score one batch: each scorer's state is a value of this call, so a batch retried in
        halves after running out of memory starts from nothing and commits only in `end_batch`."""
        states = {}
        for scorer in self.model_scorers:  # each in its own grad mode (importance differentiates)
            states[scorer] = scorer.model_pass(self.model, batch)
        states.update(self._attention_pass(batch))
        with torch.inference_mode():  # the states of the attention pass are inference tensors
            for scorer in self.scorers:
                scorer.end_batch(states[scorer])

    @torch.inference_mode()
    def _attention_pass(self, batch: Batch) -> dict:
        """{scorer: its state} of the scorers that read attention, every asked-for layer added:
        the layers in groups as large as `stack_bytes` allows (all of them for short inputs),
        each group scored in one call per scorer; query blocks one layer at a time."""
        readers = [s for s in self.scorers if s not in self.model_scorers]
        states = {scorer: scorer.prepare(batch) for scorer in readers}
        if not readers:
            return states
        offset = self.sites.query_offset(self.stack)  # cross-attention: the start token's row
        pooling: dict[int, WordRows] = {}

        def score(layers: tuple[int, ...], heads, block: QueryBlock | None = None) -> None:
            for scorer, att in measured_attention(readers, layers, heads, batch, block, pooling):
                scorer.update(att, states[scorer])

        per_layer = len(batch) * self.n_heads * batch.n_pieces**2 * 4 * self._matrices(readers)
        layers = self._scored_layers()
        stack = LayerStack(layers, group_size(len(layers), per_layer, self.stack_bytes))

        def hand_on(layer: int, heads, block: QueryBlock | None = None) -> None:
            if offset:
                heads, block = without_rows(heads, block, offset)
                if heads is None:
                    return
            if block is not None:  # a query block: one layer
                score((layer,), with_layer_axis(heads), block)
                return
            group = stack.add(layer, heads)
            if group is not None:
                score(*group)

        with AttentionCapture(
            self.model,
            self.layers,
            hand_on,
            query_block=self.query_block,
            stack=self.stack,
            needs=self.needs,
            into=None if offset or self.query_block else stack.into,
            stop=True,  # nothing reads the model's output: the pass ends at the last layer read
        ):
            self.model(**self.sites.model_inputs(batch, self.stack))
        for group in stack.leftovers():
            score(*group)
        return states

    def _scored_layers(self) -> list[int]:
        return list(range(self.n_layers)) if self.layers is None else sorted(self.layers)

    def _matrices(self, readers) -> int:
        """How many piece-level matrices per layer the readers' views stack (weights alone: 1;
        weights and norms under both readings: 3)."""
        views = dict.fromkeys(map(view_of, readers))
        return len({m if m == WEIGHTS else (m, r) for ms, r in views for m in ms})
