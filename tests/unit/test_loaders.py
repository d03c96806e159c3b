from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from hybridsearch.errors import ValidationError
from indexer.loaders import (
    AtlasLoader,
    BeirLoader,
    JsonlLoader,
    LoadReport,
    TextDirLoader,
    detect_loader,
    load_qrels,
    load_queries,
    parse_date,
    section_type,
)
from tests.conftest import DEMO


def _write(path: Path, lines: list[str], newline: str = "\n") -> Path:
    path.write_bytes(newline.join(lines).encode() + newline.encode())
    return path


def test_jsonl_reports_bad_lines_with_line_numbers_and_keeps_the_rest(tmp_path) -> None:
    f = _write(tmp_path / "units.jsonl", [
        json.dumps({"id": "a", "title": "Compact space"}),
        "{not json",
        json.dumps({"id": "b", "title": ""}),
        json.dumps({"id": "c", "text": "Fine.", "year": 1900}),
        json.dumps({"id": "a", "title": "again"}),
        json.dumps({"id": "d", "title": "x", "metadata": {"w": 1e999}}),
    ])
    report = LoadReport()
    docs = list(JsonlLoader().load(f, report))
    assert [d.id for d in docs] == ["a", "c"]
    assert report.loaded == 2
    assert [e.line for e in report.rejected] == [2, 3, 5, 6]
    assert "invalid JSON" in str(report.rejected[0])
    assert f"duplicate id (first in {f}:1)" in str(report.rejected[2])
    assert "non-finite" in str(report.rejected[3])


def test_text_no_engine_can_store_is_one_line_naming_it(tmp_path) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text('{"id": "a", "title": "x\\ud800y", "text": "t"}\n' + "[" * 100_000 + "\n"
                 + '{"id": "ok", "title": "fine"}\n')
    report = LoadReport()
    assert [d.id for d in JsonlLoader().load(f, report)] == ["ok"]
    assert [e.line for e in report.rejected] == [1, 2]
    assert "a lone surrogate '\\ud800' at character 1 of title" in str(report.rejected[0])
    assert "invalid JSON: nested too deeply" in str(report.rejected[1])
    for bad, why in (("{not json", "invalid JSON: Expecting property name"),
                     ("[" * 100_000, "invalid JSON: nested too deeply")):
        q = tmp_path / "queries.jsonl"
        q.write_text('{"_id": "q1", "text": "fine"}\n' + bad + "\n")
        with pytest.raises(ValidationError, match=f"queries.jsonl:2: {why}"):
            load_queries(q)


def test_strict_stops_at_the_first_bad_line(tmp_path) -> None:
    f = _write(tmp_path / "units.jsonl", [json.dumps({"id": "a", "title": "x"}), "[]"])
    with pytest.raises(ValidationError, match=r"units.jsonl:2"):
        list(JsonlLoader().load(f, LoadReport(), strict=True))


