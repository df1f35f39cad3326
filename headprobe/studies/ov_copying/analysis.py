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
  special or added tokens; `SAMPLE`) whose own id is among the top `TOP_K` = 5 of their row of
  M_h (its rank counts every logit >= its own, itself included: a tie counts against it, so
  a head that writes nothing copies nothing), with a Wilson 95% interval. Rows come
  from the low rank: (W_E[t] g_attn W_V^h) -> [d_head], times (W_O^h g_final W_U) -> logits
  over the vocabulary for the sampled rows only, `CHUNK` rows at a time.

It reads no corpus (a `WeightsScorer`, `input=WEIGHTS_ONLY`): computed once when the run's model
is ready, kept in the run's summary, and turned into the table from there. A family whose value
projection cannot be found is refused with one line naming it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from headprobe.core.errors import UsageError
from headprobe.core.seeds import keyed_hash
from headprobe.core.torch_modes import no_grad
from headprobe.inputs.probes import vocabulary
from headprobe.scoring.registry import WEIGHTS_ONLY, Analysis, register
from headprobe.scoring.weights_scorer import WeightsScorer
from headprobe.stats.engine import wilson

if TYPE_CHECKING:
    import torch

NAME = "ov_copying"
SAMPLE = 2000
TOP_K = 5
CHUNK = 512


def ordinary_tokens(tokenizer, vocab_size: int, sample: int = SAMPLE, seed: int = 0) -> np.ndarray:
    """Sorted ids of a seeded sample (without replacement) of `sample` ordinary tokens: below the
    model's vocabulary size, neither special nor added to the tokenizer (all of them if fewer)."""
    ids = vocabulary(tokenizer, vocab_size)
    added = {int(i) for i in (getattr(tokenizer, "added_tokens_decoder", None) or {})}
    ids = ids[~np.isin(ids, list(added))] if added else ids
    if len(ids) <= sample:
        return ids
    rng = np.random.Generator(np.random.PCG64(keyed_hash(seed, "ov-sample", "tokens")))
    return np.sort(rng.choice(ids, size=sample, replace=False))


def copying_score(core: torch.Tensor) -> float:
    """sum Re(lambda) / sum |lambda| over the eigenvalues of a square matrix ([d_head, d_head])."""
    import torch

    eig = torch.linalg.eigvals(core.double())  # [d_head] complex
    total = eig.abs().sum()
    return float(eig.real.sum() / total) if total > 0 else float("nan")


def copy_hits(rows: torch.Tensor, out: torch.Tensor, tokens: torch.Tensor, k: int = TOP_K) -> int:
    """How many sampled tokens t have their own id among the top k of their logits
    rows[t] @ out; rows [sample, d_head] (W_E[t] g_attn W_V^h), out [d_head, vocab]."""
    if out.shape[1] <= k:
        return len(tokens)
    hits = 0
    for start in range(0, len(tokens), CHUNK):
        a, ids = rows[start : start + CHUNK], tokens[start : start + CHUNK]  # [chunk, d], [chunk]
        logits = a @ out  # [chunk, vocab]
        own = logits.gather(1, ids[:, None])[:, 0]  # [chunk]
        # at most k logits >= its own (itself included) <=> the (k + 1)-th largest is below it
        hits += int((logits.topk(k + 1, dim=1).values[:, k] < own).sum())
    return hits


def site_weights(model, site) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(W_V [kv_head, hidden, d_head], W_O [head, d_head, hidden], g_attn [hidden]) of one site,
    float32; one line naming the family where its value projection cannot be found."""
    import torch

    from headprobe.model.sites import output_weight, value_weight
    from headprobe.model.unembed import fit_norm

    if getattr(site, "value", None) is None:
        raise UsageError(
            f"{NAME}: {type(model).__name__} ({site.name or site.stack}): its value projection "
            "cannot be found, so its OV circuit cannot be read"
        )
    w_v = value_weight(site).detach().float()  # [kv_head, hidden, d_head]
    w_o = output_weight(site).detach().float()  # [head, d_head, hidden]
    norm = getattr(site, "norm_in", None)
    g_attn = fit_norm(norm, w_v.shape[1])[1] if norm is not None else torch.ones(w_v.shape[1])
    return w_v, w_o, g_attn.to(w_v.device)


@no_grad
def ov_heads(model, tokens, layers=None, stack: str | None = None) -> pd.DataFrame:
    """Per head of the stack's `layers` (default all): copying score, copy-rate hits over the
    sampled `tokens` (ids), n (see the module docstring)."""
    import torch

    from headprobe.model.sites import attention_sites
    from headprobe.model.unembed import unembedding

    out = unembedding(model, NAME, need_norm=False)
    sites = attention_sites(model).of(stack)
    layers = range(len(sites)) if layers is None else layers
    device = out.w_e.device
    w_e, w_u = out.w_e.float(), out.w_u.float()  # [vocab, hidden] each
    g_final = out.gain.to(device)  # [hidden]
    ids = torch.as_tensor(np.asarray(tokens), dtype=torch.long, device=device)  # [sample]
    bridge = w_u.T @ w_e  # [hidden, hidden]: W_U (as [hidden, vocab]) times W_E
    unembed = (w_u * g_final).T  # [hidden, vocab]: diag(g_final) W_U
    rows = []
    for layer in layers:
        site = sites[layer]
        w_v, w_o, g_attn = site_weights(model, site)
        w_v, w_o = w_v.to(device), w_o.to(device)
        middle = g_final[:, None] * bridge * g_attn.to(device)[None, :]  # [hidden, hidden]
        embedded = w_e[ids] * g_attn.to(device)  # [sample, hidden]
        group = site.heads // w_v.shape[0]
        for kv in range(w_v.shape[0]):
            read = embedded @ w_v[kv]  # [sample, d_head]
            for head in range(kv * group, (kv + 1) * group):
                core = w_o[head] @ middle @ w_v[kv]  # [d_head, d_head]
                hits = copy_hits(read, w_o[head] @ unembed, ids)
                rows.append((layer, head, kv, copying_score(core), hits, len(ids)))
    return pd.DataFrame(rows, columns=["layer", "head", "kv_group", "copying", "hits", "n"])


class OVCopyingScorer(WeightsScorer):
    """Weights only: every head computed once, from the weights (module docstring)."""

    analysis = NAME
    sample = SAMPLE

    def compute(self, model, tokenizer, layers, stack, seed: int) -> dict:
        """The record the run's summary keeps: every head's numbers and how they were drawn."""
        from headprobe.model.unembed import unembedding

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
        f"score (sum Re lambda / sum |lambda|, Elhage et al. 2021) and copy rate (share of {SAMPLE:,} sampled "
        f"tokens whose own id is in the top {TOP_K} of their row, Wilson 95% interval; METHODS §9)",
        tables={f"{NAME}_heads": ov_table},
        report="headprobe.studies.ov_copying.report:ov_section",
    )
)
