"""Circuits on a task as an analysis of a run (METHODS §20): `--analyses circuit` (with
`patching`, whose nodes and roles it reads; asking for circuit adds it).

    headprobe run --model smollm2 --task ioi --n 64 --analyses circuit
    results = headprobe.run("smollm2", task="ioi", probe_n=64, analyses=["circuit"])
    results.circuit_edges    # sender, receiver, channel: eap, eap_ig, exact (the sample), fold ranks
    results.circuit_curve    # per ranking and budget: f in-sample and held out, with intervals
    results.circuit_scores   # CPR and CMD, in-sample and held out, with intervals
    results.circuit_nodes    # the smallest faithful circuit's nodes, with their patching roles
    results.circuit_check    # EAP and EAP-IG against exact path patching on a validation sample

The scorer runs the model itself. Per batch (`model_pass`) it scores every edge (`edge_scores`:
EAP and EAP-IG per example) and adds them into per-unit sums; its tally holds each head's total
EAP-IG over its outgoing edges. When the task ends (`finish`) it ranks the edges on all units and
on each fold, runs the circuits of every budget over the kept batches (in-sample: the ranking on
all units; held out: each unit evaluated with the ranking of the other fold), path-patches the
validation sample exactly, and makes the tables (`curves`).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter

import numpy as np
import pandas as pd

from headprobe.extend import TASK, Analysis, Option, UsageError, register
from headprobe.scoring.kept_tables import KeptTables
from headprobe.scoring.model_scorer import ModelScorer
from headprobe.studies.circuit.curves import BUDGETS as BUDGET_FRACTIONS
from headprobe.studies.patching.analysis import IG_STEPS, lm_head_declared, task_estimates
from headprobe.studies.patching.analysis import NAME as PATCHING

NAME = "circuit"
MIN_FOLD = 5  # units a fold needs for the held-out curve (each fold ranks, the other evaluates)


def budgets_check(flag, value, values) -> tuple:
    """`--budgets`: percentages of the graph's edges, increasing, each in (0, 100] (a comma list,
    or numbers from Python), kept as a tuple of percentages."""
    text = value if isinstance(value, str) else ",".join(str(v) for v in value)
    try:
        got = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag}: {text!r} is not a comma list of percentages") from None
    if not got or any(not 0 < v <= 100 for v in got):
        raise UsageError(f"{flag}: every budget must be a percentage in (0, 100], got {text!r}")
    if any(b <= a for a, b in zip(got, got[1:])):
        raise UsageError(f"{flag}: the budgets must increase, got {text!r}")
    return tuple(got)


BUDGETS = Option(
    "circuit_budgets",
    "0.1,0.2,0.5,1,2,5,10,20,50,100",
    "circuits' budgets, in percent of the graph's edges, increasing in (0, 100] (default: MIB's "
    "0.1,0.2,0.5,1,2,5,10,20,50,100)",
    flag="--budgets",
    metavar="PCTS",
    check=budgets_check,
    record=lambda config: tuple(config.circuit_budgets) != tuple(100 * b for b in BUDGET_FRACTIONS),
)


def needs_patching(config, facts) -> None:
    """Circuits read the patching analysis's nodes and roles: asked for alone, refused."""
    if NAME in config.analyses and PATCHING not in config.analyses:
        raise UsageError(
            f"{NAME} reads the {PATCHING} analysis's nodes and roles: ask for both "
            f"(--analyses {PATCHING},{NAME})"
        )


LABEL = "outgoing_eap_ig"  # the tally's label: a head's EAP-IG summed over its outgoing edges
TOP_EXACT, RANDOM_EXACT = 20, 10  # the validation sample: top edges by |EAP-IG|, and at random
KEPT = KeptTables(NAME)  # the tables `finish` made, until the run's tables read them


