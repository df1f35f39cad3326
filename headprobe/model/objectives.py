"""The objective a head ablation changes (METHODS §8), per example row, so effects stream per unit.

    objective = Objective.for_model(model, tokenizer)     # kind picked from the model
    targets = objective.targets(model, batch)             # outside any gates: intact reference
    with HeadGates(model, gates):
        values, tokens = objective.per_row(model, targets)   # [batch] summed loss, [batch] pieces
    values.sum() / tokens.sum()                           # the objective: a mean per piece

Kinds (`OBJECTIVES`; the one used is named in every table, `DESCRIPTIONS`):
- `causal_lm` (a model with a language-model head that attends causally): next-token
  negative log-likelihood, summed over the row's predicted pieces (every non-padding
  piece after the first).
- `masked_lm` (a language-model head, bidirectional): the MLM loss on 15% of the word
  pieces (never special pieces or padding), chosen by a keyed hash of (seed, sentence,
  piece position), `mlm_positions`; chosen pieces are replaced by the mask token.
- `representation` (no language-model head, or an untrained one): `1 - cos(h_L', h_L)`
  of the last hidden state against the intact model's, summed over non-padding pieces.
  Its gradient at g = 1 is zero (the intact state is its minimum), so importance
  (`headprobe.model.head_effects`) needs one of the two losses.

`values` are sums and `tokens` the pieces they are summed over, so a unit's value is
the sum of its rows' and any set of units reports `sum values / sum tokens`.

Encoder-decoders (T5, BART, mT5): the model is fed as the capture feeds it
(`Sites.model_inputs`), with the decoder reading its start token and the sentence for every
stack (for the encoder stack too: what the decoder reads when taught the sentence). The
scored sequence is then the decoder's: `causal_lm` (the kind of any encoder-decoder with an
LM head) is the teacher-forced loss of each next decoder piece, `representation` the
decoder's last hidden state; gating heads of any stack (`stack`) changes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from headprobe.core.seeds import SEED, keyed_hash
from headprobe.core.torch_modes import no_grad
from headprobe.inputs.align import WORD
from headprobe.inputs.probes import LOSS_WORDS

if TYPE_CHECKING:
    import torch

OBJECTIVES = ("causal_lm", "masked_lm", "representation")
DESCRIPTIONS = {
    "causal_lm": "causal LM: mean next-token negative log-likelihood (nats per piece)",
    "masked_lm": "masked LM: mean loss (nats) on 15% of word pieces chosen by hash of (seed, sentence, position)",
    "representation": "representation change: mean 1 - cos(h_L', h_L) of the last hidden state per piece",
}
MASK_RATE = 0.15
IGNORE = -100  # a target that is not scored (torch's cross-entropy default)


def lm_kind(model) -> str:
    """`causal_lm` or `masked_lm` for a model with a language-model head, else `representation`."""
    from headprobe.model.discovery import attention_sites

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        return "representation"
    sites = attention_sites(model)
    return "causal_lm" if sites.encoder_decoder or sites.causal() else "masked_lm"


def mask_key(example) -> str:
    """The sentence a masked-LM position belongs to: its `sent_id` (the unit itself where units
    are sentences; sentences of one document differ by it)."""
    return str(getattr(example, "sent_id", None) or example.unit)


def mlm_positions(keys, piece_kind, seed: int = SEED, rate: float = MASK_RATE) -> torch.Tensor:
    """[batch, piece] bool: the word pieces masked for the MLM loss. Piece `p` of the row keyed
    `keys[b]` is chosen iff keyed_hash(seed, "mask", f"{key}:{p}") < rate * 2**64 and it is a
    word piece (`piece_kind == WORD`: never a special piece or padding). `piece_kind`: a host
    array (a `Batch`'s `piece_kind_host`; the result is then on the host) or a tensor (the result
    on its device)."""
    import torch

    on_device = isinstance(piece_kind, torch.Tensor)
    kind = piece_kind.cpu().numpy() if on_device else np.asarray(piece_kind)  # [batch, piece]
    limit = int(rate * 2**64)
    chosen = np.zeros(kind.shape, dtype=bool)
    for row, key in enumerate(keys):
        for piece in np.flatnonzero(kind[row] == WORD):
            chosen[row, piece] = keyed_hash(seed, "mask", f"{key}:{piece}") < limit
    chosen = torch.from_numpy(chosen)  # [batch, piece]
    return chosen.to(piece_kind.device) if on_device else chosen


@dataclass
class Targets:
    """One batch, ready for `Objective.per_row`: what the model is fed and what is scored."""

    inputs: dict  # input_ids, attention_mask: [batch, piece]
    labels: torch.Tensor | None = None  # [batch, piece] target ids, IGNORE where not scored
    reference: torch.Tensor | None = None  # [batch, piece, hidden] the intact last hidden state


def scored_sequence(inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) [batch, piece] of the sequence the model's output covers: the decoder's
    where the model has one, else the input's (the mask as `gates.query_mask` reads it: ones
    where the inputs have none, an unpadded batch)."""
    from headprobe.model.gates import query_mask

    ids = inputs["decoder_input_ids"] if "decoder_input_ids" in inputs else inputs["input_ids"]
    return ids, query_mask(inputs, "decoder")