def test_beir_metadata_mapping_and_crlf(tmp_path) -> None:
    _write(tmp_path / "corpus.jsonl", [
        json.dumps({"_id": "1", "title": "Algebraic language", "text": "",
                    "metadata": {"authors": ["Perlis, A. J."], "date": "CACM December, 1958",
                                 "keywords": "compilers; languages", "cr": "4.22"}}),
        json.dumps({"_id": "2", "title": "T", "text": "Body", "role": "theorem",
                    "metadata": {"subjects": ["topology"], "year": "1923", "cites": ["1"],
                                 "kind": "theorem", "license": "CC-BY-4.0", "venue": "Annals"}}),
    ], newline="\r\n")
    _write(tmp_path / "queries.jsonl", [json.dumps({"_id": "q1", "text": "compilers",
                                                    "metadata": {"intent": "survey"}})], "\r\n")
    (tmp_path / "qrels").mkdir()
    _write(tmp_path / "qrels" / "test.tsv", ["query-id\tcorpus-id\tscore", "q1\t1\t2", "q1\t2\t1"], "\r\n")
    docs = {d.id: d for d in BeirLoader().load(tmp_path, LoadReport())}
    one, two = docs["1"], docs["2"]
    assert (one.year, one.month, one.date) == (1958, 12, "CACM December, 1958")
    assert one.subjects == ["compilers", "languages"] and one.authors == ["Perlis, A. J."]
    assert one.metadata == {"cr": "4.22"}
    assert (two.year, two.kind, two.license, two.venue, two.cites, two.role) == (
        1923, "theorem", "CC-BY-4.0", "Annals", ["1"], "theorem")
    assert load_qrels(tmp_path) == {"q1": {"1": 2, "2": 1}}
    # TREC qrels, separated by spaces, are read too; a grade that is not a whole number is one line
    (tmp_path / "qrels" / "trec.tsv").write_text("q1 0 1 2\nq1 0 2 0\n")
    assert load_qrels(tmp_path, "trec") == {"q1": {"1": 2, "2": 0}}
    for n, grade in enumerate(("--1", "\u00b2", "1.5")):
        (tmp_path / "qrels" / f"bad{n}.tsv").write_text(f"q1\t1\t1\nq1\t2\t{grade}\n")
        with pytest.raises(ValidationError, match="bad" + str(n) + r".tsv:2: expected .*\(a whole number\)"):
            load_qrels(tmp_path, f"bad{n}")
    (q,) = load_queries(tmp_path)
    assert q.intent == "survey" and q.metadata == {"intent": "survey"}


def test_beir_links_become_citations(tmp_path) -> None:
    _write(tmp_path / "corpus.jsonl", [json.dumps({"_id": i, "title": f"t{i}", "text": ""})
                                       for i in ("1", "2", "3")])
    _write(tmp_path / "links.tsv", ["doc-id-a\tdoc-id-b", "1\t2", "2\t3"])
    docs = {d.id: d for d in BeirLoader().load(tmp_path, LoadReport())}
    assert docs["2"].cites == ["1", "3"] and docs["1"].cites == ["2"]
    # a first pair whose ids contain "id" is a pair, not a header
    _write(tmp_path / "corpus.jsonl", [json.dumps({"_id": i, "title": i, "text": ""}) for i in ("pid1", "pid2")])
    _write(tmp_path / "links.tsv", ["pid1\tpid2"])
    docs = {d.id: d for d in BeirLoader().load(tmp_path, LoadReport())}
    assert docs["pid1"].cites == ["pid2"] and docs["pid2"].cites == ["pid1"]
    # an empty id would become a missing work named "": one error naming the line
    _write(tmp_path / "links.tsv", ["pid1\tpid2", "pid1\t "])
    with pytest.raises(ValidationError, match=r"links.tsv:2: an empty id"):
        list(BeirLoader().load(tmp_path, LoadReport()))


@pytest.mark.parametrize(("text", "expected"), [
    ("CACM December, 1958", (1958, 12)), ("2021-03-05", (2021, 3)), ("Sept. 1970", (1970, 9)),
    ("no date here", (None, None)),
])
def test_parse_date(text, expected) -> None:
    assert parse_date(text) == expected


ATLAS = """atlas_id: topo-0001
# Compactness

A space is compact when every open cover has a finite subcover.

## Definition
Every open cover has a finite subcover.

## Key examples
Closed bounded intervals.

## Steps
1. Take a cover. 2. Extract a finite one.

## Miscellany
Odd notes.
"""


def test_atlas_section_strategy(tmp_path) -> None:
    f = tmp_path / "compact.md"
    f.write_text(ATLAS)
    docs = list(AtlasLoader("section").load(f, LoadReport()))
    assert [d.id for d in docs] == ["topo-0001", "topo-0001#1", "topo-0001#2", "topo-0001#3",
                                    "topo-0001#4"]
    atom = docs[0]
    assert atom.title == "Compactness" and atom.text.startswith("A space is compact")
    assert atom.metadata == {"atlas_id": "topo-0001", "source_uri": "atlas:topo-0001"}
    assert [d.kind for d in docs[1:]] == ["definition", "example", "procedure", "other"]
    assert docs[3].procedure.startswith("1. Take a cover")
    assert all(d.work_id == "topo-0001" for d in docs)


