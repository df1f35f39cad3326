"""Heads on a task as an analysis of a run (METHODS §19): `--analyses patching` (the default
with `--task`).

    headprobe run --model smollm2 --task ioi --n 256 --estimate atp,ig
    headprobe run --model smollm2 --task mine.jsonl --analyses patching
    results = headprobe.run("smollm2", task="ioi", probe_n=256, estimate="atp,ig")
    results.patching_metric     # m_clean, m_corrupted and their difference, with intervals
    results.patching_nodes      # one row per node: noise, denoise, direct, shares, intervals, p_holm, role
    results.patching_check      # each estimate against the exact values over every node
    results.patching_heads      # the significant heads: logit split, attention targets, OV copying, role
    results.task_summary()      # the metric, whether the model does the task, the roles

The scorer runs the model itself (`ModelScorer`). Per batch it groups the examples by length and
first differing piece, patches every node of each group exactly (`node_effects`), computes the
direct effects, the estimates asked for and the clean attention from the scored piece
(`task_roles.scored_attention`), and keeps the batch's per-example rows as its state; `end_batch`
adds them into the run's per-unit sums (`task_sums`: a batch retried in halves after running out
of memory commits nothing twice). Its tally holds each head's attention from the scored piece to
the answer, the distractor and the first position (labels of those names), so those masses get
intervals and held-out halves like any mass. When the task ends (`finish`) the tables are made
(`task_tables`, `task_roles`) with the OV copying of the task's answer tokens (METHODS §9), and
kept until the run's tables read them (as the composition analysis keeps its edges).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter

import numpy as np
import pandas as pd

from headprobe.extend import TASK, Analysis, Option, RoleRule, UsageError, register
from headprobe.scoring.kept_tables import KeptTables
from headprobe.scoring.model_scorer import ModelScorer
from headprobe.studies.ablation.flags import ESTIMATE
from headprobe.studies.patching.task_roles import (
    MOVER,
    NEGATIVE,
    OTHER,
    RULES,
    SUPPRESSOR,
)

NAME = "patching"
TASK_ESTIMATES = ("atp", "atp*", "ig")
DEFAULT_ESTIMATES = ("atp",)  # on a task when --estimate is left at its default (michel)
TAIL = ("answer", "distractor", "first_position")  # the tally's labels (`task_sums.TARGETS`)
KEPT = KeptTables(NAME)  # the tables `finish` made, until the run's tables read them


def at_least_one(flag, value, values):
    if int(value) < 1:
        raise UsageError(f"{flag} must be at least 1, got {value}")
    return int(value)


IG_STEPS = Option(
    "ig_steps",
    5,
    "integrated gradients' steps on a task (--estimate ig): the gradient averaged over K passes "
    "whose embeddings run from the corrupted to the clean prompt (default: 5)",
    flag="--ig-steps",
    type=int,
    metavar="K",
    check=at_least_one,
    record=lambda config: config.ig_steps != 5,
)


LM_ARCHITECTURES = ("ForCausalLM", "ForMaskedLM", "LMHeadModel", "ForConditionalGeneration")


def lm_head_declared(config, facts) -> None:
    """Before the weights load: a model whose config names its architectures, none of them under
    a language-model head (the bundled MiniLM: `BertModel`), is refused in one line; a head
    declared but missing from the checkpoint is found once the model loads (`use_model`)."""
    names = list(getattr(facts.config, "architectures", None) or [])
    if names and not any(n.endswith(LM_ARCHITECTURES) for n in names) and not facts.causal_lm():
        raise UsageError(
            f"{NAME}: {facts.name} has no language-model head (its config names "
            f"{', '.join(names)}); a task's metric is the logit difference of its answer and "
            "distractor"
        )


def task_estimates(config, facts) -> None:
    """A task's estimates are atp, atp* and ig; michel (|dL/dg| of an LM loss) is importance's."""
    asked = tuple(config.estimate)
    if asked != ("michel",) and "michel" in asked:
        raise UsageError(
            f"{ESTIMATE.flag} michel: a task's nodes are estimated by {', '.join(TASK_ESTIMATES)} "
            "(michel is the importance analysis's |dL/dg|)"
        )


class PatchingScorer(ModelScorer):
    """See the module docstring."""

    analysis = NAME
    value = "mass"
    kinds = DEFAULT_ESTIMATES
    steps = 5

    def use_options(self, options: dict) -> None:
        asked = tuple(options.get(ESTIMATE.name) or ("michel",))
        self.kinds = DEFAULT_ESTIMATES if asked == ("michel",) else asked
        self.steps = int(options.get(IG_STEPS.name) or 5)

    def use_model(self, model, tokenizer, stack: str | None = None) -> None:
        from headprobe.model.discovery import attention_sites
        from headprobe.model.objectives import lm_kind
        from headprobe.model.task_nodes import TaskNodes
        from headprobe.studies.patching.task_sums import TaskSums

        model_name = type(model).__name__
        if attention_sites(model).encoder_decoder:
            raise UsageError(
                f"{NAME}: {model_name} is an encoder-decoder model; a task's prompt is one "
                "sequence, scored by a causal or a masked language model"
            )
        if lm_kind(model) == "representation":
            raise UsageError(
                f"{NAME}: {model_name} has no language-model head (the checkpoint has none, or "
                "lacks its weights); a task's metric is the logit difference of its answer and "
                "distractor"
            )
        super().use_model(model, tokenizer, stack)
        self.model_, self.nodes_ = model, TaskNodes(model, stack)
        self.sums_ = TaskSums(self.nodes_.names(), self.nodes_.n_layers, self.nodes_.n_heads)
        self.answers_: set = set()
        self.prefixes_: list = []
        self.row_: dict = {}  # the first example's attention from its scored piece
        self.seconds_ = Counter()  # part -> seconds (exact, direct, estimates, attention)
        self.tokenizer_ = tokenizer
        self.token = uuid.uuid4().hex

    def model_pass(self, model, batch):
        """The batch's per-example rows (the state's own) and its tally rows: each head's clean
        attention from the scored piece to the answer, the distractor and the first position."""
        import torch

        from headprobe.model.sites import model_device

        rows, units, prefixes, first, seconds = {}, [], [], None, {}
        for group in groups(batch.examples, self.nodes_):
            got, prefix, kept, took = self._group(model, group, model_device(model), first is None)
            seconds = {k: seconds.get(k, 0.0) + v for k, v in took.items()}
            first = first or _attention_row(group[0], kept, self.tokenizer_)
            units += [e.unit for e in group]
            prefixes.append(prefix)
            for key, value in got.items():
                rows.setdefault(key, []).append(value)
        rows = {k: np.concatenate(v) for k, v in rows.items()}
        att = rows["attention"]  # [row, target, layer, head]
        keys = [(u, label) for u in units for label in TAIL]
        picked = att[:, [0, 3, 6]].reshape(-1, att.shape[2], att.shape[3])  # [row * 3, layer, head]
        values = torch.as_tensor(picked)[:, self.layers]
        answers = {e.meta["answer_id"] for e in batch.examples}
        return self.new_state_with(
            batch, keys, values, (units, rows, answers, prefixes, first, seconds)
        )

    def new_state_with(self, batch, keys, values, own):
        state = self.state_of(batch, keys, [1.0] * len(keys), values)
        state.own = own
        return state

    def _group(self, model, group, device, keep_row: bool) -> tuple:
        """One group's per-example rows (numpy; "seconds": [part] the time each part took), its
        shared prefix, and (`keep_row`) its first example's attention from the scored piece
        [layer, head, key]."""
        from headprobe.studies.patching import node_effects as fx
        from headprobe.studies.patching.task_roles import scored_attention
        from headprobe.studies.patching.task_tables import estimate_key

        clock = [time.perf_counter()]

        def lap() -> float:
            clock.append(time.perf_counter())
            return clock[-1] - clock[-2]

        pairs = fx.TaskPairs.of(group, device)
        exact = fx.exact_effects(model, self.nodes_, pairs)
        rows = {
            "m_clean": fx.as_numpy(exact.m_clean),
            "m_corrupted": fx.as_numpy(exact.m_corrupted),
            "noise": fx.as_numpy(exact.noise),
            "denoise": fx.as_numpy(exact.denoise),
        }
        seconds = {"exact": lap()}
        direct = fx.direct_effects(model, self.nodes_, pairs, exact)
        for key, value in (direct or {}).items():
            rows[key] = fx.as_numpy(value)
        seconds["direct"] = lap()
        for kind, (noise, denoise) in fx.estimates(
            self.nodes_, pairs, exact, self.kinds, self.steps
        ).items():
            rows[estimate_key(kind, "noise")] = fx.as_numpy(noise)
            rows[estimate_key(kind, "denoise")] = fx.as_numpy(denoise)
        seconds["estimates"] = lap()
        rows["attention"], kept = scored_attention(model, self.nodes_, pairs, keep_row)
        seconds["attention"] = lap()
        return rows, exact.prefix, kept, seconds

    def end_batch(self, state) -> None:
        super().end_batch(state)
        if state.own is not None:
            units, rows, answers, prefixes, first, seconds = state.own
            self.sums_.add(units, rows)
            self.answers_.update(answers)
            self.prefixes_.extend(prefixes)
            if first and not self.row_:
                self.row_.update(first)
            self.seconds_.update(seconds)  # a Counter: the seconds add

    def finish(self) -> None:
        """The task ended: the tables (module docstring)."""
        super().finish()
        sums = getattr(self, "sums_", None)
        if sums is None:
            return
        if not len(sums):
            raise UsageError(f"{NAME}: no example of the task was scored")
        KEPT.put(self.token, self.tables())

    def tables(self) -> dict:
        from headprobe.stats.head_selection import min_trials
        from headprobe.studies.patching.node_effects import node_frame_index
        from headprobe.studies.patching.task_roles import heads_frame
        from headprobe.studies.patching.task_tables import does_task, patching_frames

        sums, seed = self.sums_, self.tally_.seed if self.tally_ else 0
        kinds = tuple(
            k for k in self.kinds if sums.get(f"{k.replace('*', '_star')}_noise") is not None
        )
        frames = patching_frames(sums, node_frame_index(self.nodes_), seed, kinds)
        done = does_task(frames["patching_metric"])
        attention = sums.get("attention").sum(0) / max(1.0, float(sums.get("count").sum()))
        enough = len(sums) >= min_trials(NAME)  # units: fewer name no head (METHODS §5)
        heads = heads_frame(frames["patching_nodes"], attention, self._ov(), done and enough)
        role = {(int(r.layer), int(r.head)): r.role for r in heads.itertuples(index=False)}
        nodes = frames["patching_nodes"]
        nodes["role"] = [
            role.get((int(l), int(h)), "") for l, h in zip(nodes["layer"], nodes["head"])
        ]
        frames["patching_heads"] = heads
        frames["done"], frames["enough"] = done, enough
        frames["kinds"] = kinds
        return frames

    def _ov(self):
        """Per head: the OV circuit's copying score and how many of the task's answer tokens it
        copies (METHODS §9); None where the model's weights give none (q/k norms, no final norm)."""
        from headprobe.studies.ov_copying.ov_circuits import ov_heads

        try:
            return ov_heads(self.model_, sorted(self.answers_), stack=self.nodes_.stack)
        except (UsageError, ValueError):
            return None

    def describe(self) -> dict:
        kept = KEPT.get(getattr(self, "token", None))
        prefixes = getattr(self, "prefixes_", [])
        return {
            NAME: {
                "estimates": list(kept.get("kinds", self.kinds)),
                "ig_steps": self.steps,
                "nodes": len(getattr(self, "sums_", None).nodes) if hasattr(self, "sums_") else 0,
                "units": len(getattr(self, "sums_", [])),
                "does_task": bool(kept.get("done", False)),
                "enough_units": bool(kept.get("enough", False)),
                "shared_prefix_pieces": [int(min(prefixes)), int(max(prefixes))]
                if prefixes
                else [],
                "seconds": {k: round(v, 2) for k, v in getattr(self, "seconds_", {}).items()},
                "attention_row": dict(getattr(self, "row_", {})),
                "kept": getattr(self, "token", None),
            }
        }


