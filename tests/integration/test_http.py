"""The HTTP query service: real uvicorn (`hybridsearch serve`) on loopback, driven by httpx."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.conftest import wait_ready

EXE = str(Path(sys.executable).with_name("hybridsearch"))
RESTRICTED = [{"id": "secret-brouwer", "title": "Brouwer fixed point theorem, licensed notes",
               "text": "A restricted lecture note on the Brouwer fixed point theorem and retractions.",
               "license": "proprietary"},
              {"id": "unlicensed-brouwer", "title": "Brouwer fixed point theorem without a licence",
               "text": "Every continuous map of the ball has a fixed point; no licence is recorded."}]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _key(keys: Path, name: str, *extra: str) -> str:
    out = subprocess.run([EXE, "keys", "add", name, "--file", str(keys), *extra], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def service(tmp_path_factory, demo_index):
    """`hybridsearch serve` over a copy of the demo index plus two restricted documents."""
    import shutil

    root = tmp_path_factory.mktemp("http")
    idx = root / "papers"
    shutil.copytree(demo_index, idx, ignore=shutil.ignore_patterns("owner.lock"))
    extra = root / "restricted.jsonl"
    extra.write_text("".join(json.dumps(r) + "\n" for r in RESTRICTED))
    env = {**os.environ, "HYBRIDSEARCH_QUERY_LOG_DIR": str(root / "querylog"), "HYBRIDSEARCH_HTTP_RATE_LIMIT": "5",
           "HYBRIDSEARCH_HTTP_RATE_BURST": "40", "HYBRIDSEARCH_HTTP_MAX_QUERY_CHARS": "300"}
    assert subprocess.run([EXE, "ingest", str(extra), "--index-dir", str(idx), "-q"], env=env,
                          capture_output=True).returncode == 0
    keys = root / "keys.json"
    k = {"open": _key(keys, "readers"), "all": _key(keys, "staff", "--rights", "open,restricted"),
         "other": _key(keys, "elsewhere", "--indices", "another-index"), "revoked": _key(keys, "gone")}
    subprocess.run([EXE, "keys", "revoke", "gone", "--file", str(keys)], check=True, capture_output=True)
    port = _port()
    proc = subprocess.Popen([EXE, "serve", "--index-dir", str(idx), "--keys", str(keys), "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url)
    banner = proc.stderr.readline() if proc.stderr else ""
    yield {"url": url, "keys": k, "keys_file": keys, "root": root, "proc": proc, "env": env, "idx": idx,
           "banner": banner}
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _post(svc, key: str | None, body: dict | str, **kw) -> httpx.Response:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    if isinstance(body, str):
        return httpx.post(svc["url"] + "/retrieve", content=body, headers={**headers, "content-type":
                                                                           "application/json"}, timeout=60, **kw)
    return httpx.post(svc["url"] + "/retrieve", json=body, headers=headers, timeout=60, **kw)


@pytest.mark.integration
def test_retrieve_contract(service) -> None:
    r = _post(service, service["keys"]["all"], {"query": "Brouwer fixed point theorem", "k": 5, "mode": "lookup",
                                                "filters": {"subjects": ["topology"]}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert {"candidates", "reranked", "evidence_pack", "diagnostics"} <= set(body)
    assert body["reranked"][0]["id"].startswith("topo-brouwer") and len(body["reranked"]) <= 5
    for hit in body["reranked"]:
        assert sum(hit["contributions"].values()) == pytest.approx(hit["score"], abs=1e-9)
        assert hit["components"] and all(0 <= v <= 1 for v in hit["components"].values())
    assert all(c["channels"] for c in body["candidates"])
    # the request's mode is the search's intent: prereq follows what the seeds cite
    assert body["diagnostics"]["intent"]["name"] == "lookup" and body["diagnostics"]["intent"]["rule"] == "given"
    pre = _post(service, service["keys"]["all"], {"query": "Brouwer fixed point theorem", "k": 5, "mode": "prereq"})
    assert pre.json()["diagnostics"]["stages"]["expand"]["directions"] == ["cites"]
    # kb-thinkingdb's symbolic expansion: a unit it reached carries its chain of facts
    sym = _post(service, service["keys"]["all"], {"query": "prerequisites for Euler's theorem",
                                                  "profile": "kb-thinkingdb"}).json()
    vias = [h["via"] for h in sym["reranked"] if h["via"]]
    assert vias and any("Fermat's little theorem" in v for v in vias), sym["reranked"]
    assert body["evidence_pack"]["items"] and body["diagnostics"]["stages"]["channels"]["hits"]
    assert body["diagnostics"]["mode"] == "lookup" and 0 <= body["diagnostics"]["confidence"]["margin"] <= 1
    # the body is what the OpenAPI document's RetrieveResponse says, field for field
    from query_service.http import Candidate, ChannelView, RankedHit, RetrieveResponse

    RetrieveResponse.model_validate(body, strict=True)
    assert set(body) == set(RetrieveResponse.model_fields)
    assert all(set(h) == set(RankedHit.model_fields) for h in body["reranked"])
    assert all(set(c) == set(Candidate.model_fields) and all(set(v) == set(ChannelView.model_fields)
                                                             for v in c["channels"].values())
               for c in body["candidates"])
    # one server process per usable core by default, each embedding with its share of them
    from hybridsearch.embeddings import usable_cores

    assert f"({usable_cores()} worker(s))" in service["banner"], service["banner"]
    assert httpx.get(service["url"] + "/healthz").json() == {"status": "ok"}
    # no document count: it would include documents no key may see (unauthenticated endpoint)
    assert httpx.get(service["url"] + "/readyz").json() == {"status": "ready", "index": "papers"}
    assert "hybrid" in httpx.get(service["url"] + "/profiles").json()["profiles"]
    assert "/retrieve" in httpx.get(service["url"] + "/openapi.json").json()["paths"]


@pytest.mark.integration
def test_status_codes(service) -> None:
    k = service["keys"]
    cases = [
        (None, {"query": "x"}, 401, "Authorization: Bearer"),
        ("hs_not-a-key", {"query": "x"}, 401, "unknown or revoked"),
        (k["revoked"], {"query": "x"}, 401, "unknown or revoked"),
        (k["other"], {"query": "x"}, 403, "may not read index 'papers'"),
        (k["all"], {"query": "x", "index": "nope"}, 404, "serves index 'papers'"),
        (k["all"], {"query": "x", "k": 0}, 422, "k:"),
        (k["all"], {"query": "x", "filters": {"date_range": {"gte": "19x5"}}}, 422, "YYYY"),
        (k["all"], {"query": "x", "filters": {"date_range": {"gte": "20000"}}}, 422, "year out of range"),
        (k["all"], {"query": "x", "filters": {"date_range": {"gte": "2000", "lte": "1990"}}}, 422,
         "field 'date_range': the range is empty"),
        (k["all"], {"query": "x", "filters": {"subjects": ["topology", " "]}}, 422, "field 'subjects': a blank value"),
        (k["all"], {"query": "x", "profile": "nope"}, 422, "nope"),
        (k["all"], {"query": "x", "profile": "/etc/hostname.yaml"}, 422, "unknown profile '/etc/hostname.yaml'"),
        (k["all"], {"query": "x", "profile": "kb-balanced", "overrides": {"fuser.primary": "nope"}}, 422,
         "field 'fuser.primary': names no channel of this search: nope"),
        (k["all"], {"query": "x", "profile": "kb-balanced", "overrides": {"escalation.after": "nope"}}, 422,
         "field 'escalation.after': names no channel"),
        (k["all"], {"query": "x", "profile": "semantic", "overrides": {"fuser.rrf_k": -1}}, 422,
         "one channel and so no fuser"),
        (k["all"], {"query": "x", "profile": "lexical", "overrides": {"bm25.k1": 1e308}}, 422, "overflow"),
        # in `hybrid` the rescored BM25 scores were NaN, dropped without a word with the best hits
        (k["all"], {"query": "Brouwer fixed point theorem", "overrides": {"bm25.k1": 1e308}}, 422, "overflow"),
        (k["all"], {"query": "x", "profile": "kb-balanced", "overrides": {
            "fuser.primary_weight": 1e308, "fuser.secondary_weight": 1e308}}, 422, "more than a float holds"),
        (k["all"], {"query": "x", "profile": "kb-balanced", "overrides": {
            "fuser.primary_weight": 0, "fuser.secondary_weight": 0}}, 422, "both 0"),
        (k["all"], {"query": "x", "profile": "khive", "overrides": {"fuser.rrf_k": 1e30}}, 422, "fuser.rrf_k"),
        (k["all"], {"query": "x", "k": True}, 422, "k: Input should be a valid integer"),
        (k["all"], {"query": "x", "k": "5"}, 422, "k: Input should be a valid integer"),
        (k["all"], {"query": "x", "overrides": {"min_score": True}}, 422,
         "field 'min_score': Input should be a valid number"),
        (k["all"], {"query": "x", "overrides": {"max_results": "3"}}, 422, "field 'max_results'"),
        (k["all"], {"query": "x", "overrides": {"bm25.k": None}}, 422, "overrides.bm25.k: a finite number"),
        (k["all"], {"query": "   "}, 422, "query: query text is empty"),
        (k["all"], {"query": "x", "filters": {"date_range": {"gte": "20x0"}}}, 422, "YYYY"),
        (k["all"], {"query": "x", "unknown": 1}, 422, "unknown"),
        (k["all"], {"query": "q" * 301}, 422, "query"),
        (k["all"], "{not json", 422, "body: JSON decode error at character offset 1"),
        (k["all"], '{"query": ' + "[" * 5000 + "]" * 5000 + "}", 422, "body: There was an error parsing the body"),
        (k["all"], {"query": "x" * 70_000}, 413, "at most"),
    ]
    for key, body, status, text in cases:
        r = _post(service, key, body)
        assert r.status_code == status, (body if isinstance(body, str) else list(body), r.status_code, r.text)
        assert r.headers["content-type"].startswith("application/problem+json") and text in r.text, r.text
    # a bad filter and a bad override are named where they lie in the body
    r = _post(service, k["all"], {"query": "x", "filters": {"date_range": {"gte": "2000", "lte": "1990"}}})
    assert r.json()["errors"][0]["field"] == "filters.date_range", r.text
    r = _post(service, k["all"], {"query": "x", "overrides": {"bm25.k": None}})
    assert [e["field"] for e in r.json()["errors"]] == ["overrides.bm25.k"], r.text
    # fuser.weights, an object, is an override a request can give
    r = _post(service, k["all"], {"query": "Brouwer fixed point theorem", "k": 3,
                                  "overrides": {"fuser.weights": {"bm25": 1, "dense": 0}}})
    assert r.status_code == 200, r.text
    channels = [set(c["channels"]) for c in r.json()["candidates"]]
    assert channels and not any("dense" in c for c in channels) and any("bm25" in c for c in channels), channels
    for param, value in (("min_score", 1.5), ("bm25.k", 0)):
        r = _post(service, k["all"], {"query": "x", "profile": "kb-balanced", "overrides": {param: value}})
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == f"overrides.{param}", r.text
    # a body without a length (chunked) is counted as it arrives: past the limit, 413 before any key
    big = (b"x" * 8192 for _ in range(10))
    r = httpx.post(service["url"] + "/retrieve", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "at most 65536 bytes" in r.text, r.text
    small = (part for part in (b'{"query": ', b'"Brouwer fixed point"}'))
    r = httpx.post(service["url"] + "/retrieve", content=small, headers={
        "content-type": "application/json", "authorization": f"Bearer {k['all']}"})
    assert r.status_code == 200 and r.json()["reranked"], r.text
    # a wrong method or an unknown path is a problem document too; 405 names the allowed method
    r = httpx.get(service["url"] + "/retrieve")
    assert (r.status_code, r.headers["allow"]) == (405, "POST") and r.json()["detail"].startswith("GET /retrieve")
    r = httpx.get(service["url"] + "/nosuch")
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/problem+json"), r.text
    metrics = httpx.get(service["url"] + "/metrics").text
    assert 'endpoint="other",status="404"' in metrics and "/nosuch" not in metrics
    # a key revoked while the service runs is refused at its next request
    key = _key(service["keys_file"], "temp")
    assert _post(service, key, {"query": "compact space", "profile": "lexical"}).status_code == 200
    subprocess.run([EXE, "keys", "revoke", "temp", "--file", str(service["keys_file"])], check=True)
    listed = subprocess.run([EXE, "keys", "list", "--file", str(service["keys_file"]), "--json"],
                            capture_output=True, text=True, check=True).stdout
    assert key not in listed and key not in service["keys_file"].read_text()
    assert {"name": "temp"}.items() <= next(k for k in json.loads(listed) if k["name"] == "temp").items()
    assert _post(service, key, {"query": "compact space", "profile": "lexical"}).status_code == 401
    # over the key's rate (5/s, burst 40): 429 with Retry-After
    key = _key(service["keys_file"], "burst")
    # 200 requests: to stay under the limit they would have to take 160 ms each; a lexical one takes ~6
    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(lambda _: _post(service, key, {"query": "compact", "profile": "lexical"}),
                              range(200)))
    limited = [r for r in codes if r.status_code == 429]
    assert limited and all(int(r.headers["Retry-After"]) >= 1 for r in limited)
    assert {r.status_code for r in codes} <= {200, 429}
    metrics = httpx.get(service["url"] + "/metrics").text
    assert 'hybridsearch_requests_total{endpoint="/retrieve",status="429"}' in metrics
    assert 'hybridsearch_requests_total{endpoint="/retrieve",status="401"}' in metrics
    assert "hybridsearch_stage_seconds_bucket" in metrics


@pytest.mark.integration
def test_licence_rights_fail_closed(service) -> None:
    secret = {r["id"] for r in RESTRICTED}
    for profile in ("hybrid", "lexical", "kb-balanced", "semantic", "kb-thinkingdb"):
        body = {"query": "Brouwer fixed point theorem licensed notes", "k": 20, "profile": profile}
        open_r = _post(service, service["keys"]["open"], body).json()
        seen = ({h["id"] for h in open_r["reranked"]} | {c["id"] for c in open_r["candidates"]}
                | {i["id"] for i in (open_r["evidence_pack"] or {"items": []})["items"]})
        assert not seen & secret, (profile, seen & secret)
        text = json.dumps(open_r)
        assert "restricted lecture note" not in text and "no licence is recorded" not in text
    full = _post(service, service["keys"]["all"], {"query": "Brouwer fixed point theorem licensed notes", "k": 20,
                                                   "profile": "lexical"}).json()
    assert secret <= {h["id"] for h in full["reranked"]}


@pytest.mark.integration
def test_each_request_is_logged_without_its_key(service) -> None:
    marker = f"logged query {time.time_ns()}"
    assert _post(service, service["keys"]["open"], {"query": marker, "profile": "lexical"}).status_code == 200
    logdir = service["root"] / "querylog"
    deadline = time.time() + 20
    while True:
        records = [json.loads(line) for f in logdir.glob("*.jsonl") for line in f.read_text().splitlines()]
        mine = [r for r in records if r["query"] == marker]
        if mine or time.time() > deadline:
            break
        time.sleep(0.5)
    assert len(mine) == 1 and mine[0]["key"] == "readers" and mine[0]["origin"] == "http"
    assert {"ms", "stage_ms", "hits", "zero_result", "out_of_domain", "profile"} <= set(mine[0])
    text = "".join(f.read_text() for f in logdir.glob("*.jsonl"))
    assert not any(key in text for key in service["keys"].values())
    metrics = httpx.get(service["url"] + "/metrics", timeout=10).text
    written = re.search(r"^hybridsearch_query_log_written_total (\S+)$", metrics, re.M)
    assert written and float(written[1]) >= 1
    assert re.search(r"^hybridsearch_query_log_failed_total 0\.0$", metrics, re.M)


@pytest.mark.integration
def test_openapi_fuzzing_finds_no_server_error(service) -> None:
    out = subprocess.run([str(Path(sys.executable).with_name("schemathesis")), "run",
                          service["url"] + "/openapi.json", "--checks", "not_a_server_error",
                          "--max-examples", "25", "-H", f"Authorization: Bearer {service['keys']['all']}",
                          "--seed", "1"], capture_output=True, text=True, timeout=600, cwd=service["root"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


@pytest.mark.integration
def test_sigterm_lets_requests_in_flight_finish(service) -> None:
    """Last in this module: it stops the service. Every request sent before SIGTERM gets its 200."""
    import threading

    proc, key = service["proc"], _key(service["keys_file"], "shutdown", "--rights", "open,restricted")
    n = 12
    barrier = threading.Barrier(n + 1)

    def one(i: int) -> tuple[float, int]:
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {key}"}) as c:
            c.get(service["url"] + "/healthz")  # connected before the signal
            barrier.wait()
            sent = time.monotonic()
            try:
                r = c.post(service["url"] + "/retrieve", json={"query": f"compact Hausdorff space {i}", "k": 200,
                                                               "overrides": {"bm25.k": 2000, "dense.k": 2000}})
                return sent, r.status_code
            except httpx.HTTPError:
                return sent, 0

    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(one, i) for i in range(n)]
        barrier.wait()
        time.sleep(0.2)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        results = [f.result() for f in futures]
    in_flight = [code for sent, code in results if sent < signalled - 0.05]
    assert len(in_flight) >= n // 2 and in_flight == [200] * len(in_flight), results
    # uvicorn ends by re-raising the signal, so a supervisor sees how the process stopped
    assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
    assert proc.stderr is not None and "Traceback" not in proc.stderr.read()


@pytest.mark.integration
def test_a_keys_rate_holds_across_worker_processes(demo_copy, tmp_path) -> None:
    """`serve --workers 2`: the two processes share the keys' token buckets, so a key with a burst
    of 3 (and next to no refill) gets 3 answers in all, not 3 from each process."""
    from concurrent.futures import ThreadPoolExecutor

    keys = tmp_path / "keys.json"
    key = _key(keys, "bursty")
    env = {**os.environ, "HYBRIDSEARCH_HTTP_RATE_LIMIT": "0.001", "HYBRIDSEARCH_HTTP_RATE_BURST": "3",
           "HYBRIDSEARCH_QUERY_LOG": "false"}
    port = _port()
    proc = subprocess.Popen([EXE, "serve", "--index-dir", str(demo_copy), "--keys", str(keys), "--port", str(port),
                             "--workers", "2"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    svc = {"url": f"http://127.0.0.1:{port}"}
    try:
        deadline, ready = time.time() + 240, 0
        while ready < 10:  # both workers ready: ten answers in a row, each on a new connection, say so
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.time() < deadline, "the workers did not become ready"
            try:
                ready = ready + 1 if httpx.get(svc["url"] + "/readyz", timeout=2).status_code == 200 else 0
            except httpx.HTTPError:
                ready = 0
            time.sleep(0.2)
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda _: _post(svc, key, {"query": "compact", "profile": "lexical"}).status_code,
                                  range(40)))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert sorted(codes) == [200] * 3 + [429] * 37, codes


def test_start_up_freezes_what_it_loaded(demo_copy, tmp_path) -> None:
    """The model and the modules outlive every request: once the service is ready, they are out of
    the collector's full passes (a pass over them took about 230 ms), and what a request leaves
    behind is still collected."""
    import gc
    import weakref

    from starlette.testclient import TestClient

    from query_service.http import create_app

    class Left:
        pass

    gc.unfreeze()
    try:
        with TestClient(create_app(str(demo_copy), index="papers", keys_file=tmp_path / "keys.json")) as client:
            assert client.get("/readyz").status_code == 200
            assert gc.get_freeze_count() > 100_000, gc.get_freeze_count()
            cycle = Left()
            cycle.me = cycle  # type: ignore[attr-defined]
            gone = weakref.ref(cycle)
            del cycle
            gc.collect()
            assert gone() is None
    finally:
        gc.unfreeze()


def test_start_up_measures_the_domain_for_either_kind_of_key(demo_copy, tmp_path, monkeypatch) -> None:
    """The domain check's centroid is measured before the service is ready, for keys with and
    without `restricted`, so no request waits for the vector sample (1.7 s on SciFact on OpenSearch)."""
    from starlette.testclient import TestClient

    from hybridsearch.config import get_settings
    from query_service.http import create_app
    from query_service.keys import KeyStore
    from tests.conftest import before_vector_sample

    sampled: list[list[str] | None] = []  # each sample's licence filter
    before_vector_sample(monkeypatch, lambda filters: sampled.append(None if filters is None else filters.license))
    keys = tmp_path / "keys.json"
    key = KeyStore(keys).add("readers", ["open"], None)
    with TestClient(create_app(str(demo_copy), index="papers", keys_file=keys)) as client:
        assert client.get("/readyz").status_code == 200
        assert sorted(sampled, key=str) == sorted([None, sorted(get_settings().open_licenses)], key=str)
        res = client.post("/retrieve", json={"query": "ring sizes for engagement rings"},
                          headers={"Authorization": f"Bearer {key}"})
        assert res.status_code == 200 and not res.json()["reranked"] and not res.json()["candidates"]
        assert "centroid" in res.json()["diagnostics"]["reason"]
        assert len(sampled) == 2  # the request used the measure taken at start-up


@pytest.mark.opensearch
def test_start_up_against_an_index_not_yet_created(opensearch_index, tmp_path, caplog) -> None:
    """A service on an OpenSearch index nobody has ingested into yet comes up (the domain check's
    measure waits for a search that needs it) and answers 503 until the index exists."""
    from starlette.testclient import TestClient

    from query_service.http import create_app
    from query_service.keys import KeyStore

    keys = tmp_path / "keys.json"
    key = KeyStore(keys).add("readers", ["open"], None)
    app = create_app(opensearch_index.url, index="papers", keys_file=keys, options={"index": opensearch_index.index})
    with TestClient(app) as client:
        assert client.get("/readyz").status_code == 200
        res = client.post("/retrieve", json={"query": "compact spaces"}, headers={"Authorization": f"Bearer {key}"})
        assert res.status_code == 503 and res.json()["detail"].endswith("ingest into it first"), res.json()
    assert "domain check: measuring the index failed" in caplog.text