def feeding(model, batch, stack: str | None) -> dict:
    """The model's inputs for `batch` on its device: an encoder-decoder's decoder reads its
    start token and the sentence (the decoder stack's batch holds them already)."""
    from headprobe.model.discovery import attention_sites
    from headprobe.model.gates import model_inputs
    from headprobe.model.sites import model_device

    sites = attention_sites(model)
    if sites.encoder_decoder and not isinstance(batch, dict):
        stack = "decoder" if sites.resolve(stack) == "decoder" else "cross"
    return model_inputs(batch, model_device(model), model, stack)


def last_hidden(model, inputs) -> torch.Tensor:
    """[batch, piece, hidden]: the last hidden state (the base model's, under any LM head)."""
    base = getattr(model, "base_model", model)
    return base(**inputs).last_hidden_state


class Objective:
    """See the module docstring. kind: one of `OBJECTIVES`; mask_token_id: for `masked_lm`.

    scored: None, or a function `scored(batch) -> [batch, piece] bool` naming the pieces whose
    loss is counted (LM kinds only): a target piece outside it is IGNOREd, so the objective
    is the loss on those pieces alone (e.g. the repeated half of a repeated-random probe,
    `headprobe.inputs.probes.scored_pieces`). The model still reads every piece.
    stack: the attention stack whose heads are gated (an encoder-decoder's inputs follow it)."""

    def __init__(
        self,
        kind: str,
        seed: int = SEED,
        mask_token_id: int | None = None,
        scored=None,
        stack: str | None = None,
    ):
        if kind not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, not {kind!r}")
        if kind == "masked_lm" and not isinstance(mask_token_id, int):
            raise ValueError("objective masked_lm: the tokenizer has no mask token")
        if scored is not None and kind == "representation":
            raise ValueError(
                "objective representation: a restriction to some pieces needs a language-model loss"
            )
        self.kind, self.seed, self.mask_token_id, self.scored = (
            kind,
            int(seed),
            mask_token_id,
            scored,
        )
        self.stack = stack

    @classmethod
    def for_model(
        cls,
        model,
        tokenizer=None,
        kind: str | None = None,
        seed: int = SEED,
        scored=None,
        stack: str | None = None,
    ) -> Objective:
        """The model's objective (`lm_kind`), or `kind` where given."""
        kind = kind or lm_kind(model)
        return cls(kind, seed, getattr(tokenizer, "mask_token_id", None), scored, stack)

    restriction = ""  # which pieces the examples' own `loss_words` kept, once seen

    @property
    def description(self) -> str:
        """The kind in full, and the pieces counted where the examples restrict them."""
        if not self.restriction:
            return DESCRIPTIONS[self.kind]
        return f"{DESCRIPTIONS[self.kind]}; loss on {self.restriction}"

    @no_grad
    def targets(self, model, batch) -> Targets:
        """A batch's targets. Call it outside any `HeadGates`: `representation` runs the intact
        model here. `batch`: a headprobe `Batch` (a mapping needs `piece_kind` and `keys` for MLM)."""
        inputs = feeding(model, batch, self.stack)
        ids, mask = scored_sequence(inputs)  # [batch, piece]
        if self.kind == "representation":
            return Targets(inputs, reference=last_hidden(model, inputs).detach())
        if self.kind == "causal_lm":
            labels = ids.masked_fill(mask == 0, IGNORE)  # [batch, piece]
            return Targets(inputs, labels=self._restricted(labels, batch))
        kind, keys = _kinds_and_keys(batch)
        chosen = mlm_positions(keys, kind, self.seed).to(ids.device)  # [batch, piece]
        labels = ids.masked_fill(~chosen, IGNORE)
        fed = dict(inputs, input_ids=ids.masked_fill(chosen, self.mask_token_id))
        return Targets(fed, labels=self._restricted(labels, batch))

    def _restricted(self, labels: torch.Tensor, batch) -> torch.Tensor:
        """labels [batch, piece] with the pieces outside `scored(batch)` (else the examples'
        own `loss_words`, `loss_pieces`) IGNOREd."""
        import torch

        keep = self.scored(batch) if self.scored is not None else loss_pieces(batch)
        if keep is None:
            return labels
        if self.scored is None:
            self.restriction = batch.examples[0].meta.get("loss_note", "some words")
        keep = torch.as_tensor(keep, device=labels.device, dtype=torch.bool)  # [batch, piece]
        if keep.shape[1] == labels.shape[1] - 1:  # the decoder reads its start token first
            keep = torch.cat([keep.new_zeros(keep.shape[0], 1), keep], dim=1)
        return labels.masked_fill(~keep, IGNORE)

    def per_row(self, model, targets: Targets) -> tuple[torch.Tensor, torch.Tensor]:
        """([batch] summed objective, [batch] pieces it is summed over), float32; differentiable
        (run it under `torch.no_grad()` where no gradient is wanted)."""
        import torch.nn.functional as F

        _, mask = scored_sequence(targets.inputs)  # [batch, piece]
        if self.kind == "representation":
            h = last_hidden(model, targets.inputs).float()  # [batch, piece, hidden]
            change = 1.0 - F.cosine_similarity(
                h, targets.reference.float(), dim=-1
            )  # [batch, piece]
            keep = mask.to(change.dtype)
            return (change * keep).sum(-1), keep.sum(-1)
        logits = model(**targets.inputs).logits.float()  # [batch, piece, vocab]
        labels = self.scored_labels(targets)  # [batch, piece (- 1)]
        if self.kind == "causal_lm":
            logits = logits[:, :-1]
        nll = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=IGNORE, reduction="none")
        return nll.sum(-1), (labels != IGNORE).sum(-1).to(nll.dtype)  # [batch], [batch]

    def scored_labels(self, targets: Targets) -> torch.Tensor:
        """The LM targets as the loss reads them: causal, shifted one piece left ([batch, piece - 1],
        the target of position p is piece p + 1) with padding IGNOREd; masked, `targets.labels`."""
        if self.kind != "causal_lm":
            return targets.labels
        _, mask = scored_sequence(targets.inputs)  # [batch, piece]
        return targets.labels[:, 1:].masked_fill(mask[:, :-1] == 0, IGNORE)

    def pieces(self, targets: Targets) -> torch.Tensor:
        """[batch] float32: the pieces `per_row` sums over, without running the model."""
        import torch

        if self.kind == "representation":
            return scored_sequence(targets.inputs)[1].to(torch.float32).sum(-1)
        return (self.scored_labels(targets) != IGNORE).sum(-1).to(torch.float32)


