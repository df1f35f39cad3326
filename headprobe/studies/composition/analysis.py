"""Heads that work together as an analysis of a run (METHODS §18): `--analyses composition`.

    headprobe run --model smollm2 --probe repeated-random --analyses composition,induction,previous_token \
        --receivers all --ablation mean
    results = headprobe.run("smollm2", probe="repeated-random", analyses="composition", ablation="mean")
    results.composition_edges      # one row per (sender, receiver, channel), intervals, p_holm
    results.composition_check      # the validation sample: first-order estimate beside exact
    results.composition_weights    # weights-only Q-, K-, V-composition beside the effects
    results.reads("3-1")           # what head 3-1 reads, per channel, and who reads it

The scorer runs the model itself (`ModelScorer`). Per batch it calls the sweep
(`sweep.composition_sums`: the clean pass kept per layer, every sender of every receiver layer
at once, the first-order estimate) and keeps the batch's per-unit sums as its state; `end_batch`
adds them into the run's per-unit sums (a batch retried in halves after running out of memory
commits nothing twice). Its tally holds what a head-keyed tally can: every head's clean share of
attention on each pattern role's targets (the previous token; on the repeated-random probe, the
induction target), rows = the role's scored rows.

The batches are kept for the check on disk, not in memory (`SpilledBatches`: each one's
examples and alignments pickled to a temporary file as it commits, the batch made again from
them when read, so what the scorer holds does not grow with the corpus).
When the corpus ends (`finish`), the validation sample is patched exactly over those batches,
read back one at a time, and the weights-only scores are read (`tables.composition`, given the streamed sums). The edges
table is made when the run's tables are (`composition_edges`): a receiver's role effect is the
drop of its own role's score where the run's role map (METHODS §6) gives it a pattern role
(induction, previous token; run those analyses beside this one), NaN elsewhere.

The per-unit sums are kept in memory until the run's tables are made, not as a pair tally
(`scoring.pair_tally`): a pair tally keeps each (receiver, sender, channel) cell's totals for
every fold and bootstrap resample (2 x 1,001 float64: 16 kB a cell, 3.5 GB a label on
SmolLM2's 218,700 cells), where the sums keep one float a unit. So the composition tables are
made by the run that scored them; results merged from shards (`Results.merge`) leave them out,
and say so in the summary's notes.
"""

from __future__ import annotations

import pickle
import tempfile
import uuid

import numpy as np
import pandas as pd

from headprobe.extend import ANY, CIRCUIT_COLUMN, Analysis, register
from headprobe.scoring.kept_tables import KeptTables
from headprobe.scoring.model_scorer import ModelScorer
from headprobe.studies.ablation.flags import ABLATION
from headprobe.studies.composition import run_options as flags
from headprobe.studies.composition.run_options import (
    EDGE_KEYS,
    EMBED,
    KIND,
    MLP_HEAD,
    NAME,
    SENDER,
    sender_name,
)
from headprobe.studies.induction.analysis import NAME as INDUCTION
from headprobe.studies.induction.analysis import ROLE as INDUCTION_ROLE
from headprobe.studies.previous_token.analysis import NAME as PREVIOUS_TOKEN
from headprobe.studies.previous_token.analysis import ROLE as PREVIOUS_ROLE

EDGE_COLUMNS = [
    *EDGE_KEYS,
    *[f"{e}_effect{s}" for e in ("pattern", "output", "role") for s in ("", "_low", "_high")],
    "p_holm",
    "role",
    "estimate",
    SENDER,  # the sender's kind: "head", "mlp" (sender_head -1) or "embed" (sender_layer -1 too)
]
# the role map's pattern roles (METHODS §6) -> the sweep's role targets (`intervention.role_targets`)
PATTERN_ROLES = {INDUCTION_ROLE.role: INDUCTION, PREVIOUS_ROLE.role: PREVIOUS_TOKEN}
ALPHA = 0.05
KEPT = KeptTables(NAME)  # what `finish` computed, until the run's tables are made


