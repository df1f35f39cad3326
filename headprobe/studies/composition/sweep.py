"""The whole composition over a stream of batches, summed per unit (METHODS §5, §18).

    batches = probe_batches(model, tokenizer, length=50, n=20)   # or iter_batches(prepare(...))
    means = head_means(model, batches, per_position=True)            # mean ablation's values
    sums = composition_sums(model, batches, baseline=means)           # every receiver, every sender
    sums.pattern           # [unit, edge]: total variation summed over the unit's scored rows
    sums.rows              # [unit]: the scored rows
    sums.edges[e]          # ((sender layer, sender head), (layer, head), channel)
    exact, tokens = exact_sums(model, batches, sample, baseline=means)  # [unit, edge], [unit]
    sums = composition_sums(model, batches, baseline=resampled(baselines))   # resample ablation
    sums = composition_sums(model, batches, senders=("heads", "mlp", "embed"))  # MLPs, embeddings

Per batch: one clean pass kept per layer (`clean_cache`, on the inputs the objective reads), one
backward pass for the objective's gradient at every head's slice (`first_order`; none for the
representation change, whose gradient there is 0: `first_order.has_estimate`), then per
receiver layer every sender at once (`intervention.edge_sums`, blocks sized from memory:
`memory_budget`), each layer's stream and clean call freed once it is done (the layers above
read its heads' slices only). Each batch row's sums are added into its unit's (a unit: the example's
`unit`, a document or a probe sequence), so nothing per row is kept. Rows: a sentence's word
pieces; on the repeated-random probe, the repeated half's. Role targets: the previous token on
every input, induction on the repeated-random probe (`intervention.role_targets`); `scores`
holds every head's clean attention to each role's targets, summed per unit, so a role's best
head can be named from the same run.

Ablation values (`baseline`): None (zero), a tensor as `edge_sums` takes it (mean: per head,
or per position and head), or a function of (model, batch) giving the batch's rows that are
scored and their own values [row, layer, piece, head, d_head]: `resampled` (resample ablation,
METHODS §8: each row's partner's slices, from `studies.ablation.kinds.Baselines`; a row
without a partner is left out, a batch with none skipped). With MLP or embeddings senders
(`senders`), a `senders.Baseline` holds every kind's values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import torch

from headprobe.extend import LOSS_WORDS
from headprobe.inputs.align import WORD
from headprobe.inputs.probes import REPEATED_RANDOM
from headprobe.model.channels import CHANNELS, clean_attention
from headprobe.model.discovery import attention_sites
from headprobe.model.layer_cache import check_supported, clean_cache
from headprobe.model.objectives import Objective
from headprobe.studies.ablation.kinds import rows_of
from headprobe.studies.composition.first_order import (
    has_estimate,
    input_gradients,
    slice_gradients,
)
from headprobe.studies.composition.intervention import BUDGET, edge_sums, role_targets
from headprobe.studies.composition.path_patching import clean_pass, exact_rows
from headprobe.studies.composition.run_options import sender_kind
from headprobe.studies.composition.senders import Baseline, every_sender, partner_writes
from headprobe.studies.induction.analysis import NAME as INDUCTION
from headprobe.studies.previous_token.analysis import NAME as PREVIOUS_TOKEN

# pieces (rows x length) one step of the sweep or the check holds at most (`row_blocks`): on
# SmolLM2 the repeated-random probe 20 x 50 (101 pieces a row) in one block of 20 peaked at
# 3.0 GB, in blocks of 10 at 2.2 GB and faster (benchmarks/README.md, "Composition")
ROW_PIECES = 1024


@dataclass
class UnitSums:
    """Per unit sums of every edge's effects (see the module docstring)."""

    units: list[str]  # unit ids, in the order of the unit axis
    edges: list[tuple]  # ((sender layer, sender head), (layer, head), channel)
    pattern: np.ndarray  # [unit, edge]
    output: np.ndarray  # [unit, edge]
    rows: np.ndarray  # [unit] scored rows
    estimate: np.ndarray | None = None  # [unit, edge] first-order objective change, summed
    tokens: np.ndarray | None = None  # [unit] pieces the objective is summed over
    role: dict = field(default_factory=dict)  # name -> [unit, edge] drop of the role's attention
    role_rows: dict = field(default_factory=dict)  # name -> [unit] rows with a role target
    scores: dict = field(default_factory=dict)  # name -> [unit, layer, head] clean attention


