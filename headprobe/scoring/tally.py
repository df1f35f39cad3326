"""Streaming counts (METHODS §5): per fold and per bootstrap resample, nothing per unit.

    tally = Tally("dependency", directions=("dep->head", "head<-dep"), variants=("offset=-1",),
                  layers=[0, 1], n_heads=12, resamples=1000)
    tally.add(units, labels, values, n, baseline_hits)      # one batch of (unit, label) rows
    tally.merge(other)                                       # two shards add up
    tally.hits("nsubj")                                      # [fold, resample, layer, head, direction]

Every unit (document, else sentence) has a fold and 1,000 Poisson(1) weights that
are functions of its id alone (`unit_fold`, `unit_weights`), so a batch's rows can
be added into the totals as they stream: weighted hits and trials add up per
resample, shards and orders give bit-identical totals, and memory does not grow
with the corpus. Resample 0 is the data itself (weight 1 for every unit), so the
plain counts of each fold sit beside the resamples.

Per label the tally keeps:
- `hits`  [fold, resample, layer, head, direction]: hits (int64) or summed mass (float64)
- `n`     [fold, resample, direction]: trials
- `base`  [fold, resample, variant]: baseline hits (their trials are `n[..., 0]`)
- `both`  [layer, head, direction, variant]: arcs hit by the head *and* the baseline
          (whole data; the McNemar discordant counts are hits - both and base - both)
- `extra` {name: [fold, direction]}: per-label counts that do not depend on a head
          (e.g. `unreachable` arcs)

The totals are torch tensors on the tally's device while rows are added; a tally read from a
file (`Tally.load`) holds NumPy arrays, and only adding to it, moving it (`to`) or summing it
across processes (`tensors`) makes them tensors. So a report reads saved tallies, whose readers
take `arrays(label)`, without importing torch.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from headprobe.core.seeds import SEED, keyed_hash
from headprobe.core.torch_modes import inference_mode
from headprobe.model.control import TRAINED
from headprobe.scoring.measures import WEIGHTS, tally_key

if TYPE_CHECKING:
    import torch

N_BOOT = 1000
N_FOLDS = 2
FLUSH_ROWS = 4096  # buffered (unit, label) rows before they are added into the totals


def unit_fold(unit: str, seed: int = SEED) -> int:
    """METHODS §5: the fold (0 or 1) of a unit, from a keyed hash of its id."""
    return keyed_hash(seed, "fold", unit) % N_FOLDS


def unit_weights(unit: str, seed: int = SEED, n_boot: int = N_BOOT) -> np.ndarray:
    """METHODS §5: the unit's Poisson(1) weight in each of `n_boot` resamples, from its id."""
    rng = np.random.Generator(np.random.PCG64(keyed_hash(seed, "boot", unit)))
    return rng.poisson(1.0, n_boot)


class UnitDraws:
    """Fold and weights per unit id, cached for the most recent units (documents recur).

    One cache per (seed, resamples) for the whole process (`UnitDraws.shared`): every tally of a
    run draws the same weights for a unit, so they share them. The cache is small: a flush needs
    each unit's weights once (they are recomputed from the unit's id when evicted), and a cache
    as large as the corpus's units would grow with it (1,001 float32 a unit)."""

    SIZE = 1024
    _shared: dict[tuple[int, int], UnitDraws] = {}

    def __init__(self, seed: int = SEED, n_boot: int = N_BOOT, size: int | None = None):
        self.seed, self.n_boot = seed, n_boot
        self.size = self.SIZE if size is None else size
        self._cache: OrderedDict[str, tuple[int, np.ndarray]] = OrderedDict()

    @classmethod
    def shared(cls, seed: int = SEED, n_boot: int = N_BOOT) -> UnitDraws:
        """The process's draws for (seed, n_boot)."""
        key = (int(seed), int(n_boot))
        if key not in cls._shared:
            cls._shared[key] = cls(*key)
        return cls._shared[key]

    def __call__(self, unit: str) -> tuple[int, np.ndarray]:
        """(fold, [1 + n_boot] weights with weight 1 first: resample 0 is the data itself)."""
        hit = self._cache.get(unit)
        if hit is not None:
            self._cache.move_to_end(unit)
            return hit
        weights = np.empty(1 + self.n_boot, dtype=np.float32)
        weights[0] = 1.0
        weights[1:] = unit_weights(unit, self.seed, self.n_boot)
        hit = (unit_fold(unit, self.seed), weights)
        self._cache[unit] = hit
        if len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return hit


