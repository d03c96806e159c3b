"""Bulk writes against the real node: per-item failures become BulkWriteError naming ids and
reasons after the rest is written; items rejected with 429 are sent again; credentials never
appear in errors."""

from __future__ import annotations

import pytest
from opensearchpy import helpers

from hybridsearch.errors import BulkWriteError, EngineUnavailableError, IndexNotFoundError
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
    """The index is dropped behind the engine's back: the next write fails, naming the index
    (at the read of what it keeps, or by id in the bulk request), and no index without our
    mappings appears under the write alias' name."""
    engine = opensearch_index
    engine.write([Document(id="a", title="Alpha", text="x")])
    engine.client.indices.delete(index=f"{engine.index}-v1")
    with pytest.raises(IndexNotFoundError, match=f"no index '{engine.index}'"):
        engine.write([Document(id="b", title="Beta", text="y")])
    assert not engine.client.indices.exists(index=engine.write_alias)
    with pytest.raises(BulkWriteError, match="b: index_not_found_exception"):  # the bulk request alone
        engine._bulk([{"_op_type": "create", "_index": engine.write_alias, "_id": "b", "_source": {"id": "b"}}])
    assert not engine.client.indices.exists(index=engine.write_alias)


def test_items_rejected_with_429_are_sent_again(opensearch_index, monkeypatch) -> None:
    """The node answers 429 to one item of the first pass (injected: back-pressure cannot be
    caused on demand; the item is held back and reported rejected); the engine sends that item
    again and it lands."""
    real = helpers.parallel_bulk
    held: list[dict] = []

    def first_pass(client, actions, **kwargs):
        def sent():
            for a in actions:
                if a["_id"] == "d3" and not held:
                    held.append(a)
                else:
                    yield a

        yield from real(client, sent(), **kwargs)
        for a in held[:1] if len(held) == 1 else []:  # once
            held.append(a)
            yield False, {a["_op_type"]: {"_index": a["_index"], "_id": a["_id"], "status": 429,
                                          "error": {"type": "rejected_execution_exception"}}}

    monkeypatch.setattr(helpers, "parallel_bulk", first_pass)
    monkeypatch.setattr(opensearch_index.settings, "opensearch_bulk_docs", 2)
    docs = [Document(id=f"d{i}", title=f"Doc {i}", text="body") for i in range(6)]
    assert opensearch_index.write(docs) == 6
    assert opensearch_index.count() == 6 and "d3" in opensearch_index.get(["d3"])


@pytest.mark.parametrize("retry_s", [5.0, 0.0])
def test_items_whose_shard_lost_its_node_are_sent_again(opensearch_index, monkeypatch, retry_s) -> None:
    """One item answered 503 unavailable_shards_exception (its primary was on a node the cluster
    lost: injected, since one node cannot lose another): a client that knows several nodes
    (retry_s > 0) sends it again and it lands; one that knows one node reports it."""
    real = helpers.parallel_bulk

    def first_pass(client, actions, **kwargs):
        held = []
        yield from real(client, (a for a in actions if a["_id"] != "d3" or held.append(a)), **kwargs)
        for a in held:
            yield False, {a["_op_type"]: {"_index": a["_index"], "_id": a["_id"], "status": 503, "error": {
                "type": "unavailable_shards_exception", "reason": "primary shard is not active"}}}

    monkeypatch.setattr(helpers, "parallel_bulk", first_pass)
    monkeypatch.setattr(opensearch_index, "retry_s", retry_s)
    docs = [Document(id=f"d{i}", title=f"Doc {i}", text="body") for i in range(6)]
    if retry_s:
        assert opensearch_index.write(docs) == 6 and "d3" in opensearch_index.get(["d3"])
    else:
        with pytest.raises(BulkWriteError, match="1 of 6 items failed: d3: unavailable_shards_exception"):
            opensearch_index.write(docs)


def test_credentials_never_appear_in_errors() -> None:
    from hybridsearch.engines.opensearch import OpenSearchEngine

    engine = OpenSearchEngine("http://admin:s3cr3t-pw@127.0.0.1:1", index="nowhere")  # no network call yet
    assert engine.url == "http://127.0.0.1:1"
    with pytest.raises(EngineUnavailableError) as err:
        engine.count()
    assert "s3cr3t" not in str(err.value) and "cannot reach OpenSearch at http://127.0.0.1:1" in str(err.value)
    # a comma in a password does not start another URL
    engine = OpenSearchEngine("http://admin:s3c,r3t@127.0.0.1:1,http://127.0.0.1:2", index="nowhere")
    assert engine.url == "http://127.0.0.1:1,http://127.0.0.1:2" and engine.client.transport.hosts[0]["port"] == 1


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