class UnitTotals:
    """The run's per-unit sums (`sweep.UnitSums`), added batch by batch by unit id."""

    def __init__(self):
        self.units: list[str] = []
        self.index: dict[str, int] = {}
        self.edges = None
        self.parts: dict = {}  # key -> [unit, ...] sums

    def add(self, sums) -> None:
        if self.edges is None:
            self.edges = list(sums.edges)
        elif list(sums.edges) != self.edges:
            raise ValueError("composition: batches gave different edges")
        for u in sums.units:
            if u not in self.index:
                self.index[u] = len(self.units)
                self.units.append(u)
        at = np.array([self.index[u] for u in sums.units])
        for key, values in _arrays(sums).items():
            total = self.parts.get(key)
            if total is None or total.shape[0] < len(self.units):
                grown = np.zeros((len(self.units), *values.shape[1:]))
                if total is not None:
                    grown[: total.shape[0]] = total
                total = grown
            np.add.at(total, at, values)
            self.parts[key] = total

    def sums(self):
        """The totals as one `sweep.UnitSums`."""
        from headprobe.studies.composition.sweep import UnitSums

        get = lambda key: _grown(self.parts[key], len(self.units))
        group = lambda name: {
            k.split(":", 1)[1]: get(k) for k in self.parts if k.startswith(name + ":")
        }
        return UnitSums(
            list(self.units),
            list(self.edges),
            get("pattern"),
            get("output"),
            get("rows"),
            get("estimate") if "estimate" in self.parts else None,
            get("tokens") if "tokens" in self.parts else None,
            group("role"),
            group("role_rows"),
            group("scores"),
        )


def _arrays(sums) -> dict:
    out = {"pattern": sums.pattern, "output": sums.output, "rows": sums.rows}
    if sums.estimate is not None:
        out["estimate"], out["tokens"] = sums.estimate, sums.tokens
    for group in ("role", "role_rows", "scores"):
        out.update({f"{group}:{name}": v for name, v in getattr(sums, group).items()})
    return out


def _grown(total: np.ndarray, size: int) -> np.ndarray:
    if total.shape[0] >= size:
        return total
    return np.concatenate([total, np.zeros((size - total.shape[0], *total.shape[1:]))])