def loss_pieces(batch) -> torch.Tensor | None:
    """[batch, piece] bool: the word pieces of the words each example names in
    `meta["loss_words"]` (first, stop) (a probe's repeated half, `headprobe.inputs.probes`);
    None where no example of a `Batch` names any (every piece counts)."""
    import torch

    examples = getattr(batch, "examples", None) or []
    spans = [example.meta.get(LOSS_WORDS) for example in examples]
    if all(span is None for span in spans):
        return None
    word = batch.piece_word  # [batch, piece]
    first = torch.tensor([s[0] if s else -1 for s in spans], device=word.device)[:, None]
    stop = torch.tensor([s[1] if s else 1 << 62 for s in spans], device=word.device)[:, None]
    return (batch.piece_kind == WORD) & (word >= first) & (word < stop)  # [batch, piece]


def _kinds_and_keys(batch):
    """(piece kinds [batch, piece], one mask key per row) of a `Batch` (its host copy) or a
    mapping."""
    if isinstance(batch, dict):
        return batch["piece_kind"], list(batch["keys"])
    return batch.piece_kind_host, [mask_key(example) for example in batch.examples]


ABLATIONS = ("zero", "mean", "resample")  # kinds of ablation (METHODS §8), `--ablation`
# estimates of a head's effect without one pass per head; "ig" (integrated gradients from the
# corrupted to the clean prompt) needs a task's prompt pairs, so head ablation refuses it
ESTIMATES = ("michel", "atp", "atp*", "ig")
