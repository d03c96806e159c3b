"""Index lifecycle on a real node: zero-downtime reindex with searches and writes running, an
interrupted reindex, snapshot and restore, templates, and the `indices`/`snapshot` commands."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from hybridsearch.analysis import ANALYSIS_RULES
from hybridsearch.models import Document
from tests.conftest import SHARED_DATA, opensearch_requests

pytestmark = [pytest.mark.integration, pytest.mark.opensearch]
EXE = str(Path(sys.executable).with_name("hybridsearch"))
RNG = np.random.default_rng(7)


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=600, input=stdin)


def corpus(n: int) -> list[Document]:
    """SciFact's first n abstracts when ../shared/data is present, else synthetic documents."""
    path = SHARED_DATA / "scifact" / "corpus.jsonl"
    docs = []
    with path.open() as f:
        for line in f:
            r = json.loads(line)
            docs.append(Document(id=str(r["_id"]), title=r.get("title") or "untitled", text=r["text"]))
            if len(docs) == n:
                break
    return docs


def drop_repo(admin, repo: str) -> None:
    """Delete a snapshot repository a test made, and its snapshots."""
    for s in admin.client.snapshot.get(repository=repo, snapshot="_all", ignore=404).get("snapshots", []):
        admin.client.snapshot.delete(repository=repo, snapshot=s["snapshot"])
    admin.client.snapshot.delete_repository(repository=repo, ignore=404)


