"""The HTTP query service: RFC-0003 §11's `POST /retrieve`, with health, readiness, profiles,
Prometheus metrics and the OpenAPI document, behind API keys (`Authorization: Bearer KEY`).

Status codes: 401 missing, unknown or revoked key; 403 an index the key may not read; 404 an
index this service does not serve, or an unknown path; 405 a wrong method; 413 a body over
HYBRIDSEARCH_HTTP_MAX_BODY; 422 bad input (a JSON problem naming the field); 429 over the key's
rate (with Retry-After); 503 not ready. A search runs in a worker thread, never on the event
loop; the model is loaded once per process, before the service says it is ready.
"""

from __future__ import annotations

import gc
import json
import math
import os
import socket
import sqlite3
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, field_validator
from starlette.exceptions import HTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from hybridsearch import plugins
from hybridsearch.config import Settings, get_settings
from hybridsearch.errors import ConfigError, EngineUnavailableError, HybridSearchError, IndexNotFoundError
from hybridsearch.models import DateRange, Filters, error_message
from query_service.evidence import EvidenceConfig, pack
from query_service.keys import RIGHTS, ApiKey, KeyStore

Mode = Literal["lookup", "survey", "compare", "prereq", "related"]


# -- the contract -------------------------------------------------------------------------------
class RequestFilters(BaseModel):
    model_config = ConfigDict(extra="forbid")
    date_range: DateRange | None = None
    subjects: list[str] | None = Field(default=None, max_length=100)
    sources: list[str] | None = Field(default=None, max_length=100)


def _override(value: Any) -> Any:
    """An override's value as JSON gives it: a finite number, true or false, a string, or an object of
    finite numbers (`fuser.weights`); the profile then checks it against the parameter's type."""
    def number(x: Any) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)

    if isinstance(value, bool | str) or number(value):
        return value
    if isinstance(value, dict) and all(isinstance(k, str) and number(x) for k, x in value.items()):
        return value
    raise ValueError("a finite number, true or false, a string, or an object of finite numbers (fuser.weights); "
                     f"got {json.dumps(value)[:80]}")


