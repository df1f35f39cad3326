"""A run option declared by what reads it: an analysis or a probe, in its own folder.

    from headprobe.scoring.options import Option, ModelFacts
    SHARE = Option(
        "my_share", 0.5, "the share a head must reach (default: 0.5)",
        flag="--my-share", type=float, check=lambda flag, value, values: ...,
    )
    register(Analysis(name="my_pattern", scorer=MyScorer, options=(SHARE,)))

An `Analysis` (or a `Probe`) lists the options it reads in `options`: an `Option` there is
declared by it (it owns the field, its default, check and help); a plain name is an option that
another analysis, a probe or the core of a run declares and it reads too (given without any of
its readers running, a check may refuse it). `headprobe.config` assembles the frozen `RunConfig`
from the core options and every registered declaration, so the command line, `headprobe.run`
and the record of a run (`summary["options"]`) know them with no file naming them.

`check(flag, value, values) -> value` raises `headprobe.core.errors.UsageError` in one line or
returns the value normalised; `values` holds the options checked so far by name (stages:
`STAGES`). `ModelFacts` is what a check that needs the model gets (`Analysis.model_checks`,
`Probe.model_checks`): run after the model's config is read and before the weights load.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

STAGES = ("option", "derived", "input", "model", "device", "out", "combined")
"""The order of the checks: an option's own value, the values that depend on other options,
input files, the model's name or path, the device, `--out`, then the checks of combinations
that read the options normalised."""
GIVEN = "given"  # `record`: recorded when the option's value is set (truthy)
ADDED = object()  # the help of a switch that adds analyses to a run: what they do


@dataclass(frozen=True)
class Option:
    """One `RunConfig` field. `flag`: its command-line option (None: Python only); `check(flag,
    value, values) -> value`; `choices`: the values allowed (checked, and the CLI's choices);
    `type`, `metavar`, `action` ("store_true"/"store_false"), `cli_default` (where the command
    line's default differs) and `group` (mutually exclusive options) shape the argparse option;
    `help`: a string, a callable giving it, or `ADDED` (a switch that adds analyses: what they do).

    `record`: whether results record the option: False, True, GIVEN (when its value is set), or
    a function of the config; `record_as`: its key there (a pair puts it in a nested dict:
    ("probe", "n")), `record_value`: what is recorded of the value, `record_at`: where its key
    goes among the others (the record's key order). `fingerprint`: an input file whose content
    a resumed run must find unchanged (recorded under `summary["inputs"]`)."""

    name: str
    default: Any = None
    help: str | Callable | object = ""
    flag: str | None = None
    check: Callable | None = None
    stage: str = "option"
    choices: tuple | None = None
    type: Callable | None = None
    metavar: str | None = None
    action: str | None = None
    cli_default: Any = dataclasses.field(default_factory=lambda: dataclasses.MISSING)
    group: str | None = None
    repr: bool = True
    record: Any = False
    record_as: str | tuple[str, str] | None = None
    record_value: Callable | None = None
    record_at: int = 0
    fingerprint: bool = False

    def __post_init__(self):
        assert self.stage in STAGES, self.stage

    def metadata(self) -> dict:
        """What `RunConfig` keeps of it on its field (`dataclasses.Field.metadata`)."""
        spec = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key in ("name", "default", "repr"):
            spec.pop(key)
        return spec


@dataclass
class ModelFacts:
    """What a model check reads of the model before its weights load (or of a loaded one):
    `name` (as messages say it), `config` (its transformers config), `n_layers` and `n_heads` of
    the stack asked for (0 where the config does not say), the layers asked for, and
    `causal_lm()`, whether it is a causal language model (a decoder with its head), worked
    out only when asked."""

    name: str
    config: Any
    n_layers: int
    n_heads: int
    layers: list | None
    is_causal_lm: Callable[[], bool]

    def causal_lm(self) -> bool:
        return bool(self.is_causal_lm())