class LabelCounts:
    """The running totals of one label (see the module docstring for the shapes): tensors while
    rows are added, NumPy arrays as read from a file (`on(device)` makes them tensors)."""

    TOTALS = ("hits", "n", "base", "both")

    def __init__(self, hits, n, base, both, extra: dict, host: dict | None = None):
        self.hits, self.n, self.base, self.both = hits, n, base, both
        self.extra = dict(extra)
        # on the CPU: the NumPy arrays that share the tensors' memory, read with no op
        self.host = host

    @classmethod
    def zeros(
        cls,
        resamples: int,
        n_layers: int,
        n_heads: int,
        n_dirs: int,
        n_variants: int,
        mass: bool,
        device,
        extras=(),
    ) -> LabelCounts:
        import torch

        r = resamples
        arrays = {
            # int32: exact to 2**31, half of int64's
            "hits": np.zeros(
                (N_FOLDS, r, n_layers, n_heads, n_dirs), dtype=np.float64 if mass else np.int32
            ),
            "n": np.zeros((N_FOLDS, r, n_dirs), dtype=np.float64),
            "base": np.zeros((N_FOLDS, r, n_variants), dtype=np.int64),
            "both": np.zeros((n_layers, n_heads, n_dirs, n_variants), dtype=np.int64),
            **{f"extra:{name}": np.zeros((N_FOLDS, n_dirs), dtype=np.int64) for name in extras},
        }
        if torch.device(device).type == "cpu":  # tensors over the arrays' memory
            t = {name: torch.from_numpy(array) for name, array in arrays.items()}
            host = arrays
        else:
            t = {name: torch.from_numpy(array).to(device) for name, array in arrays.items()}
            host = None
        extra = {name: t[f"extra:{name}"] for name in extras}
        return cls(t["hits"], t["n"], t["base"], t["both"], extra, host)

    def arrays(self) -> dict[str, np.ndarray]:
        if self.host is not None:  # the tensors' own memory (CPU): nothing to copy
            return dict(self.host)
        out = {name: getattr(self, name) for name in self.TOTALS}
        out.update({f"extra:{k}": v for k, v in self.extra.items()})
        return {k: _numpy(v) for k, v in out.items()}

    def on(self, device) -> LabelCounts:
        """These totals as tensors on `device`, in place (arrays read from a file become tensors;
        tensors already there stay as they are: no op); returns self."""
        import torch

        hits = self.hits
        if isinstance(hits, torch.Tensor) and hits.device == torch.device(device):
            return self
        self.host = None
        for name in self.TOTALS:
            setattr(self, name, torch.as_tensor(getattr(self, name)).to(device))
        self.extra = {k: torch.as_tensor(v).to(device) for k, v in self.extra.items()}
        return self

    def add_(self, other: LabelCounts) -> None:
        import torch

        for name in self.TOTALS:
            mine = getattr(self, name)
            mine.add_(torch.as_tensor(getattr(other, name)).to(mine.device))
        for name, value in other.extra.items():
            value = torch.as_tensor(value).to(self.n.device)
            if name not in self.extra:
                self.extra[name] = torch.zeros_like(value)
                self.host = None  # a new total the arrays do not hold
            self.extra[name].add_(value)


def _numpy(total) -> np.ndarray:
    """A total as a NumPy array (CPU): a tensor's copy (a CPU tensor's own memory, no op), an
    array itself. Totals are made in inference mode: nothing to detach."""
    if isinstance(total, np.ndarray):
        return total
    return total.numpy() if total.device.type == "cpu" else total.cpu().numpy()


