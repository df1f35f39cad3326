"""Duplicate-token heads: attention from a token to its earlier occurrences.

Pattern (TransformerLens `get_duplicate_token_head_detection_pattern`): D[i, j] = 1 for
j < i with token_j == token_i, both tokens (specials never). A token's first occurrence
has an empty row and is not scored. Scores, baselines and tables:
`headprobe.scorers.token_patterns`. The pattern looks backwards: a causal model can
express it (an encoder may also look at later duplicates, which are not counted).
Baselines: a random visible key, the first position, offsets -1 and -2.

Role `duplicate-token` (order 0.6: content-based, before the positional roles):
mul score >= 0.4 on each fold, 95% lower end >= 0.3, gap to the best baseline above 0.
"""

from __future__ import annotations

from headprobe.registry import Analysis, register
from headprobe.scorers.token_patterns import (PatternScorer, duplicate_token_pattern, group_table, head_table,
                                              pattern_rule)

NAME = "duplicate_token"
THRESHOLD, LOWER = 0.4, 0.3


class DuplicateTokenScorer(PatternScorer):
    analysis = NAME
    pattern = staticmethod(duplicate_token_pattern)
    offsets = (-1, -2)


ROLE = pattern_rule("duplicate-token", NAME, 0.6, "#937860", "dup", THRESHOLD, LOWER,
                    "attends to earlier occurrences of its own token")

ANALYSIS = register(Analysis(
    name=NAME, scorer=DuplicateTokenScorer, input="probe", selection=True, default=False,
    description="share of attention on earlier occurrences of the same token, and argmax hits on them, per head, "
                "at piece level (TransformerLens duplicate-token pattern; looks backwards, so causal models can "
                "express it); rows of first occurrences are empty and not scored",
    roles=(ROLE,),
    tables={f"{NAME}_heads": lambda results: head_table(results, NAME),
            f"{NAME}_kv_groups": lambda results: group_table(results, NAME)}))
