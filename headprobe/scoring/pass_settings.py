"""The settings of one scoring pass: a value of the pass's own, built once from the run's options.

    settings = PassSettings(layers=[0, 1], batch_size=8, progress=False, n_boot=10)
    Engine(model, tokenizer, scorers, settings).run(examples)
    settings = config.pass_settings()       # what `headprobe.run` hands the engine

The pass sits below the run's configuration (`headprobe.config`) and imports nothing of it:
`RunConfig.pass_settings` builds this value, and a caller of its own builds one directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from headprobe.core.seeds import SEED
from headprobe.scoring.tally import N_BOOT


@dataclass(frozen=True)
class PassSettings:
    """`layers`: the layers scored (None: all); `batch_size`: examples per batch; `from_mode`: the
    pooling of attention from a word over its pieces (None: the conventions'); `progress`: a
    progress bar; `seed`, `n_boot`: folds and bootstrap resamples (METHODS §5);
    `keep_unit_counts`: per-unit rows too; `conventions`: a `headprobe.inputs.conventions`
    preset, name or object (None: the default pooling, and scorers keep their own);
    `query_block`: attention captured that many query pieces at a time (None: whole matrices);
    `stack`: the attention stack scored (None: the model's default); `workers`: processes that
    tokenize the corpus ahead of the model (0: a thread of this process; None: the cores the model's
    forward leaves free, `engine.forward_cores`: on the CPU usually none)."""

    layers: list[int] | None = None
    batch_size: int | None = 64
    from_mode: str | None = None
    progress: bool = True
    seed: int = SEED
    n_boot: int = N_BOOT
    keep_unit_counts: bool = False
    conventions: str | object | None = "headprobe"
    query_block: int | None = None
    stack: str | None = None
    workers: int | None = 0
