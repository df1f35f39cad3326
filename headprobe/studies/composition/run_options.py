"""The run options of the composition analysis (METHODS §18), each with its check and help, and the
check that needs the model's shape.

    headprobe run --model smollm2 --probe repeated-random --analyses composition \
        --receivers 3-1,4-7 --ablation mean
    headprobe.run("smollm2", probe="repeated-random", analyses="composition", receivers="3-1")

The kind of ablation is the ablation study's `--ablation` (`studies.ablation.flags.ABLATION`);
the composition reads its first kind, as the group ablations do.
"""

from __future__ import annotations

from headprobe.extend import GIVEN, Option, UsageError
from headprobe.studies.ablation.flags import ABLATION

NAME = "composition"
SENDER_KINDS = ("heads", "mlp", "embed")
# A sender is (sender_layer, sender_head) in every table: a head (layer, head); layer l's MLP
# (l, MLP_HEAD); the embeddings, what enters the first layer, EMBED. The `sender` column names
# the kind (`sender_kind`), so both keys stay integers that sort and compare.
MLP_HEAD = -1  # sender_head of an MLP sender
EMBED = (-1, -1)  # (sender_layer, sender_head) of the embeddings
SENDER = "sender"  # the column naming a sender's kind: "head", "mlp" or "embed"
KINDS = ("zero", "mean", "resample")  # the kinds of ablation the composition runs
KIND = ABLATION.name  # the column naming the kind of ablation (the option of the same name)
# an edge's key in every composition table: the receiver, the channel, the sender, the ablation
EDGE_KEYS = ["layer", "head", "channel", "sender_layer", "sender_head", KIND]


def parse_receivers(text, flag: str = "--receivers") -> list[tuple[int, int]] | None:
    """'3-1,4-7' (layer-head, 0-based) -> [(3, 1), (4, 7)] in order without repeats; None, '' or
    'all' -> None (every head above the first layer). A list of (layer, head) pairs or 'L-H'
    strings is checked the same way. A head of layer 0 is refused: it has no earlier heads to read."""
    if text is None or (isinstance(text, str) and text.strip().lower() in ("", "all")):
        return None
    parts = [p.strip() for p in text.split(",")] if isinstance(text, str) else list(text)
    out: list[tuple[int, int]] = []
    for part in parts:
        try:
            pair = part.split("-") if isinstance(part, str) else list(part)
            layer, head = (int(x) for x in pair)
            ok = len(pair) == 2 and not any(isinstance(x, bool) for x in pair)
            ok = ok and layer >= 0 and head >= 0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise UsageError(
                f"{flag} {text!r}: {part!r} is not a head; give LAYER-HEAD pairs like 3-1,4-7 "
                "(0-based) or 'all'"
            )
        if layer == 0:
            raise UsageError(
                f"{flag}: receiver {layer}-{head} is in layer 0, and layer 0 has no earlier heads "
                "to read; give heads of layer 1 or above"
            )
        if (layer, head) not in out:
            out.append((layer, head))
    if not out:
        raise UsageError(f"{flag}: the list of receivers is empty (give 'all' for every head)")
    return out


def sender_kind(layer: int, head: int) -> str:
    """ "head", "mlp" or "embed" for the sender (layer, head) (module constants)."""
    if (int(layer), int(head)) == EMBED:
        return "embed"
    return "mlp" if int(head) == MLP_HEAD else "head"


def sender_name(layer: int, head: int) -> str:
    """A sender as the report and the console name it: "3-1" (a head), "MLP 3", "embed"."""
    kind = sender_kind(layer, head)
    return {"embed": "embed", "mlp": f"MLP {int(layer)}"}.get(kind, f"{int(layer)}-{int(head)}")


def _only_with_composition(flag: str, values) -> None:
    if NAME not in values["analyses"]:
        raise UsageError(f"{flag} is read by the composition analysis: add --analyses {NAME}")


def _receivers(flag, value, values):
    receivers = parse_receivers(value, flag)
    if receivers is not None:
        _only_with_composition(flag, values)
    return receivers


def parse_senders(text, flag: str = "--senders") -> tuple[str, ...]:
    """'heads,mlp,embed' -> ('heads', 'mlp', 'embed'); None or '' -> ('heads',)."""
    names = [text] if isinstance(text, str) or text is None else list(text)
    names = [x.strip() for name in names if name for x in str(name).split(",") if x.strip()]
    unknown = [name for name in names if name not in SENDER_KINDS]
    if unknown:
        raise UsageError(
            f"{flag}: {', '.join(unknown)} is not one of {', '.join(SENDER_KINDS)} (a comma list)"
        )
    return tuple(dict.fromkeys(names or ["heads"]))


def _senders(flag, value, values):
    senders = parse_senders(value, flag)
    if senders != ("heads",):
        _only_with_composition(flag, values)
    if "heads" not in senders:
        raise UsageError(f"{flag}: the senders always include heads (e.g. heads,mlp)")
    return senders


RECEIVERS = Option(
    "receivers",
    None,
    "the composition analysis's receiver heads: LAYER-HEAD pairs like 3-1,4-7 (0-based, layer 1 "
    "or above; in Python also [(3, 1), (4, 7)]), or all (default: every head above the first layer)",
    flag="--receivers",
    metavar="HEADS",
    check=_receivers,
    stage="derived",
    record=GIVEN,
    record_value=lambda heads: [f"{l}-{h}" for l, h in heads],
)
SENDERS = Option(
    "senders",
    ("heads",),
    "what the composition analysis's receivers read from, a comma list of heads (every head of "
    "an earlier layer), mlp (each earlier layer's MLP write), embed (the embeddings: what enters "
    "the first layer); heads always included (default: heads)",
    flag="--senders",
    metavar="KINDS",
    check=_senders,
    stage="derived",
    record=lambda config: tuple(config.senders) != ("heads",),
    record_value=",".join,
)


def receivers_exist(config, facts) -> None:
    """--receivers name heads the model has (model check: before the weights load)."""
    for layer, head in getattr(config, "receivers", None) or ():
        if facts.n_layers and (layer >= facts.n_layers or head >= facts.n_heads):
            raise UsageError(
                f"--receivers: {facts.name} has {facts.n_layers} layers x {facts.n_heads} heads "
                f"(0-based); receiver {layer}-{head} does not exist"
            )


def kind_of(config) -> str:
    """The composition's kind of ablation: the first of --ablation."""
    return tuple(getattr(config, ABLATION.name, None) or ("zero",))[0]


def kind_measured(config, facts) -> None:
    """The first kind of --ablation is one the composition runs (model check, before the weights
    load; the ablation study checks the option itself)."""
    if kind_of(config) not in KINDS:
        raise UsageError(
            f"{ABLATION.flag} {kind_of(config)}: the composition analysis runs "
            f"{', '.join(KINDS[:-1])} or {KINDS[-1]} ablation"
        )


def not_resumed(config, facts) -> None:
    """A resumed run is refused: the composition's per-unit sums live in memory, not in the
    checkpoint, so a resumed pass would score only the batches after it (model check)."""
    if getattr(config, "resume", False):
        raise UsageError(
            "--resume: the composition analysis keeps its sums in memory, not in the checkpoint; "
            "run it again without --resume"
        )