class RetrieveRequest(BaseModel):
    """What to retrieve. `overrides` are profile parameters (`max_results`, `min_score`, `gap`,
    `<channel>.k`, `fuser.<param>`), as `--set` takes them."""

    model_config = ConfigDict(extra="forbid")
    query: str = Field(min_length=1)
    filters: RequestFilters | None = None
    mode: Mode | None = None
    profile: str = Field(default="hybrid", min_length=1, max_length=200)
    index: str | None = Field(default=None, description="the served index (default: the only one)")
    k: StrictInt | None = Field(default=None, ge=1, le=10_000)  # never true, "5" or 1e3
    overrides: dict[str, Annotated[Any, AfterValidator(_override)]] = Field(default_factory=dict, max_length=50)

    @field_validator("query")
    @classmethod
    def _query(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("query text is empty")
        return v


class ChannelView(BaseModel):
    raw: float
    normalized: float | None
    rank: int


class Candidate(BaseModel):
    id: str
    channels: dict[str, ChannelView]


class RankedHit(BaseModel):
    rank: int
    id: str
    score: float
    contributions: dict[str, float]
    components: dict[str, float] = Field(default_factory=dict, description="the reranker's features, each in "
                                         "[0, 1]; contributions are these times their weights")
    via: str = Field(default="", description="the chain of facts by which symbolic expansion reached it")
    title: str | None = None
    work_id: str | None = None


class RetrieveResponse(BaseModel):
    query: str
    index: str
    candidates: list[Candidate]
    reranked: list[RankedHit]
    evidence_pack: dict[str, Any] | None
    diagnostics: dict[str, Any]


class NoDelayH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with Nagle's algorithm off on every connection. Several worker
    processes listen on a socket that uvicorn makes without naming TCP, so asyncio leaves Nagle
    on for the connections it accepts: a response's second write then waits for the client's
    delayed ACK, about 40 ms on every request (`serve --workers 2`: 48 ms for a 2 ms search)."""

    def connection_made(self, transport: Any) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)


# -- state ----------------------------------------------------------------------------------------
class RateLimits:
    """Token buckets, one per key name, in a SQLite file that every worker process of one service
    shares, so that a key's rate holds for the service, not once per process (`--workers N`)."""

    def __init__(self, path: Path) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=OFF")  # buckets need not outlive the service
        self._conn.execute("CREATE TABLE IF NOT EXISTS buckets(name TEXT PRIMARY KEY, tokens REAL NOT NULL,"
                           " at REAL NOT NULL)")
        self._lock = threading.Lock()

    def close(self) -> None:
        self._conn.close()

    def take(self, name: str, rate: float, burst: int) -> float:
        """0 when `name` may send a request now (one token taken), else seconds until it may. The
        bucket refills at `rate` tokens a second up to `burst`; the monotonic clock is the
        system's, one for every process."""
        from hybridsearch.engines.embedded.store import write_transaction

        with write_transaction(self._conn, self._lock) as c:
            now = time.monotonic()
            row = c.execute("SELECT tokens, at FROM buckets WHERE name=?", (name,)).fetchone()
            tokens = float(burst) if row is None else min(float(burst), row[0] + max(0.0, now - row[1]) * rate)
            wait = 0.0 if tokens >= 1 else (1 - tokens) / rate
            c.execute("INSERT OR REPLACE INTO buckets VALUES (?,?,?)", (name, tokens - 1 if not wait else tokens, now))
        return wait


@dataclass
class ServiceState:
    """One process's service: the engine, the searcher, the keys and the metrics."""

    target: str
    index: str
    options: dict[str, str]
    keys: KeyStore
    settings: Settings
    rates: RateLimits
    ready: bool = False
    engine: Any = None
    searcher: Any = None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter("hybridsearch_requests", "HTTP requests", ["endpoint", "status"], registry=r)
        self.zero = Counter("hybridsearch_zero_results", "retrievals with no result", registry=r)
        self.ood = Counter("hybridsearch_out_of_domain", "retrievals rejected as out of domain", registry=r)
        self.degraded = Counter("hybridsearch_degraded", "retrievals that fell back (a stage degraded)", registry=r)
        self.stage = Histogram("hybridsearch_stage_seconds", "latency per search stage", ["stage"], registry=r,
                               buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5))
        self.query_log = {name: Counter(f"hybridsearch_query_log_{name}", f"query-log records {what}", registry=r)
                          for name, what in (("written", "written"),
                                             ("dropped", "dropped because the buffer was full"),
                                             ("failed", "that the sink failed to write"))}
        self.latency = Histogram("hybridsearch_request_seconds", "latency of POST /retrieve", registry=r,
                                 buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))

    def allow(self, key: ApiKey) -> float:
        """0 when the key may send a request now (one token taken), else seconds until it may."""
        return self.rates.take(key.name, self.settings.http_rate_limit, self.settings.http_rate_burst)


def problem(status: int, title: str, detail: str, **extra: Any) -> JSONResponse:
    """An RFC 9457 problem document."""
    return JSONResponse({"type": "about:blank", "title": title, "status": status, "detail": detail, **extra},
                        status_code=status, media_type="application/problem+json")


class Refused(Exception):  # noqa: N818 - a response, not a failure
    def __init__(self, response: JSONResponse) -> None:
        self.response = response


