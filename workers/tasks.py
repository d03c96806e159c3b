"""Celery tasks: thin wrappers, ids in, indexer/hybridsearch functions out.

Transient errors (engine or broker unreachable, timeouts) are retried with exponential backoff and
jitter, up to HYBRIDSEARCH_WORKER_MAX_RETRIES; validation and configuration errors are not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
from celery import Task, group, signals
from celery.exceptions import Reject, Retry
from kombu.exceptions import OperationalError

from hybridsearch.config import get_settings
from hybridsearch.embeddings import default_encoder
from hybridsearch.errors import ConfigError, EngineUnavailableError, HybridSearchError, ValidationError
from indexer.pipeline import embed_ids_at, encode_hdc_ids, graph_at
from workers import jobs
from workers.celery_app import app, redis_url

log = logging.getLogger("hybridsearch.workers")

_s = get_settings()
RETRY: dict[str, Any] = {
    "autoretry_for": (EngineUnavailableError, ConnectionError, TimeoutError, redis.ConnectionError,
                      redis.TimeoutError),
    "dont_autoretry_for": (ValidationError, ConfigError),
    "retry_backoff": True, "retry_backoff_max": _s.worker_retry_backoff_max, "retry_jitter": True,
    "max_retries": _s.worker_max_retries,
}


class JobTask(Task):  # type: ignore[misc]
    """A batch of a job (`job`, `batch` keyword arguments) whose message is acknowledged only once
    its outcome is in the job: done (recorded inside the task), dead-lettered (it failed for good:
    retries exhausted, or an error that is not retried), or sent again as a retry. Where Redis
    cannot be reached to record that, the message goes back to the queue instead of away.

    A batch is dead-lettered too once it was delivered HYBRIDSEARCH_WORKER_MAX_LOST times more
    without an outcome (a batch that kills its process, out of memory say, would otherwise go back
    to the queue and kill the next one forever)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        job, batch = kwargs.get("job"), kwargs.get("batch")
        if job is None or batch is None:
            return super().__call__(*args, **kwargs)
        batch = int(batch)
        with _given_back_if_unrecorded():
            r = jobs.client(redis_url())
            lost = jobs.delivered(r, job, batch, int(self.request.retries or 0)) - 1
            if lost >= get_settings().worker_max_lost:
                jobs.record(r, job, batch, error=f"WorkerLost: the process running this batch died {lost} times "
                            "(out of memory, or killed); it is not delivered again")
                return 0
        try:
            return super().__call__(*args, **kwargs)
        except Retry:
            raise
        except Reject as e:  # the retry could not be sent (Celery would drop the message)
            raise Reject(e.reason, requeue=True) from e
        except Exception as e:
            with _given_back_if_unrecorded():
                jobs.record(r, job, batch, error=f"{type(e).__name__}: {e}".splitlines()[0])
            raise


@contextmanager
def _given_back_if_unrecorded() -> Iterator[None]:
    """Redis unreachable while recording a batch's delivery or outcome: the message is requeued
    (or, with Redis down, stays unacknowledged until the visibility timeout) rather than
    acknowledged with the job never hearing of it. The pause keeps a flapping Redis from turning
    this into a busy loop."""
    try:
        yield
    except EngineUnavailableError as e:
        time.sleep(1.0)
        raise Reject(str(e), requeue=True) from e


@app.task(name="hybridsearch.embed", base=JobTask, **RETRY)
def embed(target: str, ids: list[str], index: str | None = None, job: str | None = None,
          batch: int | None = None) -> int:
    """Embed the given chunks of an index (a directory, or an OpenSearch URL and logical index)
    that still lack a vector. On a directory the vectors go to the journal and the owning process
    applies them on its next refresh; on OpenSearch they are written through the engine."""
    report = _progress(job, batch, len(ids))
    return _recorded(embed_ids_at(target, default_encoder(), ids, index=index, progress=report), len(ids), job, batch)


@app.task(name="hybridsearch.hdc_encode", base=JobTask, **RETRY)
def hdc_encode(target: str, ids: list[str], index: str | None = None, job: str | None = None,
               batch: int | None = None) -> int:
    """HDC-encode the given chunks of an index that still lack codes, stored as `embed` stores
    vectors."""
    return _recorded(encode_hdc_ids(target, ids, index=index), len(ids), job, batch)