class CompositionScorer(ModelScorer):
    """See the module docstring."""

    analysis = NAME
    value = "mass"
    receivers = None  # [(layer, head)], None: every head above the first layer
    kind = "zero"
    senders = ("heads",)  # the kinds of sender (--senders)

    def use_options(self, options: dict) -> None:
        self.receivers = options.get("receivers")
        self.kind = tuple(options.get(ABLATION.name) or ("zero",))[0]
        self.senders = tuple(options.get("senders") or ("heads",))

    def use_model(self, model, tokenizer, stack: str | None = None) -> None:
        from headprobe.extend import UsageError
        from headprobe.model.discovery import attention_sites
        from headprobe.model.layer_cache import check_supported
        from headprobe.studies.ablation.kinds import Baselines

        stack = check_supported(model, stack)  # one line where the writes cannot be reached
        if "mlp" in self.senders:
            from headprobe.model.mlp_writes import mlp_modules

            mlp_modules(model, stack)  # one line where a layer's MLP write is not found
        sites = attention_sites(model).of(stack)
        for layer, head in self.receivers or ():
            if layer >= len(sites) or head >= sites[layer].heads:
                raise UsageError(
                    f"--receivers: the {stack} stack has {len(sites)} layers x "
                    f"{sites[0].heads} heads (0-based); receiver {layer}-{head} does not exist"
                )
        if len(sites) < 2:
            raise UsageError(
                f"composition: the {stack} stack has one layer, and layer 0 has no earlier heads "
                "to read"
            )
        super().use_model(model, tokenizer, stack)
        self.model_, self.tokenizer_, self.stack_ = model, tokenizer, stack
        self.baselines = Baselines((self.kind,), self.tally_.seed if self.tally_ else 0)
        self.totals, self.batches = UnitTotals(), SpilledBatches()
        self.token = uuid.uuid4().hex
        self.notes: list[str] = []

    def use_inputs(self, examples) -> None:
        if self.baselines.needs_inputs:
            self.baselines.read(self.model_, self.tokenizer_, examples, self.stack_)
        self.write_means = None  # (embed, mlp) means of the MLP and embeddings senders
        if self.kind == "mean" and self.senders != ("heads",):
            from headprobe.studies.composition.senders import read_write_means

            per_position = self.baselines.per_position
            args = (self.model_, self.tokenizer_, examples, self.stack_, per_position)
            self.write_means = read_write_means(*args)

    def model_pass(self, model, batch):
        """The batch's per-unit sums (kept as the state's own), and its rows of the tally: per
        (unit, role) every head's clean attention on the role's targets, over the role's rows."""
        import torch

        from headprobe.studies.composition.sweep import composition_sums

        baseline = self._baseline(model, batch)
        sums = composition_sums(
            model, [batch], self.receivers, baseline, self.objective, self.stack_,
            senders=self.senders,
        )  # fmt: skip
        keys, n, values = [], [], []
        for name, scores in sums.scores.items():  # [unit, layer, head]
            rows = sums.role_rows[name]  # [unit]
            keep = np.flatnonzero(rows > 0)
            keys += [(sums.units[i], name) for i in keep]
            n += [float(rows[i]) for i in keep]
            values.append(scores[keep])
        got = torch.as_tensor(np.concatenate(values) if values else np.zeros((0, 1, 1)))
        if not len(keys):
            got = torch.zeros(0, self.n_layers, self.n_heads)
        state = self.state_of(batch, keys, n, got[:, self.layers])
        state.own = (sums, batch)
        return state

    def _baseline(self, model, batch):
        """The sender writes' ablation values: None (zero), the means (mean), or per batch the
        partner units' writes (resample, `sweep.resampled`); `batch` None: for every batch."""
        from headprobe.studies.composition.senders import Baseline
        from headprobe.studies.composition.sweep import resampled

        if self.kind == "resample":
            return resampled(self.baselines, self.stack_, self.senders)
        if self.kind != "mean":
            return None
        means = self.baselines.means  # the heads' (the ablation study's), then the others'
        if getattr(self, "write_means", None) is None:
            return means
        embed, mlp = self.write_means
        return Baseline(means, mlp, embed)

    def end_batch(self, state) -> None:
        super().end_batch(state)
        if state.own is not None:
            sums, batch = state.own
            self.totals.add(sums)
            self.batches.add(batch)

    def finish(self) -> None:
        """The corpus ended: exact path patching of the validation sample over the kept batches,
        and the weights-only scores (`tables.composition`, given the streamed sums)."""
        super().finish()
        if not getattr(self, "batches", None):
            return
        batches, self.batches = self.batches, SpilledBatches()
        from headprobe.extend import UsageError
        from headprobe.studies.composition.tables import composition, weights_frame
        from headprobe.studies.composition.weights import composition_weights

        sums = self.totals.sums()
        if not sums.rows.sum() > 0:  # never a table of zeros
            raise UsageError(
                "composition: no receiver query row was scored (no word piece in the inputs)"
            )
        baseline = self._baseline(self.model_, None)
        frames = composition(
            self.model_,
            batches.read(),
            self.kind,
            baseline,
            self.receivers,
            self.objective,
            None,
            self.stack_,
            seed=self.tally_.seed if self.tally_ else 0,
            roles={},
            sums=sums,
        )
        try:
            weights = composition_weights(self.model_, batches.token, self.stack_)
            frames["composition_weights"] = weights_frame(weights, frames["composition_edges"])
        except UsageError as err:  # q/k norms: the heads have no W_Q, W_K matrices
            self.notes.append(f"composition_weights left out: {err}")
        frames.pop("sums", None)
        KEPT.put(self.token, {"sums": sums, "frames": frames, "kind": self.kind})
        batches.close()  # the inputs are no longer needed

    def describe(self) -> dict:
        """The summary's record: the kind of ablation, the receivers, the edges, notes."""
        kept = KEPT.get(getattr(self, "token", None))
        sums = kept.get("sums")
        return {
            NAME: {
                KIND: self.kind,
                "receivers": "all"
                if self.receivers is None
                else [f"{l}-{h}" for l, h in self.receivers],
                "senders": ",".join(self.senders),
                "edges": 0 if sums is None else len(sums.edges),
                "units": 0 if sums is None else len(sums.units),
                "stack": getattr(self, "stack_", None),
                "kept": getattr(self, "token", None),
                "notes": list(getattr(self, "notes", [])),
            }
        }


class SpilledBatches:
    """The batches the check reads again, kept on disk: each one's examples and alignments (what
    makes it, `inputs.batching.Batch`) pickled to a temporary file (deleted when closed) as it is
    added, and the batch made again from them when read, so memory holds one batch at a time
    however long the corpus; `token`: an ordinary token of the first (`ordinary_token`)."""

    def __init__(self):
        self.file, self.count, self.token = None, 0, None

    def __len__(self) -> int:
        return self.count

    def add(self, batch) -> None:
        if self.file is None:
            self.file = tempfile.TemporaryFile(prefix="headprobe-composition-")
            self.token = ordinary_token([batch])
        made = (batch.examples, batch.alignments, batch.pad_id, str(batch.device), batch.from_mode)
        pickle.dump(made, self.file, protocol=pickle.HIGHEST_PROTOCOL)
        self.count += 1

    def read(self):
        """The batches in the order they were added, one at a time."""
        from headprobe.inputs.batching import Batch

        if self.file is None:
            return
        self.file.flush()
        self.file.seek(0)
        for _ in range(self.count):
            examples, alignments, pad, device, from_mode = pickle.load(self.file)
            yield Batch(examples, alignments, pad, device=device, from_mode=from_mode)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        self.file, self.count = None, 0


