"""Weights-only composition scores (Elhage et al. 2021; METHODS §18 "Weights only").

    table = composition_weights(model, tokenizer_ids=[[id]])   # every (sender, receiver, channel)

Q-, K- and V-composition of sender s into receiver r, `||A B||_F / (||A||_F ||B||_F)`, with
W_OV = W_V W_O and W_QK = W_Q W_K^T (x W as the projections compute, rows are positions):

    q: A = W_OV^s, B = W_QK^r          k: A = W_QK^r, B = (W_OV^s)^T          v: A = W_OV^s, B = W_OV^r

The gain of each head's own input norm is folded into its W_Q, W_K, W_V (pre-norm families),
grouped-query heads read their key/value group's W_K, W_V (expanded to query heads), position
encoding is ignored. Every norm is computed in d_head space: ||V M K^T||_F^2 = tr(V^T V M K^T K
M^T), so no hidden x hidden matrix is formed. Beside each score, the same score for Gaussian
factors of the same shapes: mean and sd over `draws` seeded draws.
"""

from __future__ import annotations

import pandas as pd
import torch

from headprobe.model.channels import projection_weights
from headprobe.model.layer_cache import clean_cache
from headprobe.model.sites import output_weight
from headprobe.model.unembed import fit_norm

DRAWS = 20


def _ratio(left, m, right, a2, b2) -> torch.Tensor:
    """sqrt(tr(L M R M^T) / (a2 b2)): left [.., i, i], m [.., i, j], right [.., j, j]."""
    top = torch.einsum("...ij,...jk,...kl,...il->...", left, m, right, m)
    return (top.clamp_min(0) / (a2 * b2)).sqrt()


def head_factors(model, cache, layer: int) -> dict:
    """Per query head of `layer`: Q, K, V [head, hidden, d_head] (gain folded, GQA expanded), O
    [head, d_head, hidden], float64."""
    site = cache.sites[layer]
    q, k, v = projection_weights(model, cache, layer)
    groups = site.heads // k.shape[0]
    k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
    gain = 1.0
    if site.norm_in is not None:
        _, gain, _ = fit_norm(site.norm_in, q.shape[1])
        gain = gain.to(q.device)[None, :, None]
    o = output_weight(site).detach().to(q.device)
    return {n: (t * (gain if n != "O" else 1.0)).double() for n, t in zip("QKVO", (q, k, v, o))}


def scores(send: dict, recv: dict) -> dict:
    """channel -> [sender head, receiver head] composition scores."""
    s, r = {n: t[:, None] for n, t in send.items()}, {n: t[None] for n, t in recv.items()}
    gram = lambda a, b: a.transpose(-1, -2) @ b  # [.., d_head, d_head]
    gv_s, oo_s = gram(s["V"], s["V"]), s["O"] @ s["O"].transpose(-1, -2)
    ov2 = torch.einsum("...ij,...ji->...", gv_s, oo_s)  # ||W_OV^s||^2
    gq, gk, gv_r = gram(r["Q"], r["Q"]), gram(r["K"], r["K"]), gram(r["V"], r["V"])
    oo_r = r["O"] @ r["O"].transpose(-1, -2)
    qk2 = torch.einsum("...ij,...ji->...", gq, gk)  # ||W_QK^r||^2
    ovr2 = torch.einsum("...ij,...ji->...", gv_r, oo_r)
    return {
        "q": _ratio(gv_s, s["O"] @ r["Q"], gk, ov2, qk2),
        "k": _ratio(gq, r["K"].transpose(-1, -2) @ s["O"].transpose(-1, -2), gv_s, qk2, ov2),
        "v": _ratio(gv_s, s["O"] @ r["V"], oo_r, ov2, ovr2),
    }


def gaussian_null(hidden: int, d_head: int, draws: int = DRAWS, seed: int = 0) -> dict:
    """channel -> (mean, sd) of the score for Gaussian factors of these shapes, `draws` draws."""
    gen = torch.Generator().manual_seed(seed)
    got = {c: [] for c in "qkv"}
    for _ in range(draws):
        f = lambda *shape: torch.randn(2, *shape, generator=gen, dtype=torch.float64)
        send = {
            "Q": f(hidden, d_head),
            "K": f(hidden, d_head),
            "V": f(hidden, d_head),
            "O": f(d_head, hidden),
        }
        recv = {n: t[1:] for n, t in send.items()}
        for c, v in scores({n: t[:1] for n, t in send.items()}, recv).items():
            got[c].append(float(v[0, 0]))
    return {
        c: (float(torch.tensor(v).mean()), float(torch.tensor(v).std())) for c, v in got.items()
    }


def composition_weights(model, token_id: int, stack=None, draws: int = DRAWS, seed: int = 0):
    """DataFrame: layer, head (receiver), channel, sender_layer, sender_head, score, null_mean,
    null_sd, z. `token_id`: any ordinary token (the one-piece input the weights are read with)."""
    device = next(model.parameters()).device
    cache = clean_cache(model, {"input_ids": torch.tensor([[token_id]], device=device)}, stack)
    factors = [head_factors(model, cache, l) for l in range(len(cache.sites))]
    hidden, d_head = factors[0]["Q"].shape[1:]
    null = gaussian_null(hidden, d_head, draws, seed)
    rows = []
    for layer in range(1, len(factors)):
        for sender in range(layer):
            for c, v in scores(factors[sender], factors[layer]).items():
                mean, sd = null[c]
                for hs in range(v.shape[0]):
                    for hr in range(v.shape[1]):
                        x = float(v[hs, hr])
                        rows.append((layer, hr, c, sender, hs, x, mean, sd, (x - mean) / sd))
    columns = ["layer", "head", "channel", "sender_layer", "sender_head", "score"]
    return pd.DataFrame(rows, columns=columns + ["null_mean", "null_sd", "z"])
