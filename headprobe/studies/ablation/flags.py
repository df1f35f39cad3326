"""The run options of the ablation analyses (ablation, importance, group_ablation, prune_curve):
each declared here, with its check and help, and the checks that need the model's shape.

    headprobe.run("smollm2", analyses="ablation", heads="17-3,18-6", ablation="zero,mean")
    headprobe run --model smollm2 --analyses importance --estimate michel,atp

`headprobe.config` assembles them into `RunConfig` from the registry (`Analysis.options`).
"""

from __future__ import annotations

import re

from headprobe.extend import GIVEN, Option, UsageError
from headprobe.model.objectives import ABLATIONS, ESTIMATES
from headprobe.scoring import registry
from headprobe.scoring.options import ADDED


def parse_heads(text) -> list[tuple[int, int]] | None:
    """--heads: '17-3,18-6' (layer-head, 0-based) -> [(17, 3), (18, 6)] in that order without
    repeats; None, '' or 'all' -> None (every head). A list of (layer, head) pairs is checked."""
    if text is None or (isinstance(text, str) and text.strip().lower() in ("", "all")):
        return None
    parts = [p.strip() for p in text.split(",")] if isinstance(text, str) else list(text)
    heads: list[tuple[int, int]] = []
    for part in parts:
        try:
            layer, head = (int(x) for x in part.split("-")) if isinstance(part, str) else part
            ok = not any(isinstance(x, bool) for x in (layer, head)) and layer >= 0 and head >= 0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise UsageError(
                f"--heads {text!r}: {part!r} is not a head; give LAYER-HEAD pairs like 17-3,18-6 "
                "(0-based) or 'all'"
            )
        if (int(layer), int(head)) not in heads:
            heads.append((int(layer), int(head)))
    if not heads:
        raise UsageError("--heads: the list of heads is empty (give 'all' for every head)")
    return heads