class Tally:
    """Streaming totals of one analysis, per label; see the module docstring.

    Totals change only inside `torch.inference_mode()` (the engine's), so every method that
    adds runs in it. `device`: a torch device or its name ("cpu", "cuda:0")."""

    def __init__(
        self,
        analysis: str,
        *,
        directions=("",),
        variants=(),
        layers=(),
        n_heads: int = 0,
        value: str = "hits",
        resamples: int = N_BOOT,
        bootstrap: bool = True,
        seed: int = SEED,
        extras=(),
        device="cpu",
        model: str = TRAINED,
        measure: str = WEIGHTS,
        senders=(),
    ):
        self.analysis = analysis
        self.model = model  # "trained", or "control" (`headprobe.model.control`)
        self.measure = measure  # METHODS §7: weights or norms (`headprobe.scoring.measures`)
        self.directions = tuple(directions)
        self.variants = tuple(variants)
        self.layers = [int(x) for x in layers]
        self.n_heads = int(n_heads)
        # a pair tally's sender layers (`headprobe.scoring.pair_tally`): its head axis holds
        # (receiver head, sender layer, sender head) flat; () for a tally keyed by one head
        self.senders = [int(x) for x in senders]
        self.value = value
        self.n_boot = int(resamples) if bootstrap else 0
        self.seed = int(seed)
        self.extras = tuple(extras)
        self.device = device
        self.labels: dict[str, LabelCounts] = {}
        self.draws = UnitDraws.shared(self.seed, max(self.n_boot, 1))
        self._pending: list[tuple] = []
        self._pending_both: list[tuple] = []  # (labels, [label, layer, head, direction, variant])
        self._pending_rows = 0

    # -- the shape of one label's totals ------------------------------------------------
    @property
    def resamples(self) -> int:
        """Resample slots per fold: the data itself, then `n_boot` Poisson resamples."""
        return 1 + self.n_boot

    @property
    def head_cells(self) -> int:
        """The head axis's length: the heads, or (receiver head, sender layer, sender head)."""
        return self.n_heads * (len(self.senders) * self.n_heads if self.senders else 1)

    def label(self, name: str) -> LabelCounts:
        """The totals of label `name` as tensors on the tally's device, to add to (zeros for a
        new label)."""
        counts = self.labels.get(name)
        if counts is None:
            counts = self.labels[name] = LabelCounts.zeros(
                self.resamples,
                len(self.layers),
                self.head_cells,
                len(self.directions),
                len(self.variants),
                self.value == "mass",
                self.device,
                self.extras,
            )
        return counts.on(self.device)

    # -- streaming --------------------------------------------------------------------
    def add(self, units, labels, values=None, n=None, base=None, extra=None) -> None:
        """Add one batch of rows, one per (unit, label), into the totals.

        values: [row, layer, head, direction] hits or mass (device tensor)
        n:      [row, direction] trials
        base:   [row, variant] baseline hits
        extra:  {name: [row, direction]} per-label counts that do not depend on a head

        Rows wait in a buffer until `FLUSH_ROWS` of them are there (or the totals are
        read), then are added per (fold, label) with one weighted sum each.
        """
        if len(units) == 0:
            return
        n = np.asarray(n, dtype=np.float64)
        self._pending.append(
            (
                list(units),
                list(labels),
                values,
                n,
                None if base is None else np.asarray(base, dtype=np.float32),
                {k: np.asarray(v) for k, v in (extra or {}).items()},
            )
        )
        self._pending_rows += len(units)
        if self._pending_rows >= FLUSH_ROWS:
            self.flush()

    def add_both(self, labels, both) -> None:
        """Add head-and-baseline hits `both` [label, layer, head, direction, variant] of `labels`
        (buffered with the rows: added per label when the totals are)."""
        self._pending_both.append((list(labels), both))

    @inference_mode
    def flush(self) -> None:
        """Add the buffered rows into the totals."""
        self._flush_both()
        if not self._pending:
            return
        import torch

        from headprobe.inputs.batching import on_device

        pending, self._pending, self._pending_rows = self._pending, [], 0
        units = [u for p in pending for u in p[0]]
        labels = [l for p in pending for l in p[1]]
        drawn = [self.draws(u) for u in units]
        fold = np.array([d[0] for d in drawn])
        put = lambda array: on_device(array, self.device)  # pinned, not waiting on a GPU
        w_all = put(np.stack([d[1][: self.resamples] for d in drawn]))  # [row, resample]
        n_t = put(np.concatenate([p[3] for p in pending]))  # [row, direction]
        base_t = None
        if self.variants and pending[0][4] is not None:
            base_t = put(np.concatenate([p[4] for p in pending]))  # [row, variant]
        flat = None
        if pending[0][2] is not None:
            dtype = torch.float64 if self.value == "mass" else torch.float32
            flat = torch.cat(
                [p[2].reshape(len(p[0]), -1).to(self.device, dtype) for p in pending]
            )  # [row, cells]
        extra = {k: np.concatenate([p[5][k] for p in pending]) for k in pending[0][5]}
        groups: dict[tuple[int, str], list[int]] = {}
        for row, key in enumerate(zip(fold.tolist(), labels)):
            groups.setdefault(key, []).append(row)
        for (f, name), members in groups.items():
            counts = self.label(name)
            index = torch.as_tensor(members, device=self.device)
            w = w_all.index_select(0, index)  # [member, resample]
            counts.n[f] += w.double().T @ n_t.index_select(0, index)
            if flat is not None:
                summed = (w.to(flat.dtype).T @ flat.index_select(0, index)).reshape(
                    counts.hits.shape[1:]
                )
                counts.hits[f] += summed if self.value == "mass" else summed.round().to(torch.int32)
            if base_t is not None:
                counts.base[f] += (w.T @ base_t.index_select(0, index)).round().to(torch.int64)
            for key, value in extra.items():
                counts.extra[key][f] += torch.as_tensor(value[members].sum(0), device=self.device)

    @inference_mode
    def _flush_both(self) -> None:
        """Add the buffered head-and-baseline hits: every batch's summed per label in one call,
        then one addition per label."""
        if not self._pending_both:
            return
        import torch

        pending, self._pending_both = self._pending_both, []
        names = list(dict.fromkeys(name for labels, _ in pending for name in labels))
        slot = {name: i for i, name in enumerate(names)}
        index = [slot[name] for labels, _ in pending for name in labels]
        every = torch.cat([both for _, both in pending]).to(self.device)  # [row, l, h, d, v]
        summed = every.new_zeros((len(names), *every.shape[1:]), dtype=torch.float64)
        summed.index_add_(0, torch.as_tensor(index, device=every.device), every.double())
        summed = summed.round().to(torch.int64)  # [label, layer, head, direction, variant]
        for name, total in zip(names, summed.unbind(0)):
            self.label(name).both += total

    @inference_mode
    def merge(self, other: Tally) -> Tally:
        """Add another tally of the same analysis (a shard, another process) into this one."""
        self.flush()
        for attr in (
            "analysis",
            "model",
            "measure",
            "directions",
            "variants",
            "layers",
            "n_heads",
            "senders",
            "value",
            "n_boot",
            "seed",
        ):
            if getattr(self, attr) != getattr(other, attr):
                raise ValueError(
                    f"cannot merge {self.analysis} counts: {attr} differs "
                    f"({getattr(self, attr)!r} vs {getattr(other, attr)!r})"
                )
        other.flush()
        for name, counts in other.labels.items():
            self.label(name).add_(counts)
        return self

    def copy(self) -> Tally:
        empty = Tally(
            self.analysis,
            directions=self.directions,
            variants=self.variants,
            layers=self.layers,
            n_heads=self.n_heads,
            value=self.value,
            resamples=self.n_boot,
            bootstrap=self.n_boot > 0,
            seed=self.seed,
            extras=self.extras,
            device=self.device,
            model=self.model,
            measure=self.measure,
            senders=self.senders,
        )
        return empty.merge(self)

    @property
    def key(self) -> str:
        """This tally's name in a run's tallies and files (`measures.tally_key`): the analysis,
        `@<measure>` beyond weights, `~control` for the control's."""
        return tally_key(self.analysis, self.measure, self.model)

    # -- reading ----------------------------------------------------------------------
    def sorted_labels(self) -> list[str]:
        self.flush()
        return sorted(self.labels)

    def arrays(self, name: str) -> dict[str, np.ndarray]:
        """One label's totals as NumPy arrays (CPU)."""
        self.flush()
        return self.labels[name].arrays()

    def to(self, device) -> Tally:
        """This tally with its totals as tensors on `device` (in place)."""
        self.flush()
        self.device = device
        for counts in self.labels.values():
            counts.on(device)
        return self

    def tensors(self) -> list[torch.Tensor]:
        """Every total, in a fixed order (labels sorted): what an all-reduce sums."""
        self.flush()
        out = []
        for name in self.sorted_labels():
            counts = self.label(name)
            out += [counts.hits, counts.n, counts.base, counts.both]
            out += [counts.extra[k] for k in sorted(counts.extra)]
        return out

    # -- saving -----------------------------------------------------------------------
    def meta(self) -> dict:
        return self._meta(self.sorted_labels())

    def _meta(self, labels) -> dict:
        pairs = {"senders": self.senders} if self.senders else {}
        return {
            **pairs,
            "analysis": self.analysis,
            "model": self.model,
            "measure": self.measure,
            "directions": list(self.directions),
            "variants": list(self.variants),
            "layers": self.layers,
            "n_heads": self.n_heads,
            "value": self.value,
            "n_boot": self.n_boot,
            "seed": self.seed,
            "extras": list(self.extras),
            "labels": list(labels),
        }

    def save(self, path) -> None:
        """One .npz file: arrays named `<label index>/<array>` plus the metadata."""
        import json

        arrays = {"meta": np.frombuffer(json.dumps(self.meta()).encode(), dtype=np.uint8)}
        for i, name in enumerate(self.sorted_labels()):
            for key, value in self.arrays(name).items():
                arrays[f"{i}/{key}"] = value
        with open(path, "wb") as handle:
            np.savez(handle, **arrays)

    @classmethod
    def load(cls, path) -> Tally:
        import json

        with np.load(path) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            tally = cls(
                meta["analysis"],
                directions=meta["directions"],
                variants=meta["variants"],
                layers=meta["layers"],
                n_heads=meta["n_heads"],
                value=meta["value"],
                resamples=meta["n_boot"],
                bootstrap=meta["n_boot"] > 0,
                seed=meta["seed"],
                extras=meta["extras"],
                model=meta.get("model", TRAINED),
                measure=meta.get("measure", WEIGHTS),
                senders=meta.get("senders", ()),
            )
            for i, name in enumerate(meta["labels"]):  # NumPy arrays: no torch to read them
                tally.labels[name] = LabelCounts(
                    **{total: data[f"{i}/{total}"].copy() for total in LabelCounts.TOTALS},
                    extra={k: data[f"{i}/extra:{k}"].copy() for k in meta["extras"]},
                )
        return tally

    # -- checkpoints (resume after a kill) ----------------------------------------------
    def save_checkpoint(self, path) -> None:
        """Like `save`, but the rows still buffered are stored as they are instead of being
        added first, so that a resumed run adds them into the totals at the same moment as an
        uninterrupted run would: float sums (attention mass) stay bit-identical."""
        import json

        self._flush_both()  # whole counts: adding them now or later gives the same totals

        labels = sorted(self.labels)
        meta = self._meta(labels)
        arrays = {}
        for i, name in enumerate(labels):
            for key, value in self.labels[name].arrays().items():
                arrays[f"{i}/{key}"] = value
        pending = self._pending
        if pending:
            meta["pending"] = {
                "units": [u for p in pending for u in p[0]],
                "labels": [label for p in pending for label in p[1]],
                "values": pending[0][2] is not None,
                "base": pending[0][4] is not None,
                "extra": sorted(pending[0][5]),
            }
            if pending[0][2] is not None:
                arrays["pending/values"] = np.concatenate([_numpy(p[2]) for p in pending])
            arrays["pending/n"] = np.concatenate([p[3] for p in pending])
            if pending[0][4] is not None:
                arrays["pending/base"] = np.concatenate([p[4] for p in pending])
            for key in pending[0][5]:
                arrays[f"pending/extra:{key}"] = np.concatenate([p[5][key] for p in pending])
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        with open(path, "wb") as handle:
            np.savez(handle, **arrays)

    @classmethod
    def load_checkpoint(cls, path, device="cpu") -> Tally:
        """A tally written by `save_checkpoint`, buffered rows included, on `device`."""
        import json

        import torch

        tally = cls.load(path).to(device)
        with np.load(path) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            pending = meta.get("pending")
            if pending:
                values = (
                    torch.from_numpy(data["pending/values"].copy()) if pending["values"] else None
                )
                base = data["pending/base"].copy() if pending["base"] else None
                extra = {key: data[f"pending/extra:{key}"].copy() for key in pending["extra"]}
                tally._pending = [
                    (
                        pending["units"],
                        pending["labels"],
                        values,
                        data["pending/n"].copy(),
                        base,
                        extra,
                    )
                ]
                tally._pending_rows = len(pending["units"])
        return tally