def _attention_row(example, kept, tokenizer) -> dict | None:
    """{"example", "pieces", "weights": {"L-H": [key]}}: one example's attention from its scored
    piece, per head, for the head cards (rounded: a summary value)."""
    if kept is None:
        return None
    ids = example.meta["input_ids"][: example.meta["position"] + 1]
    weights = {
        f"{layer}-{head}": [round(float(w), 4) for w in kept[layer, head, : len(ids)]]
        for layer in range(kept.shape[0])
        for head in range(kept.shape[1])
    }
    pieces = tokenizer.convert_ids_to_tokens(ids)
    return {"example": example.source, "pieces": pieces, "weights": weights}


def groups(examples, nodes) -> list[list]:
    """The batch's examples grouped by length in pieces and first differing piece, each group cut
    to what one patched pass holds (`node_effects.rows_per_pass`)."""
    from headprobe.studies.patching.node_effects import rows_per_pass

    by: dict = {}
    for e in examples:
        clean, corrupted = e.meta["input_ids"], e.meta["corrupted_ids"]
        first = next((i for i, (a, b) in enumerate(zip(clean, corrupted)) if a != b), len(clean))
        by.setdefault((len(clean), first), []).append(e)
    out = []
    for (length, first), group in sorted(by.items()):
        size = rows_per_pass(nodes, length, first if nodes.causal else 0)
        out += [group[i : i + size] for i in range(0, len(group), size)]
    return out