def memory_budget(device=None) -> int:
    """Bytes for one block of senders' intermediate tensors: an eighth of the free memory of
    `device` (CUDA), else of the machine's available memory, at most `BUDGET`."""
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            free = 8 * BUDGET
    return int(max(16 * 2**20, min(BUDGET, free // 8)))


def probe_batches(model, tokenizer, length: int = 50, n: int = 20, batch_size: int = 20, seed=0):
    """The repeated-random probe (`inputs.probes`), `n` sequences of `length` tokens twice, as
    a list of `Batch`es (`inputs.batching`) on the model's device."""
    from headprobe.inputs.batching import iter_batches, prepare
    from headprobe.inputs.probes import repeated_random
    from headprobe.model.padding import padding_id

    examples = list(repeated_random(tokenizer, length=length, n=n, seed=seed))
    prepared = prepare(examples, tokenizer, max_length=2 * length + 8)
    device = next(model.parameters()).device
    return list(iter_batches(prepared, batch_size, padding_id(tokenizer), device=device))


def repeated_half(batch) -> tuple | None:
    """([batch, 1] the first piece of each row's repeated half, [batch, 1] its period, the
    probe's length) on the repeated-random probe, else None."""
    metas = [e.meta for e in getattr(batch, "examples", [])]
    if not metas or any(m.get("probe") != REPEATED_RANDOM for m in metas):
        return None
    length = torch.tensor([m[LOSS_WORDS][0] - 1 for m in metas])[:, None]  # [batch, 1]
    word = batch.piece_word.cpu()  # [batch, piece]
    return (word < length).sum(-1, keepdim=True), length  # before it: BOS and the first half


def scored_rows(batch, half: torch.Tensor | None) -> torch.Tensor:
    """[batch, piece] float: the receivers' scored query rows (METHODS §18)."""
    kind = batch.piece_kind.cpu()
    rows = kind == WORD
    if half is not None:
        rows &= torch.arange(kind.shape[1])[None, :] >= half[0]
    return rows.float()


def batch_roles(ids: torch.Tensor, half) -> dict:
    """name -> [batch, piece] each row's role target (-1: none)."""
    out = {PREVIOUS_TOKEN: role_targets(PREVIOUS_TOKEN, ids.cpu())}
    if half is not None:
        out[INDUCTION] = role_targets(INDUCTION, ids.cpu(), *half)
    return out


def _receivers(cache, receivers) -> dict:
    """layer -> [head] (default: every head above the first layer)."""
    if receivers is None:
        receivers = [
            (l, h) for l in range(1, len(cache.sites)) for h in range(cache.sites[l].heads)
        ]
    out: dict = {}
    for l, h in receivers:
        out.setdefault(int(l), []).append(int(h))
    return {l: sorted(set(hs)) for l, hs in sorted(out.items())}


def clean_scores(model, cache, targets: dict, rows: torch.Tensor) -> dict:
    """name -> [batch, layer, head]: each head's clean attention to the row's role target,
    summed over the scored rows with a target."""
    out = {name: [] for name in targets}
    for layer in range(len(cache.sites)):
        probs, _ = clean_attention(model, cache, layer)  # [batch, head, query, key]
        for name, t in targets.items():
            keep = (rows * (t >= 0)).to(probs)  # [batch, query]
            index = t.clamp_min(0).to(probs.device)[:, None, :, None]
            got = probs.gather(-1, index.expand(-1, probs.shape[1], -1, 1))[..., 0]
            out[name].append(torch.einsum("bhq,bq->bh", got, keep))
    return {name: torch.stack(v, 1).cpu().numpy() for name, v in out.items()}


def resampled(baselines, stack=None, senders=("heads",)):
    """Resample ablation's per-batch values from `baselines` (a `studies.ablation.kinds.Baselines`
    that has read the run's inputs with "resample" among its kinds): f(model, batch) -> (the
    batch's rows with a partner, [row, layer, piece, head, d_head] their partners' slices; with
    MLP or embeddings senders a `senders.Baseline` of the partners' slices and writes)."""

    def values(model, batch):
        kept = baselines.kept("resample", batch)
        if not kept:
            return None, None
        rows = rows_of(batch, kept)
        heads = baselines.of("resample", model, rows, stack)
        if tuple(senders) == ("heads",):
            return rows, heads
        embed, mlp = partner_writes(model, baselines, rows, attention_sites(model).resolve(stack))
        return rows, Baseline(heads, mlp, embed)

    return values


def row_blocks(batch):
    """`batch` in consecutive blocks of its rows, each of at most `ROW_PIECES` pieces in all (at
    least one row): what a sweep step holds (the clean cache, the gradients, a block of senders)
    grows with rows x pieces, and the sums per unit do not depend on the blocks."""
    per = max(1, ROW_PIECES // max(1, int(batch.input_ids.shape[1])))
    n = len(batch.examples)
    if n <= per:
        yield batch
        return
    for start in range(0, n, per):
        yield rows_of(batch, list(range(start, min(start + per, n))))


def batch_baseline(model, batch, baseline):
    """(the batch's scored rows, their ablation values): a per-batch `baseline` (`resampled`)
    called, any other one as it is. The rows are None where none is scored."""
    if callable(baseline) and not torch.is_tensor(baseline):
        return baseline(model, batch)
    return batch, baseline


def batch_sums(model, batch, receivers, baseline, objective, stack, budget, senders=("heads",)):
    """One batch's row sums: {"edges", "pattern", "output", "estimate", "role", "rows",
    "role_rows", "tokens", "scores"}, arrays [batch, ...] (edges: the edge list; no "estimate"
    where the objective has none, `first_order.has_estimate`). senders: the kinds
    (`run_options.SENDER_KINDS`)."""
    targets = objective.targets(model, batch)
    cache = clean_cache(model, targets.inputs, stack, mlp="mlp" in senders)
    half = repeated_half(batch)
    rows = scored_rows(batch, half).to(cache.x[0].device)  # [batch, piece]
    ids = targets.inputs["input_ids"]
    roles = {k: v.to(rows.device) for k, v in batch_roles(ids, half).items()}
    estimated = has_estimate(objective)
    grad_z = slice_gradients(model, cache, objective, targets) if estimated else None
    got: dict = {"edges": [], "pattern": [], "output": [], "estimate": []}
    got["role"] = {name: [] for name in roles}
    with torch.no_grad():
        got["scores"] = clean_scores(model, cache, roles, rows)
        layers = _receivers(cache, receivers)
        for layer in set(range(len(cache.sites))) - set(layers):
            _done(cache, layer)  # no receiver here: only its heads' slices are read (senders)
        for layer, heads in layers.items():
            grads = None
            if estimated:
                grads = input_gradients(model, cache, layer, grad_z, heads, budget)
            these = every_sender(cache, layer, senders)
            s = edge_sums(model, cache, layer, these, baseline, rows, roles, heads, budget, grads)
            del grads
            _done(cache, layer)
            got["edges"] += [
                (snd, (layer, h), c) for snd in s.senders for h in heads for c in CHANNELS
            ]
            flat = lambda t: t.flatten(1).cpu().numpy()  # [batch, sender * head * channel]
            got["pattern"].append(flat(s.pattern))
            got["output"].append(flat(s.output))
            if estimated:
                got["estimate"].append(flat(s.estimate))
            for name in roles:
                got["role"][name].append(flat(s.role[name]))
        tokens = objective.pieces(targets)  # [batch]
    cat = lambda v: np.concatenate(v, 1)
    summed = ("pattern", "output", "estimate") if estimated else ("pattern", "output")
    out = {k: cat(got[k]) for k in summed}
    out["role"] = {name: cat(v) for name, v in got["role"].items()}
    out["role_rows"] = {n: (rows * (t >= 0)).sum(-1).cpu().numpy() for n, t in roles.items()}
    out.update(edges=got["edges"], rows=rows.sum(-1).cpu().numpy(), scores=got["scores"])
    out["tokens"] = tokens.cpu().numpy()
    return out


def _done(cache, layer: int) -> None:
    """Layer `layer` done as a receiver: its stream, its clean call and its projections' outputs
    freed (the layers above read its heads' slices, and MLP writes, only). The stream into the
    first layer stays: it is the embeddings' write (`senders.write_changes`)."""
    for kept in (
        (cache.x, cache.calls, cache.shortcuts) if layer else (cache.calls, cache.shortcuts)
    ):
        kept.pop(layer, None)


class _ByUnit:
    """Adds per row arrays [batch, ...] into per unit arrays [unit, ...]."""

    def __init__(self):
        self.units: list[str] = []
        self.index: dict[str, int] = {}
        self.sums: dict = {}

    def add(self, units, key: str, values: np.ndarray) -> None:
        for u in units:
            if u not in self.index:
                self.index[u] = len(self.units)
                self.units.append(u)
        at = np.array([self.index[u] for u in units])
        total = self.sums.get(key)
        size = len(self.units)
        if total is None or total.shape[0] < size:
            grown = np.zeros((size, *values.shape[1:]))
            if total is not None:
                grown[: total.shape[0]] = total
            total = grown
        np.add.at(total, at, values)
        self.sums[key] = total

    def get(self, key: str) -> np.ndarray:
        total = self.sums[key]
        if total.shape[0] < len(self.units):
            total = np.concatenate(
                [total, np.zeros((len(self.units) - total.shape[0], *total.shape[1:]))]
            )
        return total


def composition_sums(
    model,
    batches,
    receivers=None,
    baseline=None,
    objective: Objective | None = None,
    stack: str | None = None,
    budget: int | None = None,
    progress=None,
    senders=("heads",),
) -> UnitSums:
    """See the module docstring. receivers: [(layer, head)] (default every head above the first
    layer); baseline: the ablation values (module docstring: None for zero, a tensor, or
    `resampled(...)`); objective: `Objective.for_model(model)` by default; progress: a callable given each
    batch's index, or None; senders: the kinds of sender, of heads, mlp, embed
    (`senders.every_sender`)."""
    stack = check_supported(model, stack)
    objective = objective or Objective.for_model(model, stack=stack)
    budget = budget or memory_budget(next(model.parameters()).device)
    acc, edges = _ByUnit(), None
    for i, whole in enumerate(batches):
        for batch in row_blocks(whole):
            batch, values = batch_baseline(model, batch, baseline)
            if batch is None:
                continue
            got = batch_sums(model, batch, receivers, values, objective, stack, budget, senders)
            units = [e.unit for e in batch.examples]
            if edges is not None and got["edges"] != edges:
                raise ValueError("composition_sums: batches gave different edges")
            edges = got["edges"]
            for key in ("pattern", "output", "estimate", "rows", "tokens"):
                if key in got:
                    acc.add(units, key, got[key])
            for group in ("role", "role_rows", "scores"):
                for name, v in got[group].items():
                    acc.add(units, f"{group}:{name}", v)
        if progress is not None:
            progress(i)
    if edges is None:
        raise ValueError("composition_sums: no batches")
    pick = lambda group: {
        k.split(":", 1)[1]: acc.get(k) for k in acc.sums if k.startswith(group + ":")
    }
    return UnitSums(
        acc.units,
        edges,
        acc.get("pattern"),
        acc.get("output"),
        acc.get("rows"),
        acc.get("estimate") if "estimate" in acc.sums else None,
        acc.get("tokens"),
        pick("role"),
        pick("role_rows"),
        pick("scores"),
    )


def exact_sums(model, batches, edges, baseline=None, objective=None, stack=None):
    """(units, [unit, edge] exact objective change summed per unit, [unit] pieces): exact path
    patching (`path_patching.exact_rows`) of `edges` over the stream."""
    stack = check_supported(model, stack)
    objective = objective or Objective.for_model(model, stack=stack)
    acc = _ByUnit()
    for batch in (part for whole in batches for part in row_blocks(whole)):
        batch, values = batch_baseline(model, batch, baseline)
        if batch is None:
            continue
        targets = objective.targets(model, batch)
        mlp = any(sender_kind(*e[0]) == "mlp" for e in edges)
        cache, kept = clean_pass(model, targets.inputs, stack, mlp=mlp)
        receivers = {layer for _, (layer, _), _ in edges}
        for layer in set(range(len(cache.sites))) - receivers:
            _done(cache, layer)  # the patched passes read its heads' slices only
        delta, tokens = exact_rows(model, cache, objective, targets, edges, values, kept)
        del cache, kept  # before the next batch's
        units = [e.unit for e in batch.examples]
        acc.add(units, "exact", delta.cpu().numpy())
        acc.add(units, "tokens", tokens.cpu().numpy())
    return acc.units, acc.get("exact"), acc.get("tokens")