def ordinary_token(batches) -> int:
    """An ordinary token the weights are read with: the first word piece of the first batch."""
    from headprobe.inputs.align import WORD

    batch = batches[0]
    at = np.argwhere(batch.piece_kind_host == WORD)
    row, piece = (int(x) for x in (at[0] if len(at) else (0, 0)))
    return int(batch.input_ids[row, piece])


# ----------------------------------------------------------------------------------- tables
def kept(results) -> dict | None:
    """What the run's scorer computed (None: results without it, e.g. merged from shards)."""
    return KEPT.of(results)


def receiver_roles(results) -> dict:
    """(layer, head) -> the sweep's role target name, for every head the run's role map gives a
    pattern role (induction, previous token)."""
    from headprobe.stats.roles import head_roles

    roles = head_roles(results)
    out = {}
    for r in roles.itertuples(index=False):
        if r.role in PATTERN_ROLES:
            out[(int(r.layer), int(r.head))] = PATTERN_ROLES[r.role]
    return out


def edges_table(results) -> pd.DataFrame:
    """`composition_edges` (module docstring; METHODS §18)."""
    from headprobe.studies.composition.tables import edges_frame

    got = kept(results)
    if got is None:
        return pd.DataFrame(columns=EDGE_COLUMNS)
    seed = int(results.summary.get("seed") or 0)
    frame = edges_frame(got["sums"], got["kind"], receiver_roles(results), seed=seed)
    return frame[EDGE_COLUMNS].reset_index(drop=True)


def _head(head) -> tuple[int, int]:
    """'3-1' or (3, 1) -> (3, 1); a sender that is not a head: 'MLP 3' -> (3, MLP_HEAD),
    'embed' -> EMBED (`run_options`)."""
    if isinstance(head, str):
        text = head.strip()
        if text.lower() == "embed":
            return EMBED
        if text.upper().startswith("MLP"):
            return int(text[3:]), MLP_HEAD
        layer, _, h = text.partition("-")
        return int(layer), int(h)
    return int(head[0]), int(head[1])


def significant(edges: pd.DataFrame, alpha: float = ALPHA) -> pd.DataFrame:
    """The edges whose output effect is not 0 after Holm (`p_holm` < alpha)."""
    return edges[edges["p_holm"] < alpha]


def reads(results, head, top: int = 5) -> dict:
    """What head `head` ('L-H' or (L, H)) reads and who reads it, from `composition_edges`:
    {"reads": {channel: DataFrame of its senders, largest output effect first, at most `top`
    significant ones; MLP and embeddings senders among them, named by the `sender` column},
    "read_by": DataFrame of the receivers that read it (significant edges, every channel,
    largest output effect first)}. `head` may be a sender that is not a head ('MLP 3',
    'embed'): it reads nothing, and "read_by" lists the heads that read it."""
    layer, head = _head(head)
    edges = results.tables.get("composition_edges")
    if edges is None or not len(edges):
        raise KeyError("no composition_edges in these results: run --analyses composition")
    order = lambda t: t.sort_values("output_effect", ascending=False, kind="stable")
    mine = significant(edges[(edges["layer"] == layer) & (edges["head"] == head)])
    by_channel = {
        c: order(mine[mine["channel"] == c]).head(top).reset_index(drop=True) for c in "qkv"
    }
    theirs = significant(edges[(edges["sender_layer"] == layer) & (edges["sender_head"] == head)])
    return {"reads": by_channel, "read_by": order(theirs).head(top).reset_index(drop=True)}


