"""The id that pads a batch: the tokenizer's pad token, else its end-of-sequence token, else 0.

    pad = padding_id(tokenizer)

A padded position is never read (its attention mask is 0, and a batch of one exact length has
none), so any id serves; this is the one place that picks it, for the scoring pass, the baselines
of mean and resample ablation and the decoded needle probe alike.
"""

from __future__ import annotations


def padding_id(tokenizer) -> int:
    """The tokenizer's pad id, else its end-of-sequence id, else 0."""
    for pad in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if pad is not None:
            return int(pad)
    return 0
