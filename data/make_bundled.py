"""Write the bundled gold data and its licence list (headprobe/inputs/samples/):

- en_ewt-ud-dev.conllu.gz: UD English EWT dev, whole, gzip-compressed;
- en_gum-ud-dev-open.conllu.gz: the documents of UD English GUM dev whose texts may be
  redistributed in an MIT-licensed package (`GUM_DOCUMENTS` decides, one row per document);
- LICENSES.md: every bundled file (`headprobe.inputs.samples.BUNDLED`) and every GUM document
  kept or left out, with its licence.

GUM's licences (https://github.com/amir-zeldes/gum, LICENSE.txt): all annotations CC BY 4.0;
the texts under their sources' terms. Kept: texts under CC BY, CC BY-SA or in the public domain.
Left out: non-commercial (NC) or no-derivatives (ND) terms, and texts whose terms are not stated.

Run:  .venv/bin/python data/make_bundled.py [SHARED_DATA_DIR]   (default ../shared/data)
The gzip files carry no time stamp, so the same input writes the same bytes.
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from headprobe.inputs.samples import BUNDLED, GUM_NAME, sample_path  # noqa: E402

EWT_SOURCE, EWT_NAME = "en_ewt-ud-dev.conllu", "en_ewt-ud-dev.conllu.gz"
GUM_SOURCE = "en_gum-ud-dev.conllu"
LICENSES = sample_path("LICENSES.md")

CC_BY_4 = "CC-BY-4.0"
CC_BY_SA_3 = "CC-BY-SA-3.0"
CC_BY_25 = "CC-BY-2.5"
US_PD = "public domain (US federal government work, 17 U.S.C. 105)"
KEEP = (CC_BY_4, CC_BY_SA_3, CC_BY_25, US_PD)
GUM_LICENCE = "GUM LICENSE.txt"  # https://github.com/amir-zeldes/gum/blob/master/LICENSE.txt

# Every document of GUM dev: (its text's licence, why). Kept where the licence is in KEEP.
GUM_DOCUMENTS = {
    "GUM_academic_exposure": (CC_BY_4, f"PLOS ONE article; {GUM_LICENCE}: academic, PLOS"),
    "GUM_academic_librarians": (CC_BY_4, f"DH2017 abstract; {GUM_LICENCE}: academic, DH2017"),
    "GUM_bio_byron": (CC_BY_SA_3, f"Wikipedia; {GUM_LICENCE}: biographies"),
    "GUM_bio_emperor": (CC_BY_SA_3, f"Wikipedia; {GUM_LICENCE}: biographies"),
    "GUM_conversation_grounded": (
        "CC-BY-ND-3.0-US",
        "Santa Barbara Corpus of Spoken American English: no derivatives (an annotated, "
        "re-tokenized text is one)",
    ),
    "GUM_conversation_risk": ("CC-BY-ND-3.0-US", "Santa Barbara Corpus: no derivatives"),
    "GUM_court_loan": (
        "not confirmed",
        f"US Supreme Court oral argument transcript, made by a contracted court reporter; "
        f"{GUM_LICENCE} gives CC BY 4.0 for court texts as a genre, the transcript's own terms "
        "were not confirmed",
    ),
    "GUM_court_negligence": (
        "not confirmed",
        "Supreme Court of Canada hearing webcast (Crown copyright); its reproduction terms for "
        "transcripts were not confirmed",
    ),
    "GUM_essay_evolved": ("CC-BY-NC-SA-4.0", f"88 Open Essays; {GUM_LICENCE}: essays"),
    "GUM_essay_tools": ("CC-BY-NC-SA-4.0", f"88 Open Essays; {GUM_LICENCE}: essays"),
    "GUM_fiction_beast": ("CC-BY-NC-SA-3.0", f"Small Beer Press; {GUM_LICENCE}: fiction"),
    "GUM_fiction_lunre": ("CC-BY-NC-SA-3.0", f"Small Beer Press; {GUM_LICENCE}: fiction"),
    "GUM_interview_cyclone": (CC_BY_25, f"Wikinews; {GUM_LICENCE}: Wikinews/interviews"),
    "GUM_interview_gaming": (CC_BY_25, f"Wikinews; {GUM_LICENCE}: Wikinews/interviews"),
    "GUM_letter_arendt": (
        "CC-BY-NC-SA-4.0",
        f"a private 1975 letter (Library of Congress, Hannah Arendt papers); {GUM_LICENCE}: letters",
    ),
    "GUM_letter_wiki": ("CC-BY-NC-SA-4.0", f"archive.org; {GUM_LICENCE}: letters"),
    "GUM_news_homeopathic": (CC_BY_25, f"Wikinews; {GUM_LICENCE}: Wikinews"),
    "GUM_news_iodine": (CC_BY_25, f"Wikinews; {GUM_LICENCE}: Wikinews"),
    "GUM_podcast_bangladesh": ("CC-BY-NC-SA-4.0", f"archive.org podcast; {GUM_LICENCE}: podcasts"),
    "GUM_podcast_wrestling": ("CC-BY-NC-SA-4.0", f"archive.org podcast; {GUM_LICENCE}: podcasts"),
    "GUM_speech_impeachment": (
        US_PD,
        "a Representative's floor speech in the Congressional Record (congress.gov)",
    ),
    "GUM_speech_inauguration": (
        US_PD,
        "President Reagan's inaugural address (1981), delivered as President; text from the American "
        "Presidency Project",
    ),
    "GUM_textbook_governments": (CC_BY_4, "OpenStax American Government 2e (Rice University)"),
    "GUM_textbook_labor": (CC_BY_4, "OpenStax Principles of Economics 2e (Rice University)"),
    "GUM_vlog_portland": (
        "YouTube standard licence",
        "a YouTube video: no licence to redistribute",
    ),
    "GUM_vlog_radiology": (
        "YouTube standard licence",
        "a YouTube video: no licence to redistribute",
    ),
    "GUM_voyage_athens": (CC_BY_SA_3, f"Wikivoyage; {GUM_LICENCE}: WikiVoyage"),
    "GUM_voyage_coron": (CC_BY_SA_3, f"Wikivoyage; {GUM_LICENCE}: WikiVoyage"),
    "GUM_whow_joke": ("CC-BY-NC-SA-3.0", f"wikiHow; {GUM_LICENCE}: WikiHow"),
    "GUM_whow_overalls": ("CC-BY-NC-SA-3.0", f"wikiHow; {GUM_LICENCE}: WikiHow"),
}


def kept(doc_id: str) -> bool:
    return GUM_DOCUMENTS[doc_id][0] in KEEP


def documents(text: str) -> list[tuple[str, str]]:
    """(doc id, its lines from `# newdoc id` up to the next one) of a CoNLL-U text."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("# newdoc id"):
            out.append((line.split("=", 1)[1].strip(), []))
        if not out:
            raise SystemExit(f"a line before the first '# newdoc id': {line!r}")
        out[-1][1].append(line)
    return [(doc_id, "".join(lines)) for doc_id, lines in out]


