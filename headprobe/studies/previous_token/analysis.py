"""Previous-token heads: attention from each token to the one right before it.

Pattern (TransformerLens `get_previous_token_head_detection_pattern`): D[i, i - 1] = 1,
both positions tokens (a special such as BOS is no previous token: the first token's
row is empty). Scores, baselines and tables: `headprobe.extend.patterns`. The
pattern looks backwards: a causal model can express it. Baselines: a random visible
key and the first position (offset -1 is the pattern itself, so it is no baseline).

Role `previous-token` (order 1.5: after the word-level `positional` role, its twin):
mul score >= 0.5 on each fold, 95% lower end >= 0.4, gap to the best baseline above 0.
"""

from __future__ import annotations

import numpy as np

from headprobe.extend import PatternRule, pattern_analysis


def previous_token_pattern(ids: np.ndarray, token: np.ndarray) -> np.ndarray:
    """[T, T] bool: D[i, i - 1], both positions tokens (not specials)."""
    t = len(ids)
    d = np.zeros((t, t), dtype=bool)
    if t > 1:
        i = np.arange(1, t)
        d[i, i - 1] = token[i] & token[i - 1]
    return d


NAME = "previous_token"
THRESHOLD, LOWER = 0.5, 0.4

ANALYSIS = pattern_analysis(
    NAME,
    previous_token_pattern,
    order=50,
    baselines=("random", "first"),
    rule=PatternRule(
        "previous-token",
        THRESHOLD,
        LOWER,
        "attends to the previous token (D[i, i-1])",
        order=1.5,
        color="#64b5cd",
        short="prev",
    ),
    description="share of attention on the previous token, and argmax hits on it, per head, at piece level "
    "(TransformerLens previous-token pattern; looks backwards, so causal models can express it); "
    "baselines: a random visible key, the first position",
)
ROLE = ANALYSIS.roles[0]
PreviousTokenScorer = ANALYSIS.scorer
