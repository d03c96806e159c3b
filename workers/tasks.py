"""Celery tasks: thin wrappers, ids in, indexer/hybridsearch functions out."""

from __future__ import annotations

from hybridsearch.embeddings import default_encoder
from indexer.pipeline import embed_ids_at, encode_hdc_ids
from workers.celery_app import app


@app.task(name="hybridsearch.embed", acks_late=True)
def embed(target: str, ids: list[str], index: str | None = None) -> int:
    """Embed the given chunks of an index (a directory, or an OpenSearch URL and logical index).
    On a directory the vectors go to the journal and the owning process applies them on its next
    refresh; on OpenSearch they are written through the engine."""
    return embed_ids_at(target, default_encoder(), ids, index=index)


@app.task(name="hybridsearch.hdc_encode", acks_late=True)
def hdc_encode(target: str, ids: list[str], index: str | None = None) -> int:
    """HDC-encode the given chunks of an index, stored as `embed` stores vectors."""
    return encode_hdc_ids(target, ids, index=index)
