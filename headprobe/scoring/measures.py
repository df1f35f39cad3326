"""Measures of attention (METHODS §7): what a head's weights say, and what it passes on.

    from headprobe.model.attention import norm_attention
    n = norm_attention(probs, value_norms)              # N = a * ||v W_O||: [batch, head, query, key]
    shares = norm_attention(probs, value_norms, rows=True)   # N / its row sum: rows sum to 1

    headprobe.run(..., measure="weights,norms")          # every table has a `measure` column

- `weights`: the attention weights `a[i, j]` (the default; what every paper before
  Kobayashi et al. 2020 scored).
- `norms`: `N[i, j] = a[i, j] * ||v_j^h W_O^h||` (Kobayashi et al. 2020): a key whose value
  vector the head's output projection shrinks to nothing passes nothing on, however much
  weight it gets (BERT's [CLS]/[SEP]).

A scorer says how it reads a measure (`CountScorer.reads`): `ARGMAX` scores (dependency,
coreference, positional, the token patterns) get `N`; `MASS` scores (surface masses and
entropy, sinks, Jensen-Shannon distances, the parsing probe's features) get the
row-normalised `N[i, j] / sum_k N[i, k]`, a distribution like the weights (an all-zero row
stays zero). Under `weights` both are the weights themselves. One run scores every measure
asked for from one forward pass: each (analysis, measure) has its own scorer and tally
(`tally_key`), and every table carries the measure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from headprobe.model.control import KEY_MARK, TRAINED

if TYPE_CHECKING:
    import torch

WEIGHTS, NORMS = "weights", "norms"
MEASURES = (WEIGHTS, NORMS)
DEFAULT = (WEIGHTS,)
ARGMAX, MASS = "argmax", "mass"  # how a scorer reads a measure (see the docstring)
# the capture quantities (`head_quantities.QUANTITIES`) each measure is computed from
NEEDS = {WEIGHTS: frozenset({"probs"}), NORMS: frozenset({"probs", "value_norms"})}


def parse_measures(value) -> tuple[str, ...]:
    """'weights,norms' (or a list) -> the measures in `MEASURES` order; None -> `DEFAULT`.
    Raises ValueError naming the bad one (`checks.check_measures` words it as an option)."""
    if value is None:
        return DEFAULT
    names = (
        [x.strip() for x in value.split(",")]
        if isinstance(value, str)
        else [str(x).strip() for x in value]
    )
    names = [x for x in names if x]
    for name in names:
        if name not in MEASURES:
            raise ValueError(f"unknown measure {name!r}; choose from {', '.join(MEASURES)}")
    if not names:
        raise ValueError(f"no measure given; choose from {', '.join(MEASURES)}")
    return tuple(m for m in MEASURES if m in names)


def needs_of(measures) -> frozenset[str]:
    """The capture quantities the measures are computed from."""
    return frozenset().union(*(NEEDS[m] for m in measures))


def tally_key(analysis: str, measure: str = WEIGHTS, model: str = TRAINED) -> str:
    """The name of a tally in a run's tallies (and its file's stem): the analysis, with
    `@<measure>` beyond weights, then `~control` for the random-init control's
    (`headprobe.model.control`): `dependency`, `dependency@norms`, `dependency@norms~control`."""
    key = analysis if measure == WEIGHTS else f"{analysis}@{measure}"
    return key if model == TRAINED else f"{key}{KEY_MARK}{model}"


class MeasuredPieces:
    """The piece-level matrices of one captured layer (or query block) per measure and reading,
    each computed once when first asked for: `get(measure, reads)` -> [batch, head, query, key]."""

    def __init__(self, heads):
        self.heads = heads  # a tensor (probs) or a `head_quantities.Heads` mapping
        self._cache: dict[tuple[str, str], torch.Tensor] = {}

    @property
    def probs(self) -> torch.Tensor:
        return self.heads["probs"] if isinstance(self.heads, Mapping) else self.heads

    def get(self, measure: str, reads: str) -> torch.Tensor:
        if measure == WEIGHTS:
            return self.probs  # rows of weights sum to 1 already: one matrix
        key = (measure, reads)
        if key not in self._cache:
            from headprobe.model.attention import norm_attention, row_shares

            if reads == MASS:
                self._cache[key] = row_shares(self.get(measure, ARGMAX))
            else:
                self._cache[key] = norm_attention(self.probs, self.heads["value_norms"])
        return self._cache[key]
