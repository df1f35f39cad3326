"""The needle probe as a run reads it (`--probe needle`): its options, its checks and its stream,
registered with the analyses (`registry.Probe`); the probe itself is `needles`.

    headprobe.run("smollm2", probe="needle", needle_lengths="500,1000", needle_depths=5)

Every option and check of the probe lives here: `--needles` (a JSONL file, read whole and
checked before the model loads), `--needle-lengths`, `--needle-depths` (each refused without
`--probe needle`), the model check (a causal language model whose context holds the longest
length and the answer) and the haystack check (a sentence corpus given as haystack holds a
sentence).
"""

from __future__ import annotations

from pathlib import Path

from headprobe import checks
from headprobe.extend import Option, Probe, UsageError, register_probe
from headprobe.inputs.corpora.base import CorpusError
from headprobe.studies.retrieval.needles import (
    DEFAULT_DEPTHS,
    DEFAULT_LENGTHS,
    NEEDLE,
    needle_stream,
    read_needles,
)


def _needle_only(flag, values, given: bool, what: str = "is an option of") -> None:
    """An option of the needle probe, `given` a value of its own, needs --probe needle."""
    if given and values["probe"] != NEEDLE:
        raise UsageError(f"{flag} {what} --probe {NEEDLE}: add --probe {NEEDLE}")


def _needles(flag, value, values):
    """--needles: a JSONL file of needles, read whole and checked (one line naming file:line)."""
    if value is None:
        return None
    _needle_only(flag, values, True, "gives the needles of")
    checks.check_input_file(flag, value)
    try:
        read_needles(Path(value).expanduser())
    except (CorpusError, UnicodeDecodeError) as err:
        raise UsageError(f"{flag}: {err}") from None
    return value


def _needle_lengths(flag, value, values) -> tuple[int, ...]:
    """'500,1000' (or a list) -> (500, 1000): context lengths in tokens, each at least 1."""
    parts = str(value).split(",") if isinstance(value, (str, int)) else list(value)
    lengths = []
    for part in parts:
        try:
            length = int(str(part).strip())
        except ValueError:
            raise UsageError(
                f"{flag} {value!r}: {str(part).strip()!r} is not a whole number of tokens"
            ) from None
        lengths.append(checks.check_int(flag, length, 1, " tokens"))
    lengths = tuple(dict.fromkeys(lengths))
    _needle_only(flag, values, lengths != DEFAULT_LENGTHS)
    return lengths


def _needle_depths(flag, value, values) -> int:
    depths = checks.check_int(flag, value, 1, " (depths, evenly spaced from 0 to 1)")
    _needle_only(flag, values, depths != DEFAULT_DEPTHS)
    return depths


def _with_needle(config) -> bool:
    return config.probe == NEEDLE


NEEDLES = Option(
    "needles",
    None,
    f"--probe {NEEDLE}: a JSONL file of needles, one object per line with needle, question "
    "and answer (a span of needle) (default: the built-in needles)",
    flag="--needles",
    metavar="FILE",
    check=_needles,
    stage="input",
    record=_with_needle,
    record_at=25,
    record_as=("probe", "needles"),
    record_value=lambda value: "built-in" if value is None else str(value),
    fingerprint=True,
)
NEEDLE_LENGTHS = Option(
    "needle_lengths",
    ",".join(map(str, DEFAULT_LENGTHS)),
    f"--probe {NEEDLE}: context lengths in tokens, a comma list (default: "
    f"{','.join(map(str, DEFAULT_LENGTHS))})",
    flag="--needle-lengths",
    metavar="N[,N]",
    check=_needle_lengths,
    record=_with_needle,
    record_at=26,
    record_as=("probe", "lengths"),
    record_value=list,
)
NEEDLE_DEPTHS = Option(
    "needle_depths",
    DEFAULT_DEPTHS,
    f"--probe {NEEDLE}: depths of the needle in the context, evenly spaced from 0 (its start) "
    f"to 1 (its end) (default: {DEFAULT_DEPTHS})",
    flag="--needle-depths",
    type=int,
    metavar="N",
    check=_needle_depths,
    record=_with_needle,
    record_at=27,
    record_as=("probe", "depths"),
)


def check_needle_model(config, facts) -> None:
    """--probe needle needs a causal language model (a decoder with its head) whose context holds
    the longest context length and the answer's tokens (from its config)."""
    from headprobe.model.decoding import MAX_NEW_TOKENS

    if not facts.causal_lm() or getattr(facts.config, "is_encoder_decoder", False):
        raise UsageError(
            f"--probe needle: {facts.name} is not a causal language model; the probe asks a "
            "question and reads the model's answer, which needs a decoder with its language-model "
            "head"
        )
    limit = checks.max_positions(facts.config)
    longest = max(config.needle_lengths)
    if limit is not None and longest + MAX_NEW_TOKENS > limit[0]:
        raise UsageError(
            f"--needle-lengths {longest}: {facts.name} reads at most {limit[0]} positions "
            f"({limit[1]}); a probe needs its context, the question and up to {MAX_NEW_TOKENS} "
            "answer tokens"
        )


def check_haystack(config, sentences, source: str) -> None:
    """A sentence corpus given as the haystack (`source`: its flag and value) has a sentence (its
    first is read before the model loads; a malformed one is its `CorpusError`, naming file:line)."""
    if sentences is not None and next(iter(sentences), None) is None:
        raise UsageError(
            f"--probe {NEEDLE}: {source} holds no sentence: an empty haystack, nothing to build a "
            "context of"
        )


def stream(config, tokenizer, net, sentences):
    """The needle probes of the run, read lazily: their haystack the run's sentence corpus where
    one is given (`sentences`), else the bundled text; prompts cut to what the model reads."""
    from headprobe.model.decoding import MAX_NEW_TOKENS

    limit = checks.max_positions(net.config)
    return needle_stream(
        tokenizer,
        needles=config.needles,
        lengths=config.needle_lengths,
        depths=config.needle_depths,
        haystack=sentences,
        max_prompt=None if limit is None else limit[0] - MAX_NEW_TOKENS,
    )


PROBE = register_probe(
    Probe(
        name=NEEDLE,
        stream=stream,
        description="a fact hidden in a long text and a question about it, answered greedily "
        "(causal language models; --needles, --needle-lengths, --needle-depths)",
        options=(NEEDLES, NEEDLE_LENGTHS, NEEDLE_DEPTHS),
        model_checks=(check_needle_model,),
        corpus_checks=(check_haystack,),
    )
)
