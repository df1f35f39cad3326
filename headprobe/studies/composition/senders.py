"""Senders that are not heads (METHODS §18, `--senders heads,mlp,embed`): each earlier layer's MLP
(its write to the residual stream) and the embeddings (what enters the first layer).

    cache = clean_cache(model, inputs, stack, mlp=True)        # model.layer_cache
    senders = every_sender(cache, layer=3, kinds=("heads", "mlp", "embed"))
    # [(0, 0), ..., (2, 8), (-1, -1), (0, -1), (1, -1), (2, -1)]: heads, embed, MLP 0 .. 2
    base = Baseline(heads=head_means, mlp=mlp_means, embed=embed_means)   # mean ablation
    d = write_changes(cache, 3, [(-1, -1), (1, -1)], base)    # [sender, batch, piece, hidden]

A sender is the pair (sender_layer, sender_head) of the tables (`run_options`: an MLP is
(layer, MLP_HEAD), the embeddings EMBED). The change of the stream entering receiver layer
`to`, for the intervention and for path patching, is b - w carried as a head's is:

- MLP of layer l: w = its write (`LayerCache.mlp_out`), b its ablation value; a norm the family
  applies to the write before the residual add (Gemma-2/3) is recomputed on b, as a head's write
  norm is; post-norm families pass the norms of layer l after the MLP and every norm of the
  layers above, each frozen at its clean scale (`LayerCache.carried`).
- Embeddings: w = x[0], the residual stream entering the first layer (token, position and
  whatever the family adds before layer 0: type embeddings, a scale, a norm, a projection);
  post-norm families pass every norm from layer 0 up, frozen.

Ablation values (`Baseline`, one tensor per kind, None for zero): mean, the write averaged over
the scored inputs' pieces (per position on a fixed-length probe, as the heads' means:
`write_means`); resample, the partner input's own write (`partner_writes`). A sender's write
is a whole hidden vector, so these senders go through the receiver layer's general path (its
norm and projections on x + d), in blocks of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headprobe.studies.composition.run_options import EMBED, MLP_HEAD, sender_kind

KIND_OF = {"heads": "head", "mlp": "mlp", "embed": "embed"}  # --senders kind -> sender_kind


@dataclass
class Baseline:
    """The ablation values of every kind of sender (None: zero ablation of that kind)."""

    heads: torch.Tensor | None = None  # as `intervention.edge_sums` takes a head baseline
    mlp: torch.Tensor | None = (
        None  # [layer, hidden], [layer, piece, hidden], [row, layer, piece, hidden]
    )
    embed: torch.Tensor | None = None  # [hidden], [piece, hidden] or [row, piece, hidden]


def heads_of(baseline):
    """The heads' part of a baseline (a bare tensor is the heads' own)."""
    return baseline.heads if isinstance(baseline, Baseline) else baseline


def every_sender(cache, layer: int, kinds=("heads",)) -> list[tuple[int, int]]:
    """The senders of receiver layer `layer`: every head of the layers below (layer-major), then
    the embeddings, then each MLP below (kinds: of `run_options.SENDER_KINDS`)."""
    out = []
    if "heads" in kinds:
        out += [(l, h) for l in range(layer) for h in range(cache.sites[l].heads)]
    if "embed" in kinds:
        out.append(EMBED)
    if "mlp" in kinds:
        out += [(l, MLP_HEAD) for l in range(layer)]
    return out


def is_head(sender) -> bool:
    return sender_kind(*sender) == "head"


def _value(values, like: torch.Tensor, layer: int | None) -> torch.Tensor:
    """The ablation value broadcast like the write [batch, piece, hidden]: zeros for None;
    `layer` indexes an MLP's values ([layer, ...] or [row, layer, ...])."""
    if values is None:
        return torch.zeros_like(like)
    if layer is not None:
        values = values[:, layer] if values.dim() == 4 else values[layer]
    return values.to(like).expand_as(like)


