"""Reference tallies for tests/test_reference_tallies.py.

- MiniLM on the first 200 sentences of EWT dev (every default analysis and the sinks) and the
  first GUM dev document (coreference), under `--measure weights,norms`:
  tests/data/reference_tallies.npz.
- SmolLM2 with the token patterns (previous_token, duplicate_token, induction, sink) on 20
  sequences of Olsson's repeated-random probe and, at piece level, on the first 40 sentences of
  EWT dev: tests/data/reference_tallies_smollm2.npz (made before the scorer contract changed:
  branch `layers`, after the random-key baseline was keyed by content, commit 6dcb942).

    PYTHONPATH=$PWD python tests/make_reference_tallies.py            # writes both fixtures
    PYTHONPATH=$PWD python tests/make_reference_tallies.py smollm2    # only SmolLM2's

The fixture was made with the code before scoring took every measure in one pass (branch
`layout`, commit ff018f4); the test reruns the same inputs with the code as it is and compares.
Per tally and label it keeps resample 0 (the data itself) and resamples 1-3 of every fold:
hits [fold, resample, layer, head, direction], n, base, and both / extra where present.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
FIXTURE = Path(__file__).resolve().parent / "data" / "reference_tallies.npz"
FIXTURE_SMOLLM2 = FIXTURE.with_name("reference_tallies_smollm2.npz")
SENTENCES, DOCUMENTS, RESAMPLES = 200, 1, 4
# the default analyses and the sinks (head similarity's statistics take minutes; the token
# patterns' scores are the sinks' kind)
ANALYSES = ["dependency", "coreference", "positional", "surface", "sink"]


def first_blocks(path: Path, n: int, start: str | None = None) -> str:
    """The first `n` sentences of a CoNLL-U file, or with `start`, its first `n` blocks
    opening a block with that line prefix (documents)."""
    blocks = path.read_text(encoding="utf-8").strip("\n").split("\n\n")
    if start is None:
        return "\n\n".join(blocks[:n]) + "\n\n"
    kept, seen = [], 0
    for block in blocks:
        if block.startswith(start) or f"\n{start}" in block:
            seen += 1
            if seen > n:
                break
        kept.append(block)
    return "\n\n".join(kept) + "\n\n"


def tallies(folder: Path, **options) -> dict:
    """{tally key: Tally} of a run on the reference inputs (written under `folder`)."""
    import headprobe

    treebank = folder / "ewt-200.conllu"
    coref = folder / "gum-1doc.conllu"
    treebank.write_text(first_blocks(DATA / "en_ewt-ud-dev.conllu", SENTENCES), encoding="utf-8")
    coref.write_text(
        first_blocks(DATA / "en_gum-ud-dev.conllu", DOCUMENTS, "# newdoc"), encoding="utf-8"
    )
    with contextlib.chdir(folder):  # relative paths: the sources (random-baseline seeds) stay
        results = headprobe.run(
            treebank=treebank.name,
            coref=coref.name,
            measure="weights,norms",
            analyses=ANALYSES,
            progress=False,
            device="cpu",
            **options,
        )
    return results.tallies


TOKEN_ANALYSES = ["previous_token", "duplicate_token", "induction", "sink"]
PROBE_N, SMOLLM2_SENTENCES = 20, 40


def smollm2_tallies(folder: Path, **options) -> dict:
    """{tally key: Tally} of SmolLM2's token patterns on the probe and on EWT sentences (the
    sentence run's tallies keyed "sentences:<key>")."""
    import headprobe

    common = dict(analyses=TOKEN_ANALYSES, progress=False, device="cpu", **options)
    probe = headprobe.run("smollm2", probe="repeated-random", probe_n=PROBE_N, **common)
    treebank = folder / "ewt-40.conllu"
    treebank.write_text(first_blocks(DATA / "en_ewt-ud-dev.conllu", SMOLLM2_SENTENCES))
    sentences = headprobe.run("smollm2", treebank=str(treebank), **common)
    return {**probe.tallies, **{f"sentences:{k}": t for k, t in sentences.tallies.items()}}


def flatten(tallies: dict) -> dict[str, np.ndarray]:
    """'key|label|array' -> the array (resamples cut to the first `RESAMPLES`)."""
    out = {}
    for key, tally in tallies.items():
        for label in tally.sorted_labels():
            for name, array in tally.arrays(label).items():
                if name in ("hits", "n", "base"):
                    array = array[:, :RESAMPLES]
                out[f"{key}|{label}|{name}"] = np.asarray(array)
    return out


def main() -> None:
    import tempfile

    makers = {"minilm": (tallies, FIXTURE), "smollm2": (smollm2_tallies, FIXTURE_SMOLLM2)}
    for name in sys.argv[1:] or list(makers):
        make, fixture = makers[name]
        with tempfile.TemporaryDirectory() as tmp:
            arrays = flatten(make(Path(tmp)))
        fixture.parent.mkdir(exist_ok=True)
        np.savez_compressed(fixture, **arrays)
        size = fixture.stat().st_size / 1e6
        print(f"{fixture}: {len(arrays)} arrays, {size:.2f} MB", file=sys.stderr)


if __name__ == "__main__":
    main()
