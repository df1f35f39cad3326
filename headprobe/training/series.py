"""A timeline's checkpoints: their names, steps and labels, checked before any model loads.

    series = checkpoints(["ckpt/step_0", "ckpt/step_1000"])              # steps from the names
    series = checkpoints(["EleutherAI/pythia-70m"], revisions="step0,step1000")
    series = checkpoints(["a", "b"], steps="0,1000")                     # steps given
    check_series(series)      # one line (UsageError) naming a checkpoint that cannot join

A checkpoint is a local directory, a hub name, or `NAME@REVISION` (`--revisions` applies a list
of revisions to one name). Its step is parsed from its revision, else its name (`step_01000`,
`step1000`, `step_20k`: k = 1,000; the last such part of the name), unless `--steps` gives them
all (METHODS §17). `check_series` reads only config and tokenizer files: a missing checkpoint,
two architectures or two tokenizers in one timeline are refused before any weights load.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from headprobe.checks import check_model, config_layers_heads, read_config
from headprobe.core.errors import UsageError

STEP = re.compile(r"step[_-]?(\d+)(k?)(?![0-9A-Za-z])", re.IGNORECASE)
# the files that fix how text becomes ids (whichever a tokenizer has)
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
)
# what a tokenizer.json holds beyond its settings of padding and truncation
TOKENIZER_PARTS = ("normalizer", "pre_tokenizer", "model", "post_processor", "added_tokens")
# what makes two configs one architecture (beside layers and heads, `config_layers_heads`)
ARCHITECTURE = ("model_type", "architectures", "hidden_size", "n_embd", "d_model", "vocab_size")


@dataclass(frozen=True)
class Checkpoint:
    """One model of a timeline: `spec` as given, `model` as `headprobe run --model` takes it (a
    path, a hub name, `NAME@REVISION`), its `step` and `label` (its results directory's name)."""

    spec: str
    model: str
    step: int
    label: str

    def record(self) -> dict:
        return {"checkpoint": self.label, "step": self.step, "model": self.model}


def parse_step(text: str) -> int | None:
    """The training step a name holds (its last `step...` part), else None.

    parse_step("step_01000") == 1000; parse_step("google/multiberts-seed_0-step_20k") == 20000"""
    found = STEP.findall(str(text))
    if not found:
        return None
    digits, thousands = found[-1]
    return int(digits) * (1000 if thousands else 1)


def _list(value) -> list[str] | None:
    if value is None:
        return None
    parts = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    return [p.strip() for p in parts if p.strip()]


def _steps(value, n: int) -> list[int] | None:
    given = _list(value)
    if given is None:
        return None
    if len(given) != n:
        raise UsageError(f"--steps gives {len(given)} steps for {n} checkpoints: give one each")
    try:
        return [int(float(s.lower().replace("k", "e3"))) for s in given]
    except ValueError:
        raise UsageError(f"--steps {','.join(given)}: not whole numbers") from None


def _label(model: str) -> str:
    """A directory name for a checkpoint: its last path part (and revision), safe characters."""
    name, _, revision = model.rpartition("@") if "@" in model else (model, "", "")
    tail = Path(name.rstrip("/")).name or name
    text = f"{tail}@{revision}" if revision else tail
    return re.sub(r"[^A-Za-z0-9._@-]+", "_", text)


def checkpoints(specs, revisions=None, steps=None) -> list[Checkpoint]:
    """The checkpoints named, ordered by step (see the module docstring); UsageError for no
    checkpoint, `--revisions` with several names, an unparseable step, or two of one step."""
    specs = [str(s) for s in (specs or [])]
    if not specs:
        raise UsageError("timeline: name at least one checkpoint")
    revs = _list(revisions)
    if revs is not None:
        if len(specs) != 1:
            raise UsageError(
                f"--revisions applies to one name, not {len(specs)}: give NAME@REVISION each"
            )
        specs = [f"{specs[0]}@{rev}" for rev in revs]
    given = _steps(steps, len(specs))
    found = []
    for k, spec in enumerate(specs):
        step = given[k] if given is not None else parse_step(spec.rpartition("@")[2] or spec)
        if step is None:
            step = parse_step(spec)
        if step is None:
            raise UsageError(
                f"checkpoint {spec}: no step in its name (step_01000, step1000, step_20k): "
                "give --steps"
            )
        found.append(Checkpoint(spec, spec, step, _label(spec)))
    _unique(found)
    return sorted(found, key=lambda c: c.step)


def _unique(found: list[Checkpoint]) -> None:
    for attr in ("step", "label"):
        seen: dict = {}
        for c in found:
            other = seen.setdefault(getattr(c, attr), c)
            if other is not c:
                raise UsageError(
                    f"checkpoints {other.spec} and {c.spec} have the same {attr} "
                    f"({getattr(c, attr)}): a timeline needs one checkpoint per {attr}"
                )


# ----------------------------------------------------------------------------- before loading
def check_series(series: list[Checkpoint]) -> dict:
    """Each checkpoint's config and tokenizer read (no weights): UsageError naming the first that
    is missing, or whose architecture or tokenizer differs from the first checkpoint's. Returns
    {"architecture": ..., "tokenizer": sha256} of the series."""
    first = None
    for c in series:
        try:
            reference = check_model(c.model)
        except UsageError as err:
            raise UsageError(f"checkpoint {c.spec}: {_without_flag(err)}") from None
        try:
            config = read_config(*reference)
        except UsageError as err:
            raise UsageError(f"checkpoint {c.spec}: {_without_flag(err)}") from None
        seen = {"architecture": architecture(config), "tokenizer": tokenizer_hash(c, reference)}
        if first is None:
            first = (c, seen)
            continue
        for what in ("architecture", "tokenizer"):
            if seen[what] != first[1][what]:
                raise UsageError(
                    f"checkpoint {c.spec}: its {what} differs from {first[0].spec}'s "
                    f"({_difference(what, first[1][what], seen[what])}): a timeline scores one model "
                    "over training"
                )
    return first[1] if first else {}


def _without_flag(err: Exception) -> str:
    return re.sub(r"^--model \S+: ", "", str(err))


def _difference(what: str, a, b) -> str:
    if what != "architecture":
        return "other tokenizer files"
    keys = [k for k in a if a.get(k) != b.get(k)]
    return ", ".join(f"{k} {a.get(k)} vs {b.get(k)}" for k in keys)


def architecture(config) -> dict:
    """What two checkpoints of one model share: model type, classes, layers, heads, widths."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    found = {key: getattr(text, key, None) for key in ARCHITECTURE}
    found["architectures"] = list(found["architectures"] or [])
    found["layers"], found["heads"] = config_layers_heads(config)
    return found


def tokenizer_hash(c: Checkpoint, reference) -> str:
    """SHA-256 over the checkpoint's tokenizer files (`TOKENIZER_FILES`; of `tokenizer.json` its
    vocabulary and pipeline, not its padding or truncation settings); UsageError for none."""
    path, extra, _ = reference
    digest, found = hashlib.sha256(), 0
    for name in TOKENIZER_FILES:
        data = _tokenizer_file(path, name, extra)
        if data is None:
            continue
        if name == "tokenizer.json":
            whole = json.loads(data)
            data = json.dumps({k: whole.get(k) for k in TOKENIZER_PARTS}, sort_keys=True).encode()
        digest.update(name.encode() + b"\0" + data)
        found += 1
    if not found:
        raise UsageError(
            f"checkpoint {c.spec}: no tokenizer files ({', '.join(TOKENIZER_FILES[:4])}, ...): "
            "each checkpoint must hold its tokenizer"
        )
    return digest.hexdigest()


def _tokenizer_file(path: str, name: str, extra: dict) -> bytes | None:
    """A tokenizer file's bytes, from the directory or the hub (at the revision), or None."""
    local = Path(path).expanduser()
    if local.is_dir():
        return (local / name).read_bytes() if (local / name).is_file() else None
    try:  # a hub name: the file at its revision (downloads; cached by huggingface_hub)
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(path, name, revision=extra.get("revision"))).read_bytes()
    except Exception:  # not in that repository (or not reachable): that file is absent
        return None
