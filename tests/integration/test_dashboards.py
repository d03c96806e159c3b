"""The Dashboards saved objects: references resolve, every field is mapped and aggregatable, every
visualization's request returns data on a real node with a real corpus and logged workload, and the
import reaches a real HTTP server with the right multipart body and headers."""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from hybridsearch.dashboards import (
    CORPUS_PATTERN,
    _import_request,
    _multipart,
    import_saved_objects,
    load_saved_objects,
    saved_objects,
    saved_objects_path,
    visualization_request,
)
from hybridsearch.engines.opensearch.queries import template
from hybridsearch.errors import EngineError, EngineUnavailableError, ValidationError
from tests.conftest import DEMO, QUERY_LOG_PREFIX

EXE = str(Path(sys.executable).with_name("hybridsearch"))

pytestmark = [pytest.mark.integration, pytest.mark.opensearch]

OBJECTS = load_saved_objects()
BY_ID = {o["id"]: o for o in OBJECTS}
VISUALIZATIONS = [o for o in OBJECTS if o["type"] == "visualization"]
QUERY_LOG_TITLE = f"{QUERY_LOG_PREFIX}*"  # the session's query log (tests/conftest.py)
QUERY_LOG_PATTERN = "hybridsearch-queries-pattern"
AGGREGATABLE = {"keyword", "integer", "long", "float", "double", "date", "boolean"}
NUMERIC = {"integer", "long", "float", "double"}
KUERY_FIELD = re.compile(r"([\w@.-]+):")


def _state(vis: Mapping[str, Any]) -> dict[str, Any]:
    return dict(json.loads(vis["attributes"]["visState"]))


def _search_source(obj: Mapping[str, Any]) -> dict[str, Any]:
    return dict(json.loads(obj["attributes"]["kibanaSavedObjectMeta"]["searchSourceJSON"]))


def _pattern_of(vis: Mapping[str, Any], by_id: Mapping[str, dict[str, Any]] = BY_ID) -> dict[str, Any]:
    ref_name = _search_source(vis)["indexRefName"]
    (ref,) = [r for r in vis["references"] if r["name"] == ref_name]
    return by_id[ref["id"]]


def _mappings() -> dict[str, dict[str, Any]]:
    """Index-pattern id -> the properties of the mappings its indices get."""
    return {QUERY_LOG_PATTERN: template("hybridsearch-queries")["template"]["mappings"]["properties"],
            CORPUS_PATTERN: template("hybridsearch-chunks")["template"]["mappings"]["properties"]}


def _uploaded(body: bytes) -> dict[str, dict[str, Any]]:
    """The saved objects of an import request's multipart body, by id."""
    part = body.split(b"\r\n\r\n", 1)[1].rsplit(b"\r\n--", 1)[0]
    return {o["id"]: o for o in map(json.loads, part.decode().splitlines())}


def _field_type(properties: Mapping[str, Any], dotted: str) -> str | None:
    """The mapped type of a field path, through object properties and multi-fields (`query.text`)."""
    node: Mapping[str, Any] = {"properties": properties}
    for part in dotted.split("."):
        if part in node.get("properties", {}):
            node = node["properties"][part]
        elif part in node.get("fields", {}):
            node = node["fields"][part]
        else:
            return None
    return str(node.get("type", "object"))


