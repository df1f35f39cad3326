"""Token-level head patterns as declarations: one function of an example gives the pattern,
`pattern_analysis` makes the rest (scorer, tables, best heads, intervals, role). Exported by
`headprobe.extend` (the built-in pattern analyses and plugins alike import it from there).

    ANALYSIS = pattern_analysis("previous_token", previous_token_pattern,
                                rule=PatternRule("previous-token", threshold=0.5, lower=0.4,
                                                 what="attends to the previous token"))

The built-in analyses `previous_token`, `duplicate_token` and `induction` are such
declarations (their modules say what each pattern means); a user declares one the same
way from the API (`headprobe.pattern_analysis`; see its docstring for an example).

Patterns are TransformerLens's detection patterns (`transformer_lens/head_detector.py`),
at piece level (tokens, not words), over the model's own input ids. For a query
position i and a key position j, D[i, j] = 1 where

- previous-token:  j = i - 1;
- duplicate-token: j < i and token_j == token_i;
- induction:       j - 1 < i and token_{j-1} == token_i: the key *after* an earlier
                   occurrence of the query's token (j = i itself when the previous token is
                   the same as the query's; TransformerLens's pattern has that cell too).

Every pattern looks backwards (j <= i), so a causal model can express all three; an
encoder may also attend forwards (to a later duplicate, say), which these patterns
do not count.

Special tokens (BOS/CLS, EOS/SEP, ...) are in no pattern, as query or as key: the
first token after a BOS has an empty previous-token row, and an induction key needs
its previous position to be a token too. Their attention still counts in the
denominator and in the argmax (a head that parks on the BOS misses).

Per head, over the query rows whose pattern is not empty (a token's first occurrence
has an empty duplicate-token row, every row of a sequence without repeats an empty
induction row), with n = the number of those rows:

- label `mul`: the share of the row's attention on the pattern, sum_j A[i, j] D[i, j] /
  sum_j A[i, j], summed (the tally's mass) and averaged (score = mass / n);
- label `argmax`: 1 when the row's argmax (ties: lowest index; every key, specials and
  self included) is a pattern position (stored as mass too: score = hits / n).

`mul_all_rows` in the `<analysis>_heads` table is the mass over *every* position of every
sequence (`queries`), empty rows and specials included: `mul` times (rows with a pattern / all
rows), about half of `mul` on Olsson's repeated random tokens. It is TransformerLens's
`detect_head` "mul" score (sum(A * D) / sum(A) over the whole matrix, pooled over equally long
sequences) only on inputs without specials: with a BOS in front TransformerLens counts the
cells from position 1 to the BOS and divides by the BOS's row too, which headprobe leaves out
(SmolLM2 head 16-0: 0.865 here against TransformerLens 4.3's 0.8743). Hence its own name.

Baselines, as declared (hits per query row with a pattern, the trials are the rows; a
baseline predicts one key per row, so its share of the pattern and its argmax hit are the
same number, and it serves both labels):

- `random`: a uniformly random visible key (keys 0..i in a causal model, every key in
  an encoder), drawn once per row from a generator seeded by the run's seed and the
  example (so shards and orders agree); its expectation is the share of the pattern
  under uniform attention, |pattern_i| / |visible_i|. A fractional expectation cannot
  be stored in the tally's baseline counts (whole numbers), hence one draw;
- `first`: position 0 (the BOS where there is one: then never a hit);
- fixed offsets (`offset=-1`, `offset=-2`) where they are not the pattern itself
  (duplicate-token, induction): previous-token has no offset baseline, as offset -1
  *is* its pattern.

Intervals, per-fold scores, best baselines and paired gaps come from `headprobe.stats.estimates`.

The McNemar counts (head and baseline both hit) are kept for the `argmax` label only;
for `mul` (a mass, not a hit) the exact test does not apply and `head_tests` shows NaN.

Role rules (`PatternRule`, see `pattern_rules.pattern_rule`): the head's `mul` score is at least the threshold on
*each* fold (found on one half, confirmed on the other), the 95% bootstrap interval's
lower end is at least a stated value, the paired interval of the gap to the best
baseline lies above 0, and there are at least `MIN_N` rows.
"""

from __future__ import annotations