def test_a_write_keeps_what_a_worker_stored_meanwhile(opensearch_index, monkeypatch) -> None:
    """A worker stores a chunk's vector, and a graph build its graph, between write's read of the
    stored chunk and its bulk request (the interleaving is forced by running them inside that
    read): the write meets the change, reads the chunk again and keeps both."""
    import numpy as np

    from hybridsearch.engines.opensearch import OpenSearchEngine
    from indexer.graph import update_graph

    engine = opensearch_index
    doc = Document(id="a", title="Alpha", text="x", cites=["b"], year=1990)
    engine.write([doc, Document(id="b", title="Beta", text="y")])
    update_graph(engine)
    vec = np.random.default_rng(3).normal(size=(1 + len(doc.passages), 384)).astype(np.float32)
    vec /= np.linalg.norm(vec, axis=1, keepdims=True)  # the chunk's vector, then its passages'
    vec, passages = vec[:1], vec[1:]
    worker = OpenSearchEngine(engine.raw_url, index=engine.index)
    real, reads = engine._mget, []

    def read_then_worker(ids, includes=None):
        got = real(ids, includes)
        reads.append(list(ids))
        if len(reads) == 1:
            assert worker.set_vectors(["a"], vec, texts=[doc.dense_text], passages=[passages]) == 1
            worker.write([Document(id="c", title="Gamma", text="z", cites=["a"])])
            assert update_graph(worker)[1]  # a is now cited by c
        return got

    monkeypatch.setattr(engine, "_mget", read_then_worker)
    assert engine.write([doc.model_copy(update={"year": 1991})]) == 1  # the dense text is unchanged
    assert reads == [["a"], ["a"]]  # read again after the conflict
    assert engine.get(["a"])["a"].year == 1991 and engine.missing_vectors(ids=["a"]) == []
    assert np.allclose(engine.vectors(["a"])["a"], vec[0]) and engine.neighbors(["a"])["a"].cited_by == ("c",)
    assert np.allclose(engine.passage_vectors(["a"])["a"], passages)
    worker.close()


def test_a_graph_build_writes_its_own_index_and_no_chunk(opensearch_index) -> None:
    """The graph goes into `graph+<index>`, one document per work: a build rewrites no chunk (their
    sequence numbers stay), a forced build of the same input writes nothing, a work that left is
    deleted from it, and a drop removes it with the chunks."""
    from indexer.graph import update_graph

    engine = opensearch_index
    engine.write([Document(id="a", title="Alpha", text="x", cites=["b"], year=1990),
                  Document(id="b", title="Beta", text="y", year=1980),
                  Document(id="c", title="Gamma", text="z", cites=["a", "b"], year=2000)])
    ids = ["a", "b", "c"]

    def seq_nos() -> dict[str, int]:
        return {i: d["_seq_no"] for i, d in engine._mget(ids, ["id"]).items()}

    def graph_versions() -> dict[str, int]:
        hits = engine.client.search(index=engine.graph_index, body={"size": 10, "version": True})["hits"]["hits"]
        return {h["_id"]: h["_version"] for h in hits}

    before = seq_nos()
    assert update_graph(engine)[1] and seq_nos() == before
    assert engine.graph_index == f"graph+{engine.index}" and set(graph_versions()) == set(ids)
    nb = engine.neighbors(["b", "c"])
    assert nb["b"].cited_by == ("a", "c") and nb["c"].cites == ("a", "b") and nb["b"].pagerank > nb["c"].pagerank
    assert engine.authority(ids) == {i: n.authority for i, n in engine.neighbors(ids).items()}
    versions = graph_versions()
    assert update_graph(engine, force=True)[1] and graph_versions() == versions  # nothing changed
    engine.delete(["c"])
    assert update_graph(engine)[1] and set(graph_versions()) == {"a", "b"}
    assert engine.neighbors(["b"])["b"].cited_by == ("a",)
    assert engine.graph_index in engine.drop()
    assert not engine.client.indices.exists(index=engine.graph_index)


def test_a_graph_held_by_the_chunks_is_read_from_them_until_the_next_build(opensearch_index) -> None:
    """An index whose graph was built before the graph index (on each chunk, `graph`) answers
    from its chunks, keeps a chunk's graph through a rewrite, and moves to the graph index at its
    next build."""
    import base64
    import json

    from hybridsearch.engines import Neighbors
    from hybridsearch.engines.opensearch import queries as Q
    from indexer.graph import update_graph

    engine = opensearch_index
    engine.write([Document(id="a", title="Alpha", text="x", cites=["b"]), Document(id="b", title="Beta", text="y")])
    old = {"a": Neighbors(cites=("b",), pagerank=0.25, authority=0.0),
           "b": Neighbors(cited_by=("a",), pagerank=0.75, authority=0.5)}

    def on_chunk(nb: Neighbors) -> dict[str, object]:
        g = {k: v for k, v in Q.graph_doc("-", nb).items() if k not in ("id", "digest")}
        return {"graph": g}

    assert engine._update(["a", "b"], [on_chunk(old["a"]), on_chunk(old["b"])]) == 2
    engine.set_meta("graph", {"hash": "earlier", "works": 2, "edges": 1, "oriented": 0, "missing": 0,
                              "dangling": 1, "pagerank_sum": 1.0, "seconds": 0.1})
    assert engine.neighbors(["a", "b"]) == old and engine.authority(["b"]) == {"b": 0.5}
    engine.write([Document(id="b", title="Beta again", text="y")])
    assert engine.neighbors(["b"]) == {"b": old["b"]}
    assert json.loads(base64.b64decode(engine._sources(["b"], ["graph"])["b"]["graph"]["lists"]))["authority"] == 0.5
    assert update_graph(engine)[1] and engine.client.indices.exists(index=engine.graph_index)
    assert engine.neighbors(["b"])["b"].cited_by == ("a",) and engine.neighbors(["b"])["b"].pagerank != 0.75


