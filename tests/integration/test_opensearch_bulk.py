"""Bulk writes against the real node: per-item failures become BulkWriteError naming ids and
reasons after the rest is written; items rejected with 429 are sent again; credentials never
appear in errors."""

from __future__ import annotations

import pytest
from opensearchpy import helpers

from hybridsearch.errors import BulkWriteError, EngineUnavailableError
from hybridsearch.models import Document

pytestmark = [pytest.mark.integration, pytest.mark.opensearch]


def test_per_item_failures_name_ids_and_reasons(opensearch_index) -> None:
    engine = opensearch_index
    engine.write([Document(id="a", title="Alpha", text="x")])
    # an update of a chunk that is gone by the time the request lands (here: never existed)
    actions = [{"_op_type": "index", "_index": engine.write_alias, "_id": "b",
                "_source": {"id": "b", "work_id": "b", "title": "Beta"}},
               {"_op_type": "update", "_index": engine.write_alias, "_id": "ghost", "doc": {"title": "x"}}]
    with pytest.raises(BulkWriteError) as err:
        engine._bulk(actions)
    assert set(err.value.failures) == {"ghost"}
    assert "document_missing_exception" in err.value.failures["ghost"]
    assert "1 of 2 items failed: ghost: document_missing_exception" in str(err.value)
    assert set(engine.get(["a", "b"])) == {"a", "b"}  # the rest was written, and is searchable


def test_writes_never_create_a_stray_index(opensearch_index) -> None:
    """The index is dropped behind the engine's back: the next write fails by id, and no index
    without our mappings appears under the write alias' name."""
    engine = opensearch_index
    engine.write([Document(id="a", title="Alpha", text="x")])
    engine.client.indices.delete(index=f"{engine.index}-v1")
    with pytest.raises(BulkWriteError, match="b: index_not_found_exception"):
        engine.write([Document(id="b", title="Beta", text="y")])
    assert not engine.client.indices.exists(index=engine.write_alias)


def test_items_rejected_with_429_are_sent_again(opensearch_index, monkeypatch) -> None:
    """The node answers 429 to one item of the first pass (injected: back-pressure cannot be
    caused on demand); the engine sends that item again and it lands."""
    real = helpers.parallel_bulk

    def first_pass(client, actions, **kwargs):
        for ok, item in real(client, actions, **kwargs):
            (op, info), = item.items()
            if info["_id"] == "d3":
                yield False, {op: {**info, "status": 429, "error": {"type": "rejected_execution_exception"}}}
            else:
                yield ok, item

    monkeypatch.setattr(helpers, "parallel_bulk", first_pass)
    monkeypatch.setattr(opensearch_index.settings, "opensearch_bulk_docs", 2)
    docs = [Document(id=f"d{i}", title=f"Doc {i}", text="body") for i in range(6)]
    assert opensearch_index.write(docs) == 6
    assert opensearch_index.count() == 6 and "d3" in opensearch_index.get(["d3"])


def test_credentials_never_appear_in_errors() -> None:
    from hybridsearch.engines.opensearch import OpenSearchEngine

    engine = OpenSearchEngine("http://admin:s3cr3t-pw@127.0.0.1:1", index="nowhere")  # no network call yet
    assert engine.url == "http://127.0.0.1:1"
    with pytest.raises(EngineUnavailableError) as err:
        engine.count()
    assert "s3cr3t" not in str(err.value) and "cannot reach OpenSearch at http://127.0.0.1:1" in str(err.value)


def test_first_writes_from_several_processes_at_once(opensearch_url) -> None:
    """Engines that create the same new index at the same moment all succeed, and all their
    documents land in the one index behind the aliases."""
    import threading
    import uuid

    from hybridsearch.engines.opensearch import OpenSearchEngine

    name = f"race-{uuid.uuid4().hex[:8]}"
    engines = [OpenSearchEngine(opensearch_url, index=name) for _ in range(4)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(engines))

    def first_write(i: int) -> None:
        try:
            start.wait()
            engines[i].write([Document(id=f"doc{i}", title=f"Doc {i}", text="body")])
        except BaseException as e:  # noqa: BLE001 - asserted below
            errors.append(e)

    threads = [threading.Thread(target=first_write, args=(i,)) for i in range(len(engines))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert engines[0].count() == 4 and engines[0].stats().details["concrete_index"] == f"{name}-v1"
    finally:
        engines[0].drop()
        for e in engines:
            e.close()