class CircuitScorer(ModelScorer):
    """See the module docstring."""

    analysis = NAME
    value = "mass"
    steps = 5
    progress = True

    budgets = BUDGET_FRACTIONS

    def use_options(self, options: dict) -> None:
        self.steps = int(options.get(IG_STEPS.name) or 5)
        self.progress = bool(options.get("progress", True))
        got = options.get(BUDGETS.name)  # percentages, checked
        if isinstance(got, str):
            got = budgets_check(BUDGETS.flag, got, options)
        self.budgets = tuple(v / 100 for v in got) if got else BUDGET_FRACTIONS

    def use_model(self, model, tokenizer, stack: str | None = None) -> None:
        from headprobe.model.task_nodes import TaskNodes

        super().use_model(model, tokenizer, stack)
        self.model_, self.nodes_ = model, TaskNodes(model, stack)
        self.graph_ = None
        self.sums_: dict = {}  # unit -> {"count", "m_clean", "m_corrupted", "eap", "eap_ig"}
        self.kept_: list = []  # (TaskPairs on the CPU, [unit] per row)
        self.seconds_ = Counter({"scores": 0.0, "circuits": 0.0, "exact": 0.0})
        self.token = uuid.uuid4().hex

    def _graph(self, ids):
        from headprobe.model.edge_graph import EdgeGraph

        if self.graph_ is None:
            self.graph_ = EdgeGraph.of(self.nodes_, ids)
            reach = self.graph_.reach()
            self.edges_ = reach.nonzero().numpy()  # [edge, (receiver, sender)]
        return self.graph_

    def model_pass(self, model, batch):
        import torch

        from headprobe.model.sites import model_device
        from headprobe.studies.circuit.edge_scores import edge_scores, gradient_rows
        from headprobe.studies.patching.node_effects import TaskPairs

        start = time.perf_counter()
        device = model_device(model)
        units, rows, kept = [], {}, []
        for group in _by_length(batch.examples):
            pairs = TaskPairs.of(group, device)
            graph = self._graph(pairs.clean)
            size = gradient_rows(graph, _suffix(model, self.nodes_, pairs), device)
            for i in range(0, len(group), size):
                part = pairs.rows(slice(i, i + size))
                got = edge_scores(model, graph, part, self.steps)
                e = self.edges_
                for key, value in (
                    ("m_clean", got.m_clean),
                    ("m_corrupted", got.m_corrupted),
                    ("eap", got.eap[:, e[:, 0], e[:, 1]]),
                    ("eap_ig", got.eap_ig[:, e[:, 0], e[:, 1]]),
                ):
                    rows.setdefault(key, []).append(value.numpy())  # float32: [row, edge]
                part_units = [x.unit for x in group[i : i + size]]
                units += part_units
                kept.append((_on_cpu(part), part_units))
        rows = {k: np.concatenate(v) for k, v in rows.items()}
        values = torch.as_tensor(self._outgoing(rows["eap_ig"]))[:, self.layers]
        keys = [(u, LABEL) for u in units]
        state = self.state_of(batch, keys, [1.0] * len(keys), values)
        state.own = (units, rows, kept, time.perf_counter() - start)
        return state

    def _outgoing(self, eap_ig: np.ndarray) -> np.ndarray:
        """[row, layer, head]: each head's EAP-IG summed over its outgoing edges."""
        g = self.graph_
        out = np.zeros((eap_ig.shape[0], g.layers, g.heads))
        senders = self.edges_[:, 1]
        for layer in range(g.layers):
            for head in range(g.heads):
                s = 1 + layer * (g.heads + 1) + head
                out[:, layer, head] = eap_ig[:, senders == s].sum(1)
        return out

    def end_batch(self, state) -> None:
        super().end_batch(state)
        if state.own is None:
            return
        units, rows, kept, seconds = state.own
        for i, unit in enumerate(units):
            got = self.sums_.setdefault(unit, {"count": 0.0})
            got["count"] += 1.0
            for key, value in rows.items():
                got[key] = got.get(key, 0.0) + value[i]
        self.kept_.extend(kept)
        self.seconds_.update({"scores": seconds})  # a Counter: the seconds add

    def finish(self) -> None:
        """The task ended: circuits evaluated, the sample path-patched, the tables made."""
        super().finish()
        if getattr(self, "sums_", None) is None:
            return
        if not self.sums_:
            raise UsageError(f"{NAME}: no example of the task was scored")
        KEPT.put(self.token, self.tables())

    def tables(self) -> dict:
        from headprobe.scoring.tally import unit_fold
        from headprobe.stats.estimates import percentiles
        from headprobe.studies.circuit import curves as cv
        from headprobe.studies.composition.tables import unit_weights_matrix

        seed = self.tally_.seed if self.tally_ else 0
        units = sorted(self.sums_)
        col = lambda key: np.stack([self.sums_[u][key] for u in units])  # [unit, ...]
        count, eap, ig = col("count"), col("eap"), col("eap_ig")
        m_clean, m_corrupted = col("m_clean"), col("m_corrupted")
        weights = unit_weights_matrix(units, seed)  # [1 + resample, unit]
        diff = weights @ (m_clean - m_corrupted)  # [1 + resample] sums: the difference's sign
        done = bool(percentiles(diff[1:])[0] > 0)
        folds = np.array([unit_fold(u, seed) for u in units])
        sizes = [int((folds == f).sum()) for f in (0, 1)]
        held = min(sizes) >= MIN_FOLD
        scores = {"all": ig.sum(0) / count.sum()}
        if held:
            for f in (0, 1):
                mine = np.nonzero(folds == f)[0]
                scores[f] = ig[mine].sum(0) / count[mine].sum()
        orders = {
            (rank, which): cv.ranking(s, rank == "absolute")
            for rank in cv.RANKINGS
            for which, s in scores.items()
        }
        sample = self._sample(scores["all"], seed)
        budgets = self.budgets if done else ()
        values = self._evaluate(orders, folds, units, sample, budgets, held)
        values.update({"m_clean": m_clean, "m_corrupted": m_corrupted})
        counts = [cv.n_edges(len(self.edges_), b) for b in budgets]
        curve, areas = cv.curve_frame(values, counts, weights, budgets, held)
        best = cv.smallest_faithful(curve) if held else None
        chosen = np.zeros(len(self.edges_), bool)
        if best is not None:
            chosen[orders[("signed", "all")][: int(best["n_edges"])]] = True
        edges = self._edges_frame(eap, ig, count, values["exact"], sample, orders, chosen)
        check = cv.spearman_check(
            {"eap": eap[:, sample], "eap_ig": ig[:, sample]}, values["exact"], weights
        )
        return {
            "circuit_edges": edges,
            "circuit_curve": curve,
            "circuit_scores": areas,
            "circuit_check": check,
            "circuit_nodes": self._nodes_frame(chosen),
            "smallest": None if best is None else (float(best["budget"]), int(best["n_edges"])),
            "does_task": done,
            "fold_units": sizes,
        }

    def _sample(self, scores: np.ndarray, seed: int) -> np.ndarray:
        """The validation sample: the top `TOP_EXACT` edges by |EAP-IG| and `RANDOM_EXACT` of the
        others drawn at random (seeded)."""
        order = np.argsort(-np.abs(scores), kind="stable")
        top = order[:TOP_EXACT]
        rest = np.sort(order[TOP_EXACT:])
        rng = np.random.default_rng(seed)
        drawn = rng.choice(rest, size=min(RANDOM_EXACT, len(rest)), replace=False)
        return np.concatenate([top, np.sort(drawn)])

    def _evaluate(self, orders, folds, units, sample, budgets, held: bool) -> dict:
        """Per-unit sums of m(C) [unit, budget] per (ranking, sample) (held out only where
        `held`), and of the sample's exact values [unit, edge], over the kept batches."""
        from tqdm.auto import tqdm

        from headprobe.model.sites import model_device
        from headprobe.studies.circuit import curves as cv
        from headprobe.studies.circuit.edge_scores import circuit_rows

        model, g = self.model_, self.graph_
        device = model_device(model)
        unit_row = {u: i for i, u in enumerate(units)}
        fold_of = dict(zip(units, folds))
        samples = cv.SAMPLES if held else cv.SAMPLES[:1]
        out = {(r, s): np.zeros((len(units), len(budgets))) for r in cv.RANKINGS for s in samples}
        out["exact"] = np.zeros((len(units), len(sample)))
        counts = [cv.n_edges(len(self.edges_), b) for b in budgets]
        shape = (len(g.receivers()), len(g.senders()))
        masks: dict = {}

        def mask(key, n):
            if (key, n) not in masks:
                masks[(key, n)] = cv.circuit_out(orders[key], n, self.edges_, shape)
            return masks[(key, n)]

        edges = [tuple(self.edges_[e]) for e in sample]
        batches = _regrouped(
            self.kept_, lambda pairs: circuit_rows(g, _suffix(model, g.nodes, pairs), device)
        )
        for cpu_pairs, batch_units in tqdm(
            batches, desc="circuits", unit="batch", disable=not self.progress
        ):
            rows = np.array([unit_row[u] for u in batch_units])
            fold = np.array([fold_of[u] for u in batch_units])
            got = self._batch(_to(cpu_pairs, device), fold, counts, mask, samples, edges)
            for key, values in got.items():
                np.add.at(out[key], rows, values)
        return out

    def _batch(self, pairs, fold, counts, mask, samples, edges) -> dict:
        """One batch's m(C) [row, budget] per (ranking, sample) and exact values [row, edge]."""
        import torch

        from headprobe.studies.circuit import curves as cv
        from headprobe.studies.circuit.edge_scores import Prefix, edge_exact, recorded

        model, g, clock = self.model_, self.graph_, time.perf_counter()
        prefix = Prefix(model, g.nodes, pairs)
        corrupted, _ = recorded(model, g, pairs, pairs.corrupted, prefix)
        clean, m_clean = recorded(model, g, pairs, pairs.clean, prefix, blocks=True)
        m_clean = m_clean.cpu()
        out = {(r, s): np.zeros((len(fold), len(counts))) for r in cv.RANKINGS for s in samples}
        for rank in cv.RANKINGS:
            for i, n in enumerate(counts):
                if n >= len(self.edges_):  # the whole graph: the clean forward (tested equal)
                    for s in samples:
                        out[(rank, s)][:, i] = m_clean.numpy()
                    continue
                whole = mask((rank, "all"), n)
                out[(rank, "in_sample")][:, i] = self._metric(pairs, corrupted, whole, prefix)
                for f in (0, 1) if len(samples) > 1 else ():
                    mine = np.nonzero(fold == f)[0]
                    if not len(mine):
                        continue
                    picked = torch.as_tensor(mine, device=pairs.clean.device)
                    sub, sub_prefix = pairs.rows(picked), prefix.rows(picked)
                    held = mask((rank, 1 - f), n)  # ranked on the other fold
                    out[(rank, "held_out")][mine, i] = self._metric(
                        sub, _rows_of(corrupted, mine), held, sub_prefix
                    )
        self.seconds_.update({"circuits": time.perf_counter() - clock})
        clock = time.perf_counter()
        out["exact"] = edge_exact(model, g, pairs, corrupted, m_clean, edges, prefix, clean).numpy()
        self.seconds_.update({"exact": time.perf_counter() - clock})
        return out

    def _metric(self, pairs, corrupted, out, prefix) -> np.ndarray:
        from headprobe.studies.circuit.edge_scores import circuit_metric

        return circuit_metric(self.model_, self.graph_, pairs, corrupted, out, prefix).numpy()

    def _edges_frame(self, eap, ig, count, exact, sample, orders, chosen) -> pd.DataFrame:
        g, e = self.graph_, self.edges_
        senders, receivers = g.senders(), g.receivers()
        n = count.sum()
        frame = pd.DataFrame(
            {
                "sender": [senders[s] for s in e[:, 1]],
                "receiver": [receivers[r][0] for r in e[:, 0]],
                "channel": [receivers[r][1] for r in e[:, 0]],
                "eap": eap.sum(0) / n,
                "eap_ig": ig.sum(0) / n,
            }
        )
        ex = np.full(len(e), np.nan)
        ex[sample] = exact.sum(0) / n
        frame["exact"] = ex
        for f in (0, 1):
            rank = np.full(len(e), np.nan)
            order = orders.get(("signed", f))
            if order is not None:
                rank[order] = np.arange(1, len(e) + 1)
            frame[f"rank_fold{f}"] = rank
        frame["in_circuit"] = chosen
        return frame

    def _nodes_frame(self, chosen: np.ndarray) -> pd.DataFrame:
        from headprobe.studies.circuit.curves import pruned

        g, e = self.graph_, self.edges_
        senders, receivers = g.senders(), g.receivers()
        keep = pruned(chosen, e, senders, receivers)
        rows = {}
        for (r, s), k in zip(e, keep):
            if not k:
                continue
            rows.setdefault(senders[s], [0, 0])[1] += 1
            rows.setdefault(receivers[r][0], [0, 0])[0] += 1
        out = []
        for node, (n_in, n_out) in rows.items():
            layer, head = _place(node, g.layers)
            out.append([node, layer, head, n_in, n_out])
        frame = pd.DataFrame(out, columns=["node", "layer", "head", "in_edges", "out_edges"])
        return frame.sort_values(["layer", "head"]).reset_index(drop=True)

    def describe(self) -> dict:
        kept = KEPT.get(getattr(self, "token", None))
        g = getattr(self, "graph_", None)
        return {
            NAME: {
                "ig_steps": self.steps,
                "edges": int(len(self.edges_)) if g is not None else 0,
                "units": len(getattr(self, "sums_", {}) or {}),
                "smallest_faithful": kept.get("smallest"),
                "does_task": kept.get("does_task"),
                "fold_units": kept.get("fold_units"),
                "min_fold_units": MIN_FOLD,
                "budgets": [round(100 * b, 6) for b in self.budgets],
                "seconds": {k: round(v, 2) for k, v in getattr(self, "seconds_", {}).items()},
                "kept": getattr(self, "token", None),
            }
        }