def unit_vectors(n: int) -> np.ndarray:
    v = RNG.standard_normal((n, 384)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.fixture
def admin(opensearch_url):
    from hybridsearch.engines.opensearch.admin import Admin

    a = Admin(opensearch_url)
    yield a
    a.close()


@pytest.fixture
def name(admin):
    n = f"life-{uuid.uuid4().hex[:8]}"
    yield n
    if any(ix.name == n for ix in admin.indices()):
        admin.delete(n)


def test_reindex_has_no_downtime_and_keeps_writes(admin, name, caplog) -> None:
    docs = corpus(5000)
    assert len(docs) == 5000
    writer = admin.engine(name)
    vectors = unit_vectors(len(docs))
    writer.write(docs, vectors)
    before = writer.count()
    queries = ["vitamin D deficiency", "tumor suppressor gene", "insulin resistance obesity", "malaria vaccine",
               "stem cell differentiation", "antibiotic resistance bacteria", "DNA methylation cancer",
               "immune response T cells"]
    reader = admin.engine(name)
    expected = {q: reader.bm25(q, k=10).ids for q in queries}
    assert all(expected.values())
    probe = unit_vectors(1)[0]
    stop = threading.Event()
    served: list[int] = []
    failures: list[str] = []

    def search_loop() -> None:
        i = 0
        while not stop.is_set():
            q = queries[i % len(queries)]
            try:
                got = reader.bm25(q, k=10)
                near = reader.knn(probe, k=5)
                if not got.ids or not near.ids:
                    failures.append(f"empty result for {q!r}")
                served.append(1)
            except Exception as e:  # every failure is counted, none may happen
                failures.append(f"{q!r}: {e}")
            i += 1

    # writes made while the copy runs: they wait for the swap and land in the new version
    new_docs = [Document(id=f"during-{i}", title=f"written during the reindex {i}", text="zebrafish fin "
                         "regeneration") for i in range(40)]
    wrote: list[int] = []
    errors: list[str] = []

    def write_during() -> None:
        w = admin.engine(name)
        try:
            w.write(new_docs[:1], unit_vectors(1))  # made while the block is certainly on
            wrote.append(1)
            for i in range(1, len(new_docs), 10):
                w.write(new_docs[i:i + 10], unit_vectors(len(new_docs[i:i + 10])))
                wrote.append(len(new_docs[i:i + 10]))
        except Exception as e:
            errors.append(str(e))
        finally:
            w.close()

    writes = threading.Thread(target=write_during)
    started = threading.Event()

    shown: list[int] = []

    def progress(done: int, total: int) -> None:
        assert total == before
        shown.append(done)
        if not started.is_set():
            started.set()
            writes.start()
            time.sleep(1.0)  # the writer meets the block before the copy can finish

    t = threading.Thread(target=search_loop)
    t.start()
    try:
        res = admin.reindex(name, progress=progress)
    finally:
        stop.set()
        t.join()
    writes.join(timeout=120)
    assert started.is_set() and not writes.is_alive()
    assert shown == sorted(shown) and shown[-1] == before, shown  # the bar never goes back, and ends full
    # the writer met the write block and waited it out
    assert any("write-blocked" in r.getMessage() for r in caplog.records)
    assert failures == [] and len(served) > 10, failures[:3]
    assert errors == [] and sum(wrote) == len(new_docs)
    assert (res.old, res.new, res.docs) == (f"{name}-v1", f"{name}-v2", before)
    ix = admin.get(name)
    assert ix.live is not None and ix.live.index == f"{name}-v2"
    assert sorted(ix.live.aliases) == sorted([name, f"{name}-write"])
    old = next(v for v in ix.versions if v.version == 1)
    assert old.aliases == [] and old.docs == before  # kept until pruned, untouched by the writes
    assert reader.count() == before + len(new_docs)
    assert set(reader.get([d.id for d in new_docs])) == {d.id for d in new_docs}
    assert all(reader.bm25(q, k=10).ids == expected[q] for q in queries)
    sample = [d.id for d in docs[::500]]
    moved = reader.vectors(sample)
    assert all(np.array_equal(moved[i], vectors[j * 500]) for j, i in enumerate(sample))
    assert reader.stats().vectors == before + len(new_docs)
    assert not admin.client.indices.exists(index=f"{name}-v3")  # no stray index from the copy
    assert admin.prune(name, keep=1) == [f"{name}-v1"]
    assert [v.version for v in admin.get(name).versions] == [2]
    reader.close()
    writer.close()


def test_interrupted_reindex_changes_nothing(admin, name) -> None:
    engine = admin.engine(name)
    engine.write(corpus(600), unit_vectors(600))

    def interrupt(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        admin.reindex(name, progress=interrupt)
    ix = admin.get(name)
    assert [v.version for v in ix.versions] == [1]
    assert ix.live is not None and not ix.live.write_blocked
    engine.write([Document(id="after", title="still writable", text="x")])
    assert engine.count() == 601
    assert not admin.status(name)["warnings"]
    engine.close()


def test_snapshot_delete_restore_brings_back_every_document_and_vector(admin, name) -> None:
    from hybridsearch.hdc import HdcEncoder
    from indexer.graph import update_graph

    repo = f"test-{uuid.uuid4().hex[:8]}"
    engine = admin.engine(name)
    docs = corpus(300)
    docs[0] = docs[0].model_copy(update={"cites": [docs[1].id, docs[2].id]})
    docs[3] = docs[3].model_copy(update={"cites": [docs[1].id]})
    vecs = unit_vectors(len(docs))
    hdc = HdcEncoder(engine.analyzer)
    engine.write(docs, vecs, [hdc.encode_document(d) for d in docs])
    ids = [d.id for d in docs]
    before_docs, before_vecs = engine.get(ids), engine.vectors(ids)
    before_hits = engine.hamming({"topic": hdc.encode_query(docs[0].title)["topic"]}, k=5)["topic"].ids
    update_graph(engine)
    before_graph = engine.neighbors(ids)
    assert before_graph[docs[1].id].cited_by == tuple(sorted([docs[0].id, docs[3].id]))
    try:
        admin.repo_add(repo)
        snap = admin.snapshot_create("snap-1", repo, [name])
        assert snap["indices"] == {name: f"{name}-v1"} and snap["graphs"] == {name: f"graph+{name}"}
        assert [s["snapshot"] for s in admin.snapshots(repo)] == ["snap-1"]
        admin.delete(name)
        assert engine.count() == 0 and not admin.client.indices.exists(index=f"graph+{name}")
        with pytest.raises(Exception, match="no snapshot 'nope'"):
            admin.snapshot_restore("nope", repo)
        res = admin.snapshot_restore("snap-1", repo)
        assert res["indices"] == {name: f"{name}-v1"} and res["replaced"] == []
        assert engine.count() == len(docs)
        assert engine.get(ids) == before_docs
        after_vecs = engine.vectors(ids)
        assert set(after_vecs) == set(ids)
        assert all(np.array_equal(after_vecs[i], before_vecs[i]) for i in ids)
        assert engine.stats().codes == len(docs)
        assert engine.hamming({"topic": hdc.encode_query(docs[0].title)["topic"]}, k=5)["topic"].ids == before_hits
        assert engine.neighbors(ids) == before_graph  # the graph index came back with it
        engine.write([Document(id="new", title="written after the restore", text="y")])  # the write alias is back
        assert engine.count() == len(docs) + 1
        with pytest.raises(Exception, match="pass --yes"):
            admin.snapshot_restore("snap-1", repo)
        replaced = admin.snapshot_restore("snap-1", repo, replace=True)
        # restored beside the existing version, aliases moved, the old one deleted
        assert replaced["replaced"] == [name] and replaced["indices"] == {name: f"{name}-v2"}
        assert [v.index for v in admin.get(name).versions] == [f"{name}-v2"]
        assert engine.count() == len(docs) and engine.get(ids) == before_docs
        assert engine.neighbors(ids) == before_graph
        engine.write([Document(id="new", title="written after the second restore", text="y")])
        assert engine.count() == len(docs) + 1
    finally:
        drop_repo(admin, repo)
        engine.close()


def test_a_restore_refuses_what_it_cannot_replace_and_undoes_a_failed_one(admin, name, opensearch_url) -> None:
    from hybridsearch.config import Settings
    from hybridsearch.engines.opensearch.admin import Admin
    from hybridsearch.engines.opensearch.engine import LOCK_INDEX

    repo, other = f"test-{uuid.uuid4().hex[:8]}", f"{name}-b"
    engine, engine_b = admin.engine(name), admin.engine(other)
    engine.write(corpus(40), unit_vectors(40))
    engine_b.write([Document(id="b1", title="the other index", text="b")])
    admin.reindex(name)  # v2, reindexed from v1
    try:
        admin.repo_add(repo)
        admin.snapshot_create("both", repo, [name, other])
        # a name the restore would take, held by an index hybridsearch did not make: refused first
        admin.delete(other)
        admin.client.indices.create(index=other)
        with pytest.raises(Exception, match=rf"snapshot 'both': {other} at .* is taken by an index "
                                            r"or alias that is not a hybridsearch index to replace"):
            admin.snapshot_restore("both", repo, replace=True)
        assert [v.index for v in admin.get(name).versions] == [f"{name}-v1", f"{name}-v2"]
        admin.client.indices.delete(index=other)
        # never beside a reindex of the same index
        admin.client.index(index=LOCK_INDEX, id=f"reindex:{name}", refresh=True, body={
            "owner": "ops-host pid 4242", "started": "2026-11-24T10:00:00+00:00", "beat": time.time()})
        with pytest.raises(Exception, match=rf"a reindex or restore of '{name}' is already running \(ops-host"):
            admin.snapshot_restore("both", repo, replace=True)
        admin.client.delete(index=LOCK_INDEX, id=f"reindex:{name}", refresh=True)
        assert not admin.client.indices.exists(index=f"{name}-v3")
        # a restore that fails part way (here: the node is slower than the time allowed) is undone
        hasty = Admin(opensearch_url, settings=Settings(opensearch_url=opensearch_url,
                                                        opensearch_snapshot_timeout=0.001))
        with pytest.raises(Exception, match=rf"the partial {name}-v3 was deleted and {name}-v1, {name}-v2 left as "
                                            rf"they were; restoring '{name}' from snapshot 'both'"):
            hasty.snapshot_restore("both", repo, [name], replace=True)
        hasty.close()
        assert not admin.client.indices.exists(index=f"{name}-v3")
        assert not admin.get(name).live.write_blocked and admin.get(name).live.index == f"{name}-v2"
        engine.write([Document(id="during", title="written after the failed restore", text="x")])
        assert engine.count() == 41
        # a whole restore: the restored version says where it came from, not the snapshot's reindex
        res = admin.snapshot_restore("both", repo, replace=True)
        assert res["indices"] == {name: f"{name}-v3", other: f"{other}-v1"} and res["replaced"] == [name]
        assert admin.get(name).live.reindexed_from is None and engine.count() == 40 and engine_b.count() == 1
        meta = admin.client.indices.get_mapping(index=f"{name}-v3")[f"{name}-v3"]["mappings"]["_meta"]
        assert meta["hybridsearch"]["restored_from"] == f"{repo}:both"
        # deleting a snapshot still being taken stops it: the question says so
        admin.client.snapshot.create_repository(repository=f"{repo}-slow", body={"type": "fs", "settings": {
            "location": f"{repo}-slow", "max_snapshot_bytes_per_sec": "20kb"}})
        admin.client.snapshot.create(repository=f"{repo}-slow", snapshot="slow", body={
            "indices": f"{name}-v3", "include_global_state": False,
            "metadata": {"hybridsearch": {"indices": {name: f"{name}-v3"}}}}, params={"wait_for_completion": "false"})
        asked = run("snapshot", "delete", "slow", "--repo", f"{repo}-slow", "--url", opensearch_url, stdin="")
        assert asked.returncode == 2 and asked.stderr.strip() == (
            f"error: delete snapshot 'slow' ({name}) at {opensearch_url}, which is IN_PROGRESS (deleting it stops "
            "it): refused without --yes (stdin is not a terminal)"), asked.stderr
        assert run("snapshot", "delete", "slow", "--repo", f"{repo}-slow", "--url", opensearch_url, "--yes"
                   ).returncode == 0
        admin.client.snapshot.delete_repository(repository=f"{repo}-slow")
        # a snapshot of an index named outright that has no live version is refused, not left out
        admin.client.indices.update_aliases(body={"actions": [{"remove": {"index": f"{other}-v1", "alias": other}}]})
        with pytest.raises(Exception, match=rf"no live version of {other} to snapshot"):
            admin.snapshot_create("part", repo, [name, other])
    finally:
        drop_repo(admin, repo)
        admin.client.indices.delete(index=f"{other}*", ignore=404)
        admin.client.indices.delete_index_template(name=f"hybridsearch-{other}", ignore=404)
        engine.close()
        engine_b.close()


def test_templates_apply_is_idempotent(admin, name) -> None:
    from hybridsearch.engines.opensearch import queries as Q

    admin.create(name)
    first = {(c.kind, c.name): c.action for c in admin.apply_templates([name])}
    assert first[("index template", f"hybridsearch-{name}")] == "unchanged"  # create put it
    ism = first[("ISM policy", Q.query_log_policy(admin.settings.query_log_prefix)[0])]
    assert first[("index template", Q.query_log_name(admin.settings.query_log_prefix))] in ("created", "unchanged")
    if "opensearch-index-management" in admin.plugins():
        assert ism in ("created", "unchanged")
    else:
        assert ism == "skipped"
    again = admin.apply_templates([name])
    assert all(c.action in ("unchanged", "skipped") for c in again), again
    # a template changed on the cluster is put back
    admin.client.indices.put_index_template(name=f"hybridsearch-{name}", body={
        "index_patterns": [f"{name}-v*"], "priority": 200, "composed_of": []})
    changed = {(c.kind, c.name): c.action for c in admin.apply_templates([name])}
    assert changed[("index template", f"hybridsearch-{name}")] == "updated"


def test_status_names_what_an_index_from_older_templates_lacks(admin, name) -> None:
    from hybridsearch.engines.opensearch import queries as Q
    from hybridsearch.engines.opensearch.admin import server_major

    admin.create(name)
    status = admin.status(name)
    assert not status["warnings"]
    # the same version as a cluster made it before the title had its keyword and binary copies
    v1 = f"{name}-v1"
    mapping = admin.client.indices.get_mapping(index=v1)[v1]["mappings"]
    aliases = admin.client.indices.get_alias(index=v1)[v1]["aliases"]
    del mapping["properties"]["title"]["fields"], mapping["properties"]["title_bin"]
    admin.client.indices.delete(index=v1)
    admin.client.indices.delete_index_template(name=f"hybridsearch-{name}")
    settings = Q.chunks_template(status["knn_engine"], server_major(admin.client))["template"]["settings"]
    admin.client.indices.create(index=v1, body={"settings": settings, "mappings": mapping, "aliases": aliases})
    # a chunk as that cluster wrote it
    admin.client.index(index=v1, id="old", body={"id": "old", "work_id": "old", "title": "Ancient title"},
                       params={"refresh": "true"})
    (warning,) = admin.status(name)["warnings"]
    assert warning.startswith(f"the live version {v1} was made from older templates and lacks title.raw, title_bin "
                              "(so the reranker and diversity read DocInfo from _source"), warning
    assert warning.endswith(f"`hybridsearch indices reindex {name}` moves it onto the current ones")
    engine = admin.engine(name)
    assert engine.doc_info(["old"])["old"].title == "Ancient title"  # from _source
    assert engine.work_chunks(["old"]) == engine.doc_info(["old"])  # its chunks' DocInfo the same way
    # the strict older mapping gets the new fields at the first write
    engine.write([Document(id="new", title="Fresh title", text="x")])
    assert engine.doc_info(["new"])["new"].title == "Fresh title"
    admin.apply_templates([name])
    admin.reindex(name)
    assert not admin.status(name)["warnings"]
    # the copy filled title_bin: both chunks' DocInfo in one doc-values request
    with opensearch_requests(engine) as sent:
        got = engine.doc_info(["old", "new"])
    assert {i: info.title for i, info in got.items()} == {"old": "Ancient title", "new": "Fresh title"}
    assert len(sent) == 1 and "title_bin" in sent[0][1][0]["docvalue_fields"], sent
    # and a work's chunks come with theirs, in the same request
    with opensearch_requests(engine) as sent:
        assert engine.work_chunks(["new", "old"]) == got
    assert len(sent) == 1, sent


def test_an_index_analysed_with_older_rules_says_so(admin, name, caplog, tmp_path) -> None:
    from hybridsearch.engines.opensearch import queries as Q

    admin.create(name)
    engine = admin.engine(name)
    engine.write([Document(id="lp", title=r"Interpolation in $L^\infty$", text="bounded maps")])
    assert not admin.status(name)["warnings"]
    # the version as an older hybridsearch made it, recording no analysis rules
    v1 = f"{name}-v1"
    meta = Q.hybridsearch_meta(admin.client.indices.get_mapping(index=v1)[v1]["mappings"])
    assert meta.pop("analysis") == ANALYSIS_RULES
    admin.client.indices.put_mapping(index=v1, body={"_meta": {"hybridsearch": meta}})
    (warning,) = admin.status(name)["warnings"]
    assert warning.startswith(f"the live version {v1} holds tokens and HDC codes made with analysis rules older "
                              f"than recorded ones, and this version analyses with rules {ANALYSIS_RULES}"), warning
    with caplog.at_level("WARNING", logger="hybridsearch"):
        reader = admin.engine(name)
        assert reader.bm25("L^∞", k=3).ids == ["lp"]
        reader.bm25("bounded", k=3)
    said = [r.getMessage() for r in caplog.records if "older than recorded ones" in r.getMessage()]
    assert len(said) == 1 and f"index {name!r}" in said[0] and "ingest the corpus again into it" in said[0], said
    # a reindex copies the tokens as they are, and the rules they were made with
    admin.reindex(name)
    assert admin.status(name)["warnings"] == [warning.replace(v1, f"{name}-v2")]
    # ingesting the whole corpus again analyses every chunk anew, and records these rules
    from indexer.pipeline import ingest

    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "lp", "title": r"Interpolation in $L^\infty$", "text": "bounded maps"}) + "\n")
    ingest(admin.engine(name), corpus, graph=False, progress=False)
    assert not [w for w in admin.status(name)["warnings"] if "analysis rules" in w], admin.status(name)["warnings"]