def metadata(block: str) -> dict[str, str]:
    """The `# meta::KEY = value` lines of a document."""
    meta = {}
    for line in block.splitlines():
        if line.startswith("# meta::"):
            key, _, value = line[len("# meta::") :].partition("=")
            meta[key.strip()] = value.strip()
    return meta


def write_gzip(path: Path, text: str) -> None:
    with open(path, "wb") as raw, gzip.GzipFile("", "wb", 9, raw, mtime=0) as handle:
        handle.write(text.encode("utf-8"))


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def licences_md(gum_text: str) -> str:
    """LICENSES.md: the bundled files (`BUNDLED`), then the GUM documents kept (their source URL,
    read from the bundled GUM file) and those left out."""
    lines = [
        "# Bundled data: sources and licences",
        "",
        "Written by `data/make_bundled.py` from `headprobe.inputs.samples.BUNDLED` (edit those, "
        "then run it). headprobe's code is MIT-licensed (LICENSE); the data files below keep "
        "their own licences.",
        "",
        "| file | what | source | licence | attribution |",
        "|---|---|---|---|---|",
    ]
    for name, b in BUNDLED.items():
        lines.append(
            f"| {name} | {cell(b.what)} | {cell(b.source)} | {cell(b.licence)} | "
            f"{cell(b.attribution)} |"
        )
    lines += [
        "",
        f"## {GUM_NAME}: one row per document",
        "",
        "GUM's annotations are CC BY 4.0 (GUM LICENSE.txt, https://github.com/amir-zeldes/gum); "
        "each text keeps its source's licence. The UD release states CC BY-NC-SA 4.0 for the "
        "treebank as a whole because it holds non-commercial texts; only documents whose texts "
        "allow redistribution (CC BY, CC BY-SA, public domain) are bundled, unchanged.",
        "",
        "| document | source URL | title | author | licence | why |",
        "|---|---|---|---|---|---|",
    ]
    for doc_id, block in documents(gum_text):
        meta = metadata(block)
        licence, why = GUM_DOCUMENTS[doc_id]
        lines.append(
            f"| {doc_id} | {meta.get('sourceURL', '')} | {cell(meta.get('title', ''))} | "
            f"{cell(meta.get('author', ''))} | {licence} | {cell(why)} |"
        )
    lines += [
        "",
        "## GUM dev documents left out",
        "",
        "| document | licence | why |",
        "|---|---|---|",
    ]
    lines += [
        f"| {doc_id} | {licence} | {cell(why)} |"
        for doc_id, (licence, why) in GUM_DOCUMENTS.items()
        if not kept(doc_id)
    ]
    return "\n".join(lines) + "\n"


def main(shared: Path) -> None:
    ewt = (shared / EWT_SOURCE).read_text(encoding="utf-8")
    write_gzip(sample_path(EWT_NAME), ewt)
    gum = documents((shared / GUM_SOURCE).read_text(encoding="utf-8"))
    unknown = sorted({doc_id for doc_id, _ in gum} ^ set(GUM_DOCUMENTS))
    if unknown:
        raise SystemExit(f"documents not in GUM_DOCUMENTS or not in the file: {unknown}")
    open_text = "".join(block for doc_id, block in gum if kept(doc_id))
    write_gzip(sample_path(GUM_NAME), open_text)
    LICENSES.write_text(licences_md(open_text), encoding="utf-8")
    n_kept = sum(kept(doc_id) for doc_id, _ in gum)
    print(f"wrote {sample_path(EWT_NAME)} ({ewt.count(chr(10)):,} lines)")
    print(f"wrote {sample_path(GUM_NAME)} ({n_kept} of {len(gum)} documents)")
    print(f"wrote {LICENSES}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "shared" / "data")
