"""The OpenSearch engine (scale-out): the engine contract on an OpenSearch 2.19+ cluster, and the
launcher of a local single-node OpenSearch (`hybridsearch opensearch start`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hybridsearch.engines.opensearch.engine import OpenSearchEngine

__all__ = ["OpenSearchEngine"]


def __getattr__(name: str) -> Any:
    # the engine pulls in opensearch-py and numpy; the launcher (node.py) needs neither
    if name == "OpenSearchEngine":
        from hybridsearch.engines.opensearch.engine import OpenSearchEngine

        return OpenSearchEngine
    raise AttributeError(name)
