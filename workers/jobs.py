"""Backfill jobs: a corpus's embedding or HDC encoding fanned out over Celery batches, with its
state in Redis so that any process can follow it, list it and retry what failed.

Keys (`hybridsearch:job:<id>`): a hash with the job's kind, target, index, totals, counters and
status; `:batches` (batch number -> JSON ids), `:done` (a set of finished batch numbers) and
`:failed` (batch number -> the error of a dead-lettered batch). A batch is recorded once however
often it is delivered (the set decides), and whichever batch finishes the job records its
completion. No credentials are stored: URL targets are kept without them, and workers take
their own from their settings.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import redis

from hybridsearch.errors import ConfigError, IndexNotFoundError

PREFIX = "hybridsearch:job:"
KINDS = ("embed", "hdc")


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

    @property
    def seconds(self) -> float:
        return (self.finished or time.time()) - self.created

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": round(self.seconds, 3)}


def client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=3, socket_timeout=10)


def create(r: redis.Redis, kind: str, target: str, index: str | None, batches: Sequence[Sequence[str]],
           ttl: int) -> str:
    """Record a new job and its batches; returns its id."""
    if kind not in KINDS:
        raise ConfigError(f"job kind {kind!r}; valid: {', '.join(KINDS)}")
    job = f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    key = PREFIX + job
    pipe = r.pipeline()
    pipe.hset(key, mapping={"kind": kind, "target": target, "index": index or "", "status": "running",
                            "batches": len(batches), "docs": sum(len(b) for b in batches), "docs_done": 0,
                            "finished_batches": 0, "created": time.time(), "finished": ""})
    if batches:
        pipe.hset(key + ":batches", mapping={str(i): json.dumps(list(b)) for i, b in enumerate(batches)})
    else:
        pipe.hset(key, mapping={"status": "done", "finished": time.time()})
    for k in (key, key + ":batches"):
        pipe.expire(k, ttl)
    pipe.execute()
    return job


def batch_ids(r: redis.Redis, job: str, batch: int) -> list[str]:
    raw = r.hget(PREFIX + job + ":batches", str(batch))
    if raw is None:
        raise IndexNotFoundError(f"no batch {batch} of job {job!r} (expired or never made)")
    ids: list[str] = json.loads(str(raw))
    return ids


def record(r: redis.Redis, job: str, batch: int, *, docs: int = 0, error: str | None = None) -> None:
    """Record a batch as done (its `docs` counted once) or dead-lettered with `error`; the batch
    that finishes the job records its completion."""
    key = PREFIX + job
    if error is None:
        if r.sadd(key + ":done", str(batch)) == 0:
            return  # delivered again after it was recorded
        pipe = r.pipeline()
        pipe.hdel(key + ":failed", str(batch))
        pipe.hincrby(key, "docs_done", docs)
        pipe.expire(key + ":done", int(r.ttl(key) or 86_400))
        pipe.execute()
    else:
        r.hset(key + ":failed", str(batch), error[:500])
        r.expire(key + ":failed", int(r.ttl(key) or 86_400))
    done, failed, total = r.scard(key + ":done"), r.hlen(key + ":failed"), int(str(r.hget(key, "batches") or 0))
    if done + failed >= total:
        r.hset(key, mapping={"status": "done" if failed == 0 else "failed", "finished": time.time()})


def state(r: redis.Redis, job: str) -> JobState:
    key = PREFIX + job
    h: dict[str, str] = r.hgetall(key)  # type: ignore[assignment]
    if not h:
        raise IndexNotFoundError(f"no job {job!r} (`hybridsearch jobs` lists them)")
    return JobState(job, h["kind"], h["target"], h["index"] or None, h["status"], int(h["batches"]),
                    int(r.scard(key + ":done")), int(r.hlen(key + ":failed")), int(h["docs"]), int(h["docs_done"]),
                    float(h["created"]), float(h["finished"]) if h["finished"] else None)


def failures(r: redis.Redis, job: str) -> dict[int, str]:
    got: dict[str, str] = r.hgetall(PREFIX + job + ":failed")  # type: ignore[assignment]
    return {int(k): v for k, v in got.items()}


def jobs(r: redis.Redis) -> list[JobState]:
    names = {k[len(PREFIX):] for k in r.scan_iter(PREFIX + "*") if k.count(":") == 2}
    return sorted((state(r, n) for n in names), key=lambda s: s.created)


def reopen(r: redis.Redis, job: str) -> list[int]:
    """Clear a job's dead-lettered batches for another run; returns their numbers."""
    batches = sorted(failures(r, job))
    if batches:
        r.delete(PREFIX + job + ":failed")
        r.hset(PREFIX + job, mapping={"status": "running", "finished": ""})
    return batches


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