def test_chunks_written_before_the_joined_field_are_refused_until_a_reindex_fills_it(admin, name) -> None:
    from hybridsearch.engines.opensearch import queries as Q
    from hybridsearch.errors import EngineError
    from hybridsearch.scoring import document_joined

    admin.create(name)
    engine = admin.engine(name)
    docs = [Document(id="both", title="Heine-Borel theorem", text="Compact sets are closed and bounded."),
            Document(id="text", text="Bounded maps of closed sets."),
            Document(id="title", title="Closed graph theorem", subjects=["analysis"])]
    fresh = {d.id: Q.to_source(d, document_joined(engine.analyzer, d), "", None, None) for d in docs}
    # the chunks as a version without `title_text` wrote them
    for d in docs:
        src = json.loads(json.dumps(fresh[d.id]))
        del src["bm25"]["title_text"], src["bm25_len"]["title_text"]
        admin.client.index(index=f"{name}-write", id=d.id, body=src, params={"refresh": "true"})
    with pytest.raises(EngineError, match=rf"BM25 field 'title_text': 3 chunks of index '{name}' .* were written "
                                          rf"before it existed; `hybridsearch indices reindex {name}` fills it in"):
        engine.bm25("closed", fields={"title_text": 1.0, "subjects": 1.0}, k=5)
    assert set(engine.bm25("closed", k=5).ids) == {"both", "text", "title"}  # the seeds' fields need no reindex
    admin.reindex(name)
    for d in docs:  # the copy holds the tokens a write gives now, placeholder included
        got = admin.client.get(index=name, id=d.id)["_source"]
        assert (got["bm25"], got["bm25_len"]) == (fresh[d.id]["bm25"], fresh[d.id]["bm25_len"]), d.id
    assert fresh["title"]["bm25"]["text"] == Q.EMPTY_FIELD_TOKEN  # an empty part adds no placeholder
    assert Q.EMPTY_FIELD_TOKEN not in fresh["title"]["bm25"]["title_text"]
    reader = admin.engine(name)
    found = reader.bm25("closed bounded", fields={"title_text": 1.0}, k=5)
    assert found.ids == ["text", "both", "title"]  # two with both terms (the shorter first), one with one