def _place(node: str, layers: int) -> tuple[int, int]:
    """(layer, head) of a node name: head -1 for an MLP, layer -1 for the embeddings, the
    logits after every layer (layer `layers`)."""
    if node == "embed":
        return -1, -1
    if node == "logits":
        return layers, -1
    if node.startswith("mlp"):
        return int(node.split()[1]), -1
    layer, head = node.split("-")
    return int(layer), int(head)


def _by_length(examples) -> list[list]:
    by: dict = {}
    for e in examples:
        by.setdefault(len(e.meta["input_ids"]), []).append(e)
    return [by[k] for k in sorted(by)]


def _suffix(model, nodes, pairs) -> int:
    """Pieces a forward of `pairs` runs: those after the shared prefix (`edge_scores.Prefix`)."""
    from headprobe.studies.patching.node_effects import shared_prefix

    return int(pairs.clean.shape[1]) - shared_prefix(model, nodes, pairs)


def _regrouped(kept: list, rows_for) -> list:
    """The kept batches (TaskPairs on the CPU, [unit] per row) joined by length in pieces, each
    cut to `rows_for(joined pairs)` rows."""
    import torch

    from headprobe.studies.patching.node_effects import TaskPairs

    by: dict = {}
    for pairs, units in kept:
        by.setdefault(int(pairs.clean.shape[1]), []).append((pairs, units))
    out = []
    for pieces in sorted(by):
        parts = by[pieces]
        joined = TaskPairs(
            *(torch.cat([getattr(p, f) for p, _ in parts]) for f in TaskPairs.__dataclass_fields__)
        )
        units = [u for _, us in parts for u in us]
        size = rows_for(joined)
        for i in range(0, len(units), size):
            out.append((joined.rows(slice(i, i + size)), units[i : i + size]))
    return out