class _BodyLimit:
    """Refuses a body over `http_max_body` with 413 (a body without a length, chunked, is counted
    as it arrives and never read past the limit) and counts every response by path and status.
    Plain ASGI: Starlette's BaseHTTPMiddleware costs about a millisecond a request."""

    def __init__(self, app: Any, state: ServiceState, routes: set[str]) -> None:
        self.app, self.state, self.routes = app, state, routes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def counted(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        limit = self.state.settings.http_max_body
        size = dict(scope["headers"]).get(b"content-length")
        fits = size is None or (size.isdigit() and int(size) <= limit)
        if fits and size is None and scope["method"] not in ("GET", "HEAD", "OPTIONS"):
            chunks, total, more = [], 0, True
            while more:
                message = await receive()
                if message["type"] != "http.request":  # the client went away
                    return
                chunks.append(message.get("body", b""))
                total += len(chunks[-1])
                if total > limit:
                    fits = False
                    break
                more = message.get("more_body", False)
            if fits:
                receive = _replay(b"".join(chunks), receive)
        if fits:
            await self.app(scope, receive, counted)
        else:
            await problem(413, "Payload Too Large", f"the body may be at most {limit} bytes")(scope, receive, counted)
        # any other path counts as one endpoint: a scan of made-up paths must not grow the metrics
        path = scope["path"] if scope["path"] in self.routes else "other"
        self.state.requests.labels(path, str(status[0])).inc()


def _replay(body: bytes, receive: Any) -> Any:
    """An ASGI receive that gives `body` whole once, then what `receive` gives (a disconnect)."""
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}
    return replay


# -- the app ---------------------------------------------------------------------------------------
def create_app(target: str, *, index: str, keys_file: Path, options: dict[str, str] | None = None,
               settings: Settings | None = None, rates_file: Path | None = None) -> FastAPI:
    """The service for one index: a directory (embedded engine) or an OpenSearch URL with the
    logical index in `options["index"]`; `index` is the name requests use for it. Worker processes
    of one service share `rates_file` (the keys' rate limits); without it the app keeps its own."""
    own = None
    if rates_file is None:
        own = tempfile.TemporaryDirectory(prefix="hybridsearch-rates-")
        rates_file = Path(own.name) / "rates.sqlite"
    state = ServiceState(target, index, options or {}, KeyStore(keys_file), settings or get_settings(),
                         RateLimits(rates_file))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from starlette.concurrency import run_in_threadpool

        await run_in_threadpool(_open, state)
        try:
            yield
        finally:
            state.ready = False
            if state.searcher is not None:
                state.searcher.close()  # flushes the query log
            if state.engine is not None:
                state.engine.close()
            state.rates.close()
            if own is not None:
                own.cleanup()

    app = FastAPI(title="hybridsearch", version=_version(), lifespan=lifespan,
                  description="Hybrid retrieval (BM25, dense, HDC, citation) with explained scores.")
    app.state.service = state
    routes: set[str] = set()  # the app's paths, filled once they are all declared (below)

    app.add_middleware(_BodyLimit, state=state, routes=routes)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> JSONResponse:
        return exc.response

    @app.exception_handler(HTTPException)
    async def routing(request: Request, exc: HTTPException) -> JSONResponse:  # an unknown path, a wrong method
        if exc.status_code == 400:  # a body the JSON parser gave up on (nested too deep, not UTF-8): bad input
            return problem(422, "Unprocessable Content", f"body: {exc.detail}",
                           errors=[{"field": "body", "message": str(exc.detail)}])
        response = problem(exc.status_code, HTTPStatus(exc.status_code).phrase,
                           f"{request.method} {request.url.path}: {exc.detail}")
        response.headers.update(exc.headers or {})  # 405's Allow
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"field": "body", "message": f"{e['msg']} at character offset {e['loc'][-1]}: {e['ctx']['error']}"}
                  if e["type"] == "json_invalid" else  # its loc ends in the offset, not a field
                  {"field": ".".join(str(p) for p in e["loc"] if p != "body") or "body",
                   "message": error_message(e)}
                  for e in exc.errors()]
        first = errors[0] if errors else {"field": "body", "message": "invalid"}
        return problem(422, "Unprocessable Content", f"{first['field']}: {first['message']}", errors=errors)

    def caller(request: Request) -> ApiKey:
        auth = request.headers.get("authorization", "")
        scheme, _, key = auth.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Refused(problem(401, "Unauthorized", "send `Authorization: Bearer KEY`"))
        try:
            found = state.keys.find(key.strip())
        except ConfigError as e:
            raise Refused(problem(503, "Service Unavailable", str(e))) from e
        if found is None:
            raise Refused(problem(401, "Unauthorized", "unknown or revoked API key"))
        wait = state.allow(found)
        if wait > 0:
            r = problem(429, "Too Many Requests", f"key {found.name!r} is over its rate")
            r.headers["Retry-After"] = str(max(1, math.ceil(wait)))
            raise Refused(r)
        return found

    @app.get("/healthz", summary="liveness")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", summary="readiness: the engine answers and the model is loaded")
    def readyz() -> JSONResponse:
        if not state.ready:
            return problem(503, "Service Unavailable", "starting")
        try:
            state.engine.count()  # the engine answers; the count is not shown (it includes what a caller may not see)
        except HybridSearchError as e:
            return problem(503, "Service Unavailable", str(e))
        return JSONResponse({"status": "ready", "index": state.index})

    @app.get("/profiles", summary="the retrieval profiles")
    def profiles() -> dict[str, Any]:
        from query_service.searcher import get_profile

        out = {}
        for name in plugins.names("profiles"):
            p = get_profile(name)
            out[name] = {"channels": sorted(p.channels), "fuser": p.fuser, "max_results": p.max_results,
                         "reranker": p.reranker}
        return {"profiles": out}

    @app.get("/metrics", summary="Prometheus metrics")
    def metrics() -> Response:
        return Response(generate_latest(_registry(state)), media_type=CONTENT_TYPE_LATEST)

    @app.post("/retrieve", response_model=RetrieveResponse, summary="retrieve, rerank and pack evidence",
              responses={401: {}, 403: {}, 404: {}, 413: {}, 422: {}, 429: {}, 503: {}})
    def retrieve(body: RetrieveRequest, key: ApiKey = Depends(caller)) -> Any:  # noqa: B008
        return _retrieve(state, body, key)

    routes.update(p for r in app.routes if isinstance(p := getattr(r, "path", None), str))
    return app


