"""The OpenSearch engine (scale-out): the engine contract on an OpenSearch 2.19+ cluster, and the
launcher of a local single-node OpenSearch (`hybridsearch opensearch start`)."""

from hybridsearch.engines.opensearch.engine import OpenSearchEngine

__all__ = ["OpenSearchEngine"]
