"""The OV circuit's numbers of every head, from the weights (the `ov_copying` analysis's math).

    heads = ov_heads(model, tokens)          # per head: copying score, copy-rate hits over `tokens`

The module docstring of `headprobe.studies.ov_copying.analysis` defines the numbers; this module
computes them with torch (the analysis imports it only when it computes, so a report reading
the results imports no torch).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import torch

from headprobe.extend import UsageError
from headprobe.model.discovery import attention_sites
from headprobe.model.sites import output_weight, value_weight
from headprobe.model.unembed import fit_norm, unembedding
from headprobe.studies.ov_copying.counts import NAME, TOP_K

VOCAB_BLOCK = 2048  # vocabulary columns per logit block
ROW_BLOCK = 128  # sampled tokens per logit block of one head: [128, 2048] float32, 1 MiB
FIRST_BLOCK = 4  # the first block, every head at once: 4 MiB a product (fewer tokens)


def copying_score(core: torch.Tensor) -> float:
    """sum Re(lambda) / sum |lambda| over the eigenvalues of a square matrix ([d_head, d_head])."""
    eig = torch.linalg.eigvals(core.double())  # [d_head] complex
    total = eig.abs().sum()
    return float(eig.real.sum() / total) if total > 0 else float("nan")


def own_logits(read: torch.Tensor, own_out: torch.Tensor) -> torch.Tensor:
    """[head, sample]: each sampled token's own logit, read[h, i] . own_out[h, :, i] (read
    [head, sample, d_head]; own_out [head, d_head, sample], the output columns of the sampled
    ids), off the diagonals of `ROW_BLOCK`-square products: a logit block's arithmetic."""
    blocks = [
        torch.diagonal(read[:, s : s + ROW_BLOCK] @ own_out[..., s : s + ROW_BLOCK], 0, 1, 2)
        for s in range(0, read.shape[1], ROW_BLOCK)
    ]
    return torch.cat(blocks, dim=1)  # [head, sample]


def rivals(read: torch.Tensor, out: torch.Tensor, own: torch.Tensor, column: torch.Tensor):
    """[head, rows]: how many logits of one vocabulary block are >= each token's own logit, its
    own column left out (`column` [rows]: the token's id less the block's first; outside the
    block where the id is elsewhere); read [head, rows, d_head], out [head, d_head, block],
    own [head, rows]."""
    logits = read @ out  # [head, rows, block]
    inside = ((column >= 0) & (column < out.shape[-1])).nonzero()[:, 0]  # rows whose id is here
    logits[:, inside, column[inside]] = -torch.inf  # a token is not its own rival
    return (logits >= own[..., None]).sum(-1)  # [head, rows]


def copy_hits(read, w_o, unembed, tokens, k: int = TOP_K) -> torch.Tensor:
    """[head]: per head, how many sampled tokens t have their own id among the top k of their
    logits read[h, t] @ w_o[h] @ unembed: read [head, sample, d_head] (W_E[t] g_attn W_V^h),
    w_o [head, d_head, hidden] (W_O^h), unembed [hidden, vocab] (diag(g_final) W_U), tokens
    [sample] (ids).

    A token is a hit when fewer than k other logits are >= its own (at most k logits >= it,
    itself included: the module docstring's rank). The rank is counted, not sorted for: a
    [sample, vocab] matrix of logits per head and a top-k over it are hundreds of MB that go
    through memory several times, so the logits are made from the low-rank factors a block of
    `VOCAB_BLOCK` columns by `ROW_BLOCK` tokens at a time (1 MiB: it stays in cache) and each
    is only compared with the token's own logit, the same float32 products as a whole row
    (`own_logits`). A token with k rivals is a miss whatever the rest holds, so later blocks
    skip it: the first block, taken for every head at once (`FIRST_BLOCK` MiB a product, so
    fewer tokens), settles most tokens of a head that does not copy them; the rest of the
    vocabulary is read only for the tokens still open, head by head, each block's
    W_O^h g_final W_U made once for the layer's open heads."""
    if not len(tokens):
        return torch.zeros(len(w_o), dtype=torch.long)
    own = own_logits(read, w_o @ unembed[:, tokens])  # [head, sample]
    found = torch.zeros(own.shape, dtype=torch.long, device=own.device)  # [head, sample]: rivals
    for start in range(0, unembed.shape[1], VOCAB_BLOCK):
        open_ = found < k  # [head, sample]
        heads = open_.any(1).nonzero()[:, 0].tolist()
        if not heads:
            break
        out = w_o[heads] @ unembed[:, start : start + VOCAB_BLOCK]  # [open head, d_head, block]
        if start == 0:  # every token open: the heads at once
            step = max(1, FIRST_BLOCK * ROW_BLOCK // len(heads))
            for s in range(0, len(tokens), step):
                rows = slice(s, s + step)
                found[:, rows] = rivals(read[:, rows], out, own[:, rows], tokens[rows])
            continue
        for head, head_out in zip(heads, out):
            for rows in open_[head].nonzero()[:, 0].split(ROW_BLOCK):
                count = rivals(
                    read[head, rows][None],
                    head_out[None],
                    own[head, rows][None],
                    tokens[rows] - start,
                )  # [1, rows]
                found[head, rows] += count[0]
    return (found < k).sum(1)


def need_value(model, site) -> None:
    """One line naming the family where a site's value projection cannot be found."""
    if getattr(site, "value", None) is None:
        raise UsageError(
            f"{NAME}: {type(model).__name__} ({site.name or site.stack}): its value projection "
            "cannot be found, so its OV circuit cannot be read"
        )


def ov_weights(model, site) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_V [kv_head, hidden, d_head], W_O [head, d_head, hidden]) of one site, float32; one line
    naming the family where its value projection cannot be found."""
    need_value(model, site)
    w_v = value_weight(site).detach().float()  # [kv_head, hidden, d_head]
    w_o = output_weight(site).detach().float()  # [head, d_head, hidden]
    return w_v, w_o


def attention_gain(site, hidden: int) -> torch.Tensor:
    """g_attn [hidden] float32: the gain of the norm the site's values read (1 where none)."""
    norm = getattr(site, "norm_in", None)
    return fit_norm(norm, hidden)[1] if norm is not None else torch.ones(hidden)


