"""The Python facade: `hybridsearch.open(path_or_url)` returns a handle that ingests and searches."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hybridsearch.engines import Engine, GraphStore, is_url, open_engine
from hybridsearch.errors import IndexNotFoundError, ValidationError
from hybridsearch.models import Document, Filters, SearchResult, validate_record


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
        f = validate_record(Filters, filters) if isinstance(filters, dict) else filters
        result: SearchResult = self._searcher.search(query, profile, k=k, filters=f,
                                                     with_documents=with_documents, overrides=overrides)
        return result

    def ingest(self, source: str | Path | Iterable[Document | Mapping[str, Any]], *, loader: str | None = None,
               embed: bool = True, strict: bool = False, progress: bool = False) -> Any:
        """Index a corpus: a path (a file or directory a loader reads), or Python objects:
        Documents, or dicts as the lines of a JSONL file (`{"id": ..., "title": ..., "vector":
        [...]}`; a `vector` given is stored as it is, not embedded)."""
        from hybridsearch.embeddings import default_encoder
        from indexer.pipeline import ingest

        data = Path(source) if isinstance(source, str | Path) else source
        return ingest(self.engine, data, loader=loader, strict=strict,
                      encoder=default_encoder() if embed else None, progress=progress)

    def update(self, path: str | Path, *, loader: str | None = None, embed: bool = True, strict: bool = False,
               progress: bool = False) -> Any:
        """Ingest changed works: each replaces its stored version whole (`ingest` does the same)."""
        return self.ingest(path, loader=loader, embed=embed, strict=strict, progress=progress)

    def delete(self, ids: Sequence[str] = (), *, works: Sequence[str] = ()) -> list[str]:
        """Delete chunks by id and every chunk of `works`; returns the ids deleted. Searches in
        every process see it at once; the citation graph is rebuilt."""
        return delete(self.engine, _names(ids, "ids"), _names(works, "works"))[0]

    def close(self) -> None:
        if self._searcher is not None:
            self._searcher.close()
        self.engine.close()

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _names(value: Any, param: str) -> list[str]:
    """Ids or work ids as a list: one string is refused (iterated, "12" would name "1" and "2")."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | set | frozenset) or not all(
            isinstance(v, str) for v in value):
        raise ValidationError(f"a list of ids (strings), e.g. delete(['12']); got {value!r:.80}", field=param)
    return list(value)


def delete(engine: Engine, ids: Sequence[str], works: Sequence[str]) -> tuple[list[str], list[str]]:
    """Delete chunks and whole works, then bring the citation graph up to date; returns the ids
    deleted and the ids and works that were not found."""
    from indexer.graph import update_graph

    found_works = {w: engine.work_chunks([w]) for w in dict.fromkeys(works)}
    targets = list(dict.fromkeys([*ids, *(i for chunks in found_works.values() for i in chunks)]))
    deleted = engine.delete(targets) if targets else []
    if deleted and isinstance(engine, GraphStore):
        update_graph(engine)
    gone = set(deleted)
    missing = [i for i in dict.fromkeys(ids) if i not in gone] + [w for w, c in found_works.items() if not c]
    return deleted, missing


def open(path_or_url: str | Path, **options: Any) -> Handle:  # noqa: A001 - the public name
    """Open an existing index; never creates one (`create` does). A directory must hold an
    embedded index; an OpenSearch index is looked up on first use (no request here)."""
    target = str(path_or_url)
    if not is_url(target) and not (Path(target) / "store.sqlite").is_file():
        raise IndexNotFoundError(f"no index at {target}; hybridsearch.create({target!r}) makes one, and "
                                 "`hybridsearch ingest PATH --index-dir DIR` fills one")
    return Handle(open_engine(target, **options))


def create(path_or_url: str | Path, **options: Any) -> Handle:
    """Open an index, creating it if it does not exist (a directory, or the logical index
    `options["index"]` on OpenSearch, created on the first write)."""
    return Handle(open_engine(str(path_or_url), **options))
