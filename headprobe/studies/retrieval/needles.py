"""The needle probe: a fact hidden in a long text, and a question about it (METHODS §16).

    from headprobe.studies.retrieval.needles import needle_stream, read_needles, recalled
    probes = needle_stream(tokenizer, lengths=(500, 1000), depths=5)   # built-in needles
    for example in probes:                   # one Example per (needle, length, depth)
        ids = example.meta["input_ids"]      # the prompt, as token ids
        start, stop = example.meta["answer_span"]   # the answer's tokens: ids[start:stop]
    recalled("Saffron.", "saffron")          # the success gate: True
    headprobe.run("smollm2", probe="needle", needle_lengths="500,1000", needle_depths=5)

A haystack of plain sentences (by default the bundled `haystack.txt`: two chapters of Thoreau's
Walden, public domain, one sentence per line; or the run's corpus, each example's words joined
as text; or any list of sentences) is cut to a context length in tokens: as many whole sentences
from its start as fit beside the needle (the haystack starts over where it runs out). The needle
sentence goes in at a depth, a fraction of the context, snapped to the sentence boundary nearest
that fraction of the haystack's tokens (depth 0: before the first sentence, 1: after the last).
A question follows: with the tokenizer's chat template (an instruction-tuned model) one user turn,
the context, a blank line, "Based on the text above, answer briefly. <question>", and the
assistant's turn opened; without one, the context, a blank line, "Question: <question>" and a
line "Answer:" (the tokenizer's own special tokens around it).

A probe is one (needle, length, depth): an `Example` whose words are the prompt's non-special
tokens (1:1, as every probe's: `headprobe.inputs.align.align_tokens`) and whose `meta` holds
`input_ids` (the prompt), `answer_span`, `needle_span` and `context_span` ((start, stop) token
positions in `input_ids`; the answer's tokens are those its characters overlap), `answer`,
`question`, `needle` (the needle's index), `needle_text`, `length` (asked) and `context_tokens`
(the context's tokens alone), `depth` (asked) and `depth_used` (haystack tokens before the needle
over the haystack's tokens), `chat` (template used) and `answer_in_haystack` (the answer's text
occurs in the haystack around it: a recall that proves nothing). Its unit (folds, bootstrap;
METHODS §5) is the probe: `needle:<hash of the needle sentence>:<length>:<depth>`, from content.

Needles: the built-in `NEEDLES`, or a JSONL file (`read_needles`), one object per line with
`needle`, `question` and `answer` (a span of `needle`); a bad line is a `CorpusError` naming
file:line. The success gate (`recalled`): the response recalls more than half of the answer's
words, lower-cased (`word_recall`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path

from headprobe.extend import Example, Stream
from headprobe.inputs.align import align_tokens
from headprobe.inputs.corpora.base import CorpusError
from headprobe.inputs.samples import sample_path

NEEDLE = "needle"  # the probe's name (`--probe needle`, registered in `needle_probe`)
FIELDS = ("needle", "question", "answer")
INSTRUCTION = "Based on the text above, answer briefly."
HAYSTACK = sample_path("haystack.txt")
DEFAULT_LENGTHS = (500, 1000, 2000)
DEFAULT_DEPTHS = 5


@dataclass(frozen=True)
class Needle:
    """A fact to retrieve: the sentence hidden in the haystack, the question, the answer (a span
    of the sentence), and where it was read ("file:line", or "built-in needle k")."""

    needle: str
    question: str
    answer: str
    source: str = ""

    @property
    def key(self) -> str:
        """A short hash of the needle sentence (the probe's unit is built on it, not on a path)."""
        return blake2b(self.needle.encode(), digest_size=4).hexdigest()


NEEDLES = (
    Needle(
        "The secret ingredient in Mara's soup is saffron.",
        "What is the secret ingredient in Mara's soup?",
        "saffron",
        "built-in needle 0",
    ),
    Needle(
        "The name of Professor Okafor's cat is Biscuit.",
        "What is the name of Professor Okafor's cat?",
        "Biscuit",
        "built-in needle 1",
    ),
    Needle(
        "Captain Ilse keeps the spare key under a green flowerpot.",
        "Where does Captain Ilse keep the spare key?",
        "under a green flowerpot",
        "built-in needle 2",
    ),
    Needle(
        "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a "
        "sunny day.",
        "What is the best thing to do in San Francisco?",
        "eat a sandwich and sit in Dolores Park on a sunny day",
        "built-in needle 3",
    ),
)
"""The built-in needles: facts a model cannot guess (the last is Kamradt's needle-in-a-haystack
sentence, which Wu et al. also used); SmolLM2-135M-Instruct recalls them in 37 of 40 probes at 500
and 1,000 tokens (benchmarks/README.md; the misses are the flowerpot's)."""


# ------------------------------------------------------------------------------ needles
def check_needle(record, where: str) -> Needle:
    """A `Needle` of one parsed JSONL record; `CorpusError` naming `where` if it is not one."""
    if not isinstance(record, dict):
        raise CorpusError(f"{where}: expected a JSON object with {', '.join(FIELDS)}")
    for name in FIELDS:
        value = record.get(name)
        if not isinstance(value, str) or not value.strip():
            got = "missing" if name not in record else f"{value!r}, not a non-empty string"
            raise CorpusError(f"{where}: field {name!r} is {got}")
    needle, answer = record["needle"].strip(), record["answer"].strip()
    if answer not in needle:
        raise CorpusError(f"{where}: answer {answer!r} is not a span of the needle {needle!r}")
    return Needle(needle, record["question"].strip(), answer, where)


def read_needles(path: str | Path) -> list[Needle]:
    """The needles of a JSONL file (blank lines skipped); `CorpusError` "file:line: why"."""
    needles = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise CorpusError(f"{where}: not JSON ({err.msg}, column {err.colno})") from None
            needles.append(check_needle(record, where))
    if not needles:
        raise CorpusError(f"{path}: no needle (one JSON object per line: {', '.join(FIELDS)})")
    return needles


# ------------------------------------------------------------------------------ the gate
def words_of(text: str) -> list[str]:
    """Lower-cased words: runs of letters and digits."""
    return re.findall(r"[^\W_]+", text.lower())


def word_recall(response: str, answer: str) -> float:
    """The share of the answer's words (lower-cased, with repeats) that the response holds."""
    wanted = Counter(words_of(answer))
    if not wanted:
        return 0.0
    got = Counter(words_of(response))
    return sum(min(n, got[word]) for word, n in wanted.items()) / sum(wanted.values())


def recalled(response: str, answer: str) -> bool:
    """The success gate: the response recalls more than half of the answer's words."""
    return word_recall(response, answer) > 0.5


# ------------------------------------------------------------------------------ haystack
def depth_grid(n: int) -> list[float]:
    """`n` depths evenly spaced from 0 to 1 (one depth: the middle, 0.5)."""
    if n < 1:
        raise ValueError(f"a needle probe needs at least one depth, not {n}")
    return [0.5] if n == 1 else [k / (n - 1) for k in range(n)]


def sentence_text(words: Sequence[str]) -> str:
    """A corpus example's words as plain text: joined by spaces, none before closing punctuation
    and clitics ("n't", "'s") or after opening brackets."""
    text = " ".join(words)
    text = re.sub(r" (?=[.,;:!?%)\]}]|n't\b|'(?:s|re|ve|ll|d|m)\b)", "", text)
    return re.sub(r"(?<=[(\[{$]) ", "", text)


def haystack_sentences(haystack=None) -> Iterator[str]:
    """The haystack's sentences: the bundled text (None), a list of sentences, or `Example`s (a
    corpus or a `Stream`: each one's words as text)."""
    if haystack is None:
        with open(HAYSTACK, encoding="utf-8") as handle:
            yield from (line.strip() for line in handle if line.strip())
        return
    for item in haystack:
        text = sentence_text(item.words) if isinstance(item, Example) else str(item).strip()
        if text:
            yield text


class Haystack:
    """Sentences and their token counts, read as far as a context needs and kept; beyond its
    end the text starts over. `name` names it in errors."""

    def __init__(self, tokenizer, sentences: Iterable[str], name: str):
        self.tokenizer, self.name = tokenizer, name
        self._source = iter(sentences)
        self.sentences: list[str] = []
        self.counts: list[int] = []  # tokens of each sentence after a space

    def _grow(self) -> bool:
        sentence = next(self._source, None)
        if sentence is None:
            return False
        self.sentences.append(sentence)
        self.counts.append(max(1, count_tokens(self.tokenizer, " " + sentence)))
        return True

    def take(self, budget: int) -> list[int]:
        """Indices into `sentences` of as many sentences from the start as fit in `budget` tokens
        (an index repeats where the text started over)."""
        taken, used = [], 0
        while True:
            k = len(taken)
            if k >= len(self.sentences) and not self._grow() and not self.sentences:
                raise CorpusError(f"{self.name}: empty haystack: no sentence to build a context of")
            index = k % len(self.sentences)
            if used + self.counts[index] > budget:
                return taken
            taken.append(index)
            used += self.counts[index]


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def nearest_boundary(counts: Sequence[int], depth: float) -> int:
    """The sentence boundary (0: before the first sentence, len(counts): after the last) whose
    token position is nearest `depth` x the sentences' tokens; the earlier one on a tie."""
    cumulative = [0]
    for n in counts:
        cumulative.append(cumulative[-1] + n)
    target = depth * cumulative[-1]
    return min(range(len(cumulative)), key=lambda b: (abs(cumulative[b] - target), b))


# ------------------------------------------------------------------------------ the prompt
def prompt_text(tokenizer, context: str, question: str) -> tuple[str, bool]:
    """(the prompt as text, whether the chat template made it)."""
    if getattr(tokenizer, "chat_template", None):
        turn = {"role": "user", "content": f"{context}\n\n{INSTRUCTION} {question}"}
        text = tokenizer.apply_chat_template([turn], tokenize=False, add_generation_prompt=True)
        return text, True
    return f"{context}\n\nQuestion: {question}\nAnswer:", False


def token_span(offsets, start: int, stop: int) -> tuple[int, int]:
    """(first, stop) of the tokens whose characters overlap characters start:stop."""
    inside = [i for i, (a, b) in enumerate(offsets) if b > a and b > start and a < stop]
    if not inside:
        raise ValueError(f"no token covers characters {start}:{stop} of the prompt")
    return inside[0], inside[-1] + 1


@dataclass(frozen=True)
class Placed:
    """A context: its text, and where in it the needle starts."""

    text: str
    needle_at: int  # character offset of the needle in `text`
    haystack: str  # the context without the needle


def place(sentences: Sequence[str], counts: Sequence[int], needle: str, depth: float) -> Placed:
    """The sentences with the needle inserted at the boundary nearest `depth`."""
    boundary = nearest_boundary(counts, depth)
    before, after = list(sentences[:boundary]), list(sentences[boundary:])
    head = " ".join(before)
    text = " ".join(before + [needle] + after)
    return Placed(text, len(head) + (1 if before else 0), " ".join(before + after))


def fit(haystack: Haystack, needle: Needle, length: int, depth: float) -> Placed:
    """The context of `length` tokens at most: the most whole haystack sentences from the start
    that fit beside the needle, the needle at `depth`."""
    room = length - count_tokens(haystack.tokenizer, " " + needle.needle)
    if room < 0:
        raise ValueError(
            f"needle probe: {needle.source} alone has more than {length} tokens, the context length"
        )
    taken = haystack.take(room)
    while True:
        sentences = [haystack.sentences[i] for i in taken]
        placed = place(sentences, [haystack.counts[i] for i in taken], needle.needle, depth)
        if count_tokens(haystack.tokenizer, placed.text) <= length or not taken:
            return placed
        taken = taken[:-1]


def build_probe(
    tokenizer, needle: Needle, index: int, haystack: Haystack, length: int, depth: float
) -> Example:
    """One probe (`needle` at `depth` of a `length`-token context) as an `Example`."""
    placed = fit(haystack, needle, length, depth)
    text, chat = prompt_text(tokenizer, placed.text, needle.question)
    encoded = tokenizer(text, add_special_tokens=not chat, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), list(encoded["offset_mapping"])
    context_at = text.index(placed.text)
    needle_at = context_at + placed.needle_at
    answer_at = needle_at + needle.needle.index(needle.answer)
    context = token_span(offsets, context_at, context_at + len(placed.text))
    needle_span = token_span(offsets, needle_at, needle_at + len(needle.needle))
    hay_tokens = (context[1] - context[0]) - (needle_span[1] - needle_span[0])
    alignment = align_tokens(tokenizer, ids)
    words = tokenizer.convert_ids_to_tokens(
        [t for t, w in zip(ids, alignment.piece_word) if w >= 0]
    )
    return Example(
        words=list(words),
        unit=f"{NEEDLE}:{needle.key}:{length}:{depth:.3f}",
        source=f"{needle.source} (length {length}, depth {depth:.2f})",
        meta={
            "input_ids": ids,
            "probe": NEEDLE,
            "answer_span": token_span(offsets, answer_at, answer_at + len(needle.answer)),
            "needle_span": needle_span,
            "context_span": context,
            "answer": needle.answer,
            "question": needle.question,
            "needle": index,
            "needle_text": needle.needle,
            "length": length,
            "context_tokens": count_tokens(tokenizer, placed.text),
            "depth": depth,
            "depth_used": (needle_span[0] - context[0]) / hay_tokens if hay_tokens else 0.0,
            "chat": chat,
            "answer_in_haystack": needle.answer.lower() in placed.haystack.lower(),
        },
    )


def needle_stream(
    tokenizer,
    needles: str | Path | Sequence[Needle] | None = None,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    depths: int = DEFAULT_DEPTHS,
    haystack=None,
    max_prompt: int | None = None,
) -> Stream:
    """The needle probes, one per (needle, length, depth) in that order, as a lazy `Stream`.

    needles: None (the built-in `NEEDLES`), a JSONL file, or `Needle`s; lengths: context lengths
    in tokens; depths: how many depths, evenly spaced from 0 to 1 (`depth_grid`); haystack: None
    (the bundled text), sentences, or examples (a corpus); max_prompt: the most tokens a prompt may
    have (the model's context less the answer's room): a longer one is a `ValueError`."""
    chosen = (
        list(NEEDLES)
        if needles is None
        else read_needles(needles)
        if isinstance(needles, (str, Path))
        else list(needles)
    )
    grid = depth_grid(depths)
    name = (
        f"{NEEDLE} ({len(chosen)} needles, lengths {','.join(map(str, lengths))}, depths {depths})"
    )
    where = str(
        getattr(haystack, "name", None)
        or ("the bundled haystack" if haystack is None else "the haystack")
    )

    def read(sink):
        stack = Haystack(tokenizer, haystack_sentences(haystack), where)
        for index, needle in enumerate(chosen):
            for length in lengths:
                for depth in grid:
                    example = build_probe(tokenizer, needle, index, stack, length, depth)
                    check_prompt(example, max_prompt)
                    yield example

    return Stream(read, name=name)


def check_prompt(example: Example, max_prompt: int | None) -> None:
    """A prompt longer than `max_prompt` tokens is a `ValueError` naming the probe."""
    n = len(example.meta["input_ids"])
    if max_prompt is not None and n > max_prompt:
        raise ValueError(
            f"needle probe {example.source}: its prompt has {n} tokens, more than the "
            f"{max_prompt} the model can read and still answer"
        )
