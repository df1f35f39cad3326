"""The ordinal probe (`--probe ordinal`): lists of random tokens, items apart by a separator,
and item_successor: which heads attend from each item to the item before it."""

import dataclasses

import numpy as np

from headprobe.extend import (
    Example,
    Option,
    Probe,
    Stream,
    UsageError,
    pattern_analysis,
    register,
    register_probe,
    vocabulary,
    wrap,
)

PROBE_NAME, NAME = "ordinal", "item_successor"


def ordinal_only(flag, value, values):  # refused without the probe, before the model loads
    if value != SEPARATOR.default and values["probe"] != PROBE_NAME:
        raise UsageError(f"{flag} is an option of --probe {PROBE_NAME}: add --probe {PROBE_NAME}")
    return value


SEPARATOR = Option(
    "ordinal_separator", ",", f"--probe {PROBE_NAME}: the token between items (default: ',')",
    flag="--ordinal-separator", metavar="TOKEN", check=ordinal_only,
)  # fmt: skip


def stream(config, tokenizer, net, sentences):
    """`--n` lists (`config.probe_n`) of `--length` items (`config.probe_length`), drawn with
    `--seed`; each item's position in the model's ids is in `meta["items"]`."""
    ids = tokenizer(config.ordinal_separator, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise UsageError(f"--ordinal-separator {config.ordinal_separator!r} is not one token")
    sep = ids[0]
    before, after = wrap(tokenizer)  # the tokenizer's own specials around plain text
    vocab = vocabulary(tokenizer, getattr(net.config, "vocab_size", None))
    n, length = config.probe_n, config.probe_length

    def read(sink):
        for k in range(n):
            rng = np.random.default_rng([config.seed, k])
            items = vocab[rng.integers(0, len(vocab), length)].tolist()
            tokens = [t for item in items for t in (item, sep)][:-1]  # a, sep, b, sep, c
            yield Example(
                words=tokenizer.convert_ids_to_tokens(tokens),  # one word per token
                unit=f"{PROBE_NAME}:{k}",
                source=f"{PROBE_NAME}#{k}",
                meta={
                    "input_ids": before + tokens + after,  # what the model reads
                    "probe": PROBE_NAME,
                    "items": [len(before) + 2 * i for i in range(length)],
                },
            )

    return Stream(read, name=PROBE_NAME, total_words=lambda: n * (2 * length - 1))


register_probe(
    Probe(
        PROBE_NAME,
        stream,
        description="lists of random tokens apart by a separator (--n, --length, --ordinal-separator)",
        options=(SEPARATOR, "probe_n", "probe_length"),  # its own, then the shared ones it reads
    )
)


def successor(example):
    """D[item k, item k - 1]: each item's pattern is the item before it (the probe's metadata)."""
    d = np.zeros((len(example.ids), len(example.ids)), dtype=bool)  # [query, key]
    items = example.meta.get("items", [])
    d[items[1:], items[:-1]] = True
    return d


ANALYSIS = register(
    dataclasses.replace(pattern_analysis(NAME, successor), probe=PROBE_NAME), replace=True
)