import inspect
import re
import sys
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from headprobe.core.seeds import example_key
from headprobe.extend.pattern_rules import PatternRule
from headprobe.extend.pattern_rules import __name__ as pattern_rule_module
from headprobe.inputs.align import WORD
from headprobe.scoring.registry import PLUGIN_ORDER, PROBE, Analysis, register
from headprobe.scoring.scorer_base import BatchState, BothIndex, CountScorer, RowIndex, first_argmax
from headprobe.stats.heads import group_table, head_table

if TYPE_CHECKING:
    import torch

MUL, ARGMAX = "mul", "argmax"
LABELS = (MUL, ARGMAX)

RANDOM, FIRST = "random", "first"
OFFSET = re.compile(r"offset=([+-]\d+)")


# ---------------------------------------------------------------------------- scorer


@dataclass(frozen=True, eq=False)
class PatternExample:
    """What a pattern function of one argument gets: one example as the model reads it.

    `ids` [T] int (the model's input ids), `token` [T] bool (False at specials), `piece_word`
    [T] int (the word each piece belongs to, -1 at specials), `example` (the `Example`: its
    `words`, `unit` and `meta`, a probe's own metadata included) and `tokenizer` (the run's;
    None when a scorer is used without one). `tokens` are the pieces as strings."""

    ids: np.ndarray
    token: np.ndarray
    piece_word: np.ndarray
    example: object
    tokenizer: object = field(default=None, repr=False)

    @property
    def words(self) -> list[str]:
        return list(self.example.words)

    @property
    def meta(self) -> dict:
        return self.example.meta

    @cached_property
    def tokens(self) -> list[str]:
        if self.tokenizer is None:
            raise ValueError("this pattern was scored without a tokenizer: no tokens as strings")
        return list(self.tokenizer.convert_ids_to_tokens([int(i) for i in self.ids]))


