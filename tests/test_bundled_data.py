"""The bundled data (headprobe/inputs/samples/): every file listed with its source and licence in
LICENSES.md, only openly licensed GUM documents, the shared releases unchanged, the defaults of a
run with no input, and their credit in the run's provenance."""

from __future__ import annotations

import gzip
import importlib.util
import re
import shutil
import warnings
from pathlib import Path

import pytest

import headprobe
from headprobe.config import RunConfig
from headprobe.inputs.corpora.conllu import read_conllu
from headprobe.inputs.samples import (
    BUNDLED,
    EWT_DEV,
    GUM_COREF,
    GUM_NAME,
    SAMPLE,
    bundled_provenance,
    sample_path,
)
from headprobe.results.findings import provenance

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
FOLDER = sample_path("")
LICENSES = FOLDER / "LICENSES.md"
NOT_DATA = {"__init__.py", "LICENSES.md", "__pycache__"}


def make_bundled():
    """data/make_bundled.py as a module (it decides which GUM documents are kept)."""
    spec = importlib.util.spec_from_file_location("make_bundled", ROOT / "data" / "make_bundled.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the Markdown table whose header row starts with `header`."""
    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def gum_documents(text: str) -> dict[str, str]:
    """{doc id: sourceURL} of a CorefUD text, in file order."""
    ids = re.findall(r"^# newdoc id = (.+)$", text, re.M)
    urls = re.findall(r"^# meta::sourceURL = (.+)$", text, re.M)
    assert len(ids) == len(urls)
    return dict(zip(ids, urls))


def test_every_bundled_file_is_listed_with_its_licence():
    files = {p.name for p in FOLDER.iterdir()} - NOT_DATA
    rows = {r[0]: r for r in table_rows(LICENSES.read_text(encoding="utf-8"), "| file |")}
    assert files == set(rows) == set(BUNDLED)
    for name, row in rows.items():
        assert row[3] and row[3] == BUNDLED[name].licence.replace("|", "\\|"), name
        assert all(row[1:]), f"{name}: an empty cell"


def test_licenses_md_is_what_make_bundled_writes():
    with gzip.open(GUM_COREF, "rt", encoding="utf-8") as handle:
        assert make_bundled().licences_md(handle.read()) == LICENSES.read_text(encoding="utf-8")


def test_only_openly_licensed_gum_documents_are_bundled():
    script = make_bundled()
    assert not any(term in licence for licence in script.KEEP for term in ("NC", "ND"))
    with gzip.open(GUM_COREF, "rt", encoding="utf-8") as handle:
        kept = gum_documents(handle.read())
    assert all(script.GUM_DOCUMENTS[doc][0] in script.KEEP for doc in kept)
    assert sorted(kept) == sorted(d for d in script.GUM_DOCUMENTS if script.kept(d))
    assert f"the {len(kept)} of its {len(script.GUM_DOCUMENTS)} documents" in BUNDLED[GUM_NAME].what
    rows = {r[0]: r for r in table_rows(LICENSES.read_text(encoding="utf-8"), "| document |")}
    for doc, url in kept.items():  # one row per document: its source URL and licence
        assert rows[doc][1] == url and rows[doc][4] == script.GUM_DOCUMENTS[doc][0]


@pytest.mark.skipif(not SHARED.is_dir(), reason="needs the shared UD files")
def test_bundled_files_are_the_shared_releases_unchanged():
    with gzip.open(EWT_DEV, "rb") as handle:
        assert handle.read() == (SHARED / "en_ewt-ud-dev.conllu").read_bytes()
    script = make_bundled()
    shared = dict(script.documents((SHARED / "en_gum-ud-dev.conllu").read_text(encoding="utf-8")))
    assert set(shared) == set(script.GUM_DOCUMENTS)  # every dev document has a licence decision
    with gzip.open(GUM_COREF, "rt", encoding="utf-8") as handle:
        bundled = dict(script.documents(handle.read()))
    assert all(shared[doc] == block for doc, block in bundled.items())


def test_a_run_with_no_input_reads_the_bundled_gold_data():
    config = RunConfig().checked()
    assert (config.treebank, config.coref) == (EWT_DEV, GUM_COREF)
    corpus = read_conllu(config.treebank)
    assert f"{len(corpus):,} sentences, {sum(len(e.words) for e in corpus):,} words" in (
        BUNDLED[EWT_DEV.name].what
    )  # 2,001 and 25,147
    assert set(bundled_provenance([EWT_DEV, GUM_COREF, None])) == {EWT_DEV.name, GUM_NAME}


def test_the_provenance_credits_the_bundled_data_read(bert_family, tmp_path):
    """A run on a bundled file records its source and licence (summary, provenance, report); a
    run on a copy outside the package records none."""
    from headprobe.report import build_report

    copy = Path(shutil.copy(SAMPLE, tmp_path / "copy.conllu"))

    def run(treebank):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return headprobe.run(
                loaded=(bert_family.sdpa, bert_family.tokenizer, "tiny"),
                treebank=treebank,
                analyses=["positional"],
                n_boot=10,
                pictures=False,
                progress=False,
            )

    bundled, other = run(SAMPLE), run(copy)
    line = BUNDLED["sample.conllu"].line()
    assert "licence: MIT" in line and bundled.summary["bundled_data"] == {"sample.conllu": line}
    assert ("bundled_data: sample.conllu", line) in provenance(bundled)
    assert other.summary["bundled_data"] == {}
    assert not any(key.startswith("bundled_data") for key, _ in provenance(other))
    report = build_report(bundled, tmp_path / "report")["markdown"].read_text(encoding="utf-8")
    assert f"bundled_data: sample.conllu: {line}" in report
