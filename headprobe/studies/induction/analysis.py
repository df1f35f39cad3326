"""Induction heads (Olsson et al. 2022): attention from a token to the token that
followed its earlier occurrence ("A B ... A -> B").

Pattern (TransformerLens `get_induction_head_detection_pattern`, the duplicate-token
pattern shifted one key to the right): D[i, j] = 1 for j - 1 < i with
token_{j-1} == token_i, with i, j and j - 1 tokens (no specials). When the previous
token equals the query's ("A A"), j = i itself is an induction key, as in
TransformerLens. Rows without an earlier occurrence are empty and not scored; on
Olsson's probe (random tokens repeated twice) that is the first half. Scores,
baselines and tables: `headprobe.extend.patterns`. The pattern looks
backwards: a causal model can express it. Baselines: a random visible key, the first
position, offsets -1 and -2.

Role `induction` (order 0.5: the most specific mechanism, tried first): mul score
>= 0.4 on each fold, 95% lower end >= 0.3, gap to the best baseline above 0. Meant
for the probe (`headprobe run --probe repeated-random`); on natural text repeats
are rarer and shorter, and scores are lower.
"""

from __future__ import annotations

import numpy as np

from headprobe.extend import PatternRule, pattern_analysis
from headprobe.studies.duplicate_token.analysis import duplicate_token_pattern


def induction_pattern(ids: np.ndarray, token: np.ndarray) -> np.ndarray:
    """[T, T] bool: D[i, j] for j >= 1, j - 1 < i, ids[j - 1] == ids[i]; i, j and j - 1 tokens."""
    t = len(ids)
    d = np.zeros((t, t), dtype=bool)
    if t > 1:
        d[:, 1:] = duplicate_token_pattern(ids, token)[:, :-1] & token[None, 1:]
    return d


NAME = "induction"
THRESHOLD, LOWER = 0.4, 0.3

ANALYSIS = pattern_analysis(
    NAME,
    induction_pattern,
    order=70,
    baselines=("random", "first", "offset=-1", "offset=-2"),
    rule=PatternRule(
        "induction",
        THRESHOLD,
        LOWER,
        "attends to the token after an earlier occurrence of its own token (Olsson et al. 2022)",
        order=0.5,
        color="#8172b3",
        short="ind",
    ),
    description="share of attention on the token after an earlier occurrence of the same token, and argmax hits "
    "on it, per head, at piece level (TransformerLens induction pattern; Olsson et al. 2022; looks "
    "backwards, so causal models can express it); rows without an earlier occurrence are not scored",
)
ROLE = ANALYSIS.roles[0]
InductionScorer = ANALYSIS.scorer
