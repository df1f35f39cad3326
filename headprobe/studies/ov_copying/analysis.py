"""What a head copies: the OV circuit in token space, from the weights alone (METHODS §9).

    headprobe.run("smollm2", analyses=["ov_copying"])
    results.ov_copying_heads      # per head: copying score, copy rate with its Wilson 95% interval

Per head h of layer l, the OV circuit maps a token's embedding to logits:

    M_h = W_E diag(g_attn) W_V^h W_O^h diag(g_final) W_U        ([vocab, vocab], never formed)

`g_attn` is the gain of the norm the values read (`AttentionSite.norm_in`, pre-norm blocks; 1
where there is none), `g_final` the final norm's gain (1 where there is none), `W_U` the
language-model head (else `W_E` transposed), `W_V^h` the value projection of h's KV group
(`sites.value_weight`), `W_O^h` h's block of the output projection (`sites.output_weight`);
biases and the norms' scalars are dropped (`headprobe.model.unembed`).

- **Copying score** (Elhage et al. 2021): sum Re(lambda) / sum |lambda| over M_h's eigenvalues,
  computed from the d_head x d_head matrix W_O^h diag(g_final) W_U W_E diag(g_attn) W_V^h, which
  has the same nonzero eigenvalues. 1: M_h copies every direction; -1: it suppresses.
- **Copy rate**: the share of a seeded sample of ordinary vocabulary tokens (default 2,000; no
  special or added tokens; `SAMPLED_TOKENS`) whose own id is among the top `TOP_K` = 5 of their row of
  M_h (its rank counts every logit >= its own, itself included: a tie counts against it, so
  a head that writes nothing copies nothing), with a Wilson 95% interval. Rows come
  from the low rank: (W_E[t] g_attn W_V^h) -> [d_head], times (W_O^h g_final W_U) -> logits
  over the vocabulary for the sampled rows only, made a cache-sized block at a time and counted
  against the token's own logit instead of sorted (`copy_hits`: no [sample, vocab] matrix, no
  top-k; a token with k rivals is settled, so most are done after the first block).

It reads no corpus (a `WeightsScorer`, `input=WEIGHTS_ONLY`): computed once when the run's model
is ready, kept in the run's summary, and turned into the table from there. A family whose value
projection cannot be found is refused with one line naming it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headprobe.core.seeds import keyed_hash
from headprobe.extend import WEIGHTS_ONLY, Analysis, WeightsScorer, register, vocabulary
from headprobe.stats.estimates import wilson
from headprobe.studies.ov_copying.counts import NAME, SAMPLED_TOKENS, TOP_K


def ordinary_tokens(
    tokenizer, vocab_size: int, sample: int = SAMPLED_TOKENS, seed: int = 0
) -> np.ndarray:
    """Sorted ids of a seeded sample (without replacement) of `sample` ordinary tokens: below the
    model's vocabulary size, neither special nor added to the tokenizer (all of them if fewer)."""
    ids = vocabulary(tokenizer, vocab_size)
    added = {int(i) for i in (getattr(tokenizer, "added_tokens_decoder", None) or {})}
    ids = ids[~np.isin(ids, list(added))] if added else ids
    if len(ids) <= sample:
        return ids
    rng = np.random.Generator(np.random.PCG64(keyed_hash(seed, "ov-sample", "tokens")))
    return np.sort(rng.choice(ids, size=sample, replace=False))


class OVCopyingScorer(WeightsScorer):
    """Weights only: every head computed once, from the weights (module docstring)."""

    analysis = NAME
    sample = SAMPLED_TOKENS

    def compute(self, model, tokenizer, layers, stack, seed: int) -> dict:
        """The record the run's summary keeps: every head's numbers and how they were drawn."""
        from headprobe.model.unembed import unembedding
        from headprobe.studies.ov_copying.ov_circuits import ov_heads  # torch: only to compute

        vocab = int(model.get_input_embeddings().weight.shape[0])
        tokens = ordinary_tokens(tokenizer, vocab, self.sample, seed)
        heads = ov_heads(model, tokens, layers, stack)
        w_u = "language-model head" if unembedding(model, NAME, False).has_head else "W_E^T"
        return {
            "sample": int(len(tokens)),
            "top_k": TOP_K,
            "unembedding": w_u,
            **{column: heads[column].tolist() for column in heads},
        }


HEAD_COLUMNS = [
    "layer",
    "head",
    "kv_group",
    "copying",
    "copy_rate",
    "copy_low",
    "copy_high",
    "hits",
    "n",
    "top_k",
    "unembedding",
]


def ov_table(results) -> pd.DataFrame:
    """One row per head: copying score, copy rate (hits / n) and its Wilson 95% interval."""
    kept = results.summary.get(NAME)
    if not kept:
        return pd.DataFrame(columns=HEAD_COLUMNS)
    table = pd.DataFrame(
        {c: kept[c] for c in ("layer", "head", "kv_group", "copying", "hits", "n")}
    )
    table["copy_rate"] = table["hits"] / table["n"]
    table["copy_low"], table["copy_high"] = wilson(table["hits"], table["n"])
    table["top_k"], table["unembedding"] = kept["top_k"], kept["unembedding"]
    return table[HEAD_COLUMNS]


ANALYSIS = register(
    Analysis(
        name=NAME,
        order=150,
        scorer=OVCopyingScorer,
        input=WEIGHTS_ONLY,
        selection=False,
        default=False,
        description="per head, from the weights alone: the OV circuit W_E g_attn W_V W_O g_final W_U's copying "
        f"score (sum Re lambda / sum |lambda|, Elhage et al. 2021) and copy rate (share of {SAMPLED_TOKENS:,} sampled "
        f"tokens whose own id is in the top {TOP_K} of their row, Wilson 95% interval; METHODS §9)",
        tables={f"{NAME}_heads": ov_table},
        report="headprobe.studies.ov_copying.report:ov_section",
    )
)
