"""Backfill jobs: a corpus's embedding or HDC encoding fanned out over Celery batches (or its
citation graph, one batch), with its state in Redis so that any process can follow it, list it and retry what failed.

Keys (`hybridsearch:job:<id>`): a hash with the job's kind, target, index, totals, counters,
status and whether a graph job is forced; `:batches` (batch number -> JSON ids), `:done` (a set of
finished batch numbers) and
`:failed` (batch number -> the error of a dead-lettered batch) and `:deliveries` (how often each
task message was delivered). A batch is recorded once however
often it is delivered (the set decides), and whichever batch finishes the job records its
completion. No credentials are stored: URL targets are kept without them, and workers take
their own from their settings.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import redis

from hybridsearch.errors import ConfigError, EngineUnavailableError, IndexNotFoundError

PREFIX = "hybridsearch:job:"
KINDS = ("embed", "hdc", "graph")


@dataclass
class JobState:
    id: str
    kind: str
    target: str
    index: str | None
    status: str  # running, done, failed (some batches dead-lettered)
    batches: int
    done: int
    failed: int
    docs: int
    docs_done: int
    created: float
    finished: float | None
    force: bool = False  # a graph job that builds even an unchanged graph (kept for `jobs retry`)
    docs_partial: int = 0  # chunks done so far inside batches still running (a progress bar's share)

    @property
    def seconds(self) -> float:
        return (self.finished or time.time()) - self.created

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": round(self.seconds, 3)}


def client(url: str, timeout: float = 10.0) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=timeout, socket_timeout=timeout)


def create(r: redis.Redis, kind: str, target: str, index: str | None, batches: Sequence[Sequence[str]],
           ttl: int, *, force: bool = False) -> str:
    """Record a new job and its batches; returns its id."""
    if kind not in KINDS:
        raise ConfigError(f"job kind {kind!r}; valid: {', '.join(KINDS)}")
    job = f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    key = PREFIX + job
    pipe = r.pipeline()
    pipe.hset(key, mapping={"kind": kind, "target": target, "index": index or "", "status": "running",
                            "batches": len(batches), "docs": sum(len(b) for b in batches), "docs_done": 0,
                            "created": time.time(), "finished": "", "force": int(force)})
    if batches:
        pipe.hset(key + ":batches", mapping={str(i): json.dumps(list(b)) for i, b in enumerate(batches)})
    else:
        pipe.hset(key, mapping={"status": "done", "finished": time.time()})
    for k in (key, key + ":batches"):
        pipe.expire(k, ttl)
    with unavailable():
        pipe.execute()
    return job


# One atomic step per batch outcome: a batch already done stays done (a late dead-letter of it is
# ignored), a batch is counted once however often it is delivered, and the status is worked out
# again every time, so that concurrent batches can never leave a stale one (a job "failed" on a
# dead-lettered batch whose redelivered copy succeeds later becomes "done"). A batch's partial
# progress ends with it. KEYS: job hash, :done, :failed, :partial; ARGV: batch, docs, error ("" when
# done).
_RECORD = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[4], ARGV[1])
local ttl = redis.call('PTTL', KEYS[1])
if ARGV[3] == '' then
  if redis.call('SADD', KEYS[2], ARGV[1]) == 1 then redis.call('HINCRBY', KEYS[1], 'docs_done', ARGV[2]) end
  redis.call('HDEL', KEYS[3], ARGV[1])
elseif redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 0 then
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
end
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl); redis.call('PEXPIRE', KEYS[3], ttl) end
local done, failed = redis.call('SCARD', KEYS[2]), redis.call('HLEN', KEYS[3])
local total = tonumber(redis.call('HGET', KEYS[1], 'batches'))
if done + failed >= total then
  local status = failed == 0 and 'done' or 'failed'
  if redis.call('HGET', KEYS[1], 'status') ~= status then
    redis.call('HSET', KEYS[1], 'status', status, 'finished', ARGV[4])
  end
else
  redis.call('HSET', KEYS[1], 'status', 'running', 'finished', '')
end
return 1
"""


def record(r: redis.Redis, job: str, batch: int, *, docs: int = 0, error: str | None = None) -> None:
    """Record a batch as done (its `docs` counted once) or dead-lettered with `error`, and the
    job's status with it (atomically, in Redis)."""
    key = PREFIX + job
    with unavailable():
        r.eval(_RECORD, 4, key, key + ":done", key + ":failed", key + ":partial", str(batch), str(docs),
               (error or "")[:500], str(time.time()))