def takes_example(fn) -> bool:
    """Whether pattern function `fn` takes one `PatternExample` (its one required positional
    argument), else the two-argument form `fn(ids, token)`."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: the two-argument form
        return False
    required = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return len(required) == 1


class PatternScorer(CountScorer):
    """Share of attention on a token pattern, and argmax hits on it, per head (see module doc).

    Subclasses (`pattern_analysis` makes them) set `analysis`, `pattern` and `baselines`
    ("random", "first", "offset=<k>", in the order the tables list them). `pattern(example)`
    gets a `PatternExample` (ids, token mask, words, the example's meta, the tokenizer), or, in
    the two-argument form, `pattern(ids, token)` gets ids [T] and the token mask [T]; either
    returns D [T, T] bool (specials are taken out of it here, as query and as key). The run
    hands the scorer its tokenizer before the pass (`use_tokenizer`)."""

    value = "mass"
    labels = LABELS
    extras = ("queries",)  # every position of the example: `mul_all_rows`'s denominator
    baselines: tuple[str, ...] = (RANDOM, FIRST)

    tokenizer = None  # the run's (`use_tokenizer`); None: a PatternExample without one

    @staticmethod
    def pattern(ids: np.ndarray, token: np.ndarray) -> np.ndarray:
        """[T, T] bool D of one example's ids [T] (token [T]: False at specials); a subclass's
        (or `pattern(example)`, given a `PatternExample`)."""
        raise NotImplementedError

    def use_tokenizer(self, tokenizer) -> None:
        """The run's tokenizer, for patterns that read tokens as strings (`PatternExample`)."""
        self.tokenizer = tokenizer

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in cls.baselines:
            if name not in (RANDOM, FIRST) and not OFFSET.fullmatch(name):
                raise ValueError(
                    f"{cls.analysis}: unknown baseline {name!r}; use 'random', 'first' or "
                    "'offset=<k>' (e.g. 'offset=-1')"
                )
        cls.variants = tuple(cls.baselines)

    def pattern_of(
        self, ids: np.ndarray, token: np.ndarray, example=None, piece_word=None
    ) -> np.ndarray:
        """[T, T] bool: the declared pattern of one example, without specials."""
        t = len(ids)
        takes = self.__dict__.get("_takes_example")
        if takes is None:  # looked up once per scorer, not per example
            takes = self._takes_example = takes_example(self.pattern)
        if takes:
            if piece_word is None:
                piece_word = np.where(token, np.cumsum(token) - 1, -1)
            seen = PatternExample(ids, token, np.asarray(piece_word), example, self.tokenizer)
            d = np.asarray(self.pattern(seen), dtype=bool)
        else:
            d = np.asarray(self.pattern(ids, token), dtype=bool)
        if d.shape != (t, t):
            raise ValueError(
                f"{self.analysis}: the pattern function gave shape {d.shape} for {t} tokens, "
                f"not ({t}, {t})"
            )
        return d & token[:, None] & token[None, :]

    def prepare(self, batch) -> BatchState:
        rows = RowIndex()
        pairs, queries = [], []  # (b, q, k) pattern cells; (b, q, mul row, argmax row) rows
        base_rows, totals = [], []
        for b, (example, alignment) in enumerate(zip(batch.examples, batch.alignments)):
            ids = np.asarray(alignment.input_ids, dtype=np.int64)
            token = np.asarray(alignment.piece_kind) == WORD
            d = self.pattern_of(ids, token, example, alignment.piece_word)  # [T, T]
            q_rows = np.flatnonzero(d.any(axis=1))  # rows with a pattern
            mul_row = rows.count(example.unit, MUL, len(q_rows))
            arg_row = rows.count(example.unit, ARGMAX, len(q_rows))
            totals.append((mul_row, arg_row, len(ids)))
            if not len(q_rows):
                continue
            q, k = np.nonzero(d)
            pairs.append(np.stack([np.full(len(q), b), q, k], axis=1))
            queries.append(
                np.stack(
                    [
                        np.full(len(q_rows), b),
                        q_rows,
                        np.full(len(q_rows), mul_row),
                        np.full(len(q_rows), arg_row),
                    ],
                    axis=1,
                )
            )
            base_rows.append(
                (mul_row, arg_row, self._baselines(d, q_rows, self.causal, self.seed, example))
            )
        state = self.new_state(batch, rows.keys, rows.n)
        for mul_row, arg_row, hits in base_rows:
            summed = hits.sum(axis=0)
            state.baseline_hits[mul_row] += summed
            state.baseline_hits[arg_row] += summed
        for mul_row, arg_row, t in totals:
            state.extra["queries"][mul_row] += t
            state.extra["queries"][arg_row] += t
        pairs = np.concatenate(pairs) if pairs else np.zeros((0, 3), dtype=np.int64)
        queries = np.concatenate(queries) if queries else np.zeros((0, 4), dtype=np.int64)
        base = (
            np.concatenate([h for _, _, h in base_rows])
            if base_rows
            else np.zeros((0, len(self.variants)), dtype=np.float32)
        )
        state.own = self.cells(batch, pairs, queries, base)
        state.own.both = self.both_index(state, queries[:, 3], base)
        return state

    @staticmethod
    def cells(batch, pairs: np.ndarray, queries: np.ndarray, base: np.ndarray) -> PatternCells:
        """The pattern's cells and rows of one batch on its device."""

        from headprobe.inputs.batching import on_device

        device = batch.device
        # pair -> its query row (both sorted by (b, q): np.nonzero walks rows in order)
        width = batch.n_pieces
        pair_query = np.searchsorted(
            queries[:, 0] * width + queries[:, 1], pairs[:, 0] * width + pairs[:, 1]
        )
        p = on_device(pairs.T, device)  # [3, pair]
        q = on_device(queries.T, device)  # [4, query]
        return PatternCells(
            pb=p[0],
            pq=p[1],
            pk=p[2],
            qb=q[0],
            qq=q[1],
            q_mul=q[2],
            q_arg=q[3],
            pair_query=on_device(pair_query.astype(np.int64), device),
            q_base=on_device(base, device),
            n_pairs=len(pairs),
        )

    def _baselines(
        self, d: np.ndarray, q_rows: np.ndarray, causal: bool, seed: int, example
    ) -> np.ndarray:
        """[query row, variant] 0/1: does each baseline's key lie on the pattern?"""
        t = d.shape[0]
        visible = q_rows + 1 if causal else np.full(len(q_rows), t)
        out = np.zeros((len(q_rows), len(self.variants)), dtype=np.float32)
        for v, name in enumerate(self.variants):
            if name == RANDOM:
                rng = np.random.Generator(np.random.PCG64(example_key(seed, example)))
                key = rng.integers(0, visible)  # [query row]
            elif name == FIRST:
                key = np.zeros(len(q_rows), dtype=np.int64)
            else:
                key = q_rows + int(OFFSET.fullmatch(name).group(1))
            inside = (key >= 0) & (key < t)
            out[inside, v] = d[q_rows[inside], key[inside]]
        return out

    def update(self, att, state) -> None:
        import torch

        c = state.own
        if c.n_pairs == 0:
            return
        probs = att.pieces  # [layer, measure, batch, head, query, key]
        total = probs.sum(-1)  # [layer, measure, batch, head, query]
        by_cell = probs.permute(2, 4, 5, 0, 1, 3)  # [batch, query, key, layer, measure, head]
        on = by_cell[c.pb, c.pq, c.pk]  # [pair, layer, measure, head]
        n_query = len(c.qq)
        share = on.new_zeros((n_query, *on.shape[1:]), dtype=torch.float64)
        share.index_add_(0, c.pair_query, on.double())
        # [query, layer, measure, head]
        share /= total.permute(2, 4, 0, 1, 3)[c.qb, c.qq].double()
        self.add(state, att, 0, c.q_mul, share.permute(1, 2, 0, 3))
        # [batch, query, layer, measure, head]
        top = first_argmax(probs, -1).permute(2, 4, 0, 1, 3)
        hit_pair = (top[c.pb, c.pq] == c.pk[:, None, None, None]).float()  # [pair, l, m, head]
        hits = hit_pair.new_zeros((n_query, *hit_pair.shape[1:]))
        hits.index_add_(0, c.pair_query, hit_pair)  # 0/1: one argmax per row
        hits = hits.permute(1, 2, 0, 3)  # [layer, measure, query, head]
        self.add(state, att, 0, c.q_arg, hits)
        self.add_both(state, att, 0, c.both, hits)


@dataclass
class PatternCells:
    """A batch's pattern cells and scored query rows on the device (`PatternScorer.prepare`)."""

    pb: torch.Tensor  # [pair] batch row of a pattern cell
    pq: torch.Tensor  # [pair] its query piece
    pk: torch.Tensor  # [pair] its key piece
    qb: torch.Tensor  # [query] batch row of a scored query row
    qq: torch.Tensor  # [query] its piece
    q_mul: torch.Tensor  # [query] its `mul` row
    q_arg: torch.Tensor  # [query] its `argmax` row
    pair_query: torch.Tensor  # [pair] the query row a cell belongs to
    q_base: torch.Tensor  # [query, variant] baseline hits
    n_pairs: int = 0  # pattern cells
    both: BothIndex | None = None  # (query, baseline) pairs where the baseline hits (`add_both`)


# ---------------------------------------------------------------------------- declarations


def pattern_analysis(
    name: str,
    pattern_fn,
    *,
    baselines=(RANDOM, FIRST),
    rule: PatternRule | None = None,
    description: str | None = None,
    input: str = PROBE,
    default: bool = False,
    module: str | None = None,
    order: float = PLUGIN_ORDER,
    replace: bool = False,
    tables: dict | None = None,
) -> Analysis:
    """Declare a token pattern and register its analysis: the scorer, the tables
    `<name>_heads` and `<name>_kv_groups`, best heads, intervals and (with `rule`) a head role,
    the same as the built-in previous-token, duplicate-token and induction analyses get.

        from headprobe.extend import PatternRule, pattern_analysis

        def last_comma(example):            # -> D [T, T] bool: each query's most recent comma
            d = np.zeros((len(example.ids),) * 2, dtype=bool)
            commas = [i for i, t in enumerate(example.tokens) if t == ","]
            for i in range(len(example.ids)):
                d[i, [c for c in commas if c < i][-1:]] = True
            return d

        pattern_analysis("last_comma", last_comma, baselines=("random", "first", "offset=-1"),
                         rule=PatternRule("comma", threshold=0.5, lower=0.4,
                                          what="attends to the most recent comma"))

    pattern_fn(example) -> D [T, T] (bool, or anything numpy reads as one): D[i, j] when
    query i's pattern holds key j, over the model's own input ids of one example (pieces,
    specials included: `example.token` is False there; specials are taken out of D as query and
    key whatever the function says). `example` is a `PatternExample`: `ids`, `token`,
    `piece_word`, `words`, `meta` (a probe's own metadata), `tokens` and `tokenizer`. The
    two-argument form `pattern_fn(ids, token)` (ids [T] int, token [T] bool) works too: a
    function with one required positional argument gets the example, else (ids, token).
    Rows with an empty pattern are not scored (module doc).
    baselines: in table order, from "random" (a uniformly random visible key), "first"
    (position 0) and "offset=<k>" (key i + k; leave out an offset that is the pattern itself).
    input: "probe" (a probe's sequences where the run has one, else the sentence corpus at
    piece level) or another of `registry.INPUTS`. default: run when no analyses are named.
    module: where the scorer class says it lives (default: the caller's module). order: its place
    among the analyses (default: after the built-ins). replace: replace an analysis of the same
    name (else a second declaration raises). tables: added to `<name>_heads`, `<name>_kv_groups`
    (its `base_tables`; one of the same name replaces one). Returns the registered `Analysis`.
    """
    module = module or sys._getframe(1).f_globals.get("__name__", "__main__")
    scorer = _pattern_scorer(name, pattern_fn, baselines, module)
    declared = dict(
        rule=rule,
        description=description,
        input=input,
        default=default,
        order=order,
        tables=dict(tables or {}),
    )
    return _register_pattern(name, scorer, baselines, declared, replace)


def _register_pattern(name, scorer, baselines, declared: dict, replace: bool) -> Analysis:
    """Register the pattern analysis `name` scored by `scorer`, with its two tables and (with
    `rule`) its role; `pattern_analysis` says what each argument is."""
    rule, description = declared["rule"], declared["description"]
    if description is None:
        description = (
            f"share of attention on the {name} token pattern, and argmax hits on it, per head, at piece "
            f"level (a declared pattern); baselines: {', '.join(baselines)}"
        )
    return register(
        Analysis(
            name=name,
            scorer=scorer,
            input=declared["input"],
            selection=True,
            default=declared["default"],
            order=declared["order"],
            description=description,
            roles=(rule.for_analysis(name),) if rule is not None else (),
            base_tables={
                f"{name}_heads": lambda results: head_table(results, name, all_rows_label=MUL),
                f"{name}_kv_groups": lambda results: group_table(results, name),
            },
            tables=declared["tables"],
            console=CONSOLE,
            # the pattern, scorer and tables of every token analysis live here, its rule beside
            homes=(__name__, pattern_rule_module),
        ),
        replace=replace,
    )


def _pattern_scorer(name: str, pattern_fn, baselines, module: str) -> type:
    """A `PatternScorer` subclass scoring `pattern_fn` as analysis `name` (the name and the
    function checked first: a clear `ValueError`)."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
        raise ValueError(
            f"pattern analysis name {name!r}: use letters, digits and '_' (it names tables and files)"
        )
    if not callable(pattern_fn):
        raise ValueError(
            f"pattern analysis {name!r}: pattern_fn must be a function (example) or (ids, token) "
            "-> [T, T] bool"
        )
    cls_name = "".join(part[:1].upper() + part[1:] for part in name.split("_")) + "Scorer"
    return type(
        cls_name,
        (PatternScorer,),
        {
            "analysis": name,
            "pattern": staticmethod(pattern_fn),
            "baselines": tuple(baselines),
            "__module__": module,
            "__qualname__": cls_name,
            "__doc__": f"The {name!r} token pattern (`pattern_analysis`): {getattr(pattern_fn, '__doc__', '') or ''}",
        },
    )


# ---------------------------------------------------------------------------- console


CONSOLE = "headprobe.extend.patterns:top_heads_text"  # a token analysis's `console`


def top_heads_text(results, analysis: str, top: int = 5) -> str:
    """A few lines on token analysis `analysis` of `results` (the CLI prints them after a run):
    its best heads by score (`mul`; the sink rate for `sink`), with interval, per-fold scores
    and the mass over all rows; "" when it has no `<analysis>_heads` table."""
    lines = []
    name = f"{analysis}_heads"
    if name not in results.tables:
        return ""
    table = results.table(name)
    label = "sink_rate" if (table["label"] == "sink_rate").any() else MUL
    rows = table[table["label"] == label].sort_values(
        ["score", "layer", "head"], ascending=[False, True, True]
    )
    if not len(rows):
        return ""
    lines.append(
        f"\n{analysis} ({label}; top {top} of {len(rows)} heads; 95% interval; fold 0 / fold 1):"
    )
    for r in rows.head(top).itertuples(index=False):
        tl = f"  mul over all rows {r.mul_all_rows:.3f}" if np.isfinite(r.mul_all_rows) else ""
        lines.append(
            f"  {r.layer}-{r.head}  {r.score:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]  "
            f"{r.fold0:.3f} / {r.fold1:.3f}  n {int(r.n)}{tl}"
        )
    return "\n".join(lines)
