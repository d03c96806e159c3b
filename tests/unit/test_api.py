from __future__ import annotations

import hybridsearch


def test_open_search_and_filters(demo_copy) -> None:
    with hybridsearch.open(str(demo_copy)) as h:
        res = h.search("Gödel incompleteness", "hybrid", k=3)
        assert res.hits[0].id.startswith("logic-godel") and res.hits[0].document is not None
        res = h.search("compactness", "lexical", k=50, filters={"subjects": ["topology"]})
        assert res.hits and all("topology" in [s.lower() for s in h.engine.get([x.id])[x.id].subjects]
                                for x in res.hits)


def test_searcher_sees_documents_ingested_after_it_opened(demo_copy, tmp_path) -> None:
    with hybridsearch.open(str(demo_copy)) as h:
        assert h.search("zorblax", "lexical").hits == []
        f = tmp_path / "new.jsonl"
        f.write_text('{"id": "new-1", "title": "Zorblax manifold", "text": "A made-up object."}\n')
        writer = hybridsearch.open(str(demo_copy))  # a second handle in the same process
        writer.ingest(f, embed=False)
        writer.close()
        assert [x.id for x in h.search("zorblax", "lexical").hits] == ["new-1"]