def _open(state: ServiceState) -> None:
    """Open the engine and the searcher, and load the model (a first query), before ready."""
    from hybridsearch.embeddings import default_encoder
    from hybridsearch.engines import open_engine
    from query_service.querylog import open_query_log
    from query_service.searcher import Searcher

    if "://" not in state.target and not (Path(state.target) / "store.sqlite").is_file():
        raise IndexNotFoundError(f"no index at {state.target}")
    state.engine = open_engine(state.target, **state.options)
    state.engine.count()
    encoder = default_encoder()
    encoder.encode(["warm up"], query=True)  # loads the model (and its query runtime) now, not on the first request
    log = open_query_log(state.engine)
    if log is not None:
        log.counted = lambda name, n: state.query_log[name].inc(n)
    state.searcher = Searcher(state.engine, encoder=encoder, query_log=log, origin="http")
    for rights in (("open",), RIGHTS):  # the domain check's measure for either kind of key, taken now
        state.searcher.measure_domain(rights)
    freeze_loaded()
    state.ready = True


def _registry(state: ServiceState) -> CollectorRegistry:
    """What /metrics reports: with several server processes (PROMETHEUS_MULTIPROC_DIR, set by
    `hybridsearch serve`), the sum over all of them, whichever one answers; else this process's."""
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        return state.registry
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    return registry


def freeze_loaded() -> None:
    """What is loaded by now (the model, the modules: about 480,000 objects) lives as long as the
    service. Frozen, it is left out of the collector's full passes, which otherwise walk all of it:
    about 230 ms each, once in about 100 searches of the hdc profile (CACM on OpenSearch: p99
    250 ms, frozen 23 ms)."""
    gc.collect()
    gc.freeze()