def write_changes(cache, to: int, senders, baseline=None) -> torch.Tensor:
    """[sender, batch, piece, hidden]: b - w of each MLP or embeddings sender as it reaches the
    stream entering layer `to` (module docstring)."""
    base = baseline if isinstance(baseline, Baseline) else Baseline(heads=baseline)
    out = []
    for layer, head in senders:
        if (layer, head) == EMBED:
            w = cache.x[0]  # [batch, piece, hidden]
            d = cache.carried(0, to, _value(base.embed, w, None) - w)  # [batch, piece, hidden]
        elif head == MLP_HEAD:
            if layer not in cache.mlp_out:
                raise ValueError(
                    "write_changes: the cache has no MLP writes (clean_cache(mlp=True))"
                )
            w = cache.mlp_out[layer].float()  # [batch, piece, hidden]
            d = _value(base.mlp, w, layer) - w  # [batch, piece, hidden]
            d = cache.mlp_change(layer, d).float()  # its norm recomputed (Gemma-2/3)
            d = cache.carried(layer, to, d, cache.mlp_after.get(layer, 0))  # [batch, piece, hidden]
        else:
            raise ValueError(f"write_changes: sender {layer}-{head} is a head")
        out.append(d)
    return torch.stack(out)  # [sender, batch, piece, hidden]


@torch.no_grad()
def sender_writes(model, inputs: dict, stack: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(embed [batch, piece, hidden], mlp [batch, layer, piece, hidden]) float32: the writes of
    one clean pass over `inputs` (the model's keyword arguments)."""
    from headprobe.model.layer_cache import clean_cache

    cache = clean_cache(model, inputs, stack, mlp=True)
    zero = torch.zeros_like(cache.x[0])  # a layer without one (the last's reaches no receiver)
    mlp = [
        cache.mlp_out[l].float() if l in cache.mlp_out else zero for l in range(len(cache.sites))
    ]
    return cache.x[0], torch.stack(mlp, 1)  # [batch, piece, hidden], [batch, layer, piece, hidden]


def write_means(model, batches, stack: str, per_position: bool = False) -> tuple:
    """(embed [hidden] or [piece, hidden], mlp [layer, hidden] or [layer, piece, hidden]): each
    write averaged over every non-padding piece of `batches` (mean ablation, as `head_means`;
    `per_position`: at each position, inputs of one length)."""
    from headprobe.model.gates import model_inputs, query_mask
    from headprobe.model.sites import model_device

    sums, count = None, 0
    for batch in batches:
        inputs = model_inputs(batch, model_device(model), model, stack)
        embed, mlp = sender_writes(model, inputs, stack)
        mask = query_mask(inputs, stack).to(torch.float64).cpu()  # [batch, piece]
        # both, weighted: [batch, 1 + layer, piece, hidden] (the embeddings, then each MLP)
        both = torch.cat([embed[:, None], mlp], 1).double().cpu()
        weighted = both * mask[:, None, :, None]
        part = weighted.sum(0) if per_position else weighted.sum((0, 2))  # [1 + layer, .., hidden]
        if per_position and sums is not None and part.shape != sums.shape:
            raise ValueError("write_means(per_position=True): inputs of different lengths")
        sums = part if sums is None else sums + part
        count = count + (mask.sum(0) if per_position else mask.sum())
    if sums is None or float(torch.as_tensor(count).min()) == 0:
        raise ValueError("write_means: no pieces in the batches")
    means = (sums / (count[None, :, None] if per_position else count)).float()  # as `part`
    return means[0], means[1:]  # embed, mlp


def partner_writes(model, baselines, batch, stack: str) -> tuple:
    """(embed, mlp) of the partners of `batch`'s kept rows (`sender_writes`)."""
    from headprobe.model.gates import model_inputs
    from headprobe.model.sites import model_device

    partner = baselines.partner_batch(batch)  # `studies.ablation.kinds.Baselines`
    return sender_writes(model, model_inputs(partner, model_device(model), model, stack), stack)


def read_write_means(model, tokenizer, examples, stack: str, per_position: bool) -> tuple:
    """`write_means` over `examples` tokenized and batched as the ablation study's means are
    (`studies.ablation.kinds.Baselines.read`): one extra pass over the run's inputs."""
    from headprobe.inputs.batching import iter_batches, prepare
    from headprobe.model.discovery import attention_sites
    from headprobe.model.padding import padding_id
    from headprobe.model.sites import model_device
    from headprobe.scoring.engine import max_length

    sites = attention_sites(model)
    prepared = prepare(list(examples), tokenizer, max_length(model, tokenizer))
    prepared.alignments = [sites.scoring_alignment(a, stack) for a in prepared.alignments]
    batches = iter_batches(prepared, 16, padding_id(tokenizer), device=model_device(model))
    return write_means(model, batches, stack, per_position)
