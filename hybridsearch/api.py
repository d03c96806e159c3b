"""The Python facade: `hybridsearch.open(path_or_url)` returns a handle that ingests and searches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hybridsearch.engines import Engine, open_engine
from hybridsearch.models import Filters, SearchResult


class Handle:
    """An open index. Services are imported lazily, inside methods."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._searcher: Any = None

    def search(self, query: str, profile: str = "hybrid", *, k: int | None = None,
               filters: Filters | dict[str, Any] | None = None, with_documents: bool = True,
               **overrides: Any) -> SearchResult:
        """Search with a profile; keyword overrides use dotted names passed as dict keys, e.g.
        `search(q, "kb-balanced", **{"min_score": 0.2, "bm25.tie_breaker": 0.3})`."""
        from query_service.querylog import open_query_log
        from query_service.searcher import Searcher

        if self._searcher is None:
            self._searcher = Searcher(self.engine, query_log=open_query_log(self.engine), origin="api")
        f = Filters.model_validate(filters, strict=False) if isinstance(filters, dict) else filters
        result: SearchResult = self._searcher.search(query, profile, k=k, filters=f,
                                                     with_documents=with_documents, overrides=overrides)
        return result

    def ingest(self, path: str | Path, *, loader: str | None = None, embed: bool = True,
               strict: bool = False, progress: bool = False) -> Any:
        from hybridsearch.embeddings import default_encoder
        from indexer.pipeline import ingest

        return ingest(self.engine, Path(path), loader=loader, strict=strict,
                      encoder=default_encoder() if embed else None, progress=progress)

    def close(self) -> None:
        if self._searcher is not None:
            self._searcher.close()
        self.engine.close()

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open(path_or_url: str | Path, **options: Any) -> Handle:  # noqa: A001 - the public name
    return Handle(open_engine(str(path_or_url), **options))