def _retrieve(state: ServiceState, body: RetrieveRequest, key: ApiKey) -> Any:
    if not state.ready:
        raise Refused(problem(503, "Service Unavailable", "starting"))
    index = body.index or state.index
    if index != state.index:
        raise Refused(problem(404, "Not Found", f"this service serves index {state.index!r}, not {index!r}"))
    if not key.may_read(index):
        raise Refused(problem(403, "Forbidden", f"key {key.name!r} may not read index {index!r}"))
    if len(body.query) > state.settings.http_max_query_chars:
        raise Refused(problem(422, "Unprocessable Content",
                              f"query: at most {state.settings.http_max_query_chars} characters",
                              errors=[{"field": "query", "message": "too long"}]))
    if body.profile not in plugins.names("profiles"):  # never a path: the service reads no file it is named
        raise Refused(problem(422, "Unprocessable Content",
                              f"profile: unknown profile {body.profile!r}; GET /profiles lists them",
                              errors=[{"field": "profile", "message": "unknown profile"}]))
    f = body.filters
    start = time.perf_counter()
    try:
        filters = None if f is None else Filters(date_range=f.date_range, subjects=f.subjects, sources=f.sources)
        result = state.searcher.search(body.query, body.profile, k=body.k, filters=filters, with_documents=True,
                                       overrides=body.overrides or None, rights=key.rights, intent=body.mode,
                                       log_extra={"key": key.name, "mode": body.mode})
    except (EngineUnavailableError, IndexNotFoundError) as e:
        raise Refused(problem(503, "Service Unavailable", str(e))) from e
    except HybridSearchError as e:  # a bad profile, override or filter value
        field = getattr(e, "field", None) or "body"
        if body.overrides and field in body.overrides:  # named where it lies in the body
            field = f"overrides.{field}"
        elif f is not None and field in RequestFilters.model_fields:
            field = f"filters.{field}"
        raise Refused(problem(422, "Unprocessable Content", str(e),
                              errors=[{"field": field, "message": str(e)}])) from e
    state.latency.observe(time.perf_counter() - start)
    diag = result.diagnostics
    for stage, info in diag.get("stages", {}).items():
        if isinstance(info, dict) and "ms" in info:
            state.stage.labels(stage).observe(info["ms"] / 1000)
    if not result.hits:
        state.zero.inc()
    if str(diag.get("reason", "")).startswith("out of domain"):
        state.ood.inc()
    if any("degraded" in stage for stage in diag.get("stages", {}).values()):
        state.degraded.inc()
    evidence = result.evidence
    if evidence is None and result.hits:
        docs = {h.id: h.document for h in result.hits if h.document is not None}
        evidence = pack(body.query, [h.id for h in result.hits], [h.score for h in result.hits], docs,
                        EvidenceConfig())
    # plain data, serialised once: what RetrieveResponse documents (a test checks the two agree),
    # without building 200 models per request and validating them again on the way out
    return JSONResponse({
        "query": body.query, "index": index,
        "candidates": [{"id": h.id, "channels": {c: {"raw": s.raw, "normalized": s.normalized, "rank": s.rank}
                                                 for c, s in h.channels.items()}} for h in result.hits],
        "reranked": [{"rank": h.rank, "id": h.id, "score": h.score, "contributions": h.contributions,
                      "components": h.components, "via": h.via,
                      "title": h.document.title if h.document else None,
                      "work_id": h.document.work_id if h.document else None} for h in result.hits],
        "evidence_pack": None if evidence is None else evidence.model_dump(),
        "diagnostics": {**diag, "mode": body.mode, "confidence": _confidence([h.score for h in result.hits])}})


def _confidence(scores: list[float]) -> dict[str, float | None]:
    """How clear the answer is: the top final score, and the margin (s1 - s2) / s1 between the first
    two (None when undefined)."""
    if not scores:
        return {"top_score": None, "margin": None}
    s1 = scores[0]
    margin = (s1 - scores[1]) / s1 if len(scores) > 1 and s1 > 0 else None
    return {"top_score": s1, "margin": margin}


def _version() -> str:
    from hybridsearch import __version__

    return __version__


def app_from_env() -> FastAPI:
    """The app `hybridsearch serve` runs in each uvicorn worker (its spec in HYBRIDSEARCH_SERVE_SPEC)."""
    import json
    import os

    spec = json.loads(os.environ["HYBRIDSEARCH_SERVE_SPEC"])
    return create_app(spec["target"], index=spec["index"], keys_file=Path(spec["keys"]), options=spec["options"],
                      rates_file=Path(spec["rates"]))
