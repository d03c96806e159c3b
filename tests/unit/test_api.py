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


def test_k_is_a_whole_number_and_the_cap_bounds_the_default(demo_copy, monkeypatch) -> None:
    """A k that is not a whole number is one QueryError (it was a TypeError from deep inside); a
    lower HYBRIDSEARCH_SEARCH_MAX_K caps a profile's default instead of refusing every search that
    names no k."""
    import numpy as np
    import pytest

    from hybridsearch.errors import QueryError

    with hybridsearch.open(demo_copy) as h:
        for bad in (2.5, 3.0, "5", [], 0, True):
            with pytest.raises(QueryError, match=r"k must be a whole number between 1 and \d+ .*got"):
                h.search("compact", "lexical", k=bad)
        assert len(h.search("compact", "lexical", k=np.int64(3)).hits) == 3
        monkeypatch.setenv("HYBRIDSEARCH_SEARCH_MAX_K", "5")  # the settings follow the environment
        assert len(h.search("compact", "lexical").hits) == 5  # lexical's max_results is larger
        with pytest.raises(QueryError, match="between 1 and 5"):
            h.search("compact", "lexical", k=6)


def test_delete_refuses_one_string_and_search_bad_arguments(demo_copy) -> None:
    """delete("12") iterated the string and deleted chunks "1" and "2"; a bad filter was a pydantic
    dump of several lines; a bytes query was a TypeError from the analyser."""
    import pytest

    from hybridsearch.errors import QueryError, ValidationError

    with hybridsearch.open(demo_copy) as h:
        before = h.engine.count()
        for ids, works, field in (("topo-basis", (), "ids"), ([], "topo-basis", "works"), (None, (), "ids"),
                                  ([1], (), "ids")):
            with pytest.raises(ValidationError, match=f"field '{field}': a list of ids") as err:
                h.delete(ids, works=works)
            assert "\n" not in str(err.value)
        assert h.engine.count() == before
        assert h.delete(["topo-basis"]) == ["topo-basis"] and h.engine.count() == before - 1
        with pytest.raises(ValidationError, match="field 'subject': unknown field") as err:
            h.search("compact", "lexical", filters={"subject": ["topology"]})
        assert "\n" not in str(err.value)
        with pytest.raises(QueryError, match="the query must be text"):
            h.search(b"compact", "lexical")
