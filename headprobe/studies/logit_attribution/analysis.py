"""What a head writes: direct logit attribution per head (METHODS §9).

    headprobe.run("smollm2", probe="repeated-random", analyses=["logit_attribution"])
    results.logit_attribution_heads   # per head: mean DLA, folds, 95% interval; share DLA > 0

For each scored position t with next token y and each head h:

    DLA_h(t) = (g * c_h(t) / s(t)) . (W_U[y] - mean_v W_U[v])

`c_h(t)` is the capture's `head_output` (head h's slice of the output projection's input times
its block of W_O, bias left out); `s(t)` the final norm's scale computed from the real residual
stream at t and frozen (RMSNorm: sqrt(mean(r^2) + eps); LayerNorm: the standard deviation, with
c_h(t) centred first); `g` the final norm's gain; W_U the language-model head, centred over the
vocabulary (`headprobe.model.unembed`). Only the targets' rows of W_U are read: per position
w(t) = g * (W_U[y] - mean W_U) ([hidden]), then DLA_h(t) = c_h(t) . w(t) / s(t); nothing of
size vocab x head is formed.

The scorer runs the base model itself (`model_pass`, one forward pass per batch with the
capture's `head_output` and a pre-hook on the final norm for the residual stream), like
`ablation`. Rows per example: (unit, `dla`) with mass = sum over its scored positions of
DLA_h(t), and (unit, `dla>0`) with mass = the positions where DLA_h(t) > 0, n = scored
positions for both; they add up per unit and fold like any mass, so the table carries mean
and share with the streaming bootstrap's intervals, and best heads held out (`selection`).

Scored positions: every piece with a next piece (the causal LM's targets); on the
repeated-random probe only the positions predicting a piece of the repeated half after its
first word (the tokens an induction head can predict, as the induction ablation scores).

Defined for causal language models with a final norm before their head; anything else
(no LM head, a masked LM, an encoder-decoder) is refused with one line. The measure
(`--measure`) does not apply: like the ablation it is scored once, under the first measure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from headprobe.core.torch_modes import no_grad
from headprobe.extend import PROBE, Analysis, UsageError, head_table, register
from headprobe.inputs.align import WORD
from headprobe.model.objectives import IGNORE, Objective, lm_kind
from headprobe.scoring.model_scorer import ModelScorer

if TYPE_CHECKING:
    import torch

NAME = "logit_attribution"
DLA, RAISES = "dla", "dla>0"
LABELS = (DLA, RAISES)
TOP = 10


def repeated_half(batch) -> torch.Tensor:
    """[batch, piece] bool: the target pieces scored. A repeated-random probe's row: the word
    pieces of its second half after that half's first word (word index > length); any other
    row: every piece."""
    import torch

    keep = torch.ones_like(batch.piece_kind, dtype=torch.bool)  # [batch, piece]
    for b, example in enumerate(batch.examples):
        if (example.meta or {}).get("probe") == "repeated-random":
            length = int(batch.n_words[b]) // 2
            keep[b] = (batch.piece_kind[b] == WORD) & (batch.piece_word[b] > length)
    return keep


def refusal(model) -> str | None:
    """Why DLA is not defined on `model` (one line), or None."""
    from headprobe.model.discovery import attention_sites

    name = type(model).__name__
    if attention_sites(model).encoder_decoder:
        return f"{NAME}: {name} is an encoder-decoder; direct logit attribution is defined for one-stack causal language models"
    kind = lm_kind(model)
    if kind == "representation":
        return f"{NAME}: {name} has no language-model head (direct logit attribution needs W_U)"
    if kind != "causal_lm":
        return f"{NAME}: {name} is a masked language model; direct logit attribution is defined for causal ones"
    return None


class LogitAttributionScorer(ModelScorer):
    """Direct logit attribution per head and scored position (module docstring)."""

    analysis = NAME
    scored = staticmethod(repeated_half)
    objective = None  # it scores no objective (the summary names none for it)

    def use_model(self, model, tokenizer, stack: str | None = None) -> None:
        """Before the run (`stack` is the engine's; a model with several stacks is refused)."""
        from headprobe.model.unembed import unembedding

        why = refusal(model)
        if why is not None:
            raise UsageError(why)
        self.unembed = unembedding(model, NAME)
        self.lm = Objective("causal_lm", scored=self.scored)  # its targets: the scored positions

    @no_grad
    def compute(self, model, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """([layer, 2 * batch, head] sums: DLA and DLA > 0 per example, [batch] positions)."""
        import torch

        from headprobe.model.capture import AttentionCapture
        from headprobe.model.unembed import base_of

        targets = self.lm.targets(model, batch)
        labels = self.lm.scored_labels(targets)  # [batch, piece - 1]
        row, pos = (labels != IGNORE).nonzero(as_tuple=True)  # [scored]
        w = self.unembed.directions(labels[row, pos])  # [scored, hidden]
        written: dict[int, torch.Tensor] = {}

        def keep(layer, heads, block=None):
            c = heads["head_output"][row, :, pos]  # [scored, head, hidden]
            written[layer] = torch.einsum("shd,sd->sh", c, w.to(c.device))  # [scored, head]

        residual = {}
        hook = self.unembed.norm.register_forward_pre_hook(
            lambda module, args: residual.__setitem__("r", args[0])
        )
        base = base_of(model)
        try:
            with AttentionCapture(base, self.layers, keep, needs={"head_output"}):
                base(**targets.inputs)
        finally:
            hook.remove()
        scale = self.unembed.scale(residual["r"][row, pos])  # [scored]
        dla = (
            torch.stack([written[layer].to(scale.device) for layer in self.layers])
            / scale[None, :, None]
        )  # [layer, scored, head]
        n_rows = labels.shape[0]
        sums = dla.new_zeros(len(self.layers), 2 * n_rows, self.n_heads)  # [layer, 2 * batch, head]
        sums.index_add_(1, 2 * row.to(dla.device), dla)
        sums.index_add_(1, 2 * row.to(dla.device) + 1, (dla > 0).to(dla.dtype))
        return sums, (labels != IGNORE).sum(-1).float()  # [batch]

    def model_pass(self, model, batch):
        """Rows (unit, dla) and (unit, dla>0) of every example, n its scored positions."""
        sums, tokens = self.compute(model, batch)  # [layer, 2 * batch, head], [batch]
        keys = [(example.unit, label) for example in batch.examples for label in LABELS]
        state = self.new_state(batch, keys, np.repeat(tokens.cpu().numpy(), len(LABELS)))
        state.values[0, :, 0] = sums.to(state.values)
        return state


HEAD_COLUMNS = [
    "layer",
    "head",
    "kv_group",
    "n",
    "dla",
    "dla_low",
    "dla_high",
    "fold0",
    "fold1",
    "share_positive",
    "share_low",
    "share_high",
]


def dla_table(results) -> pd.DataFrame:
    """One row per head: mean DLA over the scored positions (`dla`, 95% interval, per fold)
    and the share of positions where the head raises the next token's logit (DLA > 0)."""
    table = head_table(results, NAME)
    if not len(table):
        return pd.DataFrame(columns=HEAD_COLUMNS)
    keys = ["layer", "head"]
    mean = table[table["label"] == DLA].rename(
        columns={"score": "dla", "ci_low": "dla_low", "ci_high": "dla_high"}
    )
    share = table[table["label"] == RAISES].rename(
        columns={"score": "share_positive", "ci_low": "share_low", "ci_high": "share_high"}
    )[keys + ["share_positive", "share_low", "share_high"]]
    return mean.merge(share, on=keys, how="left")[HEAD_COLUMNS].reset_index(drop=True)


def writers(results, top: int = TOP) -> pd.DataFrame:
    """The heads that write the next token most (largest mean DLA, `writes`) and those that
    suppress it most (most negative, `suppresses`), `top` of each, from `dla_table`."""
    table = results.tables.get(f"{NAME}_heads")
    table = dla_table(results) if table is None else table
    if not len(table):
        return table.assign(kind=pd.Series(dtype=str))
    ordered = table.sort_values("dla", ascending=False, kind="stable")
    up = ordered.head(top).assign(kind="writes")
    down = ordered[ordered["dla"] < 0].tail(top).iloc[::-1].assign(kind="suppresses")
    return pd.concat([up, down], ignore_index=True)


ANALYSIS = register(
    Analysis(
        name=NAME,
        order=140,
        scorer=LogitAttributionScorer,
        input=PROBE,
        selection=True,
        default=False,
        description="per head: direct logit attribution (g * c_h(t) / s(t)) . (W_U[y] - mean W_U) to the "
        "next token, mean over scored positions, and the share of positions where it is > 0 (METHODS §9); "
        "causal language models; on the repeated-random probe the repeated half only",
        tables={f"{NAME}_heads": dla_table, f"{NAME}_writers": writers},
        report="headprobe.studies.logit_attribution.report:logit_section",
    )
)