# ---------------------------------------------------------------------------------- circuits
def circuits(results, roles: pd.DataFrame) -> pd.DataFrame:
    """The circuits found with evidence (METHODS §18): an induction head whose key reads a
    previous-token head. For each head of the role map's induction role, its key's senders that
    the role map calls previous-token heads; the one whose edge drops the receiver's induction
    score most, where that drop's interval excludes 0 (else its pattern effect's). One row per
    head named (both ends of the edge): layer, head, circuit (the edge and its interval)."""
    edges = results.tables.get("composition_edges")
    if edges is None or not len(edges) or not len(roles):
        return pd.DataFrame(columns=["layer", "head", CIRCUIT_COLUMN])
    role_of = {(int(r.layer), int(r.head)): r.role for r in roles.itertuples(index=False)}
    keys = edges[edges["channel"] == "k"]
    rows = []
    for (layer, head), role in role_of.items():
        if role != INDUCTION_ROLE.role:
            continue
        mine = keys[(keys["layer"] == layer) & (keys["head"] == head)]
        prev = [
            role_of.get((int(s), int(h))) == PREVIOUS_ROLE.role
            for s, h in zip(mine["sender_layer"], mine["sender_head"])
        ]
        mine = mine[np.array(prev, dtype=bool)]
        if not len(mine):
            continue
        by = "role_effect" if mine["role_effect"].notna().any() else "pattern_effect"
        best = mine.sort_values(by, ascending=False, kind="stable").iloc[0]
        if not best[f"{by}_low"] > 0:
            continue
        what = "induction score drop" if by == "role_effect" else "pattern effect"
        evidence = f"{best[by]:.3f} [{best[by + '_low']:.3f}, {best[by + '_high']:.3f}]"
        sender = f"{int(best.sender_layer)}-{int(best.sender_head)}"
        rows.append(
            (
                layer,
                head,
                f"induction: its key reads previous-token head {sender} "
                f"({what} {evidence}, {best.ablation} ablation)",
            )
        )
        rows.append(
            (
                int(best.sender_layer),
                int(best.sender_head),
                f"induction: previous-token head read by {layer}-{head}'s key ({what} {evidence})",
            )
        )
    return pd.DataFrame(rows, columns=["layer", "head", CIRCUIT_COLUMN])


def console(results, name: str, top: int = 5) -> str:
    """The strongest edges, and the circuits found."""
    edges = results.tables.get("composition_edges")
    if edges is None or not len(edges):
        return ""
    kind = edges[KIND].iloc[0]
    lines = [
        f"\ncomposition: the strongest edges by output effect ({kind} ablation; 95% intervals):"
    ]
    for r in edges.nlargest(top, "output_effect").itertuples(index=False):
        lines.append(
            f"  {sender_name(r.sender_layer, r.sender_head)} -> {r.layer}-{r.head} {r.channel}: "
            f"{r.output_effect:.3f} [{r.output_effect_low:.3f}, {r.output_effect_high:.3f}]"
        )
    corr = results.tables.get("composition_check_correlation")
    if corr is not None and len(corr):
        c = corr.iloc[0]
        if pd.isna(c.spearman):  # no estimate (`first_order.has_estimate`): the warning says why
            lines.append(f"  exact path patching on {c.edges} edges; {c.warning}")
        else:
            lines.append(
                f"  first-order estimate against exact path patching: Spearman {c.spearman:+.2f} "
                f"[{c.ci_low:+.2f}, {c.ci_high:+.2f}] over {c.edges} edges"
            )
            if isinstance(c.warning, str) and c.warning:
                lines.append(f"  WARNING: {c.warning}")
    roles = results.tables.get("roles")
    if roles is not None and CIRCUIT_COLUMN in roles:
        for r in roles[roles[CIRCUIT_COLUMN].astype(str) != ""].itertuples(index=False):
            if r.role == INDUCTION_ROLE.role:
                lines.append(f"  circuit {r.layer}-{r.head}: {r.circuit}")
    return "\n".join(lines)


COMPOSITION = register(
    Analysis(
        name=NAME,
        order=140,
        scorer=CompositionScorer,
        input=ANY,
        selection=False,
        default=False,
        options=(flags.RECEIVERS, flags.SENDERS, ABLATION.name),
        model_checks=(flags.receivers_exist, flags.kind_measured, flags.not_resumed),
        homes=tuple(
            f"headprobe.studies.composition.{module}"
            for module in (
                "run_options",
                "senders",
                "report",
                "graph",
                "sweep",
                "tables",
                "intervention",
                "path_patching",
                "first_order",
                "weights",
            )
        ),
        description="which earlier heads each head reads through its query, key and value: each "
        "sender's write replaced by its ablation in one channel of the receiver, the change of the "
        "receiver's pattern, write and role score per (sender, receiver, channel), with intervals "
        "and Holm; exact path patching on a sample beside a first-order estimate; weights-only "
        "scores beside them (METHODS §18)",
        tables={
            "composition_edges": edges_table,
            "composition_check": KEPT.frame("composition_check", within="frames"),
            "composition_check_correlation": KEPT.frame(
                "composition_check_correlation", within="frames"
            ),
            "composition_weights": KEPT.frame("composition_weights", within="frames"),
        },
        console=console,
        circuits=circuits,
        card="headprobe.studies.composition.report:card",
        queries={"reads": reads},
        report="headprobe.studies.composition.report:section",
    )
)
