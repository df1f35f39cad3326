"""What mean and resample ablation replace a head's slice with (METHODS §8 "Kinds of ablation").

    baselines = Baselines(("zero", "mean"), seed=0)
    baselines.read(model, tokenizer, examples, stack)   # one extra pass over the run's inputs
    means, kept = baselines.of("mean", model, batch)    # [layer, (piece,) head, d_head], rows
    sub = baselines.rows(batch, kept)                   # the batch's rows that are scored

- `zero`: no baseline (the gate zeroes the slice); every row is scored.
- `mean`: each head's slice averaged over the scored inputs' pieces, in one forward pass over
  them before the scoring pass (`gates.head_means`): per position where every input is a
  probe's sequence of one length (a fixed-length probe), over all pieces otherwise.
- `resample`: the slice of a partner input of the same length in pieces, taken from an intact
  forward pass over the partners (`gates.head_slices`). The inputs of one length are ordered
  by the keyed hash (METHODS §5) of their sentence id, `keyed_hash(seed, "resample", sent_id)`,
  and each one's partner is the next in that order (the last's the first): a content-keyed
  derangement, the same in any shard or batch order. An input alone at its length has no
  partner: it is counted (`unpaired`) and left out of the resample rows, never scored as zero.
"""

from __future__ import annotations

from collections import defaultdict

from headprobe.core.seeds import keyed_hash
from headprobe.model.objectives import mask_key
from headprobe.model.padding import padding_id

KIND_NOTES = {
    "zero": "the head's slice set to 0",
    "mean": "the head's slice set to its mean over the scored inputs' pieces",
    "resample": "the head's slice taken from another input of the same length (keyed pairing)",
}


class Baselines:
    """The baselines of the kinds of ablation asked for, read from one pass over the inputs."""

    def __init__(self, kinds, seed: int = 0):
        self.kinds, self.seed = tuple(kinds), int(seed)
        self.means = None  # [layer, head, d_head] or [layer, piece, head, d_head]
        self.per_position = False
        self.partners: dict[str, tuple] = {}  # sent_id -> (example, alignment) of its partner
        self.unpaired: set[str] = set()  # the inputs without a partner of their length

    @property
    def needs_inputs(self) -> bool:
        return any(kind != "zero" for kind in self.kinds)

    def read(self, model, tokenizer, examples, stack=None, batch_size: int = 16) -> None:
        """One pass over `examples` (tokenized as the engine does): the means and the pairing."""
        from headprobe.inputs.batching import iter_batches, prepare
        from headprobe.model.discovery import attention_sites
        from headprobe.model.gates import head_means
        from headprobe.scoring.engine import max_length

        sites = attention_sites(model)
        stack = sites.resolve(stack)
        prepared = prepare(list(examples), tokenizer, max_length(model, tokenizer))
        aligned = [sites.scoring_alignment(a, stack) for a in prepared.alignments]
        if "resample" in self.kinds:
            self._pair(prepared.examples, aligned)
        if "mean" in self.kinds:
            lengths = {len(a) for a in aligned}
            probe = all("input_ids" in (e.meta or {}) for e in prepared.examples)
            self.per_position = probe and len(lengths) == 1
            prepared.alignments = aligned
            pad = padding_id(tokenizer)
            batches = iter_batches(prepared, batch_size, pad, device=_device(model))
            self.means = head_means(model, batches, stack=stack, per_position=self.per_position)

    def _pair(self, examples, alignments) -> None:
        by_length = defaultdict(list)
        for example, alignment in zip(examples, alignments):
            by_length[len(alignment)].append((example, alignment))
        for group in by_length.values():
            group.sort(key=lambda item: keyed_hash(self.seed, "resample", mask_key(item[0])))
            if len(group) == 1:
                self.unpaired.add(mask_key(group[0][0]))
                continue
            for i, (example, _) in enumerate(group):
                self.partners[mask_key(example)] = group[(i + 1) % len(group)]

    def kept(self, kind: str, batch) -> list[int]:
        """The rows of `batch` that `kind` scores (resample: those with a partner)."""
        if kind != "resample":
            return list(range(len(batch.examples)))
        return [i for i, e in enumerate(batch.examples) if mask_key(e) in self.partners]

    def of(self, kind: str, model, batch, stack=None):
        """The `means` HeadGates takes for `kind` on `batch`'s rows `kept(kind, batch)` (None:
        zero ablation)."""
        from headprobe.model.gates import head_slices

        if kind == "zero":
            return None
        if kind == "mean":
            return self.means
        return head_slices(
            model, self.partner_batch(batch), stack
        )  # [row, layer, piece, head, d_head]

    def partner_batch(self, batch):
        """The batch of the partners of `batch`'s rows that resample ablation keeps."""
        from headprobe.inputs.batching import Batch

        pairs = [self.partners[mask_key(batch.examples[i])] for i in self.kept("resample", batch)]
        return Batch(
            [p[0] for p in pairs], [p[1] for p in pairs], batch.pad_id, device=batch.device
        )

    def describe(self) -> dict:
        """What a table of these kinds says of them."""
        out = {kind: KIND_NOTES[kind] for kind in self.kinds}
        if "mean" in self.kinds:
            out["mean"] += " at each position" if self.per_position else " (all positions)"
        if "resample" in self.kinds:
            out["resample_unpaired"] = len(self.unpaired)
            out["resample_paired"] = len(self.partners)
        return out


def rows_of(batch, kept: list[int]):
    """`batch` itself where every row is kept, else a batch of the kept rows only."""
    from headprobe.inputs.batching import Batch

    if len(kept) == len(batch.examples):
        return batch
    return Batch(
        [batch.examples[i] for i in kept],
        [batch.alignments[i] for i in kept],
        batch.pad_id,
        device=batch.device,
        from_mode=batch.from_mode,
    )


def _device(model):
    from headprobe.model.sites import model_device

    return model_device(model)