def _fields(vis: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(agg type or 'query', field) for every field the visualization names, queries included."""
    out = []
    queries = [_search_source(vis).get("query", {}).get("query", "")]
    for agg in _state(vis)["aggs"]:
        if "field" in agg["params"]:
            out.append((agg["type"], agg["params"]["field"]))
        queries += [f["input"]["query"] for f in agg["params"].get("filters", [])]
    out += [("query", f) for q in queries for f in KUERY_FIELD.findall(q)]
    return out


# -- the file ----------------------------------------------------------------------------------
def test_the_file_is_packaged_next_to_the_templates() -> None:
    assert saved_objects_path().name == "hybridsearch.ndjson"
    assert {o["type"] for o in OBJECTS} == {"index-pattern", "visualization", "dashboard"}
    patterns = {o["id"]: o["attributes"] for o in OBJECTS if o["type"] == "index-pattern"}
    assert patterns[QUERY_LOG_PATTERN]["timeFieldName"] == "@timestamp"
    assert "timeFieldName" not in patterns[CORPUS_PATTERN]


def test_ids_are_unique_and_every_reference_resolves() -> None:
    ids = [o["id"] for o in OBJECTS]
    assert len(ids) == len(set(ids))
    for obj in OBJECTS:
        names = [r["name"] for r in obj["references"]]
        assert len(names) == len(set(names)), obj["id"]
        for ref in obj["references"]:
            assert ref["id"] in BY_ID, f"{obj['id']} -> {ref['id']}"
            assert BY_ID[ref["id"]]["type"] == ref["type"], f"{obj['id']} -> {ref['id']}"
    for vis in VISUALIZATIONS:
        assert _pattern_of(vis)["type"] == "index-pattern"
        assert _state(vis)["title"] == vis["attributes"]["title"]
    (dashboard,) = [o for o in OBJECTS if o["type"] == "dashboard"]
    assert dashboard["attributes"]["title"] == "hybridsearch: queries and corpus"
    panels = json.loads(dashboard["attributes"]["panelsJSON"])
    assert sorted(p["panelRefName"] for p in panels) == sorted(r["name"] for r in dashboard["references"])
    assert {r["id"] for r in dashboard["references"]} == {v["id"] for v in VISUALIZATIONS}
    assert all(r["type"] == "visualization" for r in dashboard["references"])
    assert len({p["panelIndex"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:  # on the 48-column grid, no two panels overlap
        g = p["gridData"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 48 and g["i"] == p["panelIndex"]
        cell = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & cell, p
        cells |= cell


def test_every_field_is_mapped_and_aggregatable() -> None:
    mappings = _mappings()
    seen = set()
    for vis in VISUALIZATIONS:
        props = mappings[_pattern_of(vis)["id"]]
        for kind, field in _fields(vis):
            mapped = _field_type(props, field)
            where = f"{vis['id']}: {kind} on {field!r} (mapped as {mapped})"
            assert mapped in AGGREGATABLE, where
            if kind in ("sum", "avg", "max", "percentiles", "histogram"):
                assert mapped in NUMERIC, where
            if kind == "date_histogram":
                assert mapped == "date", where
            seen.add(field)
    assert {"channel_hits.bm25", "channel_hits.dense", "channel_hits.hdc", "channel_hits.citation", "subjects",
            "year", "work_id", "ms", "profile", "zero_result", "out_of_domain", "query", "@timestamp"} <= seen
    # the resolver itself: text and disabled objects are not aggregatable
    assert _field_type(mappings[QUERY_LOG_PATTERN], "query.text") == "text"
    assert _field_type(mappings[CORPUS_PATTERN], "metadata") == "object"
    assert _field_type(mappings[CORPUS_PATTERN], "no.such") is None


def test_channel_hit_counts_shows_every_channel_a_search_logs() -> None:
    """"Channel hit counts" sums every channel_hits.* field the query-log mapping declares and every
    channel a search can log: each registered channel plugin, and citation (what the citation
    expansion scored)."""
    from hybridsearch import plugins

    shown = [a["params"]["field"] for a in _state(BY_ID["hybridsearch-channel-hits"])["aggs"] if a["type"] == "sum"]
    mapped = _mappings()[QUERY_LOG_PATTERN]["channel_hits"]["properties"]
    logged = {*plugins.names("channels"), "citation"}
    assert "tfidf-multisignal" in logged and len(shown) == len(set(shown))
    assert set(shown) == {f"channel_hits.{c}" for c in {*mapped, *logged}}


def test_a_broken_line_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.ndjson"
    bad.write_text('{"type": "index-pattern", "id": "a", "attributes": {}}\n\n{"type": "visualization"}\n')
    with pytest.raises(ValidationError, match=r"bad.ndjson:3, field 'id'"):
        load_saved_objects(bad)
    bad.write_text("{not json\n")
    with pytest.raises(ValidationError, match=r"bad.ndjson:1: not JSON"):
        load_saved_objects(bad)


# -- requests as data ------------------------------------------------------------------------
def test_the_latency_request_nests_metrics_in_the_profile_buckets() -> None:
    body = visualization_request(BY_ID["hybridsearch-latency-table"])
    assert body == {"size": 0, "track_total_hits": True, "query": {"match_all": {}}, "aggs": {"2": {
        "terms": {"field": "profile", "size": 20, "order": {"_count": "desc"}},
        "aggs": {"3": {"avg": {"field": "ms"}}, "4": {"percentiles": {"field": "ms", "percents": [95]}},
                 "5": {"max": {"field": "ms"}}}}}}
    zero = visualization_request(BY_ID["hybridsearch-top-zero-result-queries"])
    assert zero["query"] == {"query_string": {"query": "zero_result:true"}}
    assert visualization_request(BY_ID["hybridsearch-queries-over-time"])["aggs"]["2"]["date_histogram"][
        "calendar_interval"] == "1h"


def test_an_unsupported_agg_names_the_visualization_and_agg() -> None:
    vis = json.loads(json.dumps(BY_ID["hybridsearch-zero-result-rate"]))
    state = _state(vis)
    state["aggs"][0] = {"id": "1", "enabled": True, "type": "top_hits", "schema": "metric",
                        "params": {"field": "query"}}
    vis["attributes"]["visState"] = json.dumps(state)
    with pytest.raises(ValueError, match=r"'Zero-result rate': agg 1 \(top_hits\) is not supported"):
        visualization_request(vis)
    state["aggs"][0] = {"id": "1", "enabled": True, "type": "count", "schema": "metric", "params": {}}
    state["aggs"][1]["params"]["otherBucket"] = True
    vis["attributes"]["visState"] = json.dumps(state)
    with pytest.raises(ValueError, match=r"agg 2 \(terms\): other/missing buckets"):
        visualization_request(vis)


# -- every visualization on a real node ------------------------------------------------------
WORKLOAD = [
    ("Heine-Borel theorem statement", "hybrid"), ("fundamental group of the circle", "hybrid"),
    ("best pizza recipe near me", "hybrid"), ("cheap flights to paris this weekend", "hybrid"),
    ("Gauss Bonnet total curvature", "lexical"), ("compactness", "lexical"), ("zzzzqx wvvvq", "lexical"),
    ("qqxxj vvbbn", "lexical"), ("every continuous self-map of a closed disk has a fixed point", "semantic"),
    ("non-orientable surface", "semantic"), ("simplicial homology versus singular homology", "semantic"),
    ("compactness", "kb-balanced"), ("Riemannian curvature", "kb-balanced"), ("prime numbers", "kb-balanced"),
    ("de Rham cohomology", "hdc"), ("connected spaces", "hdc"), ("Euler characteristic", "hybrid"),
    ("best pizza recipe near me", "kb-balanced"), ("path connected", "lexical"), ("open sets", "semantic"),
    ("compact metric spaces", "khive"),
]


@pytest.fixture(scope="module")
def workload(opensearch_url: str, encoder: Any, demo_index: Path) -> Iterator[tuple[Any, str]]:
    """The demo corpus in a fresh logical index (with the session's demo vectors, not embedded again)
    and a logged workload of searches on it; yields (client, logical index name). Removes the corpus
    afterwards (and the session its query log)."""
    from hybridsearch.config import get_settings
    from hybridsearch.engines.embedded import EmbeddedEngine
    from hybridsearch.engines.opensearch import OpenSearchEngine
    from query_service.parity import copy_corpus
    from query_service.querylog import OpenSearchSink, QueryLog
    from query_service.searcher import Searcher

    engine = OpenSearchEngine(opensearch_url, index=f"dash-{uuid.uuid4().hex[:8]}")
    client = engine.client
    try:
        with EmbeddedEngine(demo_index) as source:
            copy_corpus(DEMO, source, engine, log=lambda m: None)
        log = QueryLog(OpenSearchSink(opensearch_url, get_settings()))
        searcher = Searcher(engine, encoder=encoder, query_log=log, origin="api")
        reasons = [searcher.search(q, p).diagnostics.get("reason", "") for q, p in WORKLOAD]
        searcher.close()
        assert log.stats()["written"] == len(WORKLOAD) and log.stats()["failed"] == 0, log.stats()
        assert any(str(r).startswith("out of domain") for r in reasons), reasons
        client.indices.refresh(index=QUERY_LOG_TITLE)
        client.indices.refresh(index=engine.index)
        yield client, engine.index
    finally:
        engine.drop()
        engine.close()


def _check_levels(vis_id: str, aggs: Mapping[str, Any], bucket_ids: list[str], metric_ids: list[str]) -> None:
    """Every bucket agg has a bucket with documents at its level; the innermost non-empty buckets have
    a value for every metric."""
    levels = [aggs]
    for bid in bucket_ids:
        found: list[dict[str, Any]] = []
        for level in levels:
            raw = level[bid]["buckets"]
            found += list(raw.values()) if isinstance(raw, dict) else raw
        levels = [b for b in found if b["doc_count"] > 0]
        assert levels, f"{vis_id}: agg {bid} has no bucket with documents"
    for mid in metric_ids:
        values = [level[mid].get("value", level[mid].get("values")) for level in levels]
        assert any(v is not None and v != {} for v in values), f"{vis_id}: metric {mid} has no value"
        if isinstance(values[0], dict):
            assert any(x is not None for v in values for x in v.values()), f"{vis_id}: metric {mid} is null"


@pytest.mark.slow
@pytest.mark.parametrize("vis_id", [v["id"] for v in VISUALIZATIONS])
def test_every_visualization_returns_data(workload: tuple[Any, str], vis_id: str) -> None:
    client, logical = workload
    imported = {o["id"]: o for o in saved_objects(logical, QUERY_LOG_PREFIX)}  # as the import sends them
    vis = imported[vis_id]
    body = visualization_request(vis)
    pattern = _pattern_of(vis, imported)
    if pattern["id"] == QUERY_LOG_PATTERN:
        body["query"] = {"bool": {"must": [body["query"]], "filter": [{"term": {"index": logical}}]}}
    resp = client.search(index=pattern["attributes"]["title"], body=body)
    assert resp["hits"]["total"]["value"] > 0, vis_id
    aggs = [a for a in _state(vis)["aggs"] if a.get("enabled", True)]
    buckets = [a["id"] for a in aggs if a["type"] in ("terms", "date_histogram", "histogram", "filters")]
    metrics = [a["id"] for a in aggs if a["type"] in ("sum", "avg", "max", "cardinality", "percentiles")]
    _check_levels(vis_id, resp.get("aggregations", {}), buckets, metrics)
    if vis_id == "hybridsearch-top-zero-result-queries":
        keys = {b["key"] for b in resp["aggregations"]["2"]["buckets"]}
        assert "best pizza recipe near me" in keys and "zzzzqx wvvvq" in keys
    if vis_id == "hybridsearch-channel-hits":  # every channel the workload ran has hits
        assert all(resp["aggregations"][m]["value"] > 0 for m in metrics), resp["aggregations"]
    if vis_id == "hybridsearch-out-of-domain-rate":
        got = {k: b["doc_count"] for k, b in resp["aggregations"]["2"]["buckets"].items()}
        assert got["out of domain"] >= 1 and got["out of domain"] + got["in domain"] == len(WORKLOAD)


def test_the_corpus_panels_count_works_not_chunks(opensearch_index: Any, tmp_path: Path) -> None:
    """"Works by subject" and "Works by year" count distinct work_id values (a keyword, so
    aggregatable): on a corpus whose long works are split into several chunks, each bar is the
    number of works, not of chunks."""
    from indexer.pipeline import ingest

    words = " ".join(f"w{i}" for i in range(700))  # about three 300-word windows
    works = [{"id": "long-topology", "title": "A long topology survey", "text": words, "subjects": ["topology"],
              "year": 2020},
             {"id": "short-both", "title": "Compact operators", "text": "Short.", "subjects": ["topology", "analysis"],
              "year": 2020},
             {"id": "long-analysis", "title": "A long analysis survey", "text": words[:2500], "subjects": ["analysis"],
              "year": 2021}]
    corpus = tmp_path / "works.jsonl"
    corpus.write_text("".join(json.dumps(w) + "\n" for w in works))
    engine = opensearch_index
    ingest(engine, corpus, encoder=None, progress=False)
    engine.client.indices.refresh(index=engine.index)
    assert engine.count() > len(works)  # several chunks per long work
    imported = {o["id"]: o for o in saved_objects(engine.index, QUERY_LOG_PREFIX)}
    want = {"hybridsearch-documents-by-subject": {"topology": 2, "analysis": 2},
            "hybridsearch-documents-by-year": {2020.0: 2, 2021.0: 1}}
    for vis_id, counts in want.items():
        vis = imported[vis_id]
        state = _state(vis)
        assert vis["attributes"]["title"].startswith("Works by ")
        assert state["aggs"][0] == {"id": "1", "enabled": True, "type": "cardinality", "schema": "metric",
                                    "params": {"field": "work_id", "customLabel": "Works"}}
        assert state["params"]["valueAxes"][0]["title"] == {"text": "Works"}
        resp = engine.client.search(index=_pattern_of(vis, imported)["attributes"]["title"],
                                    body=visualization_request(vis))
        got = {b["key"]: b["1"]["value"] for b in resp["aggregations"]["2"]["buckets"]}
        assert got == counts, vis_id
        chunks = {b["key"]: b["doc_count"] for b in resp["aggregations"]["2"]["buckets"]}
        assert sum(chunks.values()) > sum(counts.values()), chunks


# -- import ------------------------------------------------------------------------------------
def test_the_multipart_body_carries_the_ndjson() -> None:
    data = saved_objects_path().read_bytes()
    content_type, body = _multipart(data)
    boundary = content_type.split("boundary=")[1]
    assert content_type.startswith("multipart/form-data; ")
    assert body.startswith(f"--{boundary}\r\n".encode()) and body.endswith(f"\r\n--{boundary}--\r\n".encode())
    assert b'Content-Disposition: form-data; name="file"; filename="hybridsearch.ndjson"' in body
    assert b"\r\n\r\n" + data + b"\r\n--" + boundary.encode() in body
    req = _import_request("http://admin:s3cret@dash.example:5601/", data, username=None, password=None,
                          overwrite=True)
    assert req.full_url == "http://dash.example:5601/api/saved_objects/_import?overwrite=true"
    assert req.get_method() == "POST" and req.get_header("Osd-xsrf") == "true"
    assert req.get_header("Authorization") == "Basic YWRtaW46czNjcmV0"
    sent_boundary = str(req.get_header("Content-type")).split("multipart/form-data; boundary=")[1]
    assert isinstance(req.data, bytes) and data in req.data and req.data.endswith(f"--{sent_boundary}--\r\n".encode())
    assert _import_request("http://d:5601", data, username=None, password=None, overwrite=False).full_url == (
        "http://d:5601/api/saved_objects/_import")


def test_import_against_nothing_listening_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(EngineUnavailableError) as e:
        import_saved_objects("http://127.0.0.1:1")
    assert "does not answer" in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "bad.pem").write_text("not a certificate")
    for ca, why in ((tmp_path / "missing.pem", "No such file"), (tmp_path / "bad.pem", "NO_CERTIFICATE")):
        out = subprocess.run([EXE, "dashboards", "import", "--url", "https://127.0.0.1:1"], capture_output=True,
                             text=True, timeout=60, env={**os.environ, "HYBRIDSEARCH_OPENSEARCH_CA_CERTS": str(ca)})
        assert out.returncode == 2
        assert out.stderr.startswith(f"error: HYBRIDSEARCH_OPENSEARCH_CA_CERTS: cannot load {ca}")
        assert why in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([EXE, "dashboards", "import", "--url", "http://admin:pw@[::1"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and out.stderr == "error: url: 'http://[::1' is not an OpenSearch Dashboards URL " \
        "(expected http(s)://host[:port])\n"


class _Dashboards(http.server.BaseHTTPRequestHandler):
    """A stand-in for Dashboards' import endpoint: records the request, answers what the test set."""

    answer: tuple[int, bytes] = (200, b"{}")
    location: str | None = None  # a Location header to answer with
    seen: list[tuple[str, dict[str, str], bytes]] = []
    gets: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append((self.path, dict(self.headers), body))
        code, payload = type(self).answer
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if type(self).location:
            self.send_header("Location", type(self).location)
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).gets.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake_dashboards() -> Iterator[str]:
    _Dashboards.seen, _Dashboards.gets, _Dashboards.location = [], [], None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Dashboards)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_import_posts_the_file_and_maps_answers(fake_dashboards: str) -> None:
    n = len(OBJECTS)
    _Dashboards.answer = (200, json.dumps({"success": True, "successCount": n}).encode())
    assert import_saved_objects(fake_dashboards, username="u", password="p") == {"success": True, "successCount": n}
    path, headers, body = _Dashboards.seen[-1]
    assert path == "/api/saved_objects/_import?overwrite=true"
    assert {k.lower(): v for k, v in headers.items()}["osd-xsrf"] == "true"
    assert _uploaded(body) == {o["id"]: o for o in saved_objects("hybridsearch", QUERY_LOG_PREFIX)}

    _Dashboards.answer = (200, json.dumps({"success": False, "successCount": 0, "errors": [
        {"id": "hybridsearch-dashboard", "type": "dashboard",
         "error": {"type": "missing_references", "references": [{"type": "visualization", "id": "x"}]}}]}).encode())
    with pytest.raises(EngineError, match=r"dashboard/hybridsearch-dashboard: missing_references visualization/x"):
        import_saved_objects(fake_dashboards)

    # the command never prints the password in the URL
    _Dashboards.answer = (200, json.dumps({"success": True, "successCount": n}).encode())
    out = subprocess.run([EXE, "dashboards", "import", "--url", fake_dashboards.replace("//", "//admin:S3cretPw@")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and f"saved objects into {fake_dashboards}" in out.stdout, out.stderr
    assert "S3cretPw" not in out.stdout + out.stderr

    _Dashboards.answer = (400, b'{"statusCode":400,"error":"Bad Request","message":"Invalid file extension .txt"}')
    with pytest.raises(EngineError, match=r"HTTP 400: Invalid file extension .txt") as e:
        import_saved_objects(fake_dashboards)
    assert not isinstance(e.value, EngineUnavailableError)


def test_credentials_in_the_url_win_over_the_settings(fake_dashboards: str) -> None:
    """The Authorization Dashboards receives: the URL's user and password where it has them, else
    HYBRIDSEARCH_OPENSEARCH_USERNAME / _PASSWORD (OpenSearch's, which Dashboards may not share)."""
    import base64

    _Dashboards.answer = (200, json.dumps({"success": True, "successCount": len(OBJECTS)}).encode())
    env = {**os.environ, "HYBRIDSEARCH_OPENSEARCH_USERNAME": "os-user", "HYBRIDSEARCH_OPENSEARCH_PASSWORD": "os-pw"}
    for url, who in ((fake_dashboards.replace("//", "//dash-user:dash%40pw@"), "dash-user:dash@pw"),
                     (fake_dashboards, "os-user:os-pw")):
        out = subprocess.run([EXE, "dashboards", "import", "--url", url], capture_output=True, text=True, timeout=60,
                             env=env)
        assert out.returncode == 0, out.stderr
        headers = {k.lower(): v for k, v in _Dashboards.seen[-1][1].items()}
        assert headers["authorization"] == "Basic " + base64.b64encode(who.encode()).decode()


def test_tenant_goes_in_the_securitytenant_header(fake_dashboards: str) -> None:
    """`--tenant` names the security plugin's tenant the objects go to; without it no tenant is
    named (the user's default); a blank name is one error line."""
    _Dashboards.answer = (200, json.dumps({"success": True, "successCount": len(OBJECTS)}).encode())
    for args, sent in ((["--tenant", "global"], "global"), (["--tenant", "analysts"], "analysts"), ([], None)):
        out = subprocess.run([EXE, "dashboards", "import", "--url", fake_dashboards, *args], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert {k.lower(): v for k, v in _Dashboards.seen[-1][1].items()}.get("securitytenant") == sent
    seen = len(_Dashboards.seen)
    for bad, option in ((["--tenant", " "], "--tenant: ' ' is not a tenant name"),
                        (["--tenant", "团队"], "--tenant: '团队' is not a tenant name this import can send"),
                        (["--corpus-index", ""], "--corpus-index: '' is not a valid logical index name")):
        out = subprocess.run([EXE, "dashboards", "import", "--url", fake_dashboards, *bad], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 2 and out.stderr.startswith(f"error: {option}") and "Traceback" not in out.stderr, (
            out.stderr)
    # a bad default names where it came from, not an option that was not given
    out = subprocess.run([EXE, "dashboards", "import", "--url", fake_dashboards], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "HYBRIDSEARCH_OPENSEARCH_INDEX": "Papers"})
    assert out.returncode == 2
    assert out.stderr.startswith("error: HYBRIDSEARCH_OPENSEARCH_INDEX: 'Papers' is not a valid"), out.stderr
    assert len(_Dashboards.seen) == seen  # nothing sent


def test_import_names_the_corpus_index_and_query_log_it_is_given(fake_dashboards: str) -> None:
    """The corpus index pattern the user gets names `--corpus-index`, by default the settings'
    logical index, and the query-log one HYBRIDSEARCH_QUERY_LOG_PREFIX's indices; every
    visualization still reaches them by id."""
    _Dashboards.answer = (200, json.dumps({"success": True, "successCount": len(OBJECTS)}).encode())
    env = {k: v for k, v in os.environ.items() if k != "HYBRIDSEARCH_OPENSEARCH_INDEX"}
    for args, extra, corpus, log in (
            (["--corpus-index", "papers"], {}, "papers", QUERY_LOG_TITLE),
            ([], {"HYBRIDSEARCH_OPENSEARCH_INDEX": "theses"}, "theses", QUERY_LOG_TITLE),
            ([], {"HYBRIDSEARCH_QUERY_LOG_PREFIX": "staging-queries-"}, "hybridsearch", "staging-queries-*")):
        out = subprocess.run([EXE, "dashboards", "import", "--url", fake_dashboards, *args], capture_output=True,
                             text=True, timeout=60, env={**env, **extra})
        assert out.returncode == 0, out.stderr
        got = _uploaded(_Dashboards.seen[-1][2])
        assert got[CORPUS_PATTERN]["attributes"] == {"title": corpus}
        assert got[QUERY_LOG_PATTERN]["attributes"] == {"title": log, "timeFieldName": "@timestamp"}
        corpus_panels = [v for v in got.values() if v["type"] == "visualization" and _pattern_of(v, got)["id"]
                         == CORPUS_PATTERN]
        assert {v["id"] for v in corpus_panels} == {"hybridsearch-documents-by-subject",
                                                    "hybridsearch-documents-by-year"}
    seen = len(_Dashboards.seen)
    out = subprocess.run([EXE, "dashboards", "import", "--url", fake_dashboards, "--corpus-index", "Papers"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.startswith("error: --corpus-index: 'Papers' is not a valid logical "
                                                         "index name") and out.stderr.count("\n") == 1
    assert len(_Dashboards.seen) == seen  # refused before anything was sent


def test_a_401_without_credentials_says_how_to_give_them(fake_dashboards: str) -> None:
    _Dashboards.answer = (401, b'{"statusCode":401,"error":"Unauthorized","message":"Authentication required"}')
    with pytest.raises(EngineError) as e:
        import_saved_objects(fake_dashboards)
    assert str(e.value).endswith("HTTP 401: Authentication required; set HYBRIDSEARCH_OPENSEARCH_USERNAME and "
                                 "HYBRIDSEARCH_OPENSEARCH_PASSWORD, or put them in the URL "
                                 "(http://USER:PASSWORD@host:5601)")
    with pytest.raises(EngineError) as e:  # credentials were sent: they were wrong, no hint about setting them
        import_saved_objects(fake_dashboards, username="u", password="wrong")
    assert str(e.value).endswith("HTTP 401: Authentication required")


def test_a_redirect_is_reported_not_followed(fake_dashboards: str) -> None:
    """Dashboards' security plugin sends a browser to its login page: the import names where, in one
    line, and never follows the POST with a GET."""
    _Dashboards.answer, _Dashboards.location = (302, b""), "/app/login?nextUrl=%2Fapi%2Fsaved_objects"
    with pytest.raises(EngineError) as e:
        import_saved_objects(fake_dashboards)
    assert "answered the import with HTTP 302, a redirect to /app/login (a login page" in str(e.value)
    assert "\n" not in str(e.value)
    assert len(_Dashboards.seen) == 1 and _Dashboards.gets == []


def test_per_object_import_errors_carry_the_server_message(fake_dashboards: str) -> None:
    _Dashboards.answer = (200, json.dumps({"success": False, "successCount": 0, "errors": [
        {"id": "hybridsearch-zero-result-rate", "type": "visualization", "title": "Zero-result rate",
         "error": {"type": "unknown", "message": "Unable to parse visState", "statusCode": 400}}]}).encode())
    with pytest.raises(EngineError, match=r"visualization/hybridsearch-zero-result-rate: unknown "
                                          r"\(Unable to parse visState\)$"):
        import_saved_objects(fake_dashboards)


def test_the_opensearch_url_given_for_dashboards_says_so(opensearch_url: str) -> None:
    """The real node answers the import path with 400, no handler: the line says to give Dashboards'."""
    out = subprocess.run([EXE, "dashboards", "import", "--url", opensearch_url], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "HTTP 400: no handler found for uri [/api/saved_objects/_import" in out.stderr
    assert out.stderr.endswith("this looks like OpenSearch, not OpenSearch Dashboards: give the Dashboards URL "
                               "(port 5601 by default)\n")
