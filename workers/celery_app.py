"""The Celery application. Broker and result backend: HYBRIDSEARCH_REDIS_URL (default local Redis)."""

from __future__ import annotations

from celery import Celery

from hybridsearch.config import get_settings


def make_app(url: str | None = None) -> Celery:
    url = url or get_settings().redis_url or "redis://127.0.0.1:6379/0"
    app = Celery("hybridsearch", broker=url, backend=url, include=["workers.tasks"])
    app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"],
                    task_acks_late=True, worker_prefetch_multiplier=1,
                    broker_connection_retry_on_startup=True)
    return app


app = make_app()
