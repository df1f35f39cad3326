"""Beyond one process: data parallelism with torch.distributed, launched by torchrun.

    torchrun --nproc_per_node 2 -m headprobe run --treebank en_ewt-ud-dev.conllu --out results/
    torchrun --nnodes 2 --node_rank 0 --nproc_per_node 8 --rdzv_backend c10d \\
        --rdzv_endpoint HOST:29500 -m headprobe run ...            # the same on every node

No launcher of our own: torchrun starts one process per rank and sets `WORLD_SIZE`,
`RANK` and `LOCAL_RANK`; `setup` sees them and joins the process group (NCCL when the
rank runs on a GPU, `cuda:LOCAL_RANK`; gloo on CPUs). Without them (or with a world of
one) nothing here does anything, and a run is exactly the single-process run.

What each rank does (`headprobe.api.run` calls these):

- **deal**: every rank reads and tokenizes the whole corpus and makes the one-process run's
  batches (the engine's pool, `inputs.batching.Pool`, decides them from the corpus alone);
  rank r scores batches r, r + N, r + 2N, ... of them (round-robin, N = world size; `owns`).
  Each batch is a one-process batch, so the float sums inside it are the same; tokenizing is
  repeated on every rank (EWT dev: a fraction of a second), the model passes are not. A unit
  (document) may span ranks: its fold and bootstrap weights are functions of its id
  (METHODS §5), so its counts land in the same cells on whichever rank scores them, and
  tallies add linearly.
- **merge**: after every pass, the per-pass statistics (examples, words, skipped inputs)
  are gathered (`reduce_stats`); at the end the ranks agree on the union of their
  labels (`all_gather_object`), create the labels they lack, and sum every total of every
  tally with one all-reduce per dtype (`all_reduce_tallies`: the tensors of
  `Tally.tensors()`, flattened). Hits, trials, baseline hits and McNemar counts are whole
  numbers: the merged totals are bit-identical to a single process's. Summed attention
  mass (surface, token-pattern shares) agrees to float rounding (summation order).
- **write**: rank 0 builds the tables, the report and the results directory; the other
  ranks return None. No rank holds per-unit data of the whole corpus, so per-unit rows
  (`--keep-unit-counts`) and checkpoints (`--resume`, which would save one rank's counts)
  are refused under torchrun, as is `--device-map` (one model per rank, or one model
  over devices: not both).
"""

from __future__ import annotations

import atexit
import os
import re
from collections import Counter
from dataclasses import dataclass

import torch

ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK")


@dataclass(frozen=True)
class World:
    """This process's place: `size` processes, this is `rank` (`local_rank` on its node)."""

    size: int = 1
    rank: int = 0
    local_rank: int = 0
    backend: str | None = None

    @property
    def main(self) -> bool:
        return self.rank == 0

    def describe(self) -> dict:
        return {
            "world_size": self.size,
            "backend": self.backend,
            "sharding": "round-robin over the one-process run's batches (rank r: batches r, r + N, ...)",
            "merge": "all-reduce (sum) of every tally total; rank 0 writes",
        }


_world = World()


def env_world() -> World:
    """The world torchrun describes in the environment (size 1 without torchrun)."""
    if not os.environ.get("WORLD_SIZE"):
        return World()
    try:
        size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError as exc:
        raise ValueError(
            f"torchrun environment not understood ({', '.join(f'{k}={os.environ.get(k)}' for k in ENV)})"
        ) from exc
    return World(size, rank, local)


def current() -> World:
    """The world joined by `setup` (size 1 when not distributed)."""
    return _world