def test_an_index_made_before_passages_lists_its_chunks_to_embed(admin, name) -> None:
    """A version whose mapping has no `passages` (made by an older version, not written to since):
    its chunks have no passage score and are listed to embed, with no error; the first write puts
    the field into its mapping, and `embed` then completes them."""
    from hybridsearch.engines.embedded.store import hash_text
    from hybridsearch.engines.opensearch import queries as Q
    from hybridsearch.engines.opensearch.admin import server_major
    from hybridsearch.scoring import document_joined

    status = admin.status(admin.create(name).name)
    v1 = f"{name}-v1"
    mapping = admin.client.indices.get_mapping(index=v1)[v1]["mappings"]
    aliases = admin.client.indices.get_alias(index=v1)[v1]["aliases"]
    del mapping["properties"]["passages"]
    admin.client.indices.delete(index=v1)
    admin.client.indices.delete_index_template(name=f"hybridsearch-{name}")
    settings = Q.chunks_template(status["knn_engine"], server_major(admin.client))["template"]["settings"]
    admin.client.indices.create(index=v1, body={"settings": settings, "mappings": mapping, "aliases": aliases})
    engine = admin.engine(name)
    doc = Document(id="old", title="Ancient title", text="One sentence. Another one.")
    vec = np.zeros(384, dtype=np.float32)
    vec[0] = 1.0
    admin.client.index(index=v1, id="old", params={"refresh": "true"},
                       body=Q.to_source(doc, document_joined(engine.analyzer, doc), str(hash_text(doc.dense_text)),
                                        vec, None))
    assert engine.passage_score(vec, ["old"]) == {}
    assert [i for i, _ in engine.missing_vectors()] == ["old"]
    engine.write([Document(id="new", title="Fresh title", text="x")])  # the mapping gains `passages`
    passages = np.zeros((len(doc.passages), 384), dtype=np.float32)
    passages[:, 1] = 1.0
    assert engine.set_vectors(["old"], vec[None, :], texts=[doc.dense_text], passages=[passages]) == 1
    assert engine.passage_score(vec, ["old"]) == {"old": pytest.approx(0.0, abs=1e-6)}
    assert [i for i, _ in engine.missing_vectors()] == ["new"]


def test_a_graph_written_before_its_doc_value_is_read_from_source_until_rebuilt(admin, name, opensearch_url
                                                                              ) -> None:
    """A graph that an earlier version stored on the chunks, one of them without `graph.lists`:
    read from doc values and `_source` (`indices status` counts that chunk) until `graph --force`
    moves it to the graph index."""
    from hybridsearch.engines import Neighbors
    from hybridsearch.engines.opensearch import queries as Q

    engine = admin.engine(name)
    engine.write([Document(id="a", title="Newer", text="x", year=1990, cites=["b"]),
                  Document(id="b", title="Older", text="y", year=1980)])
    want = {"a": Neighbors(cites=("b",), pagerank=0.25, authority=0.0),
            "b": Neighbors(cited_by=("a",), pagerank=0.75, authority=0.5)}
    assert engine._update(["a", "b"], [{"graph": {k: v for k, v in Q.graph_doc(i, want[i]).items()
                                                  if k not in ("id", "digest")}} for i in ("a", "b")]) == 2
    engine.set_meta("graph", {"hash": "earlier", "works": 2, "edges": 1, "oriented": 0, "missing": 0,
                              "dangling": 1, "pagerank_sum": 1.0, "seconds": 0.1})
    # chunk b as a version without `graph.lists` wrote it
    admin.client.update(index=f"{name}-write", id="b", body={"script": "ctx._source.graph.remove('lists')"},
                        params={"refresh": "true"})
    with opensearch_requests(engine) as sent:
        assert engine.neighbors(["a", "b", "missing"]) == want
    assert [what for what, _ in sent] == ["neighbors", "neighbors"]
    (warning,) = [w for w in admin.status(name)["warnings"] if "graph.lists" in w]
    assert warning.startswith("chunks whose citation graph was written before `graph.lists` existed: 1;"), warning
    forced = run("graph", "--url", opensearch_url, "--index", name, "--force")
    assert forced.returncode == 0, forced.stderr
    assert not [w for w in admin.status(name)["warnings"] if "graph.lists" in w]
    with opensearch_requests(engine) as sent:
        got = engine.neighbors(["a", "b", "missing"])
    assert [what for what, _ in sent] == ["neighbors", "read graph"]
    assert set(got) == {"a", "b"} and got["b"].cited_by == ("a",) and got["a"].cites == ("b",)
    assert got["b"].pagerank != 0.75  # built now, into the graph index
    engine.close()