def progress(r: redis.Redis, job: str, batch: int, docs: int) -> None:
    """Record how many chunks of a running batch are done so far (shown until the batch ends)."""
    key = PREFIX + job
    with unavailable():
        pipe = r.pipeline()
        pipe.hset(key + ":partial", str(batch), docs)
        pipe.pexpire(key + ":partial", max(int(r.pttl(key)), 1000))
        pipe.execute()


@contextmanager
def unavailable() -> Iterator[None]:
    """Redis errors as one EngineUnavailableError line."""
    try:
        yield
    except redis.RedisError as e:
        raise EngineUnavailableError(f"Redis (the job state) is not reachable: {e}".splitlines()[0]) from e


def state(r: redis.Redis, job: str) -> JobState:
    key = PREFIX + job
    with unavailable():
        h: dict[str, str] = r.hgetall(key)  # type: ignore[assignment]
        done, failed = int(r.scard(key + ":done")), int(r.hlen(key + ":failed"))
        partial = sum(int(v) for v in r.hvals(key + ":partial"))  # type: ignore[union-attr]
    if "kind" not in h:
        raise IndexNotFoundError(f"no job {job!r} (`hybridsearch jobs` lists them)")
    return JobState(job, h["kind"], h["target"], h["index"] or None, h["status"], int(h["batches"]), done, failed,
                    int(h["docs"]), int(h["docs_done"]), float(h["created"]),
                    float(h["finished"]) if h["finished"] else None, h.get("force") == "1", partial)


def failures(r: redis.Redis, job: str) -> dict[int, str]:
    with unavailable():
        got: dict[str, str] = r.hgetall(PREFIX + job + ":failed")  # type: ignore[assignment]
    return {int(k): v for k, v in got.items()}


def jobs(r: redis.Redis) -> list[JobState]:
    with unavailable():
        names = {k[len(PREFIX):] for k in r.scan_iter(PREFIX + "*") if k.count(":") == 2}
    out = []
    for n in names:
        try:
            out.append(state(r, n))
        except IndexNotFoundError:  # expired since the scan
            continue
    return sorted(out, key=lambda s: s.created)


def unfinished(r: redis.Redis, job: str) -> dict[int, list[str]]:
    """The batches of a job not recorded done (dead-lettered, expired in the queue, never sent or
    still running), by number, with their ids."""
    key = PREFIX + job
    with unavailable():
        done = {int(b) for b in r.smembers(key + ":done")}  # type: ignore[union-attr]
        raw: dict[str, str] = r.hgetall(key + ":batches")  # type: ignore[assignment]
    if not raw:
        raise IndexNotFoundError(f"the batches of job {job!r} have expired; start the backfill again")
    return {int(n): json.loads(ids) for n, ids in raw.items() if int(n) not in done}


def delivered(r: redis.Redis, job: str, batch: int, retry: int) -> int:
    """Count one more delivery of a batch's task message (its `retry`-th send: a retry is a new
    message) and return how many there have been: more than one means the process running an
    earlier one died (or vanished) holding it."""
    key = PREFIX + job + ":deliveries"
    with unavailable():
        pipe = r.pipeline()
        pipe.hincrby(key, f"{batch}:{retry}", 1)
        pipe.pttl(PREFIX + job)
        n, ttl = pipe.execute()
        if ttl > 0:
            r.pexpire(key, ttl)
    return int(n)


def reopen(r: redis.Redis, job: str, batches: Sequence[int]) -> None:
    """Clear the dead-letters and delivery counts of `batches` and mark the job running again,
    before they are resent."""
    key = PREFIX + job
    with unavailable():
        fields: list[str] = r.hkeys(key + ":deliveries")  # type: ignore[assignment]
        again = set(batches)
        counted = [f for f in fields if int(f.split(":")[0]) in again]
        pipe = r.pipeline()
        if batches:
            pipe.hdel(key + ":failed", *[str(b) for b in batches])
        if counted:
            pipe.hdel(key + ":deliveries", *counted)
        if batches:
            pipe.hdel(key + ":partial", *[str(b) for b in batches])
        pipe.hset(key, mapping={"status": "running", "finished": ""})
        pipe.execute()


def follow(r: redis.Redis, job: str, on_state: Callable[[JobState], None], poll: float = 0.5,
           timeout: float | None = None) -> JobState:
    """Poll a job's state until it is no longer running (or `timeout` seconds pass)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        st = state(r, job)
        on_state(st)
        if st.status != "running" or (deadline is not None and time.monotonic() > deadline):
            return st
        time.sleep(poll)
