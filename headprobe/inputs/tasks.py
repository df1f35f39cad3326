"""Tasks: a behaviour named by examples, each a clean prompt, a corrupted one that differs only in
the cue, an answer and a distractor (METHODS §19).

    items = read_task("ioi.jsonl")                    # TaskItem per line; bad input: one line, file:line
    items = task_items("ioi", n=256, seed=0, tokenizer=tok)   # the built-in generator
    items = task_items([{"clean": ..., "corrupted": ..., "answer": ..., "distractor": ...}])
    stream = task_stream(items, tokenizer, masked=False, name="ioi")   # a Stream of Examples

A JSONL line is `{"clean", "corrupted", "answer", "distractor"}` with optional `id` and `unit`;
other keys are kept with the example (`meta["extra"]`) and ignored by scoring. The answer's and
the distractor's token is the first piece of each as the tokenizer encodes it alone, without
special tokens; an answer of more pieces is scored by its first (one warning line says so). The
scored piece is the prompt's last (a causal LM), or its one mask token (a masked LM). Clean and
corrupted must be the same number of pieces: a node is patched position by position.

Each task example becomes an `Example` whose words are its clean prompt's non-special pieces
(1:1, as a probe's: `inputs.align.align_tokens`) and whose `meta` holds the ids the model gets
(`input_ids`, `corrupted_ids`), `answer_id`, `distractor_id`, `position` and the texts. Its unit
(folds, bootstrap; METHODS §5) is its `unit`, else its `id`, else `<task>:<line>`.

The built-in `ioi` (Wang et al. 2022): `TEMPLATES` below, each in its ABBA form (the indirect
object named first) or its BABA form (the subject first), drawn with the names, places and
objects from a generator keyed by (seed, k) alone; names are those of `NAMES` the tokenizer
writes as one piece after a space. The corrupted prompt is the ABC one: the subject's second
mention replaced by a third name. The answer is the indirect object, the distractor the subject.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from headprobe.core.errors import UsageError
from headprobe.core.seeds import keyed_hash
from headprobe.inputs.corpora.base import Example, Stream

KEYS = ("clean", "corrupted", "answer", "distractor")
BUILT_IN = ("ioi",)
IOI = "ioi"
# {A}, {B}: the two names of the first clause (ABBA: A is the indirect object, the answer; BABA:
# B is), {S}: the subject's second mention (the distractor). It stands three or four pieces from
# the end, so the pieces both prompts share run long (the patched passes run after them)
TEMPLATES = (
    "Then, {A} and {B} went to the {PLACE}. {S} gave it to",
    "When {A} and {B} got a {OBJECT} at the {PLACE}, {S} gave it to",
    "Then, {A} and {B} had a long argument. Afterwards {S} said to",
    "After {A} and {B} went to the {PLACE}, {S} said to",
    "While {A} and {B} were working at the {PLACE}, {S} handed it to",
    "Friends {A} and {B} found a {OBJECT} at the {PLACE}. {S} gave it to",
    "The {PLACE} was quiet when {A} and {B} arrived. {S} said to",
    "Yesterday {A} and {B} bought a {OBJECT} at the {PLACE}, and {S} threw it to",
)
NAMES = (
    "Mary", "John", "Tom", "James", "Anna", "Paul", "Sarah", "David", "Laura", "Mark", "Lisa",
    "Peter", "Emma", "Daniel", "Kate", "Michael", "Alice", "Robert", "Susan", "Richard", "Jane",
    "Steven", "Linda", "George", "Helen", "Frank", "Karen", "Jack", "Rose", "Henry", "Grace",
    "Sam", "Amy", "Kevin", "Rachel", "Brian", "Emily", "Eric", "Julia", "Adam", "Nancy", "Ryan",
    "Anne", "Andrew", "Lucy", "Chris", "Claire", "Scott", "Martin", "Jessica", "Joseph", "Betty",
)  # fmt: skip
PLACES = ("store", "park", "garden", "school", "office", "station", "hospital", "restaurant",
          "beach", "library", "market", "house")  # fmt: skip
OBJECTS = ("drink", "book", "ball", "bone", "basketball", "computer", "necklace", "kiss",
           "snack", "ring", "letter", "flower")  # fmt: skip
MIN_NAMES = 3
BATCH = 32  # a task's examples per batch at most: its progress bar moves per batch


@dataclass(frozen=True)
class TaskItem:
    """One example of a task, as given (texts), with where it came from."""

    clean: str
    corrupted: str
    answer: str
    distractor: str
    where: str  # "file:line", or "<task>:<k>"
    id: str | None = None
    unit: str | None = None
    extra: dict = field(default_factory=dict)


def _item(record, where: str) -> TaskItem:
    if not isinstance(record, dict):
        raise UsageError(f"{where}: a task line is a JSON object, not {type(record).__name__}")
    for key in KEYS:
        if key not in record:
            raise UsageError(f"{where}: missing key {key!r} (a task line needs {', '.join(KEYS)})")
        if not isinstance(record[key], str):
            raise UsageError(f"{where}: {key!r} must be a string, not {type(record[key]).__name__}")
        if not record[key].strip():
            raise UsageError(f"{where}: {key!r} is empty")
    name = lambda key: None if record.get(key) is None else str(record[key])
    extra = {k: v for k, v in record.items() if k not in KEYS + ("id", "unit")}
    return TaskItem(*(record[k] for k in KEYS), where, name("id"), name("unit"), extra)


def read_task(path) -> list[TaskItem]:
    """Every example of a task file (module docstring); UsageError, one line naming file:line,
    for invalid JSON, a missing key, a value that is not a string, an empty prompt; an empty
    file is refused too."""
    path = Path(path)
    items = []
    try:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                where = f"{path}:{number}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    message = f"{where}: invalid JSON ({err.msg}, column {err.colno})"
                    raise UsageError(message) from None
                items.append(_item(record, where))
    except UnicodeDecodeError as err:
        raise UsageError(f"{path}: not UTF-8 text ({err.reason})") from None
    if not items:
        raise UsageError(f"{path}: no example (a task is one JSON object per line)")
    return items


def single_piece_names(tokenizer) -> list[str]:
    """The names of `NAMES` the tokenizer writes as one piece after a space."""
    return [n for n in NAMES if len(tokenizer(" " + n, add_special_tokens=False)["input_ids"]) == 1]


def ioi_items(tokenizer, n: int = 256, seed: int = 0, mask: str | None = None) -> list[TaskItem]:
    """`n` IOI examples (module docstring); `mask`: the tokenizer's mask token, appended for a
    masked LM to score."""
    names = single_piece_names(tokenizer)
    if len(names) < MIN_NAMES:
        raise UsageError(
            f"--task ioi: the tokenizer writes only {len(names)} of the built-in names as one "
            f"piece after a space ({', '.join(names) or 'none'}); IOI needs at least {MIN_NAMES}"
        )
    items = []
    for k in range(n):
        rng = np.random.Generator(np.random.PCG64(keyed_hash(seed, "ioi", str(k))))
        template = TEMPLATES[int(rng.integers(len(TEMPLATES)))]
        io, s, c = (names[i] for i in rng.choice(len(names), 3, replace=False))
        place, thing = (
            PLACES[int(rng.integers(len(PLACES)))],
            OBJECTS[int(rng.integers(len(OBJECTS)))],
        )
        order = "ABBA" if k % 2 == 0 else "BABA"
        a, b = (io, s) if order == "ABBA" else (s, io)
        parts = {"A": a, "B": b, "PLACE": place, "OBJECT": thing}
        clean, corrupted = template.format(S=s, **parts), template.format(S=c, **parts)
        if mask:
            clean, corrupted = f"{clean} {mask}", f"{corrupted} {mask}"
        items.append(
            TaskItem(
                clean, corrupted, " " + io, " " + s, f"{IOI}:{k}", id=f"{IOI}:{k}",
                extra={"template": TEMPLATES.index(template), "order": order},
            )
        )  # fmt: skip
    return items


def task_items(task, n: int = 256, seed: int = 0, tokenizer=None, mask=None) -> list[TaskItem]:
    """A task's items: a built-in generator's name, a JSONL path, or a list of dicts."""
    if isinstance(task, str) and task in BUILT_IN:
        return ioi_items(tokenizer, n, seed, mask)
    if isinstance(task, (str, Path)):
        return read_task(task)
    items = [_item(record, f"task[{k}]") for k, record in enumerate(task)]
    if not items:
        raise UsageError("task: no example")
    return items


def task_name(task) -> str:
    if isinstance(task, str) and task in BUILT_IN:
        return task
    if isinstance(task, (str, Path)):
        return Path(task).name
    return "task"


def _first_piece(tokenizer, text: str, what: str, item: TaskItem) -> tuple[int, int]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise UsageError(f"{item.where}: {what} {text!r} is no piece at all for this tokenizer")
    return int(ids[0]), len(ids)


def task_example(item: TaskItem, tokenizer, masked: bool, name: str) -> tuple[Example, int]:
    """(the example of `item`, its answer's pieces) after its checks (`task_examples`)."""
    clean = tokenizer(item.clean)["input_ids"]
    corrupted = tokenizer(item.corrupted)["input_ids"]
    if len(clean) != len(corrupted):
        raise UsageError(
            f"{item.where}: clean is {len(clean)} pieces and corrupted {len(corrupted)}; "
            "they must be the same length (a node is patched position by position)"
        )
    answer, pieces = _first_piece(tokenizer, item.answer, "answer", item)
    distractor, _ = _first_piece(tokenizer, item.distractor, "distractor", item)
    if answer == distractor:
        token = tokenizer.convert_ids_to_tokens(answer)
        raise UsageError(
            f"{item.where}: answer {item.answer!r} and distractor {item.distractor!r} are the "
            f"same token ({token!r}, id {answer}); the metric is their logit difference"
        )
    position = len(clean) - 1
    if masked:
        mask_id = getattr(tokenizer, "mask_token_id", None)
        at = [i for i, t in enumerate(clean) if t == mask_id]
        if len(at) != 1 or corrupted[at[0]] != mask_id:
            raise UsageError(
                f"{item.where}: a masked LM is scored at the prompt's one mask token "
                f"({tokenizer.mask_token!r}); the clean prompt has {len(at)}"
                + ("" if len(at) != 1 else ", and the corrupted none at the same piece")
            )
        position = at[0]
    specials = set(getattr(tokenizer, "all_special_ids", []) or [])
    words = tokenizer.convert_ids_to_tokens([t for t in clean if t not in specials])
    meta = {
        "input_ids": list(clean),
        "corrupted_ids": list(corrupted),
        "answer_id": answer,
        "distractor_id": distractor,
        "position": position,
        "task": name,
        "texts": (item.clean, item.corrupted, item.answer, item.distractor),
        "id": item.id,
        "extra": dict(item.extra),
    }
    unit = item.unit or item.id or item.where
    return Example(words=list(words), unit=unit, source=item.where, meta=meta), pieces


def task_examples(items, tokenizer, masked: bool = False, name: str = "task") -> list[Example]:
    """The examples of `items` (module docstring), every check done before any is scored:
    UsageError, one line naming the item, for prompts of different lengths in pieces, an answer
    and distractor of one token, a masked LM's prompt without exactly one mask token; one warning
    line for answers of more than one piece (naming the first and how many more)."""
    examples, longer = [], []
    for item in items:
        example, pieces = task_example(item, tokenizer, masked, name)
        examples.append(example)
        if pieces > 1:
            longer.append((item, tokenizer.convert_ids_to_tokens(example.meta["answer_id"])))
    if longer:
        item, piece = longer[0]
        more = f" (and {len(longer) - 1} more)" if len(longer) > 1 else ""
        print(
            f"warning: {item.where}: answer {item.answer!r} is more than one piece; the first, "
            f"{piece!r}, is the one scored{more}",
            file=sys.stderr,
        )
    return examples


def task_stream(examples: list[Example], name: str) -> Stream:
    """The examples as the lazy `Stream` a pass reads (already checked, so read twice alike)."""

    def read(sink):
        yield from examples

    return Stream(read, name=name, total_words=lambda: sum(len(e.words) for e in examples))


__all__ = [
    "KEYS",
    "TEMPLATES",
    "TaskItem",
    "ioi_items",
    "read_task",
    "single_piece_names",
    "task_examples",
    "task_items",
    "task_stream",
]
