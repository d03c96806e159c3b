"""Engine protocol and capabilities; `open_engine` picks an engine plugin for a path or URL."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from hybridsearch.models import Document, Filters, RankedList


@runtime_checkable
class Engine(Protocol):
    capabilities: frozenset[str]

    def write(self, docs: Sequence[Document], vectors: np.ndarray | None = None) -> int: ...
    def delete(self, ids: Sequence[str]) -> list[str]: ...
    def get(self, ids: Sequence[str]) -> dict[str, Document]: ...
    def count(self) -> int: ...
    def close(self) -> None: ...


@runtime_checkable
class LexicalSearch(Protocol):
    def bm25(self, query: str | Sequence[tuple[str, float]], fields: Mapping[str, float] | None = None,
             k: int = 10, filters: Filters | None = None, **options: Any) -> RankedList: ...
    def term_stats(self, terms: Sequence[str]) -> dict[str, Any]: ...


@runtime_checkable
class VectorSearch(Protocol):
    def knn(self, vec: np.ndarray, k: int = 10, filters: Filters | None = None) -> RankedList: ...
    def vector_score(self, vec: np.ndarray, ids: Sequence[str]) -> dict[str, float]: ...


@runtime_checkable
class BinarySearch(Protocol):
    def hamming(self, code: np.ndarray, field: str, k: int = 10, filters: Filters | None = None) -> RankedList: ...
    def hamming_score(self, code: np.ndarray, field: str, ids: Sequence[str]) -> dict[str, float]: ...


def open_engine(path_or_url: str, **options: Any) -> Engine:
    """Open the engine for a directory (embedded) or a URL (the engine registered for its scheme)."""
    from hybridsearch import plugins

    scheme = path_or_url.split("://", 1)[0] if "://" in path_or_url else "embedded"
    name = "opensearch" if scheme in ("http", "https") else scheme
    factory = plugins.load("engines", name)
    engine: Engine = factory(path_or_url, **options)
    return engine
