"""Retrieval heads (Wu et al. 2024; METHODS §16): the heads that copy a fact out of a long context
while the model answers a question about it.

    headprobe.run("smollm2", probe="needle", needle_lengths="500,1000", needle_depths=5,
                  analyses=["retrieval"])
    results.retrieval_heads      # per head: mean copy score over recalled probes, folds, 95% interval
    results.retrieval_success    # per (length, depth): probes, recalled, share, Wilson interval
    results.roles                # role `retrieval`: mean >= 0.1 and the interval's low end > 0

The scorer runs the model itself (`model_pass`): a batch's needle probes are left-padded and
decoded greedily with the KV cache (`headprobe.model.decoding.decode`); at each step the query
row of every scored layer and query head is read and dropped. Head h *copies* at a step whose
chosen token is w when the key it attends to most (ties: the lowest position) lies in the
answer's span of the prompt and the prompt's token there is w (Wu et al.'s released code, on the
answer's span). Its score on a probe is the number of steps it copies over the span's length
in tokens. Query heads are scored one by one (under grouped-query attention each query head has
its own row). A probe counts where the response recalls more than half of the answer's words
(`headprobe.studies.retrieval.needles.recalled`).

Rows per probe (its unit is the probe: folds and bootstrap weights, METHODS §5):
- (unit, `grid:<length>:<depth>`): n = 1 and extra `recalled` 0/1, for every probe: the success
  map; no head values (a failed probe adds nothing to any head);
- (unit, `retrieval`): n = 1, mass = each head's score, for recalled probes only.
So `retrieval_heads` is the mean score over recalled probes with the streaming bootstrap's 95%
interval over probes and per-fold means, and best heads (in-sample and held-out) are selected
on the `retrieval` label alone (`Analysis.selects`). Nothing of a probe's attention is kept.

The causal check (`--retrieval-check K`: the top-k heads ablated against k random heads and
none) is `headprobe.studies.retrieval.causal`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from headprobe.extend import (
    PROBE,
    Analysis,
    RoleRule,
    UsageError,
    first_argmax,
    head_table,
    register,
)
from headprobe.model.objectives import lm_kind
from headprobe.scoring.model_scorer import ModelScorer
from headprobe.stats.estimates import wilson
from headprobe.stats.head_selection import min_trials
from headprobe.stats.roles import MATCH_COLUMNS
from headprobe.studies.retrieval.needles import NEEDLE, recalled

if TYPE_CHECKING:  # torch and the model modules are imported where a probe is decoded, so a
    import torch  # report that reads this analysis's tables imports neither

NAME = "retrieval"
SCORE = "retrieval"  # the label of a recalled probe's row: each head's copy score
GRID = "grid"  # labels grid:<length>:<depth>: every probe, for the success map
RECALLED = "recalled"  # the extra counting recalled probes
LABELS = (SCORE,)
THRESHOLD = 0.1  # Wu et al.'s: a head copying at least a tenth of the answer, on average
CHECK_MODULE = "headprobe.studies.retrieval.causal"


# ------------------------------------------------------------------------------ the probes
def decoding_setup(model, tokenizer, analysis: str) -> tuple[int, frozenset[int]]:
    """(pad id, stop tokens) to decode the needle probe on `model`; a `UsageError` naming
    `analysis` (one line) where it is not a one-stack causal language model with its head."""
    from headprobe.model.decoding import stop_tokens
    from headprobe.model.discovery import attention_sites
    from headprobe.model.padding import padding_id

    if attention_sites(model).encoder_decoder or lm_kind(model) != "causal_lm":
        raise UsageError(
            f"{analysis}: {type(model).__name__} is not a one-stack causal language model with "
            "its language-model head; the needle probe is answered by greedy decoding"
        )
    return padding_id(tokenizer), stop_tokens(tokenizer, model)


@dataclass
class Prompts:
    """A batch's needle prompts, left-padded on the model's device."""

    ids: torch.Tensor  # [probe, piece] long: the prompts, left-padded
    mask: torch.Tensor  # [probe, piece] long: 1 on the prompts' tokens
    start: torch.Tensor  # [probe] long: the answer's first token, as a padded position
    stop: torch.Tensor  # [probe] long: one past its last
    answers: list[list[int]]  # the answer's tokens of each prompt (its span's ids)

    @classmethod
    def of(cls, examples, pad_id: int, device) -> Prompts:
        """The prompts of needle-probe `examples` (`UsageError` for any other example)."""
        import torch

        for example in examples:
            meta = example.meta or {}
            if meta.get("probe") != NEEDLE or "answer_span" not in meta:
                raise UsageError(
                    f"{NAME}: example {example.source} is not a needle probe; the analysis reads "
                    f"--probe {NEEDLE}"
                )
        prompts = [list(example.meta["input_ids"]) for example in examples]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        spans = []
        for row, (prompt, example) in enumerate(zip(prompts, examples)):
            pad = width - len(prompt)
            ids[row, pad:], mask[row, pad:] = torch.tensor(prompt), 1
            start, stop = example.meta["answer_span"]
            spans.append((pad + start, pad + stop))
        start, stop = (torch.tensor(x, dtype=torch.long) for x in zip(*spans))
        answers = [p[a:b] for p, (a, b) in zip(prompts, (e.meta["answer_span"] for e in examples))]
        return cls(ids.to(device), mask.to(device), start.to(device), stop.to(device), answers)

    def __len__(self) -> int:
        return self.ids.shape[0]

    @property
    def span_length(self) -> torch.Tensor:
        return (self.stop - self.start).float()  # [probe]

    def forced(self, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, mask), each [probe, answer]: the answer's tokens of each prompt (its span's
        ids), right-padded with `pad_id`, to read teacher-forced after the prompt
        (`decoding.decode(forced=...)`: the answer given the right prefix)."""
        import torch

        width = max(len(a) for a in self.answers)
        tokens = torch.full((len(self.answers), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(tokens)
        for row, answer in enumerate(self.answers):
            tokens[row, : len(answer)], mask[row, : len(answer)] = torch.tensor(answer), 1
        return tokens.to(self.ids.device), mask.to(self.ids.device)


def step_copies(rows: torch.Tensor, token, active, ids, start, stop) -> torch.Tensor:
    """[probe, head] bool: the heads that copy at one decoding step of one layer.

    rows [probe, head, key]: the step's query rows (key j: position j of the left-padded
    sequence, generated tokens after the prompt's); token [probe]: the token the step chose;
    active [probe]: rows still generating; ids [probe, piece]: the left-padded prompts; start,
    stop [probe]: the answer's span in padded positions. A head copies when its argmax key (ties:
    the lowest position) lies in the span and the prompt's token there is the chosen one."""
    top = first_argmax(rows, -1)  # [probe, head]
    inside = (top >= start[:, None]) & (top < stop[:, None])
    at = ids.gather(1, top.clamp(max=ids.shape[1] - 1))  # [probe, head]: the token there
    return inside & (at == token[:, None]) & active[:, None]


def grid_label(meta: dict) -> str:
    """The success map's cell of a probe: grid:<length>:<depth>."""
    return f"{GRID}:{int(meta['length'])}:{float(meta['depth']):.3f}"


class RetrievalScorer(ModelScorer):
    """Copy scores of every query head on each recalled needle probe (module docstring)."""

    analysis = NAME
    extras = (RECALLED,)
    objective = None  # it scores no objective (the summary names none for it)

    def use_model(self, model, tokenizer, stack: str | None = None) -> None:
        """Before the run: a causal language model is needed; its pad and stop tokens."""
        self.tokenizer = tokenizer
        self.pad_id, self.stops = decoding_setup(model, tokenizer, NAME)

    def model_pass(self, model, batch):
        """Decode the batch's probes, count each head's copying steps; the batch's rows."""
        import torch

        from headprobe.model.decoding import decode
        from headprobe.model.sites import model_device

        prompts = Prompts.of(batch.examples, self.pad_id, model_device(model))
        copies = torch.zeros(
            len(prompts), len(self.layers), self.n_heads, device=prompts.ids.device
        )  # [probe, layer, head]

        def on_step(step) -> None:
            for slot, layer in enumerate(self.layers):
                copies[:, slot] += step_copies(
                    step.rows[layer],
                    step.token,
                    step.active,
                    prompts.ids,
                    prompts.start,
                    prompts.stop,
                )

        out = decode(
            model,
            prompts.ids,
            on_step,
            attention_mask=prompts.mask,
            stop=self.stops,
            layers=self.layers,
            pad_id=self.pad_id,
        )
        ok = [
            recalled(text, example.meta["answer"])
            for text, example in zip(out.texts(self.tokenizer), batch.examples)
        ]
        return self.probe_rows(batch, copies / prompts.span_length[:, None, None], ok)

    def probe_rows(self, batch, scores: torch.Tensor, ok: list[bool]):
        """The state of a batch: per probe its grid row, and its `retrieval` row where recalled
        (scores [probe, layer, head])."""
        import torch

        keys, values, got = [], [], []
        zero = scores.new_zeros(scores.shape[1:])  # [layer, head]
        for b, example in enumerate(batch.examples):
            keys.append((example.unit, grid_label(example.meta)))
            values.append(zero)
            got.append(int(ok[b]))
            if ok[b]:
                keys.append((example.unit, SCORE))
                values.append(scores[b])
                got.append(1)
        state = self.state_of(batch, keys, np.ones(len(keys)), torch.stack(values))
        state.extra[RECALLED][:, 0] = got
        return state


# ------------------------------------------------------------------------------ tables
HEAD_COLUMNS = [
    "layer",
    "head",
    "kv_group",
    "n",
    "score",
    "ci_low",
    "ci_high",
    "fold0",
    "fold1",
    "passes",
]
SUCCESS_COLUMNS = ["length", "depth", "probes", "recalled", "share", "share_low", "share_high"]


def passes(table: pd.DataFrame, min_n: int) -> pd.Series:
    """The role's rule (METHODS §16): mean score >= `THRESHOLD`, the 95% interval's lower end
    above 0, on at least `min_n` recalled probes."""
    ok = (table["n"] >= min_n) & (table["score"] >= THRESHOLD) & (table["ci_low"] > 0)
    return ok.fillna(False).astype(bool)


def heads_table(results) -> pd.DataFrame:
    """One row per head: mean copy score over the recalled probes (`n`), its 95% bootstrap
    interval over probes, the mean on each fold, and whether it meets the role's rule."""
    table = head_table(results, NAME)
    table = table[table["label"] == SCORE]
    if not len(table):
        return pd.DataFrame(columns=HEAD_COLUMNS)
    table = table.assign(passes=passes(table, min_trials(NAME)))
    return table[HEAD_COLUMNS].reset_index(drop=True)


def success_table(results) -> pd.DataFrame:
    """One row per (length, depth) of the grid: probes, probes recalled, the share with its Wilson
    95% interval; lengths and depths ascending."""
    tally = results.tallies.get(NAME)
    rows = []
    for label in tally.sorted_labels() if tally is not None else []:
        kind, _, cell = label.partition(":")
        if kind != GRID:
            continue
        length, depth = cell.split(":")
        a = tally.arrays(label)
        probes, got = float(a["n"][:, 0, 0].sum()), float(a[f"extra:{RECALLED}"].sum())
        low, high = wilson(got, probes)
        rows.append(
            {
                "length": int(length),
                "depth": float(depth),
                "probes": int(probes),
                "recalled": int(got),
                "share": got / probes if probes else np.nan,
                "share_low": float(low),
                "share_high": float(high),
            }
        )
    table = pd.DataFrame(rows, columns=SUCCESS_COLUMNS)
    return table.sort_values(["length", "depth"]).reset_index(drop=True)


# ------------------------------------------------------------------------------ the role
def retrieval_match(results) -> pd.DataFrame:
    """The heads of `retrieval_heads` that meet the rule (`passes`), with the numbers."""
    table = results.tables.get(f"{NAME}_heads")
    if table is None or not len(table):
        return pd.DataFrame(columns=MATCH_COLUMNS)
    hit = table[table["passes"].astype(bool)]
    evidence = [
        f"mean copy score {r.score:.4f} [{r.ci_low:.4f}, {r.ci_high:.4f}] over {int(r.n)} recalled "
        f"needle probes; fold 0 {r.fold0:.4f}, fold 1 {r.fold1:.4f} (mean >= {THRESHOLD:g}, "
        f"lower end > 0)"
        for r in hit.itertuples()
    ]
    return pd.DataFrame(
        {
            "layer": hit["layer"],
            "head": hit["head"],
            "detail": "copies the needle's answer",
            "short": "retr",
            "evidence": evidence,
            "score": hit["score"],
        },
        columns=MATCH_COLUMNS,
    )


RETRIEVAL_ROLE = RoleRule(
    "retrieval",
    0.4,
    "#da8bc3",
    f"retrieval: while the model answers a needle probe it recalls, the head's most attended key is "
    f"the answer's token it is writing; mean copy score (copying steps over the answer's tokens) at "
    f"least {THRESHOLD:g} over the recalled probes, the 95% bootstrap interval's lower end above 0, "
    f"on at least {min_trials(NAME)} recalled probes (Wu et al. 2024).",
    retrieval_match,
)


# ------------------------------------------------------------------------------ console
def console_text(results, analysis: str, top: int = 5) -> str:
    """What the CLI prints: probes recalled, and the retrieval heads found (or that none passed,
    with the best few)."""
    heads = results.tables.get(f"{analysis}_heads")
    success = results.tables.get(f"{analysis}_success")
    if heads is None or success is None:
        return ""
    probes, got = int(success["probes"].sum()), int(success["recalled"].sum())
    lines = [f"\n{analysis}: {got} of {probes} needle probes recalled"]
    passed = heads[heads["passes"].astype(bool)].sort_values("score", ascending=False)
    if len(passed):
        lines.append(
            f"retrieval heads ({len(passed)} of {len(heads)}; mean copy score >= {THRESHOLD:g} "
            "and 95% interval above 0; fold 0 / fold 1):"
        )
        shown = passed
    else:
        need = min_trials(NAME)
        why = f" (a role needs {need} recalled probes)" if got < need else ""
        lines.append(f"no retrieval head passed (mean >= {THRESHOLD:g}, lower end > 0){why}; best:")
        shown = heads.sort_values("score", ascending=False).head(top)
    for r in shown.itertuples(index=False):
        lines.append(
            f"  {r.layer}-{r.head}  {r.score:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]  "
            f"{r.fold0:.3f} / {r.fold1:.3f}  n {int(r.n)}"
        )
    return "\n".join(lines)


ANALYSIS = register(
    Analysis(
        name=NAME,
        order=160,
        scorer=RetrievalScorer,
        input=PROBE,
        probe=NEEDLE,
        selection=True,
        selects=lambda label: label == SCORE,
        default=False,
        description="per head: while the model answers the needle probe greedily, the share of the answer's "
        "tokens it copies (its most attended key is the answer's token being written), mean over the "
        "probes the model recalls, and the probes recalled per length and depth (Wu et al. 2024; "
        "METHODS §16)",
        roles=(RETRIEVAL_ROLE,),
        tables={f"{NAME}_heads": heads_table, f"{NAME}_success": success_table},
        console=console_text,
        report="headprobe.studies.retrieval.report:retrieval_section",
        homes=(CHECK_MODULE,),
    )
)
