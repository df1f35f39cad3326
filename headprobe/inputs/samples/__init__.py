"""The bundled data, shipped inside the package (read through `importlib.resources`).

    from headprobe.inputs.samples import EWT_DEV, GUM_COREF, SAMPLE, SAMPLE_COREF, SAMPLE_TEXT
    headprobe.run()                              # scores EWT_DEV and GUM_COREF: the defaults
    headprobe.run(treebank=SAMPLE, coref=SAMPLE_COREF)   # the project's own tiny samples (tests)
    bundled_provenance([EWT_DEV])                # {"en_ewt-ud-dev.conllu.gz": "what; source; ..."}

- `en_ewt-ud-dev.conllu.gz`: UD English EWT dev, whole (gold dependencies; CC BY-SA 4.0);
- `en_gum-ud-dev-open.conllu.gz`: the documents of UD English GUM dev whose texts may be
  redistributed (gold dependencies and coreference; each document's licence in LICENSES.md);
- `sample.txt`: an original English paragraph written for headprobe;
- `sample.conllu`: its silver spaCy parse (written by `data/make_samples.py`);
- `sample_coref.conllu`: two short original CorefUD documents.
- `haystack.txt`: two chapters of Thoreau's Walden (public domain), one sentence per line, the
  needle probe's default haystack (`the retrieval study`; source in LICENSES.md).

`BUNDLED` says where each file comes from and under which licence; LICENSES.md (written by
`data/make_bundled.py` from it) says the same, per GUM document too. A run that reads a bundled
file records its line of `bundled_provenance` in the results (the report's provenance).
A wheel installs the files beside this module, so each is a plain `pathlib.Path`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path


def sample_path(name: str) -> Path:
    """The path of the bundled sample file `name` (such as "sample.conllu")."""
    return Path(str(files(__name__).joinpath(name)))


@dataclass(frozen=True)
class Bundled:
    """Where a bundled file comes from and under which terms."""

    what: str
    source: str  # where it was taken from (release, URL), or how it was made
    licence: str  # an SPDX id where one exists ("CC-BY-SA-4.0", "MIT"), else the terms in words
    attribution: str  # whom to credit (and cite)

    def line(self) -> str:
        return f"{self.what}; source: {self.source}; licence: {self.licence}; credit: {self.attribution}"


GUM_NAME = "en_gum-ud-dev-open.conllu.gz"
PROJECT = "headprobe contributors"
BUNDLED = {
    "en_ewt-ud-dev.conllu.gz": Bundled(
        "UD English EWT, dev split, whole (2,001 sentences, 25,147 words, gold dependencies), "
        "gzip-compressed",
        "Universal Dependencies UD_English-EWT release 2.16 (2025-05-15), en_ewt-ud-dev.conllu, "
        "https://github.com/UniversalDependencies/UD_English-EWT",
        "CC-BY-SA-4.0",
        "UD English EWT annotations (c) 2013-2020 The Board of Trustees of The Leland Stanford "
        "Junior University; texts from the LDC English Web Treebank (LDC2012T13); cite Silveira et "
        "al. (2014), A Gold Standard Dependency Corpus for English, LREC 2014",
    ),
    GUM_NAME: Bundled(
        "UD English GUM, dev split: the 14 of its 30 documents whose texts may be redistributed "
        "(gold dependencies and coreference), unchanged, gzip-compressed",
        "Universal Dependencies UD_English-GUM release 2.16, en_gum-ud-dev.conllu, "
        "https://github.com/UniversalDependencies/UD_English-GUM (GUM: "
        "https://github.com/amir-zeldes/gum)",
        "per document, see headprobe/inputs/samples/LICENSES.md: texts CC-BY-4.0, CC-BY-SA-3.0, "
        "CC-BY-2.5 or US public domain; annotations CC-BY-4.0",
        "GUM annotators (https://gucorpling.org/gum/) and each document's source (LICENSES.md "
        "beside this file); cite Zeldes (2017), The GUM Corpus: Creating Multilayer Resources in "
        "the Classroom, Language Resources and Evaluation 51(3)",
    ),
    "haystack.txt": Bundled(
        "Henry David Thoreau, Walden; or, Life in the Woods (1854): the chapters 'Where I Lived, and "
        "What I Lived For' and 'Solitude', one sentence per line (344 sentences, 9,528 words; "
        "paragraph lines joined, indented verse quotations left out, '--' written ' -- ', nothing "
        "else changed): the needle probe's default haystack (the retrieval study)",
        "Project Gutenberg eBook #205 ('Walden, and On the Duty of Civil Disobedience'), from a "
        "plain-text copy with Project Gutenberg's header and footer removed",
        "public domain (published 1854; the author died in 1862)",
        "Henry David Thoreau; Project Gutenberg",
    ),
    "sample.txt": Bundled(
        "an original English paragraph (43 sentences) written for headprobe",
        "headprobe, data/make_samples.py (the TEXT it writes)",
        "MIT",
        PROJECT,
    ),
    "sample.conllu": Bundled(
        "a silver dependency parse of sample.txt by spaCy en_core_web_sm (not gold)",
        "headprobe, data/make_samples.py",
        "MIT",
        PROJECT,
    ),
    "sample_coref.conllu": Bundled(
        "two short original CorefUD documents (hand-annotated coreference), for tests",
        "headprobe, written for its tests",
        "MIT",
        PROJECT,
    ),
}

EWT_DEV = sample_path("en_ewt-ud-dev.conllu.gz")
GUM_COREF = sample_path(GUM_NAME)
SAMPLE = sample_path("sample.conllu")
SAMPLE_COREF = sample_path("sample_coref.conllu")
SAMPLE_TEXT = sample_path("sample.txt")
DEFAULT_TREEBANK, DEFAULT_COREF = EWT_DEV, GUM_COREF  # what `headprobe run` reads with no input


def bundled_provenance(paths: Iterable) -> dict[str, str]:
    """{file name: its `Bundled.line()`} of each of `paths` that is a bundled file (others left out)."""
    here = sample_path("").resolve()
    out = {}
    for path in paths:
        if path is None:
            continue
        p = Path(str(path)).expanduser().resolve()
        if p.parent == here and p.name in BUNDLED:
            out[p.name] = BUNDLED[p.name].line()
    return out
