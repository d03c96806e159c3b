"""The embedded engine: SQLite truth, tantivy BM25, faiss dense vectors, all in-process."""

from hybridsearch.engines.embedded.engine import EmbeddedEngine

__all__ = ["EmbeddedEngine"]