@app.task(name="hybridsearch.graph", base=JobTask, **RETRY)
def graph(target: str, index: str | None = None, job: str | None = None, batch: int | None = None,
          force: bool = False) -> int:
    """Build an index's citation graph (neighbour lists and authority) and store it with the
    index, unless it was built from the same input already (and not `force`); returns the works
    in the graph."""
    summary, _ = graph_at(target, index, force=force)
    return _recorded(summary.works, 0, job, batch)


def _progress(job: str | None, batch: int | None, size: int) -> Callable[[float], None] | None:
    """A callback that records a batch's progress in its job at most once a second (a Redis
    error there is logged, not raised: the batch itself goes on)."""
    if job is None or batch is None:
        return None
    last = 0.0

    def report(fraction: float) -> None:
        nonlocal last
        if time.monotonic() - last >= 1.0 and fraction < 1.0:
            last = time.monotonic()
            try:
                jobs.progress(jobs.client(redis_url()), job, batch, int(size * fraction))
            except HybridSearchError as e:
                log.warning("job %s batch %s: progress not recorded (%s)", job, batch, e)

    return report


def _recorded(n: int, size: int, job: str | None, batch: int | None) -> int:
    """Record the batch as done in its job, inside the task: if Redis cannot be reached the task
    fails and is retried (its work is then already done and costs nothing), so a batch is never
    acknowledged without being counted."""
    if job is not None and batch is not None:
        jobs.record(jobs.client(redis_url()), job, batch, docs=size)
    return n


TASKS = {"embed": embed, "hdc": hdc_encode, "graph": graph}


@signals.task_revoked.connect
def _dead_letter_revoked(sender: Any = None, request: Any = None, terminated: bool = False, expired: bool = False,
                         **_: Any) -> None:
    """A batch that expired in the queue (or was revoked) never runs, so no task outcome records it:
    dead-letter it here, in the worker that discarded it, so that its job ends instead of staying
    "running" and `jobs retry` sends it again."""
    kwargs = getattr(request, "kwargs", None) or {}
    if getattr(sender, "name", None) in {t.name for t in TASKS.values()} and kwargs.get("job") is not None:
        why = ("TaskExpired: waited in the queue longer than HYBRIDSEARCH_WORKER_TASK_EXPIRES" if expired
               else "TaskRevoked: terminated while running" if terminated else "TaskRevoked: revoked before it ran")
        jobs.record(jobs.client(redis_url()), kwargs["job"], int(kwargs["batch"]), error=why)


def submit(kind: str, target: str, index: str | None, job: str, batches: dict[int, list[str]],
           force: bool = False) -> None:
    """Send batches of a job as one group of tasks (`force`: a graph job builds even an unchanged
    graph)."""
    expires = get_settings().worker_task_expires
    task = TASKS[kind]
    extra = {"force": True} if force else {}
    try:
        group(task.signature((target, index) if kind == "graph" else (target, ids, index),
                             {"job": job, "batch": n, **extra}, expires=expires)
              for n, ids in batches.items()).apply_async()
    except (OperationalError, redis.RedisError) as e:
        raise EngineUnavailableError(f"could not send the tasks of job {job} to the broker ({e}); "
                                     f"`hybridsearch jobs retry {job}` sends what is missing") from e


def start(kind: str, target: str, index: str | None, ids: list[str], chunk: int, *, force: bool = False) -> str:
    """Record a job over `ids` in batches of `chunk` and send its tasks; returns the job id. A
    graph job is one batch over the whole index (PageRank is global), whatever `ids`; with
    `force` it builds the graph even if the stored one has the same input."""
    r = jobs.client(redis_url())
    batches = [[]] if kind == "graph" else [ids[i:i + chunk] for i in range(0, len(ids), chunk)]
    job = jobs.create(r, kind, target, index, batches, get_settings().worker_job_ttl, force=force)
    submit(kind, target, index, job, dict(enumerate(batches)), force)
    return job


def retry(job: str) -> int:
    """Send every batch of a job that is not recorded done again (dead-lettered, expired in the
    queue, never sent, or lost); safe because a batch does only the work still missing. Returns
    how many."""
    r = jobs.client(redis_url())
    st = jobs.state(r, job)
    batches = jobs.unfinished(r, job)
    if batches:
        jobs.reopen(r, job, list(batches))
        submit(st.kind, st.target, st.index, job, batches, st.force)
    return len(batches)
