"""Duplicate-token heads: attention from a token to its earlier occurrences.

Pattern (TransformerLens `get_duplicate_token_head_detection_pattern`): D[i, j] = 1 for
j < i with token_j == token_i, both tokens (specials never). A token's first occurrence
has an empty row and is not scored. Scores, baselines and tables:
`headprobe.extend.patterns`. The pattern looks backwards: a causal model can
express it (an encoder may also look at later duplicates, which are not counted).
Baselines: a random visible key, the first position, offsets -1 and -2.

Role `duplicate-token` (order 0.6: content-based, before the positional roles):
mul score >= 0.4 on each fold, 95% lower end >= 0.3, gap to the best baseline above 0.
"""

from __future__ import annotations

import numpy as np

from headprobe.extend import PatternRule, pattern_analysis


def duplicate_token_pattern(ids: np.ndarray, token: np.ndarray) -> np.ndarray:
    """[T, T] bool: D[i, j] for j < i with ids[j] == ids[i], both tokens."""
    t = len(ids)
    same = ids[:, None] == ids[None, :]
    before = np.tri(t, t, -1, dtype=bool)  # j < i
    return same & before & token[:, None] & token[None, :]


NAME = "duplicate_token"
THRESHOLD, LOWER = 0.4, 0.3

ANALYSIS = pattern_analysis(
    NAME,
    duplicate_token_pattern,
    order=60,
    baselines=("random", "first", "offset=-1", "offset=-2"),
    rule=PatternRule(
        "duplicate-token",
        THRESHOLD,
        LOWER,
        "attends to earlier occurrences of its own token",
        order=0.6,
        color="#937860",
        short="dup",
    ),
    description="share of attention on earlier occurrences of the same token, and argmax hits on them, per head, "
    "at piece level (TransformerLens duplicate-token pattern; looks backwards, so causal models can "
    "express it); rows of first occurrences are empty and not scored",
)
ROLE = ANALYSIS.roles[0]
DuplicateTokenScorer = ANALYSIS.scorer
