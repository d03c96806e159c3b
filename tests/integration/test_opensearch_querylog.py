"""The query log on a real node: daily indices from their own template, records of real searches,
an unreachable log that never fails a search, and `logs prune`."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from hybridsearch.config import get_settings
from query_service.querylog import OpenSearchSink, QueryLog, index_for
from tests.conftest import DEMO, QUERY_LOG_PREFIX, wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.opensearch]
EXE = str(Path(sys.executable).with_name("hybridsearch"))


def test_searches_are_logged_to_the_daily_index(opensearch_index) -> None:
    from indexer.pipeline import ingest
    from query_service.searcher import Searcher

    engine = opensearch_index
    ingest(engine, DEMO, encoder=None, progress=False)
    log = QueryLog(OpenSearchSink(engine.raw_url, get_settings()))
    searcher = Searcher(engine, query_log=log, origin="api")
    searcher.search("Gödel incompleteness", "lexical", k=5)
    searcher.search("zzzzqx wvvvq", "lexical")
    searcher.search("Banach fixed point", "lexical", log_extra={"key": "analyst"})
    searcher.close()
    assert log.stats()["written"] == 3 and log.stats()["failed"] == 0
    client = engine.client
    client.indices.refresh(index=f"{QUERY_LOG_PREFIX}*")
    got = client.search(index=f"{QUERY_LOG_PREFIX}*", body={
        "size": 10, "query": {"term": {"index": engine.index}}, "sort": [{"@timestamp": "asc"}]})["hits"]["hits"]
    records = [h["_source"] for h in got]
    assert [r["query"] for r in records] == ["Gödel incompleteness", "zzzzqx wvvvq", "Banach fixed point"]
    assert all(h["_index"] == index_for(h["_source"]["@timestamp"], QUERY_LOG_PREFIX) for h in got)
    assert records[0]["engine"] == "opensearch" and records[0]["hits"] == 5 and len(records[0]["top_ids"]) == 5
    assert records[1]["zero_result"] is True and records[1]["hits"] == 0
    assert records[2]["key"] == "analyst"
    mapping = client.indices.get_mapping(index=got[0]["_index"])[got[0]["_index"]]["mappings"]["properties"]
    assert mapping["query"]["type"] == "keyword" and mapping["ms"]["type"] == "float"
    assert mapping["channel_hits"]["properties"]["bm25"]["type"] == "integer"
    # aggregations an analyst runs work on the mapped fields
    aggs = client.search(index=f"{QUERY_LOG_PREFIX}*", body={
        "size": 0, "query": {"term": {"index": engine.index}},
        "aggs": {"zero": {"terms": {"field": "zero_result"}}, "p95": {"percentiles": {"field": "ms",
                                                                                        "percents": [95]}}}})
    assert {b["key_as_string"]: b["doc_count"] for b in aggs["aggregations"]["zero"]["buckets"]} == {
        "false": 2, "true": 1}


def test_an_unreachable_log_never_fails_a_search(opensearch_index) -> None:
    from query_service.searcher import Searcher

    engine = opensearch_index
    from hybridsearch.models import Document

    engine.write([Document(id="a", title="Hilbert spaces", text="inner product")])
    log = QueryLog(OpenSearchSink("http://127.0.0.1:1", get_settings()))
    searcher = Searcher(engine, query_log=log)
    assert searcher.search("Hilbert", "lexical").hits[0].id == "a"
    assert log.flush(30)
    assert log.stats()["failed"] == 1 and "ConnectionError" in (log.stats()["last_error"] or "")
    searcher.close()


def test_logs_prune_deletes_old_daily_indices_of_its_own_prefix_only(opensearch_url) -> None:
    """The query log's indices, template pattern and `logs prune` follow HYBRIDSEARCH_QUERY_LOG_PREFIX:
    another environment's log on the same node (another prefix, here one that the first starts)
    gets its own template, and keeps its days."""
    import os

    from hybridsearch.config import Settings
    from hybridsearch.engines.opensearch import queries as Q

    marker = f"prune-{uuid.uuid4().hex[:6]}"
    other_prefix = f"{QUERY_LOG_PREFIX}staging-"  # its indices match the first log's pattern too
    sink = OpenSearchSink(opensearch_url, get_settings())
    other = OpenSearchSink(opensearch_url, Settings(query_log_prefix=other_prefix))
    old = {"@timestamp": "2020-01-02T03:04:05.000Z", "query": marker, "index": marker}
    try:
        sink.write([old])
        other.write([old])
        mine, theirs = f"{QUERY_LOG_PREFIX}2020.01.02", f"{other_prefix}2020.01.02"
        assert sink.client.indices.exists(index=mine) and sink.client.indices.exists(index=theirs)
        for prefix in (QUERY_LOG_PREFIX, other_prefix):  # each log's template covers its own indices
            (tpl,) = sink.client.indices.get_index_template(name=Q.query_log_name(prefix))["index_templates"]
            assert tpl["index_template"]["index_patterns"] == [f"{prefix}*"]
        # the narrower pattern decides: the staging log's indices are made from its own template
        overlapping = sink.client.indices.simulate_index_template(name=theirs).get("overlapping", [])
        assert [o["name"] for o in overlapping] == [Q.query_log_name(QUERY_LOG_PREFIX)]  # matched, not applied
        refused = subprocess.run([EXE, "logs", "prune", "--older-than", "30d", "--url", opensearch_url],
                                 capture_output=True, text=True, input="")
        assert refused.returncode == 2 and "refused without --yes" in refused.stderr
        out = subprocess.run([EXE, "logs", "prune", "--older-than", "30d", "--url", opensearch_url, "--yes", "--json"],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        deleted = json.loads(out.stdout)["deleted"]
        assert mine in deleted and all(name.startswith(QUERY_LOG_PREFIX) for name in deleted)
        assert not sink.client.indices.exists(index=mine) and sink.client.indices.exists(index=theirs)
        env = {**os.environ, "HYBRIDSEARCH_QUERY_LOG_PREFIX": other_prefix}
        out = subprocess.run([EXE, "logs", "prune", "--older-than", "30d", "--url", opensearch_url, "--yes", "--json"],
                             capture_output=True, text=True, env=env)
        assert out.returncode == 0 and json.loads(out.stdout)["deleted"] == [theirs], out.stderr
    finally:
        sink.client.indices.delete(index=f"{other_prefix}*", params={"ignore_unavailable": "true"})
        sink.client.indices.delete_index_template(name=Q.query_log_name(other_prefix), ignore=404)
        sink.close()
        other.close()


def test_a_forked_child_logs_through_connections_of_its_own(opensearch_url) -> None:
    """A forked child (a multiprocessing pool's worker) never writes through the parent's pooled
    sockets, which both would then read answers from: its sink makes a client of its own. The
    child's record and the parent's next one both arrive."""
    import os

    marker = f"fork-{uuid.uuid4().hex[:6]}"
    sink = OpenSearchSink(opensearch_url, get_settings())
    rec = {"@timestamp": "2026-01-02T03:04:05.000Z", "index": marker}
    sink.write([{**rec, "query": "parent before"}])
    parent_client = sink.client
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if it wrote through a client of its own
        try:
            sink.write([{**rec, "query": "child"}])
            os._exit(0 if sink.client is not parent_client else 3)
        except BaseException:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    sink.write([{**rec, "query": "parent after"}])
    assert sink.client is parent_client
    day = f"{QUERY_LOG_PREFIX}2026.01.02"
    sink.client.indices.refresh(index=day)
    got = sink.client.search(index=day, body={"query": {"term": {"index": marker}}})
    assert sorted(h["_source"]["query"] for h in got["hits"]["hits"]) == ["child", "parent after", "parent before"]
    sink.client.indices.delete(index=day)
    sink.close()


def test_an_opensearch_index_keeps_the_hdc_ties_it_was_encoded_with(opensearch_index) -> None:
    """A new index records content ties in its metadata; one whose metadata predates the choice
    (no `ties`) is read with the fixed tie vector its codes were encoded with."""
    from hybridsearch.engines.opensearch import OpenSearchEngine

    engine = opensearch_index
    engine.ensure_index()
    assert engine.hdc_encoder().ties == "content"
    concrete = f"{engine.index}-v1"
    meta = engine.client.indices.get_mapping(index=concrete)[concrete]["mappings"]["_meta"]
    assert meta["hybridsearch"]["hdc"] == {"ngrams": False, "ties": "content"}
    meta["hybridsearch"]["hdc"] = {"ngrams": False}  # as an index made before stored it
    engine.client.indices.put_mapping(index=concrete, body={"_meta": meta})
    again = OpenSearchEngine(engine.raw_url, index=engine.index)
    assert again.hdc_encoder().ties == "fixed"
    again.close()


def test_the_http_service_logs_mode_and_the_effective_k(opensearch_index, tmp_path) -> None:
    """`hybridsearch serve` on OpenSearch logs each request's mode, mapped as an aggregatable keyword,
    and the k it searched for: the request's, else the profile's max_results."""
    import os
    import signal
    import socket

    import httpx

    from indexer.pipeline import ingest

    engine = opensearch_index
    ingest(engine, DEMO, encoder=None, progress=False)
    keys = tmp_path / "keys.json"
    added = subprocess.run([EXE, "keys", "add", "analyst", "--file", str(keys)], capture_output=True, text=True)
    assert added.returncode == 0, added.stderr
    key = added.stdout.strip().splitlines()[-1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([EXE, "serve", "--url", engine.raw_url, "--index", engine.index, "--keys", str(keys),
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HYBRIDSEARCH_QUERY_LOG_DIR": ""})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url)
        auth = {"Authorization": f"Bearer {key}"}
        for body in ({"query": "Banach fixed point", "profile": "lexical", "mode": "survey"},
                     {"query": "Banach fixed point", "profile": "lexical", "mode": "lookup", "k": 3}):
            r = httpx.post(url + "/retrieve", json=body, headers=auth, timeout=60)
            assert r.status_code == 200, r.text
    finally:
        proc.send_signal(signal.SIGTERM)  # closing the log writes what it holds
        proc.wait(timeout=60)
    client = engine.client
    client.indices.refresh(index=f"{QUERY_LOG_PREFIX}*")
    got = client.search(index=f"{QUERY_LOG_PREFIX}*", body={
        "size": 10, "query": {"term": {"index": engine.index}}, "sort": [{"@timestamp": "asc"}]})["hits"]["hits"]
    assert [(h["_source"]["mode"], h["_source"]["k"]) for h in got] == [("survey", 10), ("lookup", 3)]
    caps = client.field_caps(index=f"{QUERY_LOG_PREFIX}*", fields="mode,k")["fields"]
    assert caps["mode"]["keyword"]["aggregatable"] is True and caps["k"]["integer"]["aggregatable"] is True
    aggs = client.search(index=f"{QUERY_LOG_PREFIX}*", body={
        "size": 0, "query": {"term": {"index": engine.index}}, "aggs": {"mode": {"terms": {"field": "mode"}},
                                                                         "k": {"sum": {"field": "k"}}}})["aggregations"]
    assert {b["key"]: b["doc_count"] for b in aggs["mode"]["buckets"]} == {"survey": 1, "lookup": 1}
    assert aggs["k"]["value"] == 13
