"""The run's seed and the keyed hashes every random draw of a run comes from (METHODS §5).

    fold = keyed_hash(SEED, "fold", unit) % 2
    rng = np.random.Generator(np.random.PCG64(example_key(SEED, example)))

A draw is a function of the seed, a kind (what it is for) and ids, never of the directory a file
lives in: the same corpus read from two directories gives the same folds, resamples, random
baselines and probes, so byte-identical tables (tests/test_seeds.py).
"""

from __future__ import annotations

import os
from hashlib import blake2b

SEED = 0


def keyed_hash(seed: int, kind: str, key: str) -> int:
    """METHODS §5's 64-bit hash of f"{seed}:{kind}:{key}" (blake2b, little-endian): folds,
    bootstrap weights, probes, the masked-LM positions of METHODS §8, random baselines."""
    return int.from_bytes(
        blake2b(f"{seed}:{kind}:{key}".encode(), digest_size=8).digest(), "little"
    )


def example_key(seed: int, example) -> int:
    """A 64-bit key naming one example of one run by its ids: its unit, its sentence id, and
    where it is in its corpus (the file's name and line, never the directory it lives in), so
    the random-key baselines of the token patterns and the sinks draw the same keys wherever the
    corpus is read from. A probe's source is its name and ordinal already."""
    where = os.path.basename(str(example.source))
    return keyed_hash(seed, "random-key", f"{example.unit}:{example.sent_id}:{where}")
