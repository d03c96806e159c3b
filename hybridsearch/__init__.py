"""hybridsearch: hybrid BM25 + dense retrieval for scientific and mathematical corpora."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from hybridsearch.api import Handle


def open(path_or_url: str, **options: Any) -> Handle:  # noqa: A001 - the public name
    """Open an existing index: a directory (embedded engine) or a URL (the engine registered for
    it). Never creates one: a directory without an index is IndexNotFoundError."""
    from hybridsearch.api import open as _open

    return _open(path_or_url, **options)


def create(path_or_url: str, **options: Any) -> Handle:
    """Open an index, creating it when it does not exist."""
    from hybridsearch.api import create as _create

    return _create(path_or_url, **options)