# ----------------------------------------------------------------------------------- tables
def task_summary(results) -> dict:
    """The task in a few values: its name and examples, the metric (clean, corrupted and their
    difference, each with its interval), whether the model does it, and the heads per task role."""
    metric = results.tables.get("patching_metric")
    heads = results.tables.get("patching_heads")
    info = results.summary.get(NAME) or {}
    task = results.summary.get("task") or {}
    out = {"task": task.get("name"), "examples": task.get("examples"), "does_task": None}
    if metric is not None and len(metric):
        for r in metric.itertuples(index=False):
            out[r.metric] = (float(r.value), float(r.low), float(r.high))
        out["does_task"] = bool(info.get("does_task", metric.iloc[2]["low"] > 0))
    roles = {}
    if heads is not None and len(heads):
        for r in heads.itertuples(index=False):
            roles.setdefault(r.role, []).append(f"{int(r.layer)}-{int(r.head)}")
    out["roles"] = roles
    out["attention_row"] = info.get("attention_row") or {}
    return out


def _role_match(role: str):
    def match(results) -> pd.DataFrame:
        heads = results.tables.get("patching_heads")
        columns = ["layer", "head", "detail", "short", "evidence", "score"]
        if heads is None or not len(heads):
            return pd.DataFrame(columns=columns)
        mine = heads[heads["role"] == role]
        return pd.DataFrame(
            {
                "layer": mine["layer"].astype(int),
                "head": mine["head"].astype(int),
                "detail": role,
                "short": {MOVER: "MOV", SUPPRESSOR: "SUP", NEGATIVE: "NEG", OTHER: "OTH"}[role],
                "evidence": mine["evidence"],
                "score": mine["direct"],
            }
        )

    match.__name__ = f"{role.replace(' ', '_')}_match"
    return match