def test_indices_and_snapshot_commands(opensearch_url, name) -> None:
    url = ["--url", opensearch_url]
    created = run("indices", "create", name, *url, "--json")
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["index"] == f"{name}-v1"
    again = run("indices", "create", name, *url)
    assert again.returncode == 2 and again.stderr.strip() == f"error: index {name!r} already exists at {opensearch_url}"
    listed = {r["name"]: r for r in json.loads(run("indices", "list", *url, "--json").stdout)}
    assert {"name", "version", "index", "docs", "health"} <= set(listed[name])
    assert (listed[name]["version"], listed[name]["docs"]) == (1, 0)
    assert name in run("indices", "list", *url).stdout
    re_ = run("indices", "reindex", name, *url, "--json")
    assert re_.returncode == 0, re_.stderr
    assert json.loads(re_.stdout)["new"] == f"{name}-v2"
    status = json.loads(run("indices", "status", name, *url, "--json").stdout)
    assert status["index"] == f"{name}-v2" and [v["version"] for v in status["versions"]] == [1, 2]
    refused = run("indices", "prune", name, *url, stdin="")
    assert refused.returncode == 2 and "refused without --yes" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    pruned = run("indices", "prune", name, "--keep", "1", "--yes", *url, "--json")
    assert json.loads(pruned.stdout) == {"deleted": [f"{name}-v1"]}
    repo = f"cli-{uuid.uuid4().hex[:8]}"
    assert run("snapshot", "repo-add", repo, *url).returncode == 0
    made = run("snapshot", "create", "s1", "--repo", repo, "--index", name, *url, "--json")
    assert made.returncode == 0 and json.loads(made.stdout)["state"] == "SUCCESS", made.stderr
    listed_snaps = json.loads(run("snapshot", "list", "--repo", repo, *url, "--json").stdout)
    assert [s["snapshot"] for s in listed_snaps] == ["s1"]
    refused_restore = run("snapshot", "restore", "s1", "--repo", repo, *url, stdin="")
    assert refused_restore.returncode == 2 and "refused without --yes" in refused_restore.stderr
    restored = run("snapshot", "restore", "s1", "--repo", repo, "--yes", *url, "--json")
    assert restored.returncode == 0, restored.stderr
    assert json.loads(restored.stdout)["replaced"] == [name]
    assert json.loads(restored.stdout)["indices"] == {name: f"{name}-v3"}  # beside v2, which it replaced
    missing = run("snapshot", "list", "--repo", "no-such-repo", *url)
    assert missing.returncode == 2 and "snapshot repo-add no-such-repo" in missing.stderr
    assert run("snapshot", "create", "s2", "--repo", repo, "--index", name, *url).returncode == 0
    for pattern in ("s*", "s1,s2", "_all", ""):  # one snapshot's name, never a pattern that deletes several
        several = run("snapshot", "delete", pattern, "--repo", repo, "--yes", *url)
        assert several.returncode == 2 and several.stderr.strip() == (
            f"error: snapshot: {pattern!r} is not one snapshot's name (no wildcards, commas or _all)"), several.stderr
    kept = run("snapshot", "delete", "s2", "--repo", repo, *url, stdin="")
    assert kept.returncode == 2 and "refused without --yes" in kept.stderr
    dropped = run("snapshot", "delete", "s2", "--repo", repo, "--yes", *url)
    assert dropped.returncode == 0 and dropped.stdout.strip() == f"deleted snapshot 's2' ({name}) from {repo!r}"
    assert [s["snapshot"] for s in json.loads(run("snapshot", "list", "--repo", repo, *url, "--json").stdout)] == ["s1"]
    nothing = run("snapshot", "delete", "s2", "--repo", repo, "--yes", *url)
    assert nothing.returncode == 2 and nothing.stderr.strip() == f"error: no snapshot 's2' in repository {repo!r}"
    gone = run("indices", "delete", name, "--yes", *url)
    assert gone.returncode == 0 and gone.stdout.strip() == f"deleted {name}-v3"
    assert run("indices", "status", name, *url).returncode == 2
    bad = run("indices", "list", "--url", "http://127.0.0.1:1")
    assert bad.returncode == 2 and bad.stderr.startswith("error: cannot reach OpenSearch")
    from hybridsearch.engines.opensearch.admin import Admin

    a = Admin(opensearch_url)
    a.client.snapshot.delete(repository=repo, snapshot="s1")
    a.client.snapshot.delete_repository(repository=repo)
    a.close()


def test_reindex_cleans_up_after_a_killed_reindex_and_refuses_strays(admin, name) -> None:
    engine = admin.engine(name)
    engine.write(corpus(50), unit_vectors(50))
    meta = {"hybridsearch": {"index": name, "version": 2, "reindexed_from": f"{name}-v1"}}
    # what a reindex killed mid-copy leaves: a newer version without aliases, the live one blocked
    admin.client.indices.create(index=f"{name}-v2", body={"mappings": {"_meta": meta}})
    admin.client.indices.add_block(index=f"{name}-v1", block="write")
    assert any("write-blocked" in w for w in admin.status(name)["warnings"])
    res = admin.reindex(name)
    assert res.removed == [f"{name}-v2"] and res.new == f"{name}-v2" and res.docs == 50
    assert engine.count() == 50 and not admin.status(name)["warnings"]
    # a newer version someone made by hand is not deleted
    admin.client.indices.create(index=f"{name}-v7", body={"mappings": {"_meta": {"hybridsearch": {"index": name}}}})
    with pytest.raises(Exception, match=f"{name}-v7 is newer than the live version"):
        admin.reindex(name)
    assert admin.client.indices.exists(index=f"{name}-v7")
    engine.close()


def test_reindex_keeps_the_settings_an_operator_set_on_the_live_version(admin, name) -> None:
    engine = admin.engine(name)
    engine.write(corpus(20), unit_vectors(20))
    hand_set = {"index.number_of_replicas": "1", "index.max_result_window": "20000", "index.refresh_interval": "7s",
                "index.search.slowlog.threshold.query.warn": "2s"}
    admin.client.indices.put_settings(index=f"{name}-v1", body=hand_set)
    res = admin.reindex(name)
    assert res.carried == hand_set  # not the replica count of 0 the templates gave both versions
    got = admin.client.indices.get_settings(index=res.new, params={"flat_settings": "true"})[res.new]["settings"]
    assert {k: got.get(k) for k in hand_set} == hand_set and "index.blocks.write" not in got
    assert engine.count() == 20
    # and on to the version after
    again = admin.reindex(name)
    assert again.carried == hand_set
    # the one replica has no second node to go to here, which is all the status warns of
    assert admin.status(name)["warnings"] == [f"1 shard copies of {name}-v3 are unassigned (a node is missing, or "
                                              "the cluster has fewer nodes than copies)"]
    engine.close()


