"""Celery tasks: thin wrappers, ids in, indexer/hybridsearch functions out.

Transient errors (engine or broker unreachable, timeouts) are retried with exponential backoff and
jitter, up to HYBRIDSEARCH_WORKER_MAX_RETRIES; validation and configuration errors are not.
"""

from __future__ import annotations

from typing import Any

from hybridsearch.config import get_settings
from hybridsearch.embeddings import default_encoder
from hybridsearch.errors import ConfigError, EngineUnavailableError, ValidationError
from indexer.pipeline import embed_ids_at, encode_hdc_ids
from workers.celery_app import app

_s = get_settings()
RETRY: dict[str, Any] = {
    "autoretry_for": (EngineUnavailableError, ConnectionError, TimeoutError),
    "dont_autoretry_for": (ValidationError, ConfigError),
    "retry_backoff": True, "retry_backoff_max": _s.worker_retry_backoff_max, "retry_jitter": True,
    "max_retries": _s.worker_max_retries, "acks_late": True,
}


@app.task(name="hybridsearch.embed", **RETRY)
def embed(target: str, ids: list[str], index: str | None = None) -> int:
    """Embed the given chunks of an index (a directory, or an OpenSearch URL and logical index).
    On a directory the vectors go to the journal and the owning process applies them on its next
    refresh; on OpenSearch they are written through the engine."""
    return embed_ids_at(target, default_encoder(), ids, index=index)


@app.task(name="hybridsearch.hdc_encode", **RETRY)
def hdc_encode(target: str, ids: list[str], index: str | None = None) -> int:
    """HDC-encode the given chunks of an index, stored as `embed` stores vectors."""
    return encode_hdc_ids(target, ids, index=index)
