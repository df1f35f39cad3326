"""The bundled samples, shipped inside the package (read through `importlib.resources`).

    from headprobe.inputs.samples import SAMPLE, SAMPLE_COREF, SAMPLE_TEXT
    headprobe.run(treebank=SAMPLE)        # what `headprobe run` scores with no input given

- `sample.txt`: an original English paragraph written for headprobe;
- `sample.conllu`: its silver spaCy parse (written by `data/make_samples.py`);
- `sample_coref.conllu`: two short original CorefUD documents.
- `haystack.txt`: two chapters of Thoreau's Walden (public domain), one sentence per line, the
  needle probe's default haystack (`headprobe.inputs.needle`; source in LICENSES.md).

A wheel installs them as files beside this module, so each is a plain `pathlib.Path`.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def sample_path(name: str) -> Path:
    """The path of the bundled sample file `name` (such as "sample.conllu")."""
    return Path(str(files(__name__).joinpath(name)))


SAMPLE = sample_path("sample.conllu")
SAMPLE_COREF = sample_path("sample_coref.conllu")
SAMPLE_TEXT = sample_path("sample.txt")