def test_two_reindexes_at_once_never_both_run(admin, name) -> None:
    from hybridsearch.engines.opensearch.admin import Admin
    from hybridsearch.engines.opensearch.engine import LOCK_INDEX

    engine = admin.engine(name)
    engine.write(corpus(200), unit_vectors(200))
    start = threading.Barrier(2)
    outcomes: list[object] = []

    def one() -> None:
        a = Admin(admin.url)
        start.wait()
        try:
            outcomes.append(a.reindex(name, poll=0.05))
        except Exception as e:
            outcomes.append(e)
        finally:
            a.close()

    runs = [threading.Thread(target=one) for _ in range(2)]
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    done = [o for o in outcomes if not isinstance(o, Exception)]
    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert len(done) == 1 and len(refused) == 1, outcomes
    assert f"a reindex or restore of {name!r} is already running" in str(refused[0])
    assert [v.index for v in admin.get(name).versions] == [f"{name}-v1", f"{name}-v2"]
    assert admin.get(name).live.index == f"{name}-v2" and engine.count() == 200
    assert not admin.client.exists(index=LOCK_INDEX, id=f"reindex:{name}")  # released


def test_a_killed_reindexs_lock_is_taken_over_once_silent(admin, name) -> None:
    from hybridsearch.engines.opensearch.engine import LOCK_INDEX, LOCK_TTL, LockLost

    engine = admin.engine(name)
    engine.write(corpus(30), unit_vectors(30))
    admin.reindex(name)  # makes the lock index
    key = f"reindex:{name}"

    def held(silent: float) -> None:
        admin.client.index(index=LOCK_INDEX, id=key, refresh=True,
                           body={"owner": "ops-host pid 4242", "started": "2026-11-24T10:00:00+00:00",
                                 "beat": time.time() - silent})

    held(5)
    with pytest.raises(Exception, match=r"already running \(ops-host pid 4242, started 2026-11-24T10:00:00"):
        admin.reindex(name)
    assert admin.get(name).live.index == f"{name}-v2" and not admin.get(name).live.write_blocked
    held(LOCK_TTL + 5)  # a killed run's
    assert admin.reindex(name).new == f"{name}-v3"
    assert not admin.client.exists(index=LOCK_INDEX, id=key)

    # a run that lost its lock to another stops without touching what the other now owns
    def taken_over(done: int, total: int) -> None:
        held(0)

    with pytest.raises(LockLost, match="another run took over the lock"):
        admin.reindex(name, progress=taken_over)
    assert admin.client.indices.exists(index=f"{name}-v4")  # left for the run that took over
    assert admin.client.get(index=LOCK_INDEX, id=key)["_source"]["owner"] == "ops-host pid 4242"
    admin.client.delete(index=LOCK_INDEX, id=key)
    assert admin.reindex(name).removed == [f"{name}-v4"] and engine.count() == 30
    engine.close()
    with pytest.raises(Exception, match="'hybridsearch-locks' is not a valid logical index name"):
        admin.engine(LOCK_INDEX)


def test_a_lock_whose_process_on_this_machine_is_gone_is_taken_over_at_once(admin, name) -> None:
    """A run killed on this machine leaves its lock behind; the next run finds its process gone and
    goes on at once instead of waiting LOCK_TTL. A holder recorded on another machine is waited for."""
    from hybridsearch.engines.opensearch.engine import LOCK_INDEX

    engine = admin.engine(name)
    engine.write(corpus(20), unit_vectors(20))
    key = f"reindex:{name}"
    holder = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from hybridsearch.engines.opensearch.admin import Admin
from hybridsearch.engines.opensearch.engine import cluster_lock
admin = Admin({admin.url!r})
with cluster_lock(admin.client, admin.errors, {key!r}, "a held lock"):
    print("held", flush=True)
    time.sleep(600)
"""], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(Exception, match=rf"already running \(\S+ pid {holder.pid},"):
            admin.reindex(name)
    finally:
        holder.kill()
        holder.wait()
    assert admin.client.get(index=LOCK_INDEX, id=key)["_source"]["pid"] == holder.pid  # left behind
    assert admin.reindex(name).new == f"{name}-v2"  # at once: its process is gone
    assert not admin.client.exists(index=LOCK_INDEX, id=key)

    # the same pid recorded on another machine says nothing about a process here
    admin.client.index(index=LOCK_INDEX, id=key, refresh=True, body={
        "owner": f"ops-host pid {holder.pid}", "machine": "ops-host pid:[1]", "pid": holder.pid,
        "started": "2026-11-24T10:00:00+00:00", "beat": time.time()})
    with pytest.raises(Exception, match=rf"already running \(ops-host pid {holder.pid},"):
        admin.reindex(name)
    admin.client.delete(index=LOCK_INDEX, id=key)
    engine.close()


@pytest.mark.slow
def test_merge_drops_replaced_copies_so_bm25_equals_the_embedded_engines(admin, name, tmp_path) -> None:
    """A re-ingest leaves a replaced copy of each chunk that Lucene's BM25 statistics count;
    `indices status` says so and `indices merge` drops them (after OpenSearch's retention leases
    pass), after which BM25 scores equal the embedded engine's on the same documents."""
    from hybridsearch.engines.embedded.engine import EmbeddedEngine

    docs, url = corpus(300), ["--url", admin.url]
    vectors = unit_vectors(len(docs))
    embedded = EmbeddedEngine(tmp_path / "emb")
    embedded.write(docs, vectors)
    remote = admin.engine(name)
    try:
        remote.write(docs, vectors)
        remote.write(docs[:120], vectors[:120])  # re-ingested: 120 replaced copies
        queries = [d.title for d in docs[::37]]

        def differ() -> float:
            worst = 0.0
            for q in queries:
                a, b = embedded.bm25(q, k=10), remote.bm25(q, k=10)
                assert a.ids[:3] == b.ids[:3], q
                worst = max(worst, *(abs(x - y) for x, y in zip(a.scores, b.scores, strict=False)))
            return worst

        assert differ() > 1e-3  # the replaced copies shift the statistics
        status = json.loads(run("indices", "status", name, *url, "--json").stdout)
        assert status["versions"][0]["deleted"] == 120
        assert any(f"indices merge {name}" in w for w in status["warnings"]), status["warnings"]
        bad = run("indices", "merge", name, "--timeout", "nan", *url)
        assert bad.returncode == 2 and bad.stderr == ("error: argument --timeout: a number of seconds above 0, got "
                                                      "'nan' (see `hybridsearch indices merge --help`)\n")
        merged = run("indices", "merge", name, *url)
        assert merged.returncode == 0, merged.stderr
        assert merged.stdout.startswith(f"merged {name}-v1: dropped 120 deleted or replaced copies in "), merged.stdout
        assert merged.stderr.endswith(f"merging the segments of {name}-v1 that hold 120 deleted or replaced copies\n")
        assert differ() < 1e-4
        key = "index.merge.policy.expunge_deletes_allowed"  # set to 0 for the merge, then back to the default
        assert admin.client.indices.get_settings(index=f"{name}-v1", name=key) == {}  # nothing set
        status = json.loads(run("indices", "status", name, *url, "--json").stdout)
        assert status["versions"][0]["deleted"] == 0 and status["warnings"] == []
        assert remote.count() == len(docs) and remote.stats().vectors == len(docs)
        again = json.loads(run("indices", "merge", name, *url, "--json").stdout)
        assert (again["dropped"], again["remaining"]) == (0, 0)
        admin.client.indices.add_block(index=f"{name}-v1", block="write")  # as a running reindex does
        blocked = run("indices", "merge", name, *url)
        assert blocked.returncode == 2 and f"`hybridsearch indices reindex {name}` finishes it" in blocked.stderr
        admin.client.indices.put_settings(index=f"{name}-v1", body={"index": {"blocks": {"write": None}}})
    finally:
        remote.close()
        embedded.close()


