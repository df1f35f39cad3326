"""offset_back: which heads attend to the token k places back (k: --offset-back, default 2)."""

import dataclasses

import numpy as np

from headprobe.extend import (
    Cell,
    Option,
    Paragraph,
    Section,
    Table,
    UsageError,
    pattern_analysis,
    register,
)

NAME = "offset_back"


def at_least_one(flag, value, values):  # an option's check: one line, before the model loads
    if value < 1:
        raise UsageError(f"{flag} must be at least 1, got {value}")
    return value


HELP = "how many tokens back the offset_back analysis looks (default: 2)"
OFFSET = Option(
    NAME, 2, HELP, flag="--offset-back", type=int, metavar="K", check=at_least_one, record=True
)


def offset(example, k=OFFSET.default):
    """D[i, i - k]: query i's pattern is the token k places back."""
    return np.eye(len(example.ids), k=-k, dtype=bool)  # [query, key]


def top_heads(results):
    """The table: one row per head, its share of attention on the offset token, best first."""
    heads = results.head_scores(NAME, "mul")
    heads = heads.assign(share=heads["mass"] / heads["n"])[["layer", "head", "n", "share"]]
    return heads.sort_values("share", ascending=False, kind="stable").reset_index(drop=True)


def section(results, name):
    """The report section: the five heads with the largest share."""
    top = results.table(f"{name}_top").head(5)
    cells = [
        [Cell(f"{r.layer}-{r.head}"), Cell(f"{r.share:.3f}", numeric=True)]
        for r in top.itertuples()
    ]
    table = Table(f"{name}_top", "The five heads with the largest share", ["head", "share"], cells)
    about = Paragraph("The share of each head's attention on the token k places back.")
    return Section(name, "Heads that look a fixed offset back", [about, table])


# the pattern's analysis: scorer, best heads, intervals, offset_back_heads and _kv_groups, + _top
PATTERN = pattern_analysis(
    NAME, offset, baselines=("random", "first"), tables={f"{NAME}_top": top_heads}
)


class OffsetScorer(PATTERN.scorer):
    k = OFFSET.default

    def use_options(self, options):  # the run hands over the options the analysis declares
        self.k = options[NAME]

    def pattern(self, example):
        return offset(example, self.k)


ANALYSIS = register(  # the same analysis, with its own scorer, option and section
    dataclasses.replace(PATTERN, scorer=OffsetScorer, options=(OFFSET,), report=section),
    replace=True,
)