def test_atlas_atom_strategy(tmp_path) -> None:
    f = tmp_path / "compact.md"
    f.write_text(ATLAS)
    (doc,) = AtlasLoader("atom").load(f, LoadReport())
    assert doc.id == "topo-0001" and "Closed bounded intervals" in doc.text


def test_section_aliases() -> None:
    assert section_type("Definitions") == "definition"
    assert section_type("Proof sketch") == "proof"
    assert section_type("See also") == "reference"
    assert section_type("Something else") == "other"


def test_atlas_without_title_is_rejected_and_reported(tmp_path) -> None:
    (tmp_path / "a.md").write_text("# Good\n\nbody\n\n## Definition\nx\n")
    (tmp_path / "b.md").write_text("no title\n## Definition\nx\n")
    report = LoadReport()
    docs = list(AtlasLoader().load(tmp_path, report))
    assert {d.work_id for d in docs} == {"a"}
    assert len(report.rejected) == 1 and "b.md" in str(report.rejected[0])


def test_two_atlas_files_with_one_atlas_id_never_overwrite_each_other(tmp_path) -> None:
    for name, words in (("a.md", "First atom"), ("m.md", "Middle"), ("z.md", "Second atom")):
        atlas_id = "other-1" if name == "m.md" else "shared-1"
        (tmp_path / name).write_text(f"atlas_id: {atlas_id}\n# {words}\n\nbody\n\n## Definition\n{words}\n")
    report = LoadReport()
    docs = list(AtlasLoader().load(tmp_path, report))
    assert {d.id for d in docs} == {"shared-1", "shared-1#1", "other-1", "other-1#1"}
    assert next(d for d in docs if d.id == "shared-1").title == "First atom"
    assert report.loaded == 2  # files, not chunks
    (err,) = report.rejected
    assert str(tmp_path / "z.md") in str(err) and f"duplicate id (first in {tmp_path / 'a.md'})" in str(err)


def test_text_directory(tmp_path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "one.txt").write_text("Baire category theorem\nA complete metric space is not meagre.\n")
    (tmp_path / "sub" / "two.md").write_text("# Urysohn lemma\n\nNormal spaces separate closed sets.\n")
    (tmp_path / "skip.bin").write_bytes(b"\x00")
    docs = {d.id: d for d in TextDirLoader().load(tmp_path, LoadReport())}
    assert set(docs) == {"one.txt", "sub/two.md"}
    assert docs["sub/two.md"].title == "Urysohn lemma" and docs["one.txt"].source == "one.txt"


def test_detect_loader(tmp_path) -> None:
    assert detect_loader(DEMO) == "beir"
    assert detect_loader(DEMO / "corpus.jsonl") == "beir"
    (tmp_path / "x.jsonl").write_text("")
    assert detect_loader(tmp_path / "x.jsonl") == "jsonl"
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.md").write_text("# T\n\nbody\n\n## Details\nmore\n")
    assert detect_loader(mixed) == "atlas"
    (mixed / "b.txt").write_text("Notes\nplain text\n")  # the atlas loader would skip it
    assert detect_loader(mixed) == "textdir"


def test_demo_corpus_is_complete() -> None:
    report = LoadReport()
    docs = list(BeirLoader().load(DEMO, report))
    assert 150 <= len(docs) <= 300 and not report.rejected
    subjects = {d.subjects[0] for d in docs}
    assert {"topology", "geometry", "analysis", "algebra", "number theory", "probability",
            "logic"} <= subjects
    ids = {d.id for d in docs}
    assert sum(bool(d.cites) for d in docs) > 100 and all(c in ids for d in docs for c in d.cites)
    assert sum("near_duplicate_of" in d.metadata for d in docs) >= 6
    queries = load_queries(DEMO)
    qrels = load_qrels(DEMO)
    assert len(queries) >= 50
    assert {q.intent for q in queries} == {"lookup", "survey", "compare", "prereq", "related"}
    ood = [q for q in queries if q.id not in qrels]
    assert len(ood) >= 3
    assert {g for rels in qrels.values() for g in rels.values()} == {1, 2}


