"""Celery tasks: thin wrappers, ids in, indexer/hybridsearch functions out."""

from __future__ import annotations

from pathlib import Path

from hybridsearch.embeddings import default_encoder
from indexer.pipeline import embed_store_ids, encode_hdc_ids
from workers.celery_app import app


@app.task(name="hybridsearch.embed", acks_late=True)
def embed(index_dir: str, ids: list[str]) -> int:
    """Embed the given chunks and append their vectors to the index's journal. The process that
    owns the index applies them to the dense index on its next refresh."""
    return embed_store_ids(Path(index_dir), default_encoder(), ids)


@app.task(name="hybridsearch.hdc_encode", acks_late=True)
def hdc_encode(index_dir: str, ids: list[str]) -> int:
    """HDC-encode the given chunks into the index's journal (the same function ingest runs)."""
    return encode_hdc_ids(Path(index_dir), ids)