TASK_RULES = tuple(
    RoleRule(role, order, color, f"{role} (a task, METHODS §19): {RULES[role]}", _role_match(role))
    for role, order, color in (
        (MOVER, 0.1, "#1b9e77"),
        (SUPPRESSOR, 0.2, "#d95f02"),
        (NEGATIVE, 0.3, "#7570b3"),
        (OTHER, 0.35, "#a6a6a6"),
    )
)


def console(results, name: str, top: int = 8) -> str:
    """The metric, whether the model does the task, and the significant heads by role."""
    from headprobe.studies.patching.report import console_text

    return console_text(results, top)


PATCHING = register(
    Analysis(
        name=NAME,
        order=135,
        scorer=PatchingScorer,
        input=TASK,
        selection=False,
        default=True,
        options=(ESTIMATE.name, IG_STEPS),
        model_checks=(task_estimates, lm_head_declared),
        roles=TASK_RULES,
        homes=tuple(
            f"headprobe.studies.patching.{m}"
            for m in ("node_effects", "task_roles", "task_sums", "task_tables", "report")
        ),
        description="every head, MLP and the embeddings patched on a task's prompt pairs: noising, "
        "denoising and the direct effect on the logit difference, with intervals and Holm; "
        "estimates (atp, atp*, ig) beside every node's exact value; what the significant heads "
        "attend to and which logit they move (METHODS §19)",
        tables={
            "patching_metric": KEPT.frame("patching_metric"),
            "patching_nodes": KEPT.frame("patching_nodes"),
            "patching_check": KEPT.frame("patching_check"),
            "patching_heads": KEPT.frame("patching_heads"),
        },
        console=console,
        queries={"task_summary": task_summary},
        card="headprobe.studies.patching.report:card",
        report="headprobe.studies.patching.report:section",
    )
)