def parse_head_groups(text) -> dict[str, list[tuple[int, int]]] | None:
    """--head-groups: 'induction=18-6,17-3;other=1-2,3-4' (or a dict of name -> heads) ->
    {name: [(layer, head), ...]} in the order given; None or '' -> None. Names are letters,
    digits and '_' (they name table rows), once each; every group holds at least one head."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    if isinstance(text, str):
        pairs = []
        for part in (p.strip() for p in text.split(";") if p.strip()):
            name, eq, heads = part.partition("=")
            if not eq:
                raise UsageError(
                    f"--head-groups {text!r}: {part!r} is not NAME=HEADS; give groups like "
                    "induction=18-6,17-3;other=2-1,5-4"
                )
            pairs.append((name.strip(), heads.strip()))
    else:
        pairs = list(dict(text).items())
    groups: dict[str, list[tuple[int, int]]] = {}
    for name, heads in pairs:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", str(name)) or name == "intact":
            raise UsageError(
                f"--head-groups: group name {name!r}: use letters, digits and '_' ('intact' is "
                "the model with no head ablated, always scored)"
            )
        if name in groups:
            raise UsageError(f"--head-groups: group {name!r} is given twice")
        parsed = parse_heads(heads) if not isinstance(heads, str) or heads.strip() else None
        if parsed is None:
            raise UsageError(f"--head-groups: group {name!r} names no heads")
        groups[str(name)] = parsed
    return groups


def check_heads_exist(
    heads, n_layers: int, n_heads: int, layers, model: str, option: str = "--heads"
) -> None:
    """Heads asked for must exist in the model and lie in the layers scored (`--layers`)."""
    for layer, head in heads or ():
        if layer >= n_layers or head >= n_heads:
            raise UsageError(
                f"{option}: {model} has {n_layers} layers x {n_heads} heads (0-based); "
                f"head {layer}-{head} does not exist"
            )
        if layers is not None and layer not in layers:
            raise UsageError(
                f"{option}: head {layer}-{head} is in layer {layer}, which --layers leaves out"
            )


def _heads(flag, value, values):
    heads = parse_heads(value)
    readers = registry.reading("heads")
    if heads is not None and not set(readers) & set(values["analyses"]):
        raise UsageError(
            f"--heads selects the heads the {' or '.join(readers)} analysis ablates: "
            f"add --analyses {readers[0]}"
        )
    return heads


def _heads_help() -> str:
    return (
        f"the heads the {' or '.join(registry.reading('heads'))} analysis ablates: LAYER-HEAD pairs "
        "like 17-3,18-6 (0-based; in Python also [(17, 3), (18, 6)]), or all (default: all)"
    )


def _kinds(allowed: tuple, default: str):
    """The check of a comma list of `allowed` names (--ablation, --estimate): known, each once, and
    only where an analysis that reads the option runs (`Analysis.options`)."""

    def check(option, value, values) -> tuple[str, ...]:
        names = [value] if isinstance(value, str) else list(value or [default])
        names = [x.strip() for name in names for x in str(name).split(",") if x.strip()]
        unknown = [name for name in names if name not in allowed]
        if unknown or not names:
            raise UsageError(
                f"{option}: {', '.join(unknown) or 'nothing'} is not one of {', '.join(allowed)} "
                "(a comma list)"
            )
        readers = registry.reading(option.lstrip("-"))
        if names != [default] and not set(readers) & set(values["analyses"]):
            raise UsageError(
                f"{option} is read by the {', '.join(readers)} "
                f"analys{'i' if len(readers) == 1 else 'e'}s: add --analyses {readers[0]}"
            )
        return tuple(dict.fromkeys(names))

    return check


def _switch(flag, value, values):
    if value is not True and value is not False:
        raise UsageError(f"{flag} is a switch (True or False), not {value!r}")
    return value


HEADS = Option(
    "heads",
    None,
    _heads_help,
    flag="--heads",
    metavar="HEADS",
    check=_heads,
    stage="derived",
    record=GIVEN,
    record_at=22,
)
HEAD_GROUPS = Option(
    "head_groups",
    None,
    ADDED,
    flag="--head-groups",
    metavar="GROUPS",
    check=lambda flag, value, values: parse_head_groups(value),
    stage="derived",
    record=GIVEN,
    record_value=lambda groups: {
        name: [f"{l}-{h}" for l, h in heads] for name, heads in groups.items()
    },
    record_at=25,
)
PRUNE_CURVE = Option(
    "prune_curve", False, ADDED, flag="--prune-curve", action="store_true", check=_switch
)
ABLATION = Option(
    "ablation",
    "zero",
    "the kinds of head ablation, a comma list of zero (the head's slice of the output "
    "projection's input set to 0), mean (set to its mean over the inputs' pieces: per "
    "position on a fixed-length probe), resample (taken from another input of the same "
    "length, paired by a keyed hash); every table names its kind; several give a table each "
    "and the paired difference per head; groups and the pruning curve use the first (METHODS "
    "§8) (default: zero)",
    flag="--ablation",
    metavar="KIND[,KIND]",
    check=_kinds(ABLATIONS, "zero"),
    stage="derived",
    record=lambda config: tuple(config.ablation) != ("zero",),
    record_value=",".join,
    record_at=29,
)
ESTIMATE = Option(
    "estimate",
    "michel",
    "estimates of a head's effect, a comma list of michel (E|dL/dg|, Michel et al. 2019), atp "
    "(attribution patching: (b - a) . dL/da, the signed first-order estimate of --ablation's "
    "effect, or on a task of the patch), atp* (AtP with GradDrop, Kramar et al. 2024: one "
    "backward pass per layer), ig (on a task: integrated gradients from the corrupted to the "
    "clean prompt, --ig-steps); importance checks each against the exact effect of 20 heads "
    "(METHODS §8), a task against every node's (§19) (default: michel; on a task: atp)",
    flag="--estimate",
    metavar="E[,E]",
    check=_kinds(ESTIMATES, "michel"),
    stage="derived",
    record=lambda config: tuple(config.estimate) != ("michel",),
    record_value=",".join,
    record_at=30,
)


def no_task_estimate(config, facts) -> None:
    """Head ablation has no corrupted prompt to integrate from: --estimate ig is a task's."""
    if "ig" in config.estimate:
        raise UsageError(
            "--estimate ig: integrated gradients run from a task's corrupted prompt to its clean "
            "one; importance takes michel, atp, atp*"
        )


def heads_exist(config, facts) -> None:
    """--heads and --head-groups name heads the model has, in the layers scored."""
    shape = (facts.n_layers, facts.n_heads, config.layers, facts.name)
    check_heads_exist(config.heads, *shape)
    for heads in (config.head_groups or {}).values():
        check_heads_exist(heads, *shape, option="--head-groups")
