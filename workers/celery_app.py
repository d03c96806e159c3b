"""The Celery application. Broker and result backend: HYBRIDSEARCH_REDIS_URL (default local Redis).

Queues `embed`, `hdc` and `graph`. Tasks are acknowledged after they ran (`acks_late`) and are
given back to the queue when the worker process running them dies (`task_reject_on_worker_lost`);
Redis redelivers a task whose worker vanished after `HYBRIDSEARCH_WORKER_VISIBILITY_TIMEOUT`
seconds, which must exceed the longest batch. Transient errors (the engine or the broker
unreachable) are retried with exponential backoff and jitter; validation errors are not.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from celery import Celery
from kombu import Queue

from hybridsearch.config import Settings, get_settings
from hybridsearch.errors import ConfigError, EngineUnavailableError

QUEUES = ("embed", "hdc", "graph")
DEFAULT_URL = "redis://127.0.0.1:6379/0"


def redis_url(settings: Settings | None = None) -> str:
    """The broker URL from the settings, checked for form (one clear error otherwise)."""
    import redis

    url = (settings or get_settings()).redis_url or DEFAULT_URL
    shown = url.rpartition("@")[2]  # never the password
    try:
        redis.ConnectionPool.from_url(url)
    except ValueError as e:
        raise ConfigError(f"HYBRIDSEARCH_REDIS_URL: {shown!r} is not a Redis URL ({e})") from e
    parts = urlsplit(url)
    db = parts.path.strip("/")  # redis-py lets a database that is not a number through; the broker would not
    if parts.scheme in ("redis", "rediss") and db and not db.isdigit():
        raise ConfigError(f"HYBRIDSEARCH_REDIS_URL: {shown!r} names database {db!r}; a database is a number "
                          "(redis://host:6379/0)")
    return url


def check_broker(url: str, timeout: float = 3.0) -> None:
    """Raise EngineUnavailableError (one line) unless Redis at `url` answers PING within `timeout`."""
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
        client.ping()
        client.close()
    except redis.RedisError as e:
        shown = url.split("@")[-1]
        raise EngineUnavailableError(f"the Celery broker at {shown} does not answer: {e}".splitlines()[0]) from e


def make_app(url: str | None = None, settings: Settings | None = None) -> Celery:
    s = settings or get_settings()
    url = url or redis_url(s)
    app = Celery("hybridsearch", broker=url, backend=url, include=["workers.tasks"])
    vt = s.worker_visibility_timeout
    # kombu sweeps for tasks whose worker vanished every interval x throttle seconds (10 x 10 by
    # default) under a lock that a worker killed mid-sweep holds for 300 s: scan every
    # min(10, timeout / 2) s instead, and let a dead sweeper's lock lapse after 30 s (a sweep
    # takes milliseconds), so redelivery follows the visibility timeout closely
    transport = {"visibility_timeout": vt, "unacked_restore_interval": max(1, min(10, vt // 2)),
                 "unacked_restore_throttle": 1, "unacked_mutex_expire": 30}
    app.conf.update(
        task_serializer="json", result_serializer="json", accept_content=["json"],
        task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1,
        task_queues=[Queue(q) for q in QUEUES], task_default_queue="embed",
        task_routes={"hybridsearch.embed": {"queue": "embed"}, "hybridsearch.hdc_encode": {"queue": "hdc"},
                     "hybridsearch.graph": {"queue": "graph"}},
        broker_transport_options=transport, task_ignore_result=True,
        broker_connection_retry_on_startup=True, result_expires=s.worker_task_expires,
        # a retry sent while Redis restarts waits for it (about 40 s) instead of failing the task
        task_publish_retry_policy={"max_retries": 10, "interval_start": 0.5, "interval_step": 1.0,
                                   "interval_max": 5.0})
    return app


app = make_app()
