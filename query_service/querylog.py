"""The query log: one record per search, written in the background.

A record holds the time, the query text, profile, engine, index, origin (cli, api, http), the
per-stage latency, hit counts per channel (an escalation's channel, and `citation`: the candidates the
citation expansion scored), the zero-result and out-of-domain flags and the top
ids; never credentials or API keys (a caller's key goes in by name, through `log_extra`). `put`
never blocks and never raises: a full buffer drops the record and counts it, and a failing sink
counts its failures. The first loss of each kind is logged as a warning, and closing a log that
lost records says how many; the HTTP service exports the counts as metrics. A forked child logs
through a writer thread and connections of its own; a multiprocessing child (a pool's worker,
which may be terminated at any moment) writes each record as it comes. On OpenSearch records
go to daily indices `<HYBRIDSEARCH_QUERY_LOG_PREFIX>YYYY.MM.DD`, `hybridsearch-queries-YYYY.MM.DD` by
default (template `opensearch_templates/hybridsearch-queries.json`); on the embedded engine to daily JSONL files
`queries-YYYY-MM-DD.jsonl` with the same fields.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import json
import logging
import os
import queue
import re
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from hybridsearch.config import Settings, get_settings
from hybridsearch.errors import ConfigError
from hybridsearch.models import SearchResult

_log = logging.getLogger("hybridsearch.querylog")
FILE_PREFIX = "queries-"
TOP_IDS = 10


class Sink(Protocol):
    """Where batches of records go; `write` may raise (the log counts the failure)."""

    def write(self, records: Sequence[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


def make_record(query: str, result: SearchResult, *, engine: str, index: str, origin: str,
                extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The log record of one search (the fields the query-log template maps); `k` is the result count
    the search was run for (the caller's, else the profile's), from its diagnostics."""
    diag = result.diagnostics
    stages = diag.get("stages", {})
    reason = str(diag.get("reason", ""))
    hits = dict(stages.get("channels", {}).get("hits", {}))  # per channel; escalation and citation as channels
    if "escalation" in stages:
        hits[stages["escalation"]["channel"]] = stages["escalation"]["hits"]
    if "expand" in stages:
        hits["citation"] = stages["expand"]["cited"]
    return {
        "@timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "query": query, "profile": diag.get("profile"), "engine": engine, "index": index, "origin": origin,
        "k": diag.get("k"), "hits": len(result.hits), "ms": round(float(diag.get("ms", 0.0)), 3),
        "stage_ms": {name: round(float(s["ms"]), 3) for name, s in stages.items() if "ms" in s},
        "channel_hits": hits,
        "zero_result": not result.hits, "out_of_domain": reason.startswith("out of domain"),
        "reason": reason or None, "top_ids": [h.id for h in result.hits[:TOP_IDS]],
        **(extra or {}),
    }


