"""Do the retrieval heads matter? The causal check of Wu et al. (2024) on the needle probe
(METHODS §16).

    headprobe.run("smollm2", probe="needle", needle_lengths="500,1000", analyses=["retrieval"],
                  retrieval_check=10)
    headprobe run --model smollm2 --probe needle --analyses retrieval --retrieval-check 10
    results.retrieval_check          # none / top-k retrieval heads / k random heads, 5 draws
    results.retrieval_check_versus   # the top-k against the random draws' mean, paired

A second pass over the same probes (`second_pass`), after the `retrieval` analysis (added where
it is not asked for): its tally ranks the heads by their mean copy score over the recalled
probes (ties: layer-major); the top k are ablated together (gated to 0, METHODS §8), and so are
k heads drawn at random among the others (`DRAWS` seeded draws: a generator keyed by the run's
seed and the draw), and none. Under each condition, on every probe (recalled or not):

- success: the greedy response (`headprobe.model.decoding.decode`, the gates on) recalls more
  than half of the answer's words (`headprobe.studies.retrieval.needles.recalled`);
- the answer's log-probability: the answer's own tokens (those of its span in the needle)
  teacher-forced after the prompt, no decoding: the sum of log p over them, read from the same
  prefill as the decoding (`decode(forced=...)`: the prompt's cache, copied, then the answer).

Each condition's copy of the batch runs in one call, a gate per row (`HeadGates`), up to `ROWS`
rows at a time.

Rows per (probe, condition): `recalled@<condition>` with n = 1 and mass 0/1, `logprob@<condition>`
with n = the answer's tokens and mass the summed log p, in one whole-model cell (as the groups of
`group_ablation`), so every rate and mean has a 95% bootstrap interval over probes and every change
a paired one (same probes, same resamples). The conditions and their heads are in the summary
(`summary["retrieval_check"]`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from headprobe import checks
from headprobe.core.seeds import keyed_hash
from headprobe.extend import GIVEN, PROBE, Analysis, Option, UsageError, register
from headprobe.scoring.model_scorer import ModelScorer
from headprobe.scoring.options import ADDED
from headprobe.stats.estimates import estimate, paired_gap
from headprobe.stats.heads import tally_scores
from headprobe.studies.ablation.effects import MODEL_LEVEL
from headprobe.studies.ablation.flags import ABLATION
from headprobe.studies.ablation.groups import model_level_totals
from headprobe.studies.retrieval.analysis import (
    NAME,
    SCORE,
    Prompts,
    decoding_setup,
)
from headprobe.studies.retrieval.needles import NEEDLE, recalled

if TYPE_CHECKING:  # imported where the probes are decoded (a report imports no torch)
    import torch

CHECK = "retrieval_check"
DRAWS = 5  # random draws of k heads
ROWS = 16  # rows (probe x condition) decoded or scored in one call at most
NONE, TOP, RANDOM = "none", "retrieval", "random"
RECALL, LOGPROB = "recalled", "logprob"
OBJECTIVE = (
    "success: the greedy response recalls more than half of the answer's words; answer log p: "
    "mean log-probability (nats per token) of the answer's tokens after the prompt, teacher-forced"
)


def head_scores(tally) -> pd.DataFrame:
    """layer, head, score (mean copy score over the recalled probes) of a `retrieval` tally; empty
    where no probe was recalled."""
    if tally is None or SCORE not in tally.labels:
        return pd.DataFrame(columns=["layer", "head", "score"])
    return tally_scores(tally, SCORE)


def conditions(scores: pd.DataFrame, k: int, seed: int, draws: int = DRAWS) -> list:
    """[(label, [(layer, head), ...])]: none, the top k by score (ties: layer-major), and `draws`
    sets of k heads drawn among the others, each with a generator keyed by (seed, draw)."""
    every = [(int(l), int(h)) for l, h in zip(scores["layer"], scores["head"])]
    if 2 * k > len(every):
        raise UsageError(
            f"--retrieval-check {k}: the check needs k top heads and k other heads to draw "
            f"from; the run scores {len(every)} heads"
        )
    score = np.nan_to_num(scores["score"].to_numpy(float), nan=-np.inf)
    order = np.lexsort((scores["head"].to_numpy(), scores["layer"].to_numpy(), -score))
    top = [every[i] for i in order[:k]]
    others = [x for x in every if x not in set(top)]
    out = [(NONE, []), (TOP, sorted(top))]
    for d in range(1, draws + 1):
        rng = np.random.Generator(np.random.PCG64(keyed_hash(seed, CHECK, f"draw {d}")))
        picked = rng.choice(len(others), size=k, replace=False)
        out.append((f"{RANDOM} {d}", sorted(others[i] for i in picked)))
    return out


class RetrievalCheckScorer(ModelScorer):
    """Success and the answer's log-probability with the top-k retrieval heads, k random heads
    (several draws) and no head ablated (module docstring)."""

    analysis = CHECK
    second_pass = True  # after the retrieval pass, whose tally ranks the heads
    objective = None

    def __init__(self):
        super().__init__()
        self.k, self.groups, self.note = None, [], ""

    @staticmethod
    def prerequisites(kind: str, heads=None) -> list[str]:
        """The analysis whose counts rank the heads."""
        return [NAME]

    def use_options(self, options: dict) -> None:
        """k, the number of heads ablated (`--retrieval-check K`)."""
        self.k = int(options[CHECK])

    def use_tallies(self, tallies: dict) -> None:
        """The conditions, from the first pass's `retrieval` tally (none where no probe was
        recalled: then nothing is ablated, and the summary says why)."""
        scores = head_scores(tallies.get(NAME))
        if not len(scores) or not np.isfinite(scores["score"]).any():
            self.groups, self.note = [], "no probe was recalled: no head has a retrieval score"
            return
        seed = next(iter(tallies.values())).seed
        self.groups = conditions(scores, self.k, seed)

    def describe(self) -> dict:
        """What the summary keeps: k, the draws, each condition's heads, why nothing ran."""
        return {
            CHECK: {
                "k": self.k,
                "draws": DRAWS,
                "conditions": {g: [f"{l}-{h}" for l, h in heads] for g, heads in self.groups},
                "objective": OBJECTIVE,
                "note": self.note,
            }
        }

    def bind(self, n_layers, n_heads, layers=None, **options) -> None:
        super().bind(1, 1, [MODEL_LEVEL], **options)  # one cell: the whole model

    def use_model(self, model, tokenizer, stack: str | None = None) -> None:
        from headprobe.model.discovery import attention_sites

        self.tokenizer, self.stack = tokenizer, stack
        self.pad_id, self.stops = decoding_setup(model, tokenizer, CHECK)
        sites = attention_sites(model)
        self.shape = (sites.n_layers(stack), sites.n_heads(stack))

    def gates(self, rows: int, device) -> torch.Tensor:
        """[condition * rows, layer, head]: each condition's gates (its heads 0), `rows` times,
        condition-major."""
        import torch

        gates = torch.ones(len(self.groups), *self.shape, device=device)
        for c, (_, heads) in enumerate(self.groups):
            for layer, head in heads:
                gates[c, layer, head] = 0.0
        return gates.repeat_interleave(rows, dim=0)

    def under_conditions(self, model, examples, prompts: Prompts):
        """([probe, condition] 0/1: the greedy response recalls the answer, [probe, condition] the
        answer's summed log p teacher-forced after the prompt), under each condition's gates; the
        conditions' copies of the batch decoded together, up to `ROWS` rows at a time."""
        import torch

        from headprobe.model.decoding import decode
        from headprobe.model.gates import HeadGates

        c, b = len(self.groups), len(prompts)
        gates = self.gates(b, prompts.ids.device)  # [condition * probe, layer, head]
        forced, forced_mask = (x.repeat(c, 1) for x in prompts.forced(self.pad_id))
        ids, mask = prompts.ids.repeat(c, 1), prompts.mask.repeat(c, 1)
        step = max(1, ROWS // b) * b
        texts, logp = [], []
        for start in range(0, c * b, step):
            rows = slice(start, min(start + step, c * b))
            with HeadGates(model, gates[rows], stack=self.stack):
                out = decode(
                    model,
                    ids[rows],
                    attention_mask=mask[rows],
                    stop=self.stops,
                    layers=[],
                    pad_id=self.pad_id,
                    forced=forced[rows],
                    forced_mask=forced_mask[rows],
                )
            texts += out.texts(self.tokenizer)
            logp.append(out.forced.double().sum(-1).cpu())  # [row]
        answers = [example.meta["answer"] for example in examples] * c
        got = [recalled(text, answer) for text, answer in zip(texts, answers)]
        got = np.asarray(got, dtype=np.float64).reshape(c, b).T
        return got, torch.cat(logp).reshape(c, b).T.numpy()

    def model_pass(self, model, batch):
        """Rows (unit, recalled@condition) and (unit, logprob@condition) of every probe."""
        import torch

        from headprobe.model.sites import model_device

        if not self.groups:
            return self.new_state(batch, [], np.zeros(0))
        prompts = Prompts.of(batch.examples, self.pad_id, model_device(model))
        got, logp = self.under_conditions(model, batch.examples, prompts)  # [probe, condition]
        keys, n, values = [], [], []
        for b, example in enumerate(batch.examples):
            for c, (label, _) in enumerate(self.groups):
                keys += [(example.unit, f"{RECALL}@{label}"), (example.unit, f"{LOGPROB}@{label}")]
                n += [1, len(prompts.answers[b])]
                values += [got[b, c], logp[b, c]]
        values = torch.tensor(values, dtype=torch.float64).reshape(-1, 1, 1)  # [row, 1, 1]
        return self.state_of(batch, keys, np.asarray(n, dtype=np.float64), values)


# ------------------------------------------------------------------------------ tables
CHECK_COLUMNS = [
    "condition",
    "heads",
    "n_heads",
    "probes",
    "success",
    "success_low",
    "success_high",
    "success_change",
    "success_change_low",
    "success_change_high",
    "answer_tokens",
    "logprob",
    "logprob_low",
    "logprob_high",
    "logprob_change",
    "logprob_change_low",
    "logprob_change_high",
    "objective",
]
VERSUS_COLUMNS = ["condition", "versus", "what", "change", "change_low", "change_high"]
MEAN = f"{RANDOM} (mean)"


def _totals(results) -> tuple[dict, dict, dict] | None:
    """{condition: [resample] mass}, {condition: [resample] n} for `recalled` and `logprob`, the
    random draws' mean added as `MEAN`; and the conditions' heads. None without rows."""
    tally = results.tallies.get(CHECK)
    info = (results.summary.get(CHECK) or {}).get("conditions") or {}
    if tally is None or not info or f"{RECALL}@{NONE}" not in tally.labels:
        return None
    mass, n = {}, {}
    for what in (RECALL, LOGPROB):
        for label in info:
            mass[what, label], n[what, label] = model_level_totals(tally, f"{what}@{label}")
        draws = [label for label in info if label.startswith(RANDOM)]
        if draws:
            mass[what, MEAN] = sum(mass[what, d] for d in draws) / len(draws)
            n[what, MEAN] = n[what, draws[0]]
    heads = dict(info)
    return mass, n, heads


def check_table(results) -> pd.DataFrame:
    """One row per condition (none, the top-k retrieval heads, each random draw, the draws' mean):
    success rate and the answer's mean log p per token with 95% intervals, and each one's paired
    change from none (same probes, same resamples)."""
    found = _totals(results)
    if found is None:
        return pd.DataFrame(columns=CHECK_COLUMNS)
    mass, n, heads = found
    rows = []
    for label in [*heads, *([MEAN] if (RECALL, MEAN) in mass else [])]:
        row = {"condition": label}
        drawn = [h for g, h in heads.items() if g.startswith(RANDOM)]
        row["heads"] = " ".join(heads[label]) if label in heads else f"{len(drawn)} draws"
        row["n_heads"] = len(heads[label]) if label in heads else len(drawn[0])
        row["probes"] = int(n[RECALL, label][0])
        row["answer_tokens"] = int(n[LOGPROB, label][0])
        for what, name in ((RECALL, "success"), (LOGPROB, "logprob")):
            value, low, high = (float(x) for x in estimate(mass[what, label], n[what, label]))
            change = [
                float(x) for x in paired_gap(mass[what, label], mass[what, NONE], n[what, label])
            ]
            row.update({name: value, f"{name}_low": low, f"{name}_high": high})
            row.update(dict(zip([f"{name}_change{s}" for s in ("", "_low", "_high")], change)))
        rows.append(row)
    table = pd.DataFrame(rows)
    table["objective"] = OBJECTIVE
    return table[CHECK_COLUMNS].astype({"probes": int, "answer_tokens": int})


def versus_table(results) -> pd.DataFrame:
    """The top-k retrieval heads ablated against k random heads ablated (the draws' mean): the
    paired change of the success rate and of the answer's mean log p (retrieval minus random)."""
    found = _totals(results)
    if found is None or (RECALL, MEAN) not in found[0]:
        return pd.DataFrame(columns=VERSUS_COLUMNS)
    mass, n, _ = found
    rows = []
    for what, name in ((RECALL, "success"), (LOGPROB, "logprob")):
        change, low, high = paired_gap(mass[what, TOP], mass[what, MEAN], n[what, TOP])
        rows.append(
            {
                "condition": TOP,
                "versus": MEAN,
                "what": name,
                "change": float(change),
                "change_low": float(low),
                "change_high": float(high),
            }
        )
    return pd.DataFrame(rows, columns=VERSUS_COLUMNS)


def console_text(results, analysis: str) -> str:
    """The conditions in a few lines, and the top-k against the random draws."""
    table = results.tables.get(analysis)
    note = (results.summary.get(analysis) or {}).get("note")
    if table is None or not len(table):
        return f"\n{analysis}: not run ({note})" if note else ""
    lines = [f"\n{analysis} (answer log p per token; success rate; 95% intervals, change vs none):"]
    for r in table.itertuples(index=False):
        lines.append(
            f"  {r.condition:<14} log p {r.logprob:.3f} [{r.logprob_low:.3f}, {r.logprob_high:.3f}] "
            f"change {r.logprob_change:+.3f} [{r.logprob_change_low:+.3f}, "
            f"{r.logprob_change_high:+.3f}]  success {r.success:.3f} "
            f"[{r.success_low:.3f}, {r.success_high:.3f}]"
        )
    versus = results.tables.get(f"{analysis}_versus")
    for r in versus.itertuples(index=False) if versus is not None else []:
        lines.append(
            f"  {r.condition} vs {r.versus}: {r.what} change {r.change:+.3f} "
            f"[{r.change_low:+.3f}, {r.change_high:+.3f}]"
        )
    return "\n".join(lines)


def _k(flag, value, values):
    """K, at least 1; checked with the others normalised: it ablates by zero only (the tokens it
    decodes have no mean or partner at their positions)."""
    if value is None:
        return None
    value = checks.check_int(flag, value, 1, " heads")
    if tuple(values[ABLATION.name]) != ("zero",):
        raise UsageError(
            f"{ABLATION.flag}: {CHECK} ({flag}) ablates by zero only (the tokens it decodes have no "
            "mean or partner at their positions); run it apart"
        )
    return value


K = Option(
    CHECK,
    None,
    ADDED,
    flag="--retrieval-check",
    type=int,
    metavar="K",
    check=_k,
    stage="combined",
    record=GIVEN,
    record_at=28,
)


ANALYSIS = register(
    Analysis(
        name=CHECK,
        order=165,
        scorer=RetrievalCheckScorer,
        input=PROBE,
        probe=NEEDLE,
        selection=False,
        default=False,
        added_by=CHECK,
        options=(K,),
        description="the needle probe's success rate and the answer's teacher-forced log-probability with the "
        "top k retrieval heads ablated together, with k other heads drawn at random ablated (5 seeded draws), "
        "and with none, with paired 95% intervals (Wu et al. 2024; METHODS §16)",
        tables={CHECK: check_table, f"{CHECK}_versus": versus_table},
        console=console_text,
        report="headprobe.studies.retrieval.report:check_section",
        homes=("headprobe.studies.retrieval.analysis",),
    )
)