def test_an_index_keeps_the_knn_engine_it_was_made_with(admin, name) -> None:
    """A process set to another k-NN engine than the one an index was made with reads that index's
    scores by the index's own (faiss scores inner products 1 + ip, Lucene cosines (1 + cos) / 2):
    the same cosines, and `stats` names the index's engine."""
    from hybridsearch.config import Settings
    from hybridsearch.engines.opensearch import OpenSearchEngine

    engine = admin.engine(name)
    vecs = unit_vectors(3)
    engine.write([Document(id=f"d{i}", title=f"t{i}", text="x") for i in range(3)], vecs)
    want = engine.knn(vecs[0], 3)
    assert want.ids[0] == "d0" and want.scores[0] == pytest.approx(1.0, abs=1e-5)
    other = OpenSearchEngine(engine.raw_url, index=name, settings=Settings(opensearch_knn_engine="faiss"))
    got = other.knn(vecs[0], 3)
    assert got.ids == want.ids and got.scores == pytest.approx(want.scores, abs=1e-6)
    details = other.stats().details
    assert (details["knn_engine"], details["space_type"]) == ("lucene", "cosinesimil")
    other.close()
    engine.close()


def test_a_reader_follows_a_reindex_to_another_knn_method(admin, name, monkeypatch) -> None:
    """A reindex may make the next version with another k-NN method (`opensearch_knn_engine`
    changed in between); a process that read the last one reads the new version's scores by the new
    method from its next kNN, without a restart. This node has no native k-NN libraries, so the
    other method is Lucene's inner product (scored 1 + ip, as faiss's is), made by the reindex with
    the chunk template's space type set to it."""
    from hybridsearch.engines.opensearch import queries as Q
    from hybridsearch.engines.opensearch.admin import apply_chunk_templates

    writer = admin.engine(name)
    vecs = unit_vectors(4)
    vecs[1] = -vecs[0]  # cosine -1: the far end of both formulas
    writer.write([Document(id=f"d{i}", title=f"t{i}", text="x") for i in range(4)], vecs)
    reader = admin.engine(name)
    want = reader.knn(vecs[0], 4)
    assert want.ids[0] == "d0" and want.ids[-1] == "d1"
    cosines = [float(vecs[0] @ vecs[int(i[1:])]) for i in want.ids]
    assert want.scores == pytest.approx(cosines, abs=1e-5)
    with monkeypatch.context() as m:
        m.setitem(Q.SPACE_TYPE, "lucene", "innerproduct")
        admin.reindex(name)
    try:
        assert admin.engine(name).stats().details["space_type"] == "innerproduct"
        got = reader.knn(vecs[0], 4)  # read by (1 + cos) / 2 this would say 3.0 for d0
        assert got.ids == want.ids and got.scores == pytest.approx(cosines, abs=1e-5)
        assert reader.stats().details["concrete_index"] == f"{name}-v2"
    finally:
        apply_chunk_templates(admin.client, name, "lucene", "1x")  # the shared component template as it was
    reader.close()
    writer.close()


@pytest.mark.slow
def test_a_long_merge_says_what_the_node_is_merging(admin, name, monkeypatch) -> None:
    """While the merge task runs, a line every `report_every` seconds says which merges are under
    way. This small index merges at once, so its task is reported unfinished at its first two
    polls (a merge that outlasts them cannot be caused in test time); everything else is the node's."""
    import re

    engine = admin.engine(name)
    docs = corpus(200)
    engine.write(docs)
    engine.write(docs[:50])  # 50 replaced copies
    real = admin.client.tasks.get
    polls: list[bool] = []

    def slow(*args, **kwargs):
        got = real(*args, **kwargs)
        polls.append(bool(got.get("completed")))
        return {**got, "completed": False} if len(polls) <= 2 else got

    monkeypatch.setattr(admin.client.tasks, "get", slow)
    lines: list[str] = []
    result = admin.merge(name, progress=lines.append, poll=0.05, report_every=0)
    assert result.dropped == 50 and len(polls) >= 3
    still = [line for line in lines if line.startswith(f"still merging {name}-v1 after ")]
    assert len(still) >= 2, lines
    assert all(re.search(r"after \d+ s: \d+ merge\(s\) under way over [\d,]+ documents \([\d.,]+ MiB\)$", line)
               for line in still), still