class QueryLog:
    """A bounded buffer drained by one daemon thread that writes batches to a sink. In a
    multiprocessing child (a pool's worker) each record is written as it comes instead: such a
    child may be terminated or leave through os._exit at any moment, past atexit, and a
    buffered record would be lost."""

    def __init__(self, sink: Sink, *, capacity: int = 10_000, batch: int = 500) -> None:
        self.sink = sink
        # told each count as it grows ("written", "dropped" or "failed", and by how many): the HTTP
        # service's metrics, which add up those of all its processes
        self.counted: Callable[[str, int], None] | None = None
        self.batch = batch
        self._closed = False
        self._direct = _in_mp_child()
        self._start(capacity)
        atexit.register(self.close)  # a log never closed still writes what it holds at exit
        _LIVE.add(self)
        self._direct_in_mp_child()

    def _start(self, capacity: int) -> None:
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=capacity)
        self.dropped = self.written = self.failed = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._pending = 0  # accepted and not yet written or failed
        self._idle = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._run, name="query-log", daemon=True)
        if not self._direct:
            self._thread.start()

    def _after_fork(self) -> None:
        """In a forked child the writer thread is gone: start the child's own, with an empty buffer
        (what the parent had queued is the parent's to write) and counts of its own; a
        multiprocessing child, known once it starts (its after-fork hooks), writes directly."""
        if self._closed:
            return
        self._start(self._queue.maxsize)
        self._direct_in_mp_child()

    def _direct_in_mp_child(self) -> None:
        """Write directly once in a multiprocessing child: multiprocessing runs its after-fork
        hooks as a child starts, forked or spawned (a spawned child makes its logs while it
        imports the main module, before it knows it is a child)."""
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None:
            mp_util.register_after_fork(self, QueryLog._write_directly)

    def _write_directly(self) -> None:
        self._direct = True

    def put(self, record: dict[str, Any]) -> bool:
        """Queue a record (or write it, in a multiprocessing child); False (and counted) when the
        buffer is full or the log is closed."""
        with self._lock:
            accepted = not self._closed
            if accepted and not self._direct:
                try:
                    self._queue.put_nowait(record)
                except queue.Full:
                    if not self.dropped:
                        _log.warning("query log: the buffer of %d records is full, so records are dropped (and "
                                     "counted) until the writer catches up", self._queue.maxsize)
                    accepted = False
            if accepted:
                self._pending += 1
            else:
                self.dropped += 1
        if not accepted:
            self._count("dropped", 1)
        elif self._direct:
            self._write([record])
        return accepted

    def _count(self, name: str, n: int) -> None:
        if self.counted is not None:
            self.counted(name, n)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            stop = first is None
            records = [] if first is None else [first]
            while len(records) < self.batch and not stop:
                try:
                    r = self._queue.get(timeout=0.05)
                except queue.Empty:
                    break
                if r is None:
                    stop = True
                else:
                    records.append(r)
            if records:
                self._write(records)
            if stop:
                return

    def _write(self, records: list[dict[str, Any]]) -> None:
        """Write a batch through the sink and count the outcome."""
        try:
            self.sink.write(records)
            ok, error = True, None
        except Exception as e:  # a log that cannot be written must not fail a search
            ok, error = False, f"{type(e).__name__}: {e}".splitlines()[0][:300]
        with self._lock:
            if ok:
                self.written += len(records)
            else:
                if not self.failed:
                    _log.warning("query log: %d records could not be written (%s); later failures are "
                                 "counted, not logged", len(records), error)
                self.failed += len(records)
                self.last_error = error
            self._pending -= len(records)
            self._idle.notify_all()
        self._count("written" if ok else "failed", len(records))

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every accepted record was written (or failed); False on timeout."""
        with self._lock:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"written": self.written, "dropped": self.dropped, "failed": self.failed,
                    "queued": self._pending, "last_error": self.last_error}

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (for at most `timeout` seconds), then stop; later records are
        dropped and counted."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        _LIVE.discard(self)
        if self._thread.is_alive():
            with contextlib.suppress(queue.Full):
                self._queue.put(None, timeout=timeout)
            self._thread.join(timeout)
        self.sink.close()
        s = self.stats()
        if s["dropped"] or s["failed"] or s["queued"]:
            _log.warning("query log closed: %d records written, %d dropped, %d failed, %d not written in time%s",
                         s["written"], s["dropped"], s["failed"], s["queued"],
                         f" (last error: {s['last_error']})" if s["last_error"] else "")


_LIVE: weakref.WeakSet[QueryLog] = weakref.WeakSet()


def _in_mp_child() -> bool:
    """Whether this process is a multiprocessing child (spawned or forked)."""
    mp = sys.modules.get("multiprocessing")
    return mp is not None and mp.parent_process() is not None


def _restart_logs_in_child() -> None:
    for log in list(_LIVE):
        log._after_fork()


os.register_at_fork(after_in_child=_restart_logs_in_child)


class JsonlSink:
    """Daily JSONL files in a directory; each batch is one append (O_APPEND), so several
    processes can log to the same directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def write(self, records: Sequence[dict[str, Any]]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        by_day: dict[str, list[str]] = {}
        for r in records:
            by_day.setdefault(r["@timestamp"][:10], []).append(json.dumps(r, ensure_ascii=False))
        for day, lines in by_day.items():
            fd = os.open(self.directory / f"{FILE_PREFIX}{day}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, ("\n".join(lines) + "\n").encode())
            finally:
                os.close(fd)

    def close(self) -> None:
        pass


class OpenSearchSink:
    """Bulk writes into the daily query-log index; the template is put once, by the writer thread."""

    def __init__(self, url: str, settings: Settings) -> None:
        from hybridsearch.engines.opensearch.engine import make_client

        self._make = lambda: make_client(url, settings)
        self.client, self._pid = self._make(), os.getpid()
        self.prefix = settings.query_log_prefix
        self._template = False

    def write(self, records: Sequence[dict[str, Any]]) -> None:
        import opensearchpy
        from opensearchpy import helpers

        from hybridsearch.engines.opensearch import queries as Q
        from hybridsearch.engines.opensearch.admin import put_template

        if self._pid != os.getpid():  # a forked child: its own connections, never the parent's sockets
            self.client, self._pid = self._make(), os.getpid()
        if not self._template:
            self._template = True
            try:
                put_template(self.client, "index template", *Q.query_log_template(self.prefix))
            except opensearchpy.exceptions.TransportError as e:
                if e.status_code not in (401, 403):  # a user who may only write: `templates apply` puts it
                    self._template = False
                    raise
        actions = [{"_op_type": "create", "_index": index_for(r["@timestamp"], self.prefix), "_source": r}
                   for r in records]
        _, errors = helpers.bulk(self.client, actions, raise_on_error=False, stats_only=False)
        if errors:
            raise RuntimeError(f"{len(errors)} query-log records were rejected: {errors[0]}")

    def close(self) -> None:
        self.client.close()


def index_for(timestamp: str, prefix: str) -> str:
    """The daily query-log index of an ISO timestamp (UTC), for indices named `<prefix>YYYY.MM.DD`."""
    return prefix + timestamp[:10].replace("-", ".")


def open_query_log(engine: Any, settings: Settings | None = None) -> QueryLog | None:
    """The query log for searches on `engine`, or None when HYBRIDSEARCH_QUERY_LOG is off or the
    engine is neither embedded nor OpenSearch (e.g. several knowledge bases at once)."""
    s = settings or get_settings()
    if not s.query_log:
        return None
    kind = engine_fields(engine)["engine"]
    sink: Sink
    if s.query_log_dir is not None:
        sink = JsonlSink(s.query_log_dir)
    elif kind == "opensearch":
        sink = OpenSearchSink(engine.raw_url, s)
    elif kind == "embedded":
        sink = JsonlSink(engine.path / "querylog")
    else:
        return None
    return QueryLog(sink, capacity=s.query_log_buffer, batch=s.query_log_batch)


def engine_fields(engine: Any) -> dict[str, str]:
    """The engine and index a record names."""
    if hasattr(engine, "write_alias") and hasattr(engine, "raw_url"):
        return {"engine": "opensearch", "index": str(engine.index)}
    if isinstance(getattr(engine, "path", None), Path):
        return {"engine": "embedded", "index": str(engine.path.resolve())}
    return {"engine": type(engine).__name__, "index": ""}


# -- pruning ----------------------------------------------------------------------------------
_AGE = re.compile(r"^(\d+)([dh])$")


MAX_AGE_DAYS = 36_500  # a hundred years: an older cutoff would fall before the calendar's start


def parse_age(text: str) -> dt.timedelta:
    """`30d` or `12h`."""
    m = _AGE.match(text.strip())
    if not m or int(m[1]) < 1:
        raise ConfigError(f"--older-than: {text!r} is not an age like 30d or 12h")
    n = int(m[1])
    if n > (MAX_AGE_DAYS if m[2] == "d" else MAX_AGE_DAYS * 24):
        raise ConfigError(f"--older-than: {text!r} is more than {MAX_AGE_DAYS} days")
    return dt.timedelta(days=n) if m[2] == "d" else dt.timedelta(hours=n)


def prune_files(directory: Path, older_than: dt.timedelta, now: dt.datetime | None = None) -> list[str]:
    """Delete daily JSONL files whose whole day lies before now - older_than."""
    cutoff = (now or dt.datetime.now(dt.UTC)) - older_than
    out = []
    for f in sorted(Path(directory).glob(f"{FILE_PREFIX}*.jsonl")):
        day = _day(f.stem[len(FILE_PREFIX):], "%Y-%m-%d")
        if day is not None and day + dt.timedelta(days=1) <= cutoff:
            f.unlink()
            out.append(f.name)
    return out


def prune_indices(client: Any, older_than: dt.timedelta, prefix: str, now: dt.datetime | None = None) -> list[str]:
    """Delete the daily query-log indices `<prefix>YYYY.MM.DD` whose whole day lies before now - older_than."""
    cutoff = (now or dt.datetime.now(dt.UTC)) - older_than
    names = sorted(client.indices.get(index=f"{prefix}*", params={"expand_wildcards": "all"}))
    doomed = []
    for name in names:
        day = _day(name[len(prefix):], "%Y.%m.%d")
        if day is not None and day + dt.timedelta(days=1) <= cutoff:
            doomed.append(name)
    _delete_indices(client, doomed)
    return doomed


def delete_log(client: Any, prefix: str) -> None:
    """Delete the query log `<prefix>*` whole: its daily indices, its index template and its ISM
    policy (what a test session or a benchmark leaves that logged under a prefix of its own)."""
    from hybridsearch.engines.opensearch import queries as Q

    _delete_indices(client, sorted(client.indices.get(index=f"{prefix}*", params={"expand_wildcards": "all"})))
    client.indices.delete_index_template(name=Q.query_log_name(prefix), ignore=404)
    client.transport.perform_request("DELETE", f"/_plugins/_ism/policies/{Q.query_log_policy(prefix)[0]}",
                                     params={"ignore": [400, 404]})  # 400: no index-management plugin


def _delete_indices(client: Any, names: list[str]) -> None:
    for i in range(0, len(names), 50):  # a request line holds some 50 names comfortably
        client.indices.delete(index=",".join(names[i:i + 50]))


def _day(text: str, fmt: str) -> dt.datetime | None:
    try:
        return dt.datetime.strptime(text, fmt).replace(tzinfo=dt.UTC)
    except ValueError:
        return None
