"""A Hugging Face `datasets` source: `NAME[:CONFIG[:SPLIT]]` -> dependency `Example`s.

NAME is a hub dataset (e.g. `universal_dependencies:en_ewt:validation`, for
users with hub access) or a local directory written by `save_to_disk`. Columns
are found by their usual names: words in `tokens`/`words`/`form`, heads
(1-based, 0 = root) in `head`/`heads`, relations in `deprel`/`deprels`, tags
in `upos`/`pos` (class labels are turned into their names), sentence ids in
`sent_id`/`id`/`idx`. A row with a bad tree raises an error naming the dataset and row,
or is skipped with `skip_bad`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from headprobe.inputs.corpora.base import (
    Accounting,
    Corpus,
    CorpusError,
    Example,
    SentIds,
    Stream,
    base_relation,
    check_tree,
)

COLUMNS = {
    "words": ("tokens", "words", "form", "forms"),
    "heads": ("head", "heads"),
    "deprels": ("deprel", "deprels"),
    "upos": ("upos", "pos", "pos_tags"),
    "ids": ("sent_id", "id", "idx"),
}


def parse_spec(spec: str) -> tuple[str, str | None, str]:
    parts = spec.split(":")
    if len(parts) > 3 or not parts[0]:
        raise ValueError(f"--hf-dataset takes NAME[:CONFIG[:SPLIT]], not {spec!r}")
    name = parts[0]
    config = parts[1] if len(parts) > 1 and parts[1] else None
    split = parts[2] if len(parts) > 2 and parts[2] else "validation"
    return name, config, split


def open_dataset(spec: str):
    import datasets

    name, config, split = parse_spec(spec)
    if Path(name).exists():
        data = datasets.load_from_disk(name)
    else:
        data = datasets.load_dataset(name, config, split=split)
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise ValueError(f"{spec}: no split {split!r} (has {sorted(data)})")
        data = data[split]
    return data


def _column(data, role: str, spec: str, required: bool = True):
    for name in COLUMNS[role]:
        if name in data.column_names:
            return name
    if required:
        raise ValueError(
            f"{spec}: no {role} column (looked for {COLUMNS[role]}; has {data.column_names})"
        )
    return None


def _label_names(data, column):
    feature = data.features[column]
    inner = getattr(feature, "feature", None)
    return getattr(inner, "names", None)


def _no_head(head) -> bool:
    return head is None or str(head) in ("None", "_", "")


def read_hf_dataset(spec: str, *, skip_bad: bool = False) -> Corpus:
    """Read a dataset's rows as a `Corpus` of dependency `Example`s (`stream_hf_dataset`: lazily).

        corpus = read_hf_dataset("universal_dependencies:en_ewt:validation", skip_bad=True)

    Each row is checked as a tree (`base.check_tree`); a bad row raises `CorpusError`
    ("NAME:CONFIG:SPLIT row k: ...", k the 0-based row index) or with `skip_bad` is skipped and counted.
    Units and sentence ids (METHODS §5; datasets mark no documents): the row's
    `sent_id` / `id` / `idx` column, else "NAME:CONFIG:SPLIT#<ordinal>" (1-based); a repeated id is an
    error like a repeated `# sent_id` in a file (`duplicate_sent_id`).
    """
    return stream_hf_dataset(spec, skip_bad=skip_bad).collect()


def stream_hf_dataset(spec: str, *, skip_bad: bool = False) -> Stream:
    """`read_hf_dataset` as a lazy `Stream`: the dataset is opened (and its columns found) now,
    its rows are read one at a time in each pass (Arrow data is memory-mapped, not loaded)."""
    data = open_dataset(spec)
    columns = {
        role: _column(data, role, spec, required=role in ("words", "heads", "deprels"))
        for role in COLUMNS
    }
    upos_names = _label_names(data, columns["upos"]) if columns["upos"] else None
    return Stream(
        lambda sink: _examples(data, spec, columns, upos_names, skip_bad, sink), name=spec
    )


def _examples(
    data, spec: str, columns: dict, upos_names, skip_bad: bool, sink: Accounting
) -> Iterator[Example]:
    words_col, heads_col, rel_col, upos_col, id_col = (columns[role] for role in COLUMNS)
    ids = SentIds()
    for row_index, row in enumerate(data):
        where = f"{spec} row {row_index}"
        upos = None
        if upos_col:
            upos = [
                upos_names[t] if upos_names and isinstance(t, int) else str(t)
                for t in row[upos_col]
            ]
        words, raw_heads, raw_rels = list(row[words_col]), list(row[heads_col]), list(row[rel_col])
        if len(words) == len(raw_heads) == len(raw_rels):
            # the hub's UD loader keeps multiword-token lines and empty nodes, with head "None":
            # they are not syntactic words (METHODS §1), and word ids count without them
            keep = [k for k, head in enumerate(raw_heads) if not _no_head(head)]
            words, raw_heads, raw_rels = (
                [x[k] for k in keep] for x in (words, raw_heads, raw_rels)
            )
            if upos is not None and len(upos) == len(row[words_col]):
                upos = [upos[k] for k in keep]
        sent_id = str(row[id_col]) if id_col and row[id_col] not in (None, "") else None
        try:
            n = len(words)
            if not (len(raw_heads) == len(raw_rels) == n) or n == 0:
                raise CorpusError(
                    f"{where}: {n} words, {len(raw_heads)} heads, {len(raw_rels)} relations"
                )
            heads = check_tree([str(w) for w in words], raw_heads, raw_rels, where)
            if sent_id is not None:
                ids.add(sent_id, where, f"row {row_index}")
        except CorpusError as exc:
            sink.reject(exc, skip_bad)
            continue
        sent_id = sent_id or f"{spec}#{row_index + 1}"
        yield Example(
            words=words,
            unit=sent_id,
            source=where,
            heads=heads,
            deprels=[base_relation(str(r)) for r in raw_rels],
            upos=upos,
            sent_id=sent_id,
        )
