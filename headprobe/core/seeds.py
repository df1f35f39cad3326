"""The run's seed and the keyed hashes every random draw of a run comes from (METHODS §5).

    fold = keyed_hash(SEED, "fold", unit) % 2
    rng = np.random.Generator(np.random.PCG64(example_key(SEED, example)))

A draw is a function of the seed, a kind (what it is for) and ids or content, never of where a
file lives: the same corpus read from two directories gives the same folds, resamples, random
baselines and probes, so byte-identical tables (tests/test_sources.py).
"""

from __future__ import annotations

from hashlib import blake2b

SEED = 0


def keyed_hash(seed: int, kind: str, key: str) -> int:
    """METHODS §5's 64-bit hash of f"{seed}:{kind}:{key}" (blake2b, little-endian): folds,
    bootstrap weights, probes, the masked-LM positions of METHODS §8, random baselines."""
    return int.from_bytes(
        blake2b(f"{seed}:{kind}:{key}".encode(), digest_size=8).digest(), "little"
    )


def content_digest(example) -> str:
    """A digest of what the model reads of an example: its words, and its token ids where it
    carries its own (`meta["input_ids"]`, a probe)."""
    digest = blake2b(digest_size=16)
    digest.update("\x1f".join(example.words).encode())
    ids = (getattr(example, "meta", None) or {}).get("input_ids")
    if ids is not None:
        digest.update(b"\x1e" + ",".join(str(int(i)) for i in ids).encode())
    return digest.hexdigest()


def example_key(seed: int, example) -> int:
    """A 64-bit key naming one example of one run by its ids and content (never its file's
    path): the random-key baselines of the token patterns and the sinks draw from it."""
    return keyed_hash(
        seed, "random-key", f"{example.unit}:{example.sent_id}:{content_digest(example)}"
    )