def _on_cpu(pairs):
    from headprobe.studies.patching.node_effects import TaskPairs

    return TaskPairs(
        *(t.cpu() for t in (pairs.clean, pairs.corrupted, pairs.targets, pairs.position))
    )


def _to(pairs, device):
    from headprobe.studies.patching.node_effects import TaskPairs

    return TaskPairs(
        *(t.to(device) for t in (pairs.clean, pairs.corrupted, pairs.targets, pairs.position))
    )


def _rows_of(values, rows):
    """NodeValues restricted to `rows` of the batch."""
    import torch

    from headprobe.model.task_nodes import NodeValues

    idx = torch.as_tensor(rows)
    take = lambda t: t[idx.to(t.device)]
    return NodeValues(
        slices={k: take(v) for k, v in values.slices.items()},
        mlp={k: take(v) for k, v in values.mlp.items()},
        embed=take(values.embed),
        x0=take(values.x0),
        final=None if values.final is None else take(values.final),
    )


# ----------------------------------------------------------------------------------- tables
def nodes_table(results) -> pd.DataFrame:
    """`circuit_nodes`: the smallest faithful circuit's nodes, each with its patching role (the
    task role of `patching_heads` where the head has one) and its noising share."""
    frame = KEPT.frame("circuit_nodes")(results)
    if not len(frame):
        return frame
    nodes = results.tables.get("patching_nodes")
    role, share = {}, {}
    if nodes is not None and len(nodes):
        role = dict(zip(nodes["node"], nodes["role"].fillna("")))
        share = dict(zip(nodes["node"], nodes["noise_share"]))
    frame["role"] = [role.get(n, "") for n in frame["node"]]
    frame["noise_share"] = [share.get(n, np.nan) for n in frame["node"]]
    return frame


def console(results, name: str, top: int = 8) -> str:
    from headprobe.studies.circuit.report import console_text

    return console_text(results, top)


CIRCUIT = register(
    Analysis(
        name=NAME,
        order=136,
        scorer=CircuitScorer,
        input=TASK,
        selection=False,
        default=False,
        options=(IG_STEPS, BUDGETS, "progress"),
        model_checks=(needs_patching, task_estimates, lm_head_declared),
        homes=tuple(f"headprobe.studies.circuit.{m}" for m in ("edge_scores", "curves", "report")),
        description="every edge between the embeddings, heads, MLPs and the logits scored on a "
        "task (EAP, EAP-IG), exact path patching on a validation sample, circuits at MIB's "
        "budgets evaluated exactly, faithfulness curves in-sample and held out, CPR and CMD "
        "with intervals (METHODS §20)",
        tables={
            "circuit_edges": KEPT.frame("circuit_edges"),
            "circuit_curve": KEPT.frame("circuit_curve"),
            "circuit_scores": KEPT.frame("circuit_scores"),
            "circuit_nodes": nodes_table,
            "circuit_check": KEPT.frame("circuit_check"),
        },
        console=console,
        report="headprobe.studies.circuit.report:section",
    )
)
