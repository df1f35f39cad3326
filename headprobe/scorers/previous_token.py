"""Previous-token heads: attention from each token to the one right before it.

Pattern (TransformerLens `get_previous_token_head_detection_pattern`): D[i, i - 1] = 1,
both positions tokens (a special such as BOS is no previous token: the first token's
row is empty). Scores, baselines and tables: `headprobe.scorers.token_patterns`. The
pattern looks backwards: a causal model can express it. Baselines: a random visible
key and the first position (offset -1 is the pattern itself, so it is no baseline).

Role `previous-token` (order 1.5: after the word-level `positional` role, its twin):
mul score >= 0.5 on each fold, 95% lower end >= 0.4, gap to the best baseline above 0.
"""

from __future__ import annotations

from headprobe.registry import Analysis, register
from headprobe.scorers.token_patterns import (PatternScorer, group_table, head_table, pattern_rule,
                                              previous_token_pattern)

NAME = "previous_token"
THRESHOLD, LOWER = 0.5, 0.4


class PreviousTokenScorer(PatternScorer):
    analysis = NAME
    pattern = staticmethod(previous_token_pattern)
    offsets = ()


ROLE = pattern_rule("previous-token", NAME, 1.5, "#64b5cd", "prev", THRESHOLD, LOWER,
                    "attends to the previous token (D[i, i-1])")

ANALYSIS = register(Analysis(
    name=NAME, scorer=PreviousTokenScorer, input="probe", selection=True, default=False,
    description="share of attention on the previous token, and argmax hits on it, per head, at piece level "
                "(TransformerLens previous-token pattern; looks backwards, so causal models can express it); "
                "baselines: a random visible key, the first position",
    roles=(ROLE,),
    tables={f"{NAME}_heads": lambda results: head_table(results, NAME),
            f"{NAME}_kv_groups": lambda results: group_table(results, NAME)}))