def test_long_text_is_chunked_by_page_then_window(tmp_path) -> None:
    from hybridsearch.models import Document
    from indexer.chunking import chunk_document

    words = " ".join(f"w{i}" for i in range(700))
    chunks = chunk_document(Document(id="book", title="Book", text=words), window=300, overlap=50)
    assert [c.id for c in chunks] == ["book#0", "book#1", "book#2"]
    assert all(c.work_id == "book" and c.title == "Book" for c in chunks)
    assert chunks[1].text.split()[0] == "w250" and chunks[2].text.split()[-1] == "w699"
    paged = chunk_document(Document(id="p", title="P", text="one page\ftwo page\f\fthree"))
    assert [(c.chunk_no, c.page, c.text) for c in paged] == [(0, 1, "one page"), (1, 2, "two page"),
                                                             (2, 4, "three")]
    assert chunk_document(Document(id="s", title="S", text="short")) == [Document(id="s", title="S",
                                                                                   text="short")]
    (tmp_path / "doc.txt").write_text("Notes\nfirst page\fsecond page\n")
    docs = list(TextDirLoader().load(tmp_path, LoadReport()))
    assert [(d.id, d.page, d.source) for d in docs] == [("doc.txt#0", 1, "doc.txt"), ("doc.txt#1", 2, "doc.txt")]


def test_jsonl_line_with_unicode_line_separator_stays_one_record(tmp_path) -> None:
    f = tmp_path / "u.jsonl"
    f.write_text(json.dumps({"id": "a", "title": "x\u2028y"}, ensure_ascii=False) + "\n", encoding="utf-8")
    (doc,) = JsonlLoader().load(f, LoadReport(), strict=True)
    assert doc.title == "x\u2028y"


def test_a_line_that_is_not_utf8_is_one_rejected_record(tmp_path) -> None:
    """One bad byte rejected the whole file, naming a byte offset into it; now that line alone is
    skipped and reported with its line number, as a malformed JSON line is."""
    f = tmp_path / "mixed.jsonl"
    f.write_bytes(b'\xef\xbb\xbf{"id": "a1", "title": "One"}\n{"id": "a2", "title": "Bad \xff bytes"}\r\n'
                  b'{"id": "a3", "title": "Three"}\r\n')
    report = LoadReport()
    assert [d.id for d in JsonlLoader().load(f, report)] == ["a1", "a3"]
    assert report.loaded == 2 and len(report.rejected) == 1
    assert str(report.rejected[0]).startswith(f"{f}:2") and "not UTF-8" in str(report.rejected[0])
    with pytest.raises(ValidationError, match=r"mixed.jsonl:2.*not UTF-8"):
        list(JsonlLoader().load(f, LoadReport(), strict=True))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
@pytest.mark.parametrize("loader", [JsonlLoader(), BeirLoader()], ids=["jsonl", "beir"])
def test_a_jsonl_corpus_is_streamed_not_read_whole(tmp_path, loader) -> None:
    """The first record comes out while the rest of the file is still unwritten: a named pipe
    whose writer holds back the second line until the loader has yielded the first record (a
    loader reading the whole file would wait for the writer to give up, and get both at once)."""
    pipe = tmp_path / "corpus.jsonl"
    os.mkfifo(pipe)
    first_out = threading.Event()
    waited: list[bool] = []

    def write() -> None:
        with open(pipe, "wb") as f:
            f.write(json.dumps({"id": "a", "title": "First", "text": "one"}).encode() + b"\n")
            f.flush()
            waited.append(first_out.wait(timeout=10))
            f.write(json.dumps({"id": "b", "title": "Second", "text": "two"}).encode() + b"\n")

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    ids = []
    for doc in loader.load(pipe, LoadReport(), strict=True):
        ids.append(doc.id)
        first_out.set()
    writer.join(timeout=20)
    assert ids == ["a", "b"] and waited == [True]
