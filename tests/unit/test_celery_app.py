"""The Celery app's delivery guarantees and retry policy, as configured."""

from __future__ import annotations

import pytest

from hybridsearch.errors import ConfigError, EngineUnavailableError, ValidationError


def test_queues_delivery_and_visibility_come_from_settings(monkeypatch) -> None:
    from hybridsearch.config import Settings
    from workers.celery_app import make_app

    app = make_app("redis://127.0.0.1:6379/0", Settings(worker_visibility_timeout=7200, worker_task_expires=600))
    conf = app.conf
    assert sorted(q.name for q in conf.task_queues) == ["embed", "graph", "hdc"]
    assert conf.task_acks_late and conf.task_reject_on_worker_lost and conf.worker_prefetch_multiplier == 1
    assert conf.broker_transport_options["visibility_timeout"] == 7200
    # a vanished worker's tasks are looked for every 10 s, with no throttle and a short sweep lock
    assert conf.broker_transport_options["unacked_restore_interval"] == 10
    assert conf.broker_transport_options["unacked_restore_throttle"] == 1
    assert make_app("redis://127.0.0.1:6379/0", Settings(worker_visibility_timeout=5)).conf.broker_transport_options[
        "unacked_restore_interval"] == 2
    assert conf.result_expires == 600
    assert conf.task_routes["hybridsearch.hdc_encode"] == {"queue": "hdc"}
    assert conf.task_routes["hybridsearch.graph"] == {"queue": "graph"}


def test_tasks_retry_transient_errors_only() -> None:
    from hybridsearch.config import Settings
    from workers.tasks import embed, graph, hdc_encode

    for task in (embed, hdc_encode, graph):
        assert EngineUnavailableError in task.autoretry_for and ConnectionError in task.autoretry_for
        assert set(task.dont_autoretry_for) == {ValidationError, ConfigError}
        assert task.retry_backoff and task.retry_jitter and task.max_retries == Settings().worker_max_retries


def test_a_malformed_broker_url_is_a_config_error() -> None:
    from hybridsearch.config import Settings
    from workers.celery_app import redis_url

    with pytest.raises(ConfigError, match="HYBRIDSEARCH_REDIS_URL: 'x' is not a Redis URL"):
        redis_url(Settings(redis_url="amqp://user:secret@x"))  # the password is never shown
    assert redis_url(Settings(redis_url=None)) == "redis://127.0.0.1:6379/0"


def test_a_broker_url_whose_database_is_not_a_number_is_a_config_error() -> None:
    """redis-py lets `/abc` through (as database 0) where the broker fails with a traceback, after
    the job was recorded: the check refuses it first."""
    from hybridsearch.config import Settings
    from workers.celery_app import redis_url

    for bad, db in (("redis://h:6379/abc", "abc"), ("redis://:secret@h:6379/0/x", "0/x")):
        with pytest.raises(ConfigError, match=f"names database '{db}'; a database is a number") as e:
            redis_url(Settings(redis_url=bad))
        assert "secret" not in str(e.value)
    assert redis_url(Settings(redis_url="redis://h:6379/3")) == "redis://h:6379/3"
    assert redis_url(Settings(redis_url="redis://h:6379")) == "redis://h:6379"