def rank_device(device, world: World):
    """This rank's device: `cuda:LOCAL_RANK` for "cuda" / None with GPUs; else as asked."""
    text = None if device is None else str(device)
    if text in (None, "auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{world.local_rank}"
    return device if device is not None else "cpu"


def setup(device=None):
    """Join the process group torchrun set up for (once per process); (World, this rank's device).
    Without torchrun (or with one process): (World(), device) and nothing is initialised."""
    global _world
    world = env_world()
    if world.size <= 1:
        return _world, device
    device = rank_device(device, world)
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(torch.device(device))
        dist.init_process_group(backend=backend)
        atexit.register(teardown)
    _world = World(world.size, world.rank, world.local_rank, dist.get_backend())
    return _world, device


def teardown() -> None:
    global _world
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _world = World()


def for_run(
    device,
    *,
    out,
    progress: bool,
    checkpoint_every: int,
    resume: bool,
    keep_unit_counts: bool,
    device_map=None,
):
    """`api.run`'s options for this rank: (world, device, out, checkpoint_every, progress).
    Only rank 0 writes (`out`) and shows progress; checkpoints are off; per-unit rows,
    --resume and --device-map are refused under torchrun (ValueError: a usage error)."""
    if env_world().size <= 1:
        return current(), device, out, checkpoint_every, progress
    for given, what in (
        (keep_unit_counts, "--keep-unit-counts (per-unit rows stay on their rank)"),
        (resume, "--resume (a checkpoint holds one process's counts)"),
        (
            device_map is not None,
            "--device-map (one model per rank, or one model over devices: not both)",
        ),
    ):
        if given:
            raise ValueError(f"{what} cannot be used with torchrun (WORLD_SIZE > 1)")
    world, device = setup(device)
    return world, device, (out if world.main else None), 0, progress and world.main


def owns(batch: int, world: World | None = None) -> bool:
    """Does this rank score batch number `batch` (from 0, in the order the engine makes them)?
    Rank r scores batches r, r + N, ...; one process scores every batch."""
    world = world or current()
    return world.size <= 1 or batch % world.size == world.rank


def _source_key(text: str):
    """Sort key of a skipped source "path:line: why" (path, then line number, then text)."""
    match = re.match(r"(.*?):(\d+)(?::|$)", text)
    return (match.group(1), int(match.group(2)), text) if match else (text, -1, text)


def reduce_stats(stats: dict) -> dict:
    """One engine pass's statistics over every rank (the same dict on each): examples, words
    and skipped counts summed; skipped sources pooled in source order; seconds the slowest
    rank's; the final batch size the smallest; notes pooled."""
    world = current()
    if world.size <= 1:
        return stats
    import torch.distributed as dist

    every = [None] * world.size
    dist.all_gather_object(every, stats)
    out = dict(stats)
    out["examples"] = sum(s["examples"] for s in every)
    out["words"] = sum(s["words"] for s in every)
    out["skipped"] = dict(sum((Counter(s["skipped"]) for s in every), Counter()))
    out["skipped_sources"] = sorted(
        (x for s in every for x in s["skipped_sources"]), key=_source_key
    )
    out["seconds"] = max(s["seconds"] for s in every)
    out["batch_size"] = min(s["batch_size"] for s in every)
    notes = [n for s in every for n in s.get("notes", [])]
    if notes:
        out["notes"] = list(dict.fromkeys(notes))
    return out


@torch.inference_mode()
def all_reduce_tallies(tallies) -> None:
    """Sum every total of `tallies` (a list, the same analyses in the same order on every rank)
    over all ranks, in place: first the union of the labels, then one all-reduce per dtype."""
    world = current()
    if world.size <= 1:
        return
    import torch.distributed as dist

    tallies = list(tallies)
    mine = [t.sorted_labels() for t in tallies]  # flushes the buffered rows
    every = [None] * world.size
    dist.all_gather_object(every, [(t.key, labels) for t, labels in zip(tallies, mine)])
    for index, tally in enumerate(tallies):
        names = {rank_labels[index][0] for rank_labels in every}
        if names != {tally.key}:
            raise RuntimeError(f"ranks disagree on the analyses to merge: {sorted(names)}")
        for labels in (rank_labels[index][1] for rank_labels in every):
            for name in labels:
                tally.label(name)  # a label this rank never saw: zeros
    tensors = [x for tally in tallies for x in tally.tensors()]
    groups: dict[tuple, list[torch.Tensor]] = {}
    for x in tensors:
        groups.setdefault((x.dtype, x.device), []).append(x)
    for (_dtype, _device), group in sorted(
        groups.items(), key=lambda item: str(item[0][0])
    ):  # same order on every rank
        flat = torch.cat([x.reshape(-1) for x in group])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for x in group:
            x.copy_(flat[offset : offset + x.numel()].view_as(x))
            offset += x.numel()