def across_cores(work, items) -> list:
    """[work(item) for item in items], in order: on CPU in torch's intra-op thread count of
    threads, each with one intra-op thread (restored after), grad off and inference mode as the
    caller's. The logit blocks are small products: split across threads, every one of them ends
    in a wait for the slowest thread, and on cores that other jobs share a thread descheduled
    for a time slice stalls them all (SmolLM2 at a load of 9 on 2 cores: 224 s, against 36 s
    for two threads of one layer each); on a GPU, or with one thread, one after another."""
    threads = torch.get_num_threads()
    if threads == 1 or not items:
        return [work(item) for item in items]
    inference = torch.is_inference_mode_enabled()

    def alone(item):
        with torch.no_grad(), torch.inference_mode(inference):
            return work(item)

    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(alone, items))
    finally:
        torch.set_num_threads(threads)


@torch.no_grad()
def ov_heads(model, tokens, layers=None, stack: str | None = None) -> pd.DataFrame:
    """Per head of the stack's `layers` (default all): copying score, copy-rate hits over the
    sampled `tokens` (ids), n (see the module docstring). Layers run side by side on CPU
    (`across_cores`)."""
    out = unembedding(model, NAME, need_norm=False)
    sites = attention_sites(model).of(stack)
    layers = list(range(len(sites)) if layers is None else layers)
    device = out.w_e.device
    w_e, w_u = out.w_e.float(), out.w_u.float()  # [vocab, hidden] each
    g_final = out.gain.to(device)  # [hidden]
    ids = torch.as_tensor(np.asarray(tokens), dtype=torch.long, device=device)  # [sample]
    bridge = w_u.T @ w_e  # [hidden, hidden]: W_U (as [hidden, vocab]) times W_E
    unembed = (w_u * g_final).T  # [hidden, vocab]: diag(g_final) W_U
    for layer in layers:  # refused before any work
        need_value(model, sites[layer])
    # the norms run here, not in the threads (a dispatched model's hooks are not shared)
    gains = [attention_gain(sites[layer], w_e.shape[1]).to(device) for layer in layers]

    def layer_rows(index: int) -> list[tuple]:
        layer, g_attn = layers[index], gains[index]
        w_v, w_o = (x.to(device) for x in ov_weights(model, sites[layer]))
        middle = g_final[:, None] * bridge * g_attn[None, :]  # [hidden, hidden]
        embedded = w_e[ids] * g_attn  # [sample, hidden]
        heads = w_o.shape[0]
        kv = [head // (heads // w_v.shape[0]) for head in range(heads)]  # each head's KV group
        reads = [embedded @ w_v[group] for group in range(w_v.shape[0])]  # [sample, d_head] each
        hits = copy_hits(torch.stack([reads[group] for group in kv]), w_o, unembed, ids)  # [head]
        return [
            (layer, head, group, copying_score(w_o[head] @ middle @ w_v[group]), int(hits[head]))
            for head, group in enumerate(kv)  # the core: [d_head, d_head]
        ]

    parallel = across_cores if device.type == "cpu" else lambda work, items: list(map(work, items))
    rows = [row + (len(ids),) for part in parallel(layer_rows, range(len(layers))) for row in part]
    return pd.DataFrame(rows, columns=["layer", "head", "kv_group", "copying", "hits", "n"])