def test_a_write_never_goes_into_an_index_hybridsearch_did_not_make(opensearch_url) -> None:
    """Both aliases name an index made by hand: the write is refused with one line, and that
    index's mapping and documents stay as they were."""
    import uuid

    from hybridsearch.engines.opensearch import OpenSearchEngine
    from hybridsearch.errors import ConfigError

    name = f"foreign-{uuid.uuid4().hex[:8]}"
    engine = OpenSearchEngine(opensearch_url, index=name)
    theirs = f"{name}-theirs"
    engine.client.indices.create(index=theirs, body={"mappings": {"properties": {"x": {"type": "keyword"}}}})
    engine.client.indices.update_aliases(body={"actions": [
        {"add": {"index": theirs, "alias": name}}, {"add": {"index": theirs, "alias": f"{name}-write"}}]})
    try:
        with pytest.raises(ConfigError, match=f"index: '{name}' at .* was not made by hybridsearch"):
            engine.write([Document(id="a", title="Alpha", text="x")])
        props = engine.client.indices.get_mapping(index=theirs)[theirs]["mappings"]["properties"]
        assert set(props) == {"x"} and engine.client.count(index=theirs)["count"] == 0
    finally:
        engine.client.indices.delete(index=theirs)
        engine.close()


def test_a_chunk_deleted_under_an_update_is_skipped(opensearch_index, monkeypatch) -> None:
    """A chunk deleted between set_codes' check that it exists and its update (forced by deleting
    it inside that check) is skipped, as an unknown id is, and the other chunk is updated."""
    from hybridsearch.hdc import HdcEncoder

    engine = opensearch_index
    docs = [Document(id="a", title="Alpha", text="x"), Document(id="b", title="Beta", text="y")]
    engine.write(docs)
    real = engine._sources

    def check_then_delete(ids, includes=None):
        got = real(ids, includes)
        if includes == ["id"]:
            engine.delete(["a"])
        return got

    monkeypatch.setattr(engine, "_sources", check_then_delete)
    codes = [HdcEncoder().encode_document(d) for d in docs]
    assert engine.set_codes(["a", "b"], codes) == 1
    assert engine.get(["a"]) == {} and engine.missing_codes(["a", "b"]) == []


def test_a_url_list_reaches_the_nodes_that_answer(opensearch_url, request) -> None:
    """Several URLs (the nodes of a cluster): a node that does not answer is passed over, and
    credentials stay out of what the engine shows."""
    import uuid

    from hybridsearch.engines.opensearch import OpenSearchEngine

    live = opensearch_url.replace("://", "://admin:s3cr3t-pw@", 1)
    engine = OpenSearchEngine(f"http://admin:s3cr3t-pw@127.0.0.1:1, {live}", index=f"test-urls-{uuid.uuid4().hex[:6]}")
    request.addfinalizer(engine.close)
    request.addfinalizer(engine.drop)
    assert engine.url == f"http://127.0.0.1:1,{opensearch_url}"
    for i in range(4):  # each request may meet the dead node first
        engine.write([Document(id=f"d{i}", title="Alpha", text="body")])
    assert engine.count() == 4 and engine.bm25("alpha", k=10).ids


def test_nodes_that_do_not_answer(monkeypatch) -> None:
    """One URL that does not answer fails at once, as ever; a list of them is tried again for
    opensearch_retry_s, then fails in one line; a malformed list is refused naming it."""
    import time

    from hybridsearch.engines.opensearch import OpenSearchEngine
    from hybridsearch.errors import ConfigError

    monkeypatch.setenv("HYBRIDSEARCH_OPENSEARCH_RETRY_S", "3")
    one = OpenSearchEngine("http://127.0.0.1:1", index="nowhere")
    began = time.monotonic()
    with pytest.raises(EngineUnavailableError, match="cannot reach OpenSearch at http://127.0.0.1:1 "):
        one.count()
    assert time.monotonic() - began < 3  # not tried again for the window
    engine = OpenSearchEngine("http://127.0.0.1:1,http://127.0.0.1:2", index="nowhere")
    began = time.monotonic()
    with pytest.raises(EngineUnavailableError) as err:
        engine.count()
    assert time.monotonic() - began >= 3 and "\n" not in str(err.value)
    assert "cannot reach OpenSearch at http://127.0.0.1:1,http://127.0.0.1:2" in str(err.value)
    for bad, says in (("http://a:1,https://b:2", "mixes http and https"), (" , ", "is not an OpenSearch URL"),
                      ("http://a:1,ftp://b", "'http://a:1,ftp://b' is not an OpenSearch URL")):
        with pytest.raises(ConfigError, match=says):
            OpenSearchEngine(bad, index="nowhere")