def test_lifecycle_never_takes_an_index_it_did_not_make(admin, name) -> None:
    """An index named like one of our versions but made by someone else is neither adopted by
    `indices create` nor deleted by `indices delete`; and a logical index whose name extends
    another's with `-v…` (`x` and `x-vb`) lives beside it."""
    from hybridsearch.errors import ConfigError

    theirs = f"{name}-v1"
    admin.client.indices.create(index=theirs, body={"mappings": {"_meta": {"owner": "someone-else"}}})
    try:
        with pytest.raises(ConfigError, match=f"{theirs} at .* exists and was not made by hybridsearch for '{name}'"):
            admin.create(name)
        assert not admin.client.indices.exists_alias(name=name)
    finally:
        admin.client.indices.delete(index=theirs)
    admin.create(name)
    stray = f"{name}-v07"
    admin.client.indices.create(index=stray, body={"mappings": {"_meta": {"owner": "someone-else"}}})
    try:
        assert admin.delete(name) == [f"{name}-v1"] and admin.client.indices.exists(index=stray)
    finally:
        admin.client.indices.delete(index=stray)
    longer = f"{name}-vb"
    admin.create(name)
    try:
        admin.create(longer)
        admin.engine(longer).write([Document(id="a", title="Alpha", text="x")])
        admin.engine(name).write([Document(id="b", title="Beta", text="y")])
        assert admin.engine(longer).count() == 1 and admin.engine(name).count() == 1
        assert admin.get(longer).live.index == f"{longer}-v1"
    finally:
        admin.delete(longer)


def test_metadata_written_by_processes_at_once_all_holds(admin, name) -> None:
    """A mapping update replaces the whole `_meta`: each key written at the same time still holds."""
    admin.create(name)
    engines = [admin.engine(name) for _ in range(4)]
    start = threading.Barrier(len(engines))

    def write(n: int) -> None:
        start.wait()
        for i in range(8):
            engines[n].set_meta(f"k{n}-{i}", {"n": n, "i": i})

    threads = [threading.Thread(target=write, args=(n,)) for n in range(len(engines))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reader = admin.engine(name)
    assert {f"k{n}-{i}": reader.get_meta(f"k{n}-{i}") for n in range(4) for i in range(8)} == {
        f"k{n}-{i}": {"n": n, "i": i} for n in range(4) for i in range(8)}


@pytest.mark.slow
def test_a_long_restore_keeps_its_lock_and_a_lost_swap_answer_is_not_undone(admin, name, monkeypatch) -> None:
    import opensearchpy

    from hybridsearch.engines.opensearch import engine as engine_mod

    monkeypatch.setattr(engine_mod, "LOCK_TTL", 2.0)  # a holder silent for 2 s is taken for killed
    monkeypatch.setattr(engine_mod, "LOCK_BEAT", 0.3)
    repo = f"test-{uuid.uuid4().hex[:8]}"
    engine = admin.engine(name)
    engine.write(corpus(40), unit_vectors(40))
    try:
        admin.client.snapshot.create_repository(repository=repo, body={"type": "fs", "settings": {
            "location": repo, "max_restore_bytes_per_sec": "40kb"}})  # a restore of several seconds
        admin.snapshot_create("s", repo, [name])
        refused: list[str] = []

        def reindex_meanwhile() -> None:
            time.sleep(3.5)  # the restore's lock would have gone silent for longer than LOCK_TTL
            try:
                admin.reindex(name)
            except Exception as e:  # noqa: BLE001
                refused.append(str(e))

        t = threading.Thread(target=reindex_meanwhile)
        t.start()
        index, blips = admin.client.index, []

        def one_blip(*args, **kwargs):  # the first renewal of the lock times out; the next ones go through
            if "if_seq_no" in kwargs and not blips:
                blips.append(kwargs)
                raise opensearchpy.exceptions.ConnectionTimeout("TIMEOUT", "read timed out", None)
            return index(*args, **kwargs)

        monkeypatch.setattr(admin.client, "index", one_blip)
        began = time.monotonic()
        res = admin.snapshot_restore("s", repo, replace=True)
        t.join()
        assert time.monotonic() - began > 3.5, "the restore was too quick to show the lock held"
        assert res["indices"] == {name: f"{name}-v2"}
        assert refused and f"a reindex or restore of {name!r} is already running" in refused[0], refused
        assert [v.index for v in admin.get(name).versions] == [f"{name}-v2"] and blips
        # the swap happens on the node but its answer is lost, and so is the first look at the
        # aliases after it: the restore is finished, not undone
        update, get_alias, looks = admin.client.indices.update_aliases, admin.client.indices.get_alias, []

        def swapped_then_lost(*args, **kwargs):
            update(*args, **kwargs)
            raise opensearchpy.exceptions.ConnectionTimeout("TIMEOUT", "read timed out", None)

        def look_lost(*args, **kwargs):  # where the alias named `name` is: the look after a swap
            if "name" in kwargs:
                looks.append(kwargs)
            if "name" in kwargs and len(looks) <= fails:
                raise opensearchpy.exceptions.ConnectionError("N/A", "connection reset", None)
            return get_alias(*args, **kwargs)

        monkeypatch.setattr(admin.client.indices, "update_aliases", swapped_then_lost)
        monkeypatch.setattr(admin.client.indices, "get_alias", look_lost)
        monkeypatch.setattr(engine_mod, "LOCK_TTL", 60.0)
        fails = 1
        res = admin.snapshot_restore("s", repo, replace=True)
        assert res["indices"] == {name: f"{name}-v1"}  # the snapshot's version number is free again
        assert [(v.index, sorted(v.aliases)) for v in admin.get(name).versions] == [
            (f"{name}-v1", [name, f"{name}-write"])]
        assert engine.count() == 40
        # when the node cannot say where the aliases are, nothing is deleted, and the error says so
        looks.clear()
        fails = 3
        with pytest.raises(Exception, match=rf"could not tell whether the aliases of '{name}' moved to {name}-v2, "
                                            rf"so nothing was deleted: `hybridsearch indices status {name}`"):
            admin.snapshot_restore("s", repo, replace=True)
        looks.clear()
        fails = 0
        assert sorted(v.index for v in admin.get(name).versions) == [f"{name}-v1", f"{name}-v2"]
        assert admin.get(name).live.index == f"{name}-v2" and engine.count() == 40
    finally:
        drop_repo(admin, repo)
        engine.close()


def test_metadata_written_while_a_reindex_swaps_goes_along(admin, name, monkeypatch) -> None:
    engine = admin.engine(name)
    engine.write(corpus(20), unit_vectors(20))
    other = admin.engine(name)
    copies, writer = [], []
    meta_for = admin._meta_for

    def copy_then_write(old: str, new: str) -> dict:
        got = meta_for(old, new)
        copies.append(new)
        if len(copies) == 2:  # the reindex's last copy of the metadata, just before its swap
            writer.append(threading.Thread(target=other.set_meta, args=("written", {"during": "the swap"})))
            writer[0].start()
            writer[0].join(1.5)  # lands at once unless it waits for the swap
        return got

    monkeypatch.setattr(admin, "_meta_for", copy_then_write)
    admin.reindex(name)
    writer[0].join()
    assert admin.engine(name).get_meta("written") == {"during": "the swap"}
    engine.close()
    other.close()
